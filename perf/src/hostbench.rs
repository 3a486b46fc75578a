//! The host's own sources (`eventd-perf host-sources`), against the eventd
//! binary and, for service output, beside journald:
//!
//! - **kernel**: N records written into `/dev/kmsg` as fast as one thread
//!   can (a fresh descriptor per 10 records: the kernel lets a descriptor
//!   write no more), read by eventd (`KernelLog = true`) into its kernel
//!   ring and stored; beside it **syslog**: N datagrams of the same size
//!   into the same eventd's syslog socket from one blocking sender. For
//!   each: records stored per second, lost (the kernel overwrote them
//!   before eventd read them), eventd's CPU per record by stage.
//! - **service output**: the same N lines (`yes LINE | head -n N` in `sh`)
//!   captured three ways: `eventctl run` into eventd's stdout socket,
//!   `systemd-cat` into journald (the standalone journald of the syslog
//!   scenario, in private namespaces; `systemd-cat` entered into them with
//!   `nsenter`), and `logger` reading the lines into eventd's syslog
//!   socket. For each: the daemon's CPU per captured line (its process
//!   tree), the command side's (the wrapper and the command: this
//!   harness's waited-for children), and the wall time to the last line
//!   stored.

use crate::syslog;
use anyhow::{bail, Context};
use serde::Serialize;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Message bytes, as in the syslog scenario.
const LINE_BYTES: usize = 92;

#[derive(Debug, Clone, Serialize)]
pub struct SourceRun {
    pub path: &'static str,
    pub sent: u64,
    pub stored: u64,
    pub lost: u64,
    pub seconds: f64,
    pub stored_per_s: f64,
    /// The daemon's CPU µs per stored record (its whole process tree).
    pub daemon_us: f64,
    /// The command side's CPU µs per record (wrapper and command; for the
    /// kernel and syslog rows the harness's own sender is not counted).
    pub client_us: Option<f64>,
    /// eventd's CPU µs per record by stage (thread name).
    pub stages: Vec<(String, f64)>,
}

/// A running eventd binary with a private data directory.
struct Eventd {
    child: Child,
    data: PathBuf,
}

impl Eventd {
    fn start(binary: &Path, dir: &Path) -> anyhow::Result<Eventd> {
        let data = dir.join("data");
        let config = dir.join("eventd.toml");
        // Unlimited, as the peers run: one source emits everything here.
        std::fs::write(&config, "KernelLog = true\nRateLimitBurst = 0\n")?;
        let child = Command::new(binary)
            .arg("--data-dir")
            .arg(&data)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("eventd.log"))?)
            .spawn()
            .context("starting eventd")?;
        let mut e = Eventd { child, data };
        let ready = [e.socket("query.sock"), e.socket("stdout.sock")];
        wait_for(Duration::from_secs(60), "eventd's sockets", || {
            ready.iter().all(|p| p.exists())
        })?;
        // The kernel's backlog read and stored before anything is measured.
        let mut last = u64::MAX;
        wait_for(Duration::from_secs(120), "the kernel backlog", || {
            let read = e
                .stats()
                .map_or(0, |s| s["kernel"]["read"].as_u64().unwrap_or(0));
            let settled = read == last && read > 0;
            last = read;
            std::thread::sleep(Duration::from_millis(300));
            settled
        })?;
        e.child.try_wait()?.map_or(Ok(()), |s| {
            Err(anyhow::anyhow!("eventd exited at start: {s}"))
        })?;
        Ok(e)
    }

    fn socket(&self, name: &str) -> PathBuf {
        self.data.join("run").join(name)
    }

    fn stats(&self) -> anyhow::Result<serde_json::Value> {
        let mut out = serde_json::Value::Null;
        eventd::query::client::call(
            &self.socket("query.sock"),
            &eventd::query::Request::Stats,
            |v| {
                out = v["stats"].clone();
                Ok(true)
            },
        )?;
        Ok(out)
    }

    fn stat(&self, section: &str, key: &str) -> u64 {
        self.stats()
            .map_or(0, |s| s[section][key].as_u64().unwrap_or(0))
    }

    /// Events committed, over every shard.
    fn committed(&self) -> u64 {
        self.stats().map_or(0, |s| {
            s["shards"]
                .as_array()
                .map_or(0, |a| a.iter().filter_map(|x| x["events"].as_u64()).sum())
        })
    }

    fn cpu(&self) -> (u64, std::collections::BTreeMap<String, u64>) {
        let pid = self.child.id();
        (syslog::tree_cpu_ns(pid), syslog::threads_cpu_ns(pid))
    }

    fn stop(mut self) -> anyhow::Result<()> {
        syslog::sigterm(&mut self.child)
    }
}

fn wait_for(within: Duration, what: &str, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// CPU time (ns) of this process's waited-for children so far.
fn children_cpu_ns() -> u64 {
    // SAFETY: getrusage writes into the rusage struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut r) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(r.ru_utime) + ns(r.ru_stime)
}

/// What a measured run used, from before to after.
struct Usage {
    at: Instant,
    daemon: (u64, std::collections::BTreeMap<String, u64>),
    children: u64,
}

impl Usage {
    fn now(daemon: (u64, std::collections::BTreeMap<String, u64>)) -> Usage {
        Usage {
            at: Instant::now(),
            daemon,
            children: children_cpu_ns(),
        }
    }

    /// The run from `before` to `self`, for `stored` records; `client` is
    /// the command side's CPU (ns), taken when the command ended (the
    /// harness's later children, journalctl, are not the command's).
    fn run(
        &self,
        before: &Usage,
        path: &'static str,
        (sent, stored, lost): (u64, u64, u64),
        client: Option<u64>,
    ) -> SourceRun {
        let per = |ns: u64| ns as f64 / 1000.0 / stored.max(1) as f64;
        let seconds = self.at.duration_since(before.at).as_secs_f64();
        let mut stages: Vec<(String, f64)> = self
            .daemon
            .1
            .iter()
            .map(|(s, ns)| {
                let was = before.daemon.1.get(s).copied().unwrap_or(0);
                (s.clone(), per(ns.saturating_sub(was)))
            })
            .filter(|(_, us)| *us >= 0.01)
            .collect();
        let daemon_us = per(self.daemon.0.saturating_sub(before.daemon.0));
        // Threads that ended meanwhile (a connection's) count in the
        // process's total only.
        let ended = daemon_us - stages.iter().map(|(_, us)| us).sum::<f64>();
        if !self.daemon.1.is_empty() && ended >= 0.05 {
            stages.push(("threads ended".to_string(), ended));
        }
        SourceRun {
            path,
            sent,
            stored,
            lost,
            seconds,
            stored_per_s: stored as f64 / seconds,
            daemon_us,
            client_us: client.map(per),
            stages,
        }
    }
}

/// A line of `n` bytes: the bench's tag, then filler.
fn line(tag: &str, n: usize) -> String {
    let mut l = format!("{tag} ");
    while l.len() < n {
        l.push((b'a' + (l.len() % 26) as u8) as char);
    }
    l
}

/// The kernel path: `n` records written while eventd reads them.
fn kernel(e: &Eventd, n: u64) -> anyhow::Result<SourceRun> {
    let tag = format!("eventd-bench-{}", std::process::id());
    let record = format!("<7>{}\n", line(&tag, LINE_BYTES));
    let (stored0, lost0) = (e.stat("kernel", "stored"), e.stat("kernel", "lost"));
    let before = Usage::now(e.cpu());
    let mut written = 0u64;
    while written < n {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .context("/dev/kmsg (the kernel path needs root)")?;
        for _ in 0..10.min(n - written) {
            f.write_all(record.as_bytes())?;
            written += 1;
        }
    }
    let end = format!("<7>{tag} end\n");
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")?
        .write_all(end.as_bytes())?;
    // Every record up to the end mark passed: stored or counted lost.
    let sent = n + 1;
    let mut last = (0, Instant::now());
    wait_for(Duration::from_secs(300), "the kernel records", || {
        let done = e.stat("kernel", "stored") - stored0 + e.stat("kernel", "lost") - lost0;
        if done != last.0 {
            last = (done, Instant::now());
        }
        done >= sent || last.1.elapsed() > Duration::from_secs(10)
    })?;
    let stored = e.stat("kernel", "stored") - stored0;
    wait_for(
        Duration::from_secs(120),
        "the kernel records committed",
        || e.committed() >= stored,
    )?;
    let after = Usage::now(e.cpu());
    let lost = e.stat("kernel", "lost") - lost0;
    Ok(after.run(&before, "kernel (/dev/kmsg)", (sent, stored, lost), None))
}

/// The syslog path: `n` datagrams from one blocking sender.
fn syslog(e: &Eventd, n: u64) -> anyhow::Result<SourceRun> {
    let message = format!(
        "<13>Nov 30 10:01:02 bench[4242]: {}",
        line("m", LINE_BYTES - 32)
    );
    let committed0 = e.committed();
    let before = Usage::now(e.cpu());
    let s = UnixDatagram::unbound()?;
    s.connect(e.socket("syslog.sock"))?;
    for _ in 0..n {
        s.send(message.as_bytes())?;
    }
    wait_for(
        Duration::from_secs(300),
        "the syslog messages committed",
        || e.committed() >= committed0 + n,
    )?;
    let after = Usage::now(e.cpu());
    Ok(after.run(&before, "syslog datagrams", (n, n, 0), None))
}

/// The command whose output is captured: `seq` writing N numbered lines
/// of [`LINE_BYTES`] (the number tells how far a store got).
fn command_text(n: u64) -> String {
    let filler = line("", LINE_BYTES - "captured 00000000".len());
    format!("seq -f 'captured %08.0f{filler}' 1 {n}")
}

/// The command side's CPU since `before`, now that it has ended.
fn client_ns(before: &Usage) -> u64 {
    children_cpu_ns().saturating_sub(before.children)
}

/// `eventctl run` into eventd's stdout socket.
fn eventctl_run(e: &Eventd, eventctl: &Path, n: u64) -> anyhow::Result<SourceRun> {
    let stored0 = e.stat("stdout", "stored");
    let before = Usage::now(e.cpu());
    let status = Command::new(eventctl)
        .arg("--data-dir")
        .arg(&e.data)
        .args(["run", "-t", "bench", "--", "sh", "-c", &command_text(n)])
        .status()?;
    if !status.success() {
        bail!("eventctl run: {status}");
    }
    let client = client_ns(&before);
    // The lines and the exit record.
    wait_for(Duration::from_secs(300), "the captured lines", || {
        e.stat("stdout", "stored") > stored0 + n
    })?;
    let committed = e.committed();
    wait_for(Duration::from_secs(120), "their commit", || {
        e.stat("stdout", "stored") - stored0 <= committed
    })?;
    let after = Usage::now(e.cpu());
    Ok(after.run(&before, "eventctl run → eventd", (n, n, 0), Some(client)))
}

/// `logger` reading the command's lines into eventd's syslog socket.
fn logger(e: &Eventd, n: u64) -> anyhow::Result<SourceRun> {
    let committed0 = e.committed();
    let before = Usage::now(e.cpu());
    let script = format!(
        "{} | logger --socket {} -t bench",
        command_text(n),
        e.socket("syslog.sock").display()
    );
    let status = Command::new("sh").args(["-c", &script]).status()?;
    if !status.success() {
        bail!("logger: {status}");
    }
    let client = client_ns(&before);
    wait_for(Duration::from_secs(300), "logger's lines committed", || {
        e.committed() >= committed0 + n
    })?;
    let after = Usage::now(e.cpu());
    Ok(after.run(&before, "logger → eventd syslog", (n, n, 0), Some(client)))
}

/// `systemd-cat` into a standalone journald.
fn systemd_cat(work: &Path, n: u64) -> anyhow::Result<SourceRun> {
    let dir = work.join("host-journald");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut journald = syslog::Journald::start(&dir)?;
    let pid = journald
        .daemon_pid()
        .context("journald's process in its namespaces")?;
    let cpu = || (syslog::tree_cpu_ns(journald.pid()), Default::default());
    let before = Usage::now(cpu());
    let status = Command::new("nsenter")
        .args([
            "--target",
            &pid.to_string(),
            "--mount",
            "systemd-cat",
            "-t",
            "bench",
        ])
        .args(["sh", "-c", &command_text(n)])
        .status()?;
    if !status.success() {
        bail!("systemd-cat: {status}");
    }
    let client = client_ns(&before);
    // The last line's number, polled cheaply (journalctl reads from the
    // end); the whole count once at the end.
    wait_for(Duration::from_secs(300), "journald's last line", || {
        std::thread::sleep(Duration::from_millis(100));
        syslog::journal_last(&dir, "bench").is_ok_and(|last| last >= n)
    })?;
    let after = Usage::now(cpu());
    let stored = syslog::journal_lines(&dir, "bench")?;
    let run = after.run(
        &before,
        "systemd-cat → journald",
        (n, stored, 0),
        Some(client),
    );
    journald.stop_now()?;
    Ok(run)
}

/// The host-sources scenario's options.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    output: crate::cli::Output,
    #[command(flatten)]
    binary: crate::cli::Binary,
    /// Records sent through each path.
    #[arg(long, default_value_t = 1_000_000)]
    messages: u64,
}

pub(crate) fn main(args: &Args) -> anyhow::Result<String> {
    run(&args.binary.path()?, &args.output.work()?, args.messages)
}

/// Runs every path and prints the table.
pub fn run(eventd_binary: &Path, work: &Path, n: u64) -> anyhow::Result<String> {
    let work = &std::fs::canonicalize(work)?;
    let dir = work.join("host-sources");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let eventctl = eventd_binary.with_file_name("eventctl");
    let e = Eventd::start(eventd_binary, &dir)?;
    let mut runs = Vec::new();
    eprintln!("kernel: {n} records into /dev/kmsg");
    runs.push(kernel(&e, n)?);
    eprintln!("syslog: {n} datagrams");
    runs.push(syslog(&e, n)?);
    eprintln!("eventctl run: {n} lines");
    runs.push(eventctl_run(&e, &eventctl, n)?);
    eprintln!("logger: {n} lines");
    runs.push(logger(&e, n)?);
    e.stop()?;
    eprintln!("systemd-cat: {n} lines into journald");
    match systemd_cat(work, n) {
        Ok(r) => runs.push(r),
        Err(e) => eprintln!("systemd-cat into journald not measured: {e:#}"),
    }
    let machine = crate::runner::Machine::describe();
    println!(
        "\n## host sources ({n} records of {LINE_BYTES} bytes per path; {} CPUs)\n",
        machine.cpus
    );
    println!(
        "| path | stored/s | daemon CPU µs per record (by stage) | command side CPU µs per line \
         | stored | lost | seconds |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &runs {
        let stages: Vec<(String, f64)> = r.stages.clone();
        println!(
            "| {} | {:.0} | {:.2}{} | {} | {} | {} | {:.2} |",
            r.path,
            r.stored_per_s,
            r.daemon_us,
            syslog::stages_text(&stages),
            r.client_us.map_or("—".to_string(), |c| format!("{c:.2}")),
            r.stored,
            r.lost,
            r.seconds
        );
    }
    let json = serde_json::to_string(&runs)?;
    std::fs::write(work.join("host-sources.json"), &json)?;
    Ok(format!("HOST_SOURCES {json}"))
}
