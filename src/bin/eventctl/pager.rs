//! The pager `eventctl query` pipes its output into on a terminal, as
//! journalctl does: `$EVENTD_PAGER`, else `$SYSTEMD_PAGER`, else `$PAGER`,
//! else `less`, run by `/bin/sh -c`, with `LESS=FRX` when `LESS` is unset
//! (quit at once when it all fits on one screen, colours through, no
//! screen clearing). An empty value or `cat` means no pager. Run as root
//! (or set-id), only `less` is run, in its secure mode (see `secure`).

use std::io::{IsTerminal, Write};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};

/// A pager reading what eventctl writes to its standard output; dropped,
/// it is sent the end of the output and waited for.
pub struct Pager {
    child: Child,
}

/// The pager's command line, from the environment; `None` for none.
fn command() -> Option<String> {
    let chosen = ["EVENTD_PAGER", "SYSTEMD_PAGER", "PAGER"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .unwrap_or_else(|| "less".to_string());
    let chosen = chosen.trim();
    (!chosen.is_empty() && chosen != "cat").then(|| chosen.to_string())
}

/// Whether the pager must not let its user out (a shell, an editor, a
/// file written), as journalctl decides it: `SYSTEMD_PAGERSECURE` when set
/// (`0` or `1`), else on for root and for a set-id run. In that mode only
/// `less` is run, with `LESSSECURE=1`; any other pager is done without.
/// So that a sudo rule allowing `eventctl query` gives no root shell.
fn secure() -> bool {
    match std::env::var("SYSTEMD_PAGERSECURE")
        .ok()
        .as_deref()
        .map(str::trim)
    {
        Some("0") | Some("false") | Some("no") => false,
        Some("1") | Some("true") | Some("yes") => true,
        // SAFETY: geteuid and getuid have no preconditions.
        _ => unsafe { libc::geteuid() == 0 || libc::geteuid() != libc::getuid() },
    }
}

/// Whether `command` runs `less` (its first word, any directory).
fn is_less(command: &str) -> bool {
    let first = command.split_whitespace().next().unwrap_or_default();
    first.rsplit('/').next() == Some("less")
}

impl Pager {
    /// Starts the pager when standard output is a terminal and one is
    /// wanted; from here on standard output is the pager's input. A pager
    /// that cannot be started is done without: the output goes to the
    /// terminal.
    pub fn start() -> Option<Pager> {
        if !std::io::stdout().is_terminal() {
            return None;
        }
        let chosen = command()?;
        let secure = secure();
        if secure && !is_less(&chosen) {
            return None;
        }
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(chosen).stdin(Stdio::piped());
        if std::env::var_os("LESS").is_none() {
            cmd.env("LESS", "FRX");
        }
        if secure {
            cmd.env("LESSSECURE", "1");
        }
        let mut child = cmd.spawn().ok()?;
        let input = child.stdin.take()?;
        let _ = std::io::stdout().flush();
        // SAFETY: both descriptors are open (the pipe's write end is ours
        // until `input` drops, after this); dup2 makes 1 a copy of it.
        if unsafe { libc::dup2(input.as_raw_fd(), libc::STDOUT_FILENO) } < 0 {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        // Ctrl-C belongs to the pager now (less stops reading on it and
        // stays); eventctl ends when the pager is quit (the next write
        // meets a closed pipe) or when the output is done.
        // SAFETY: setting SIGINT's disposition to SIG_IGN has no
        // preconditions.
        unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
        Some(Pager { child })
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        let _ = std::io::stdout().flush();
        // The pipe's last write end is descriptor 1: pointing it at
        // /dev/null tells the pager the output is complete.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            // SAFETY: both descriptors are open; 1 becomes a copy of the
            // /dev/null one.
            unsafe { libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO) };
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::is_less;

    #[test]
    fn only_less_counts_as_less() {
        assert!(is_less("less"));
        assert!(is_less("/usr/bin/less -S"));
        assert!(!is_less("most"));
        assert!(!is_less("sh -c less"));
        assert!(!is_less("lesspipe"));
    }
}
