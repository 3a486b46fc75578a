//! `eventd-gen OUT_DIR`: eventd's man pages and shell completions, made
//! when the package is built (`scripts/package`), from the very clap
//! definitions `eventd` and `eventctl` parse with: their `cli.rs` files are
//! compiled into this program as they are. So a new option shows in the
//! man page and completes in the shell without anyone writing it twice,
//! and the shipped binaries carry no generator.
//!
//! Writes `OUT_DIR/man/eventd.8`, `eventctl.1` and one `eventctl-*.1` per
//! subcommand, `OUT_DIR/completions/` for bash (`NAME.bash`), zsh
//! (`_NAME`) and fish (`NAME.fish`), and `OUT_DIR/doc/`, the pages the
//! package installs under `/usr/share/doc/eventd` (`docs.rs`). Its tests also keep
//! `docs/reference/eventctl.md` in step with eventctl's CLI (`markdown.rs`).

// The argument structs are only rendered here, never filled: their fields
// are read by the binaries, not by this program.
mod docs;
#[allow(dead_code)]
#[path = "../../../src/bin/eventctl/cli.rs"]
mod eventctl_cli;
#[allow(dead_code)]
#[path = "../../../src/bin/eventd/cli.rs"]
mod eventd_cli;
// Only its test uses it: it checks (or, with EVENTD_BLESS, writes) the
// page in the repository; the packages do not ship it.
#[cfg(test)]
mod markdown;

use clap::CommandFactory;
use clap_complete::Shell;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: eventd-gen OUT_DIR");
        return ExitCode::from(2);
    };
    match generate(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("eventd-gen: {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}

fn generate(out: &Path) -> std::io::Result<()> {
    let man = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let source = format!("eventd {}", env!("CARGO_PKG_VERSION"));
    // eventd is a daemon: section 8. eventctl and its subcommands: 1.
    let eventd = eventd_cli::Args::command();
    clap_mangen::Man::new(eventd.clone())
        .section("8")
        .source(source.clone())
        .manual("eventd")
        .generate_to(&man)?;
    clap_mangen::generate_to(eventctl_cli::Args::command(), &man)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        for (mut cmd, name) in [
            (eventd.clone(), "eventd"),
            (eventctl_cli::Args::command(), "eventctl"),
        ] {
            clap_complete::generate_to(shell, &mut cmd, name, &completions)?;
        }
    }
    docs::stage(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .as_path(),
        &out.join("doc"),
    )
}
