//! The eventd the clients write to: a child under the work directory.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(super) struct Daemon {
    child: Child,
    data: PathBuf,
}

impl Daemon {
    pub(super) fn start(binary: &Path, data: &Path) -> anyhow::Result<Daemon> {
        let _ = std::fs::remove_dir_all(data);
        let log = std::fs::File::create(data.with_extension("log"))?;
        // Rate limits off (the producers' budgets follow): each figure is
        // what an event costs to write, not to refuse.
        let config = data.with_extension("toml");
        std::fs::write(&config, "RateLimitBurst = 0\n")?;
        let child = Command::new(binary)
            .arg("--data-dir")
            .arg(data)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid_file = data.join("run/eventd.pid");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&pid_file)
            .is_ok_and(|s| s.split_whitespace().next() == Some(&child.id().to_string()))
        {
            if Instant::now() > deadline {
                bail!(
                    "eventd did not start (see {})",
                    data.with_extension("log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Daemon {
            child,
            data: data.to_path_buf(),
        })
    }

    pub(super) fn kmes(&self) -> PathBuf {
        self.data.join("kmes")
    }

    pub(super) fn syslog_socket(&self) -> PathBuf {
        self.data.join("run/syslog.sock")
    }

    /// Waits until eventd has stored what the runs before sent it: its CPU
    /// time (all threads, /proc/PID/stat) still for SETTLED_FOR, or
    /// SETTLE_MAX at most. A run then measures its path with eventd
    /// keeping up with it, not finishing the last run's backlog on the same
    /// two CPUs.
    pub(super) fn settle(&self) {
        const SETTLED_FOR: Duration = Duration::from_millis(300);
        const SETTLE_MAX: Duration = Duration::from_secs(30);
        let stat = format!("/proc/{}/stat", self.child.id());
        let ticks = || {
            let text = std::fs::read_to_string(&stat).ok()?;
            // After the command's closing parenthesis: state is field 3,
            // utime and stime fields 14 and 15.
            let rest = &text[text.rfind(')')? + 1..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        };
        let deadline = Instant::now() + SETTLE_MAX;
        let mut last = ticks();
        let mut still_since = Instant::now();
        while Instant::now() < deadline && last.is_some() {
            std::thread::sleep(Duration::from_millis(50));
            let now = ticks();
            if now != last {
                last = now;
                still_since = Instant::now();
            } else if still_since.elapsed() >= SETTLED_FOR {
                return;
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill with our unreaped child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
