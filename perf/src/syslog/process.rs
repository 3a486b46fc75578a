//! Starting, waiting for and stopping a peer daemon, and installing its
//! package.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn sigterm(child: &mut Child) -> anyhow::Result<()> {
    // SAFETY: kill with the pid of a child not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Starts a daemon with its stdout discarded and its stderr in `log`, and
/// waits for each of its `sockets` to appear; `what` names it in errors.
pub(super) fn start_logged(
    cmd: &mut Command,
    log: &Path,
    what: &str,
    sockets: &[PathBuf],
) -> anyhow::Result<Child> {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    for socket in sockets {
        wait_for_socket(socket, &mut child, log)?;
    }
    Ok(child)
}

fn wait_for_socket(path: &Path, child: &mut Child, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if let Some(status) = child.try_wait()? {
            bail!(
                "exited at start ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!("{} did not appear", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Runs `cmd` to its end: its standard output, or an error with its
/// standard error when it fails.
pub(crate) fn run_cmd(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(super) fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    eprintln!("installing {}", packages.join(" "));
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .map(|_| ())
}

// ---- eventd ----
