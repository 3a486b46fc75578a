//! The LTTng-UST peer (perf/clients/lttng_bench.c): the same event as the
//! Rust raw emit, recorded by a tracepoint into LTTng's per-CPU
//! shared-memory buffers, in the same run, so the raw emit's goal can be
//! read as a ratio to the tool it was set by rather than to a figure from
//! another machine.
//!
//! The session daemon is private: a child of this program with its own
//! `LTTNG_HOME` in a fresh temporary directory, stopped by PID at the end.
//! Run as root, it and the tracepoint program run as `nobody` (a root
//! session daemon would take the machine's `/run/lttng`; one of another
//! user keeps everything under its `LTTNG_HOME`). The channel matches
//! eventd's rings: per-CPU buffers of 4 MiB (four 1 MiB sub-buffers) in
//! overwrite mode, a consumer daemon writing the trace to disk.

use super::c::build_c_bench;
use super::cost::{cost, Cost, BUSY_BEFORE_MS};
use crate::syslog::{run_cmd, sigterm};
use anyhow::{bail, Context};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to install when LTTng is missing.
pub(super) const LTTNG_PACKAGES: &str = "apt-get install lttng-tools liblttng-ust-dev";

/// A private session daemon with a recording session for the bench's
/// tracepoint; stopped (SIGTERM, by PID) and its directory removed on drop.
struct Session {
    sessiond: Child,
    /// Removed when the session is dropped, after the daemon has stopped.
    dir: tempfile::TempDir,
    as_nobody: bool,
}

impl Session {
    fn start() -> anyhow::Result<Session> {
        // SAFETY: geteuid has no preconditions.
        let as_nobody = unsafe { libc::geteuid() } == 0;
        // Not under the work directory: `nobody` must reach it, and a
        // test's temporary directory is open to its owner only. A fresh
        // directory of a random name (made with mode 0700, then opened for
        // reading), so nothing another user prepared in /tmp is used.
        let dir = tempfile::Builder::new()
            .prefix("eventd-perf-lttng-")
            .tempdir()?;
        std::fs::create_dir(dir.path().join("home"))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        if as_nobody {
            run_cmd(
                Command::new("chown")
                    .args(["nobody:nogroup"])
                    .arg(dir.path().join("home")),
            )?;
        }
        let log = dir.path().join("sessiond.log");
        let mut cmd = Self::command_in(dir.path(), as_nobody, "lttng-sessiond");
        let sessiond = cmd
            .arg("--no-kernel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting lttng-sessiond")?;
        let mut session = Session {
            sessiond,
            dir,
            as_nobody,
        };
        session.wait_ready(&log)?;
        let trace = session.dir.path().join("home/trace");
        session.lttng(&[
            "create",
            "eventd-perf",
            &format!("--output={}", trace.display()),
        ])?;
        session.lttng(&[
            "enable-channel",
            "--userspace",
            "--overwrite",
            "--subbuf-size=1M",
            "--num-subbuf=4",
            "bench",
        ])?;
        session.lttng(&[
            "enable-event",
            "--userspace",
            "--channel=bench",
            "eventd_bench:order",
        ])?;
        session.lttng(&["start"])?;
        Ok(session)
    }

    /// `program` run with this session's `LTTNG_HOME` (as `nobody` when
    /// this program is root).
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        Self::command_in(self.dir.path(), self.as_nobody, program)
    }

    fn command_in(dir: &Path, as_nobody: bool, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let home = dir.join("home");
        let mut cmd = if as_nobody {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
                .arg(program);
            c
        } else {
            Command::new(program)
        };
        cmd.env("HOME", &home).env("LTTNG_HOME", &home);
        cmd
    }

    fn lttng(&self, args: &[&str]) -> anyhow::Result<String> {
        run_cmd(self.command("lttng").args(args))
    }

    /// Waits until the session daemon answers its client socket.
    fn wait_ready(&mut self, log: &Path) -> anyhow::Result<()> {
        let socket = self.dir.path().join("home/.lttng/client-lttng-sessiond");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.sessiond.try_wait()? {
                bail!(
                    "lttng-sessiond exited at start ({status}): {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            if socket.exists() && self.lttng(&["list"]).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("lttng-sessiond did not answer on {}", socket.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.lttng(&["destroy", "--all"]);
        let _ = sigterm(&mut self.sessiond);
    }
}

/// Whether LTTng-UST's session daemon and headers are installed.
pub(super) fn lttng_installed() -> bool {
    let on_path = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|p| p.join("lttng-sessiond").is_file())
    });
    // The header where Debian puts it (under the multiarch triplet), or
    // where a build from source does.
    let header = |dir: &Path| dir.join("lttng/tracepoint.h").is_file();
    let include = Path::new("/usr/include");
    let multiarch = std::fs::read_dir(include)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| header(&e.path()));
    on_path && (header(include) || multiarch || header(Path::new("/usr/local/include")))
}

/// The tracepoint program built, in a recording session.
pub(super) struct Lttng {
    session: Session,
    exe: PathBuf,
}

impl Lttng {
    pub(super) fn start() -> anyhow::Result<Lttng> {
        let session = Session::start()?;
        let exe = session.dir.path().join("lttng_bench");
        build_c_bench(
            "perf/clients/lttng_bench.c",
            "perf/clients",
            &exe,
            ["-llttng-ust", "-ldl"],
        )?;
        Ok(Lttng { session, exe })
    }

    /// The tracepoint program recording `n` events (and its untimed
    /// quarter) under valgrind with `options`, in this session.
    pub(super) fn under_valgrind(&self, options: &[&str], n: u64) -> Command {
        let mut cmd = self.session.command("valgrind");
        cmd.args(options).arg(&self.exe).arg(n.to_string());
        cmd
    }

    /// One run of `n` recorded tracepoints.
    pub(super) fn run(&self, n: u64) -> anyhow::Result<Cost> {
        let out = run_cmd(
            self.session
                .command(&self.exe)
                .arg(n.to_string())
                .arg(BUSY_BEFORE_MS.to_string()),
        )?;
        cost(&out, "lttng")
    }
}
