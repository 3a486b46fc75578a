//! What `eventd --version` and `eventctl --version` say besides the
//! version: the git commit the binaries were built from and the cargo
//! profile. Both reach the code as compile-time environment variables
//! (`EVENTD_GIT_COMMIT`, `EVENTD_BUILD_PROFILE`), read by `eventd::version`.
//!
//! The commit comes from `EVENTD_GIT_COMMIT` when it is set (a build from
//! a source tarball can say where it came from), else from `git`, else it
//! is "unknown". The script runs again only when the checkout's HEAD moves
//! (a commit, a checkout), not at every edit, so a developer's next build
//! after a commit recompiles the library once.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=EVENTD_GIT_COMMIT");
    let commit = match std::env::var("EVENTD_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=EVENTD_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=EVENTD_BUILD_PROFILE={}", profile());
}

/// The abbreviated commit of HEAD, asking cargo to run this again when
/// HEAD or the branch it names moves.
fn git_commit() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&dir)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD itself (a checkout), the branch it points at (a commit) and the
    // packed refs (a branch packed by gc): paths as git resolves them, so a
    // worktree's own HEAD is watched, not the main checkout's.
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched.into_iter().flatten() {
        let path = if Path::new(&path).is_absolute() {
            PathBuf::from(path)
        } else {
            dir.join(path)
        };
        // A path that does not exist would make cargo run this at every
        // build (a branch only in packed-refs has no file of its own).
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    Some(commit)
}

/// The cargo profile: the name of the profile's directory under the target
/// directory (`debug` for the dev profile, `release`, `dist`), which is
/// three levels above OUT_DIR (`target/<profile>/build/<pkg>-<hash>/out`,
/// or `target/<triple>/<profile>/…` when cross-compiling). Cargo's own
/// PROFILE variable only says "debug" or "release", which would call the
/// packaged `dist` build "release".
fn profile() -> String {
    std::env::var_os("OUT_DIR")
        .map(PathBuf::from)
        .and_then(|out| {
            out.ancestors()
                .nth(3)
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
        })
        .or_else(|| std::env::var("PROFILE").ok())
        .unwrap_or_else(|| "unknown".to_string())
}
