//! `eventd-perf clients`: what one event costs the program that emits it,
//! through each client eventd offers beside what that program would use
//! today, in one run against one running eventd (the binary, as a child):
//!
//! - Rust: `tracing::info!` with three fields through eventd-tracing's
//!   layer, through `tracing-subscriber`'s fmt layer writing to a file, and
//!   as a syslog datagram to eventd's own socket (what a `syslog(3)`
//!   binding does); and the raw `Emitter` the layer is judged against.
//! - C: `eventd_emit` against a syslog(3)-style send (perf/clients/bench.c).
//! - Python: `EventdHandler` against `logging.handlers.SysLogHandler`
//!   (perf/clients/bench.py).
//!
//! Every figure is the median of three runs of `--messages` events (one
//! thread), in nanoseconds per event.

use anyhow::{bail, Context};
use eventd::rings::{Emitter, Event, Level};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    data: PathBuf,
}

impl Daemon {
    fn start(binary: &Path, data: &Path) -> anyhow::Result<Daemon> {
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

    fn kmes(&self) -> PathBuf {
        self.data.join("kmes")
    }

    fn syslog_socket(&self) -> PathBuf {
        self.data.join("run/syslog.sock")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill with our unreaped child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// Wall and CPU time (this thread's) per event, ns.
#[derive(Clone, Copy)]
struct Cost {
    wall: f64,
    cpu: f64,
}

fn thread_cpu_ns() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: t is a valid timespec to write; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

struct Clock(Instant, f64);

fn start() -> Clock {
    Clock(Instant::now(), thread_cpu_ns())
}

fn per_event(clock: Clock, n: u64) -> Cost {
    Cost {
        wall: clock.0.elapsed().as_nanos() as f64 / n as f64,
        cpu: (thread_cpu_ns() - clock.1) / n as f64,
    }
}

/// Median of three runs of `f` (by CPU time, each figure its own median).
fn median(mut f: impl FnMut() -> anyhow::Result<Cost>) -> anyhow::Result<Cost> {
    let runs = [f()?, f()?, f()?];
    Ok(median_of(&runs))
}

fn median_of(runs: &[Cost]) -> Cost {
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Cost {
        wall: mid(runs.iter().map(|c| c.wall).collect()),
        cpu: mid(runs.iter().map(|c| c.cpu).collect()),
    }
}

fn rust_raw(kmes: &Path, n: u64) -> anyhow::Result<Cost> {
    let emitter = Emitter::open(kmes)?;
    let mut fields = String::with_capacity(128);
    let clock = start();
    for i in 0..n {
        use std::fmt::Write;
        fields.clear();
        let _ = write!(
            fields,
            "{{\"order\":{i},\"amount\":{:?},\"paid\":{}}}",
            i as f64 * 0.5,
            i % 2 == 1
        );
        let event = Event {
            ts_ns: eventd::rings::now_ns(),
            pid: 1,
            tid: 1,
            uid: 0,
            level: Level::Info,
            provider: "rust-bench",
            name: "bench",
            message: "order taken",
            fields: &fields,
        };
        let _ = emitter.emit(&event);
    }
    Ok(per_event(clock, n))
}

fn tracing_loop(n: u64) {
    for i in 0..n {
        tracing::info!(
            order = i,
            amount = i as f64 * 0.5,
            paid = i % 2 == 1,
            "order taken"
        );
    }
}

fn rust_layer(kmes: &Path, n: u64) -> anyhow::Result<Cost> {
    use tracing_subscriber::prelude::*;
    let layer = eventd_tracing::EventdLayer::builder()
        .kmes_dir(kmes)
        .provider("rust-bench")
        .layer();
    let subscriber = tracing_subscriber::registry().with(layer);
    let clock = start();
    tracing::subscriber::with_default(subscriber, || tracing_loop(n));
    Ok(per_event(clock, n))
}

fn rust_fmt_file(dir: &Path, n: u64) -> anyhow::Result<Cost> {
    use tracing_subscriber::prelude::*;
    let file = std::fs::File::create(dir.join("fmt.log"))?;
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file));
    let subscriber = tracing_subscriber::registry().with(layer);
    let clock = start();
    tracing::subscriber::with_default(subscriber, || tracing_loop(n));
    Ok(per_event(clock, n))
}

/// What a tracing-to-syslog layer does per event: format the message with
/// its fields in the RFC 3164 shape and send one datagram.
fn rust_syslog(socket: &Path, n: u64) -> anyhow::Result<Cost> {
    let sock = UnixDatagram::unbound()?;
    sock.connect(socket)?;
    let pid = std::process::id();
    let mut line = String::with_capacity(256);
    let clock = start();
    for i in 0..n {
        use std::fmt::Write;
        line.clear();
        let _ = write!(
            line,
            "<14>{} rust-bench[{pid}]: order taken order={i} amount={:?} paid={}",
            eventd::rings::now_ns() / 1_000_000_000,
            i as f64 * 0.5,
            i % 2 == 1
        );
        sock.send(line.as_bytes())?;
    }
    Ok(per_event(clock, n))
}

/// libeventd next to this program, built if missing.
fn libeventd() -> anyhow::Result<PathBuf> {
    let dir = std::env::current_exe()?
        .parent()
        .context("the directory of this program")?
        .to_path_buf();
    if !dir.join("libeventd.so").is_file() {
        let release = dir.file_name().is_some_and(|n| n == "release");
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo.args(["build", "-p", "libeventd"]);
        if release {
            cargo.arg("--release");
        }
        if !cargo.status()?.success() {
            bail!("cargo build -p libeventd failed");
        }
    }
    Ok(dir)
}

/// A "NAME WALL CPU" line of a client bench's output.
fn cost(out: &str, name: &str) -> anyhow::Result<Cost> {
    out.lines()
        .find_map(|l| {
            let mut words = l.strip_prefix(name)?.split_whitespace();
            Some(Cost {
                wall: words.next()?.parse().ok()?,
                cpu: words.next()?.parse().ok()?,
            })
        })
        .with_context(|| format!("no {name} in {out:?}"))
}

fn run_output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn c_bench(work: &Path, lib: &Path, daemon: &Daemon, n: u64) -> anyhow::Result<(Cost, Cost)> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let exe = work.join("clients-bench");
    run_output(
        Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(repo.join("perf/clients/bench.c"))
            .arg("-I")
            .arg(repo.join("clients/c/include"))
            .arg("-L")
            .arg(lib)
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-leventd"),
    )?;
    let mut ring = Vec::new();
    let mut sock = Vec::new();
    for _ in 0..3 {
        let out = run_output(
            Command::new(&exe)
                .arg(daemon.kmes())
                .arg(daemon.syslog_socket())
                .arg(n.to_string()),
        )?;
        ring.push(cost(&out, "eventd_emit")?);
        sock.push(cost(&out, "syslog")?);
    }
    Ok((median_of(&ring), median_of(&sock)))
}

fn python_bench(lib: &Path, daemon: &Daemon, n: u64) -> anyhow::Result<(Cost, Cost)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/bench.py");
    let mut ring = Vec::new();
    let mut sock = Vec::new();
    for _ in 0..3 {
        let out = run_output(
            Command::new("python3")
                .arg(&script)
                .arg(daemon.kmes())
                .arg(daemon.syslog_socket())
                .arg(n.to_string())
                .env("EVENTD_LIB", lib.join("libeventd.so")),
        )?;
        ring.push(cost(&out, "handler")?);
        sock.push(cost(&out, "syslog")?);
    }
    Ok((median_of(&ring), median_of(&sock)))
}

/// Runs the scenario; returns the machine-readable last line.
pub(crate) fn run(eventd: &Path, work: &Path, messages: u64) -> anyhow::Result<String> {
    let dir = work.join("clients");
    std::fs::create_dir_all(&dir)?;
    let daemon = Daemon::start(eventd, &dir.join("data"))?;
    let n = messages.max(1000);
    // Python is some hundred times slower per record: fewer records.
    let n_py = (n / 10).max(1000);
    let kmes = daemon.kmes();
    let raw = median(|| rust_raw(&kmes, n))?;
    let layer = median(|| rust_layer(&kmes, n))?;
    let fmt = median(|| rust_fmt_file(&dir, n))?;
    let syslog = median(|| rust_syslog(&daemon.syslog_socket(), n))?;
    let lib = libeventd()?;
    let (c_ring, c_sock) = c_bench(&dir, &lib, &daemon, n)?;
    let (py_ring, py_sock) = python_bench(&lib, &daemon, n_py)?;
    drop(daemon);

    println!(
        "per event, median of 3 runs, one thread ({n} events; Python {n_py}); CPU: the \
         emitting thread's own CPU time, wall: elapsed (eventd shares the CPUs)"
    );
    println!(
        "{:<58} {:>9} {:>10} {:>9} {:>10}",
        "path", "cpu ns", "vs eventd", "wall ns", "vs eventd"
    );
    let row = |name: &str, c: Cost, base: Cost| {
        println!(
            "{name:<58} {:>9.1} {:>9.1}x {:>9.1} {:>9.1}x",
            c.cpu,
            c.cpu / base.cpu,
            c.wall,
            c.wall / base.wall
        );
    };
    row(
        "Rust: raw Emitter::emit (fields formatted by hand)",
        raw,
        raw,
    );
    row(
        "Rust: tracing::info!, 3 fields, eventd-tracing layer",
        layer,
        layer,
    );
    row(
        "Rust: tracing::info!, 3 fields, fmt layer to a file",
        fmt,
        layer,
    );
    row(
        "Rust: the same as a syslog datagram to eventd's socket",
        syslog,
        layer,
    );
    row("C: eventd_emit, 3 fields as JSON", c_ring, c_ring);
    row("C: syslog(3)-style send to eventd's socket", c_sock, c_ring);
    row(
        "Python: logging + EventdHandler, 3 extra fields",
        py_ring,
        py_ring,
    );
    row(
        "Python: logging + SysLogHandler to eventd's socket",
        py_sock,
        py_ring,
    );
    println!(
        "goals (CPU): socket paths >= 10x the eventd path: Rust {:.1}x, C {:.1}x, Python {:.1}x; \
         layer within 3x of the raw Emitter: {:.2}x",
        syslog.cpu / layer.cpu,
        c_sock.cpu / c_ring.cpu,
        py_sock.cpu / py_ring.cpu,
        layer.cpu / raw.cpu
    );
    Ok(format!(
        "clients cpu_ns raw={:.1} layer={:.1} fmt_file={:.1} syslog={:.1} c={:.1} c_syslog={:.1} \
         py={:.1} py_syslog={:.1}",
        raw.cpu, layer.cpu, fmt.cpu, syslog.cpu, c_ring.cpu, c_sock.cpu, py_ring.cpu, py_sock.cpu
    ))
}
