//! syslog-ng as a peer: Debian's packages unpacked with `dpkg -x`, an `sql()`
//! destination into SQLite.

use super::process::{apt_install, run_cmd, sigterm, start_logged};
use crate::running::Running;
use anyhow::bail;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

pub(super) struct SyslogNg {
    pub(super) child: Child,
    pub(super) dir: PathBuf,
    pub(super) root: PathBuf,
}

/// Unpacks syslog-ng and the libraries the host lacks into `root` (once).
fn unpack_syslog_ng(root: &Path) -> anyhow::Result<PathBuf> {
    let binary = root.join("usr/sbin/syslog-ng");
    if binary.exists() {
        return Ok(binary);
    }
    // The SQL driver is an ordinary library package, installable beside
    // rsyslog; only syslog-ng itself conflicts and is unpacked.
    if !Path::new("/usr/lib/x86_64-linux-gnu/dbd/libdbdsqlite3.so").exists() {
        apt_install(&["libdbi1", "libdbd-sqlite3"])?;
    }
    let debs = root.join("debs");
    std::fs::create_dir_all(&debs)?;
    let wanted = [
        "syslog-ng-core",
        "syslog-ng-mod-sql",
        "libivykis0",
        "libnet1",
        "libwrap0",
        "libpcre3",
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|p| {
            p.starts_with("syslog-ng")
                || !Command::new("dpkg")
                    .args(["-s", p])
                    .output()
                    .is_ok_and(|o| o.status.success())
        })
        .collect();
    run_cmd(
        Command::new("apt-get")
            .arg("download")
            .args(&missing)
            .current_dir(&debs),
    )?;
    for entry in std::fs::read_dir(&debs)? {
        let deb = entry?.path();
        run_cmd(Command::new("dpkg").arg("-x").arg(&deb).arg(root))?;
    }
    if !binary.exists() {
        bail!("syslog-ng not found in the unpacked packages");
    }
    Ok(binary)
}

pub(super) fn start_syslog_ng(dir: &Path, root: &Path) -> anyhow::Result<SyslogNg> {
    let binary = unpack_syslog_ng(root)?;
    let conf = dir.join("syslog-ng.conf");
    std::fs::write(
        &conf,
        format!(
            "@version: 3.38\n\
             options {{ threaded(yes); log-fifo-size(2000000); stats-freq(0); }};\n\
             source s {{ unix-dgram(\"{d}/log.sock\" so-rcvbuf(8388608)); }};\n\
             destination db {{ sql(type(sqlite3) database(\"{d}/logs.db\") host(\"\") port(\"\")\n\
               username(\"\") password(\"\") table(\"messages\")\n\
               columns(\"datetime\", \"host\", \"program\", \"pid\", \"message\")\n\
               values(\"${{R_DATE}}\", \"${{HOST}}\", \"${{PROGRAM}}\", \"${{PID}}\", \"${{MSGONLY}}\")\n\
               indexes(\"datetime\") flags(explicit-commits) batch-lines(1000) batch-timeout(100)\n\
               log-fifo-size(2000000)); }};\n\
             log {{ source(s); destination(db); }};\n",
            d = dir.display()
        ),
    )?;
    let lib = |p: &str| root.join(p).display().to_string();
    let log = dir.join("syslog-ng.log");
    let mut cmd = Command::new(&binary);
    cmd.arg("-F")
        .arg("-f")
        .arg(&conf)
        .arg(format!("--module-path={}", lib("usr/lib/syslog-ng/3.38")))
        .arg("-p")
        .arg(dir.join("syslog-ng.pid"))
        .arg("-R")
        .arg(dir.join("syslog-ng.persist"))
        .arg("-c")
        .arg(dir.join("syslog-ng.ctl"))
        .arg("--no-caps")
        .env("LD_LIBRARY_PATH", library_path(root));
    let child = start_logged(&mut cmd, &log, "syslog-ng", &[dir.join("log.sock")])?;
    Ok(SyslogNg {
        child,
        dir: dir.to_path_buf(),
        root: root.to_path_buf(),
    })
}

impl SyslogNg {
    pub(super) fn env(&self, cmd: &mut Command) {
        cmd.env("LD_LIBRARY_PATH", library_path(&self.root));
    }
}

impl Running for SyslogNg {
    fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("log.sock")
    }

    fn stored(&mut self) -> anyhow::Result<u64> {
        // Its own count of rows written: reading the database while it
        // runs would take SQLite locks from under it (its driver does not
        // wait for them, and a refused commit suspends the destination).
        let mut cmd = Command::new(self.root.join("usr/sbin/syslog-ng-ctl"));
        cmd.arg("stats")
            .arg("-c")
            .arg(self.dir.join("syslog-ng.ctl"));
        self.env(&mut cmd);
        let out = run_cmd(&mut cmd)?;
        Ok(out
            .lines()
            .filter(|l| l.starts_with("dst.sql;") && l.contains(";a;written;"))
            .filter_map(|l| l.rsplit(';').next()?.trim().parse::<u64>().ok())
            .sum())
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        sigterm(&mut self.child)
    }
}

/// The rows syslog-ng's database holds (after it stopped).
pub(super) fn syslog_ng_rows(dir: &Path) -> anyhow::Result<u64> {
    let c = rusqlite::Connection::open(dir.join("logs.db"))?;
    Ok(c.query_row("SELECT count(*) FROM messages", [], |r| r.get::<_, i64>(0))? as u64)
}

/// The library folders of the syslog-ng unpacked under `root`, for
/// `LD_LIBRARY_PATH`.
fn library_path(root: &Path) -> String {
    [
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/syslog-ng",
        "lib/x86_64-linux-gnu",
    ]
    .map(|p| root.join(p).display().to_string())
    .join(":")
}
