//! rsyslog as a peer: Debian's package with a private configuration, `imuxsock`
//! into `omfile`.

use super::process::{apt_install, sigterm, start_logged};
use crate::running::Running;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

pub(super) struct Rsyslog {
    pub(super) child: Child,
    pub(super) dir: PathBuf,
    pub(super) file: Option<std::fs::File>,
    pub(super) lines: u64,
    /// The end of the file read last, after its last newline.
    pub(super) partial: Vec<u8>,
}

pub(super) fn start_rsyslog(dir: &Path) -> anyhow::Result<Rsyslog> {
    if Command::new("rsyslogd").arg("-v").output().is_err() {
        apt_install(&["rsyslog"])?;
    }
    let conf = dir.join("rsyslog.conf");
    std::fs::write(
        &conf,
        format!(
            "global(workDirectory=\"{d}\" maxMessageSize=\"64k\")\n\
             module(load=\"imuxsock\" SysSock.Use=\"off\")\n\
             input(type=\"imuxsock\" Socket=\"{d}/log.sock\" RateLimit.Interval=\"0\")\n\
             *.* action(type=\"omfile\" file=\"{d}/messages\")\n",
            d = dir.display()
        ),
    )?;
    let log = dir.join("rsyslogd.log");
    let child = start_logged(
        Command::new("rsyslogd")
            .arg("-n")
            .arg("-f")
            .arg(&conf)
            .arg("-i")
            .arg(dir.join("rsyslogd.pid")),
        &log,
        "rsyslogd",
        &[dir.join("log.sock")],
    )?;
    Ok(Rsyslog {
        child,
        dir: dir.to_path_buf(),
        file: None,
        lines: 0,
        partial: Vec::new(),
    })
}

impl Running for Rsyslog {
    fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("log.sock")
    }

    fn stored(&mut self) -> anyhow::Result<u64> {
        if self.file.is_none() {
            self.file = std::fs::File::open(self.dir.join("messages")).ok();
        }
        if let Some(f) = &mut self.file {
            // Counts the bench's lines written since the last look (not
            // rsyslog's own start-up line).
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                self.partial.extend_from_slice(&buf[..n]);
                let complete = self
                    .partial
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                self.lines += self.partial[..complete]
                    .split(|&b| b == b'\n')
                    .filter(|l| l.windows(12).any(|w| w == b"bench[4242]:"))
                    .count() as u64;
                self.partial.drain(..complete);
            }
        }
        Ok(self.lines)
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        sigterm(&mut self.child)
    }
}

// ---- journald ----
