//! `eventd-perf clients`: what one event costs the program that emits it,
//! through each client eventd offers beside what that program would use
//! today, in one run against one running eventd (the binary, as a child):
//!
//! - Rust: `tracing::info!` with three fields through eventd-tracing's
//!   layer, through `tracing-subscriber`'s fmt layer writing to a file, and
//!   as a syslog datagram to eventd's own socket (what a `syslog(3)`
//!   binding does); and the raw `Emitter` the layer is judged against.
//! - C: `eventd_emit` (JSON fields), `eventd_emit_kv` (key/value text:
//!   values the program holds as text, and numbers it formats with
//!   `snprintf` first, beside those `snprintf` calls alone) and
//!   `eventd_emit_fields` (typed fields) against a syslog(3)-style send
//!   (perf/clients/bench.c).
//! - Python (perf/clients/bench.py): the native package's `eventd.emit` and
//!   `logging` + `eventd.Handler`, the ctypes module's `EventdHandler`,
//!   against `logging.handlers.SysLogHandler`, beside the floor (`logging`
//!   with a handler that does nothing) and a bare ctypes call. The native
//!   package is installed as a user gets it (a venv, `pip install
//!   ./clients/python`), once: the venv is kept under the work directory
//!   (or `$EVENTD_PERF_VENV`) and reused.
//!
//! Every figure is the median of three runs of `--messages` events (one
//! thread), in nanoseconds per event, printed beside the goal or a
//! published figure of another tool (an anchor), with the ratio.

use crate::runner;
use anyhow::{bail, Context};
use eventd::rings::{Emitter, Event, Field, Level, Value};
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

/// Runs of each measurement.
const RUNS: usize = 3;

/// Median of three runs of `f` (by CPU time, each figure its own median).
fn median(mut f: impl FnMut() -> anyhow::Result<Cost>) -> anyhow::Result<Cost> {
    let runs = runner::interleave(&[()], RUNS, runner::Order::Same, |_, _| f())?;
    let runs: Vec<Cost> = runs.into_iter().flatten().collect();
    Ok(median_of(&runs))
}

fn median_of(runs: &[Cost]) -> Cost {
    let mid = |v: Vec<f64>| runner::median(&v);
    Cost {
        wall: mid(runs.iter().map(|c| c.wall).collect()),
        cpu: mid(runs.iter().map(|c| c.cpu).collect()),
    }
}

fn rust_raw(kmes: &Path, n: u64) -> anyhow::Result<Cost> {
    let emitter = Emitter::open(kmes)?;
    let clock = start();
    for i in 0..n {
        let fields = [
            Field::new("order", Value::U64(i)),
            Field::new("amount", Value::F64(i as f64 * 0.5)),
            Field::new("paid", Value::Bool(i % 2 == 1)),
        ];
        let event = Event {
            ts_ns: eventd::rings::now_ns(),
            pid: 1,
            tid: 1,
            uid: 0,
            level: Level::Info,
            provider: "rust-bench",
            name: "bench",
            message: "order taken",
            fields: "",
        };
        let _ = emitter.emit_typed(&event, &fields);
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
            let mut words = l.split_whitespace();
            if words.next()? != name {
                return None;
            }
            Some(Cost {
                wall: words.next()?.parse().ok()?,
                cpu: words.next()?.parse().ok()?,
            })
        })
        .with_context(|| format!("no {name} in {out:?}"))
}

/// The medians of three runs of a bench program, by the names it prints.
fn medians(
    names: &[&str],
    mut run: impl FnMut() -> anyhow::Result<String>,
) -> anyhow::Result<Vec<Option<Cost>>> {
    let outs = runner::interleave(&[()], RUNS, runner::Order::Same, |_, _| run())?;
    let outs: Vec<String> = outs.into_iter().flatten().collect();
    Ok(names
        .iter()
        .map(|name| {
            let costs: Vec<Cost> = outs.iter().filter_map(|o| cost(o, name).ok()).collect();
            (costs.len() == RUNS).then(|| median_of(&costs))
        })
        .collect())
}

struct CCosts {
    json: Cost,
    /// `eventd_emit_kv` with values already text: the library's cost.
    kv: Cost,
    /// `eventd_emit_kv` after two `snprintf`s of the numbers, and those
    /// `snprintf`s alone: the caller's share.
    kv_snprintf: Cost,
    snprintf: Cost,
    fields: Cost,
    syslog: Cost,
}

fn c_bench(work: &Path, lib: &Path, daemon: &Daemon, n: u64) -> anyhow::Result<CCosts> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let exe = work.join("clients-bench");
    crate::syslog::run_cmd(
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
    let names = [
        "eventd_emit",
        "eventd_emit_kv",
        "eventd_emit_kv_snprintf",
        "snprintf",
        "eventd_emit_fields",
        "syslog",
    ];
    let got = medians(&names, || {
        crate::syslog::run_cmd(
            Command::new(&exe)
                .arg(daemon.kmes())
                .arg(daemon.syslog_socket())
                .arg(n.to_string()),
        )
    })?;
    let each = |i: usize| got[i].with_context(|| format!("no {} from {}", names[i], exe.display()));
    Ok(CCosts {
        json: each(0)?,
        kv: each(1)?,
        kv_snprintf: each(2)?,
        snprintf: each(3)?,
        fields: each(4)?,
        syslog: each(5)?,
    })
}

/// A Python with the native package (`import eventd`) installed from this
/// checkout the way a user installs it: a venv, `pip install
/// ./clients/python` (maturin from the configured package index). The venv
/// is reused when it already imports eventd; delete it to rebuild. None,
/// said on stderr with pip's words, when it cannot be built.
fn python_with_package(work: &Path) -> Option<PathBuf> {
    let venv = std::env::var_os("EVENTD_PERF_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| work.join("py-venv"));
    let python = venv.join("bin/python");
    let imports = |python: &Path| {
        Command::new(python)
            .args(["-c", "import eventd._native"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if imports(&python) {
        return Some(python);
    }
    eprintln!(
        "clients: installing the eventd Python package into {} (pip install ./clients/python; \
         maturin builds it, a few minutes once)",
        venv.display()
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let installed = (|| -> anyhow::Result<()> {
        if !python.is_file() {
            crate::syslog::run_cmd(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        }
        crate::syslog::run_cmd(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .arg(repo.join("clients/python")),
        )?;
        Ok(())
    })();
    match installed {
        Ok(()) if imports(&python) => Some(python),
        Ok(()) => {
            eprintln!("clients: the installed package does not import; the native Python paths are left out");
            None
        }
        Err(e) => {
            eprintln!(
                "clients: the eventd Python package could not be installed ({e:#}); the native \
                 Python paths (py_emit, py_handler) are left out, the ctypes ones measured with \
                 python3"
            );
            None
        }
    }
}

struct PyCosts {
    ctypes_handler: Cost,
    syslog: Cost,
    floor: Cost,
    ctypes_call: Cost,
    /// The native package's paths, when it is installed.
    emit: Option<Cost>,
    native_handler: Option<Cost>,
}

fn python_bench(python: &Path, lib: &Path, daemon: &Daemon, n: u64) -> anyhow::Result<PyCosts> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/bench.py");
    let names = [
        "ctypes_handler",
        "syslog",
        "floor",
        "ctypes_call",
        "emit",
        "native_handler",
    ];
    let got = medians(&names, || {
        crate::syslog::run_cmd(
            Command::new(python)
                .arg(&script)
                .arg(daemon.kmes())
                .arg(daemon.syslog_socket())
                .arg(n.to_string())
                .env("EVENTD_LIB", lib.join("libeventd.so")),
        )
    })?;
    let each =
        |i: usize| got[i].with_context(|| format!("no {} from {}", names[i], script.display()));
    Ok(PyCosts {
        ctypes_handler: each(0)?,
        syslog: each(1)?,
        floor: each(2)?,
        ctypes_call: each(3)?,
        emit: got[4],
        native_handler: got[5],
    })
}

/// A published figure (or the goal) a path is read beside, ns.
struct Anchor(&'static str, f64);

const LTTNG: Anchor = Anchor("LTTng-UST tracepoint ~100 ns", 100.0);
const SPDLOG: Anchor = Anchor("spdlog front end ~150 ns", 150.0);
const GOAL_RAW: Anchor = Anchor("goal <= 100 ns", 100.0);
const GOAL_LAYER: Anchor = Anchor("goal <= 150 ns", 150.0);
const GOAL_KV: Anchor = Anchor("goal <= 150 ns", 150.0);
const GOAL_PY_EMIT: Anchor = Anchor("goal <= 1 us", 1000.0);
const PY_LOGGING: Anchor = Anchor("Python logging alone ~6.6 us", 6600.0);
const CTYPES_CALL: Anchor = Anchor("bare ctypes call ~0.4 us", 400.0);

/// The clients scenario's options.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    output: crate::cli::Output,
    #[command(flatten)]
    binary: crate::cli::Binary,
    /// Events each client emits per run.
    #[arg(long, default_value_t = 1_000_000)]
    messages: u64,
}

pub(crate) fn main(args: &Args) -> anyhow::Result<String> {
    run(&args.binary.path()?, &args.output.work()?, args.messages)
}

/// Runs the scenario; returns the machine-readable last line.
pub(crate) fn run(eventd: &Path, work: &Path, messages: u64) -> anyhow::Result<String> {
    let dir = work.join("clients");
    std::fs::create_dir_all(&dir)?;
    // Before the daemon starts: the first install takes minutes.
    let native = python_with_package(work);
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
    let c = c_bench(&dir, &lib, &daemon, n)?;
    let python = native.clone().unwrap_or_else(|| PathBuf::from("python3"));
    let py = python_bench(&python, &lib, &daemon, n_py)?;
    drop(daemon);

    println!(
        "per event, median of 3 runs, one thread ({n} events; Python {n_py}); CPU: the \
         emitting thread's own CPU time, wall: elapsed (eventd shares the CPUs)"
    );
    println!(
        "{:<56} {:>9} {:>9}  {:<30} {:>8}",
        "path", "cpu ns", "wall ns", "anchor (CPU)", "vs it"
    );
    let row = |name: &str, c: Cost, anchor: Option<&Anchor>| {
        let (label, ratio) = match anchor {
            Some(Anchor(label, ns)) => (*label, format!("{:.2}x", c.cpu / ns)),
            None => ("", String::new()),
        };
        println!(
            "{name:<56} {:>9.1} {:>9.1}  {label:<30} {ratio:>8}",
            c.cpu, c.wall
        );
    };
    row(
        "Rust: raw Emitter::emit, 3 typed fields",
        raw,
        Some(&GOAL_RAW),
    );
    row("", raw, Some(&LTTNG));
    row(
        "Rust: tracing::info!, 3 fields, eventd-tracing layer",
        layer,
        Some(&GOAL_LAYER),
    );
    row("", layer, Some(&SPDLOG));
    row(
        "Rust: tracing::info!, 3 fields, fmt layer to a file",
        fmt,
        None,
    );
    row(
        "Rust: the same as a syslog datagram to eventd's socket",
        syslog,
        None,
    );
    row("C: eventd_emit, 3 fields as JSON", c.json, Some(&LTTNG));
    row(
        "C: eventd_emit_kv, 3 fields held as text",
        c.kv,
        Some(&GOAL_KV),
    );
    row("", c.kv, Some(&SPDLOG));
    row(
        "C: eventd_emit_kv after snprintf of the 2 numbers",
        c.kv_snprintf,
        None,
    );
    row(
        "C: those 2 snprintf calls alone (the caller's)",
        c.snprintf,
        None,
    );
    row(
        "C: eventd_emit_fields, 3 typed fields",
        c.fields,
        Some(&GOAL_KV),
    );
    row("C: syslog(3)-style send to eventd's socket", c.syslog, None);
    if let Some(emit) = py.emit {
        row(
            "Python: eventd.emit, 3 typed fields",
            emit,
            Some(&GOAL_PY_EMIT),
        );
        row("", emit, Some(&CTYPES_CALL));
    }
    if let Some(h) = py.native_handler {
        row(
            "Python: logging + eventd.Handler, 3 extra fields",
            h,
            Some(&PY_LOGGING),
        );
    }
    row(
        "Python: logging + EventdHandler (ctypes), 3 extra fields",
        py.ctypes_handler,
        Some(&PY_LOGGING),
    );
    row(
        "Python: logging + a do-nothing handler (the floor)",
        py.floor,
        Some(&PY_LOGGING),
    );
    row(
        "Python: logging + SysLogHandler to eventd's socket",
        py.syslog,
        Some(&PY_LOGGING),
    );
    row(
        "Python: a bare ctypes call (eventd_version)",
        py.ctypes_call,
        Some(&CTYPES_CALL),
    );
    println!(
        "front ends (the caller's cost; formatting left to a background thread): Quill/fmtlog \
         ~8 ns, NanoLog ~13 ns, spdlog ~150 ns; Rust raw is {:.1}x fmtlog, {:.1}x NanoLog, \
         {:.2}x spdlog; C eventd_emit_kv {:.1}x fmtlog, {:.1}x NanoLog, {:.2}x spdlog",
        raw.cpu / 8.0,
        raw.cpu / 13.0,
        raw.cpu / 150.0,
        c.kv.cpu / 8.0,
        c.kv.cpu / 13.0,
        c.kv.cpu / 150.0
    );
    let ok = |met: bool| if met { "met" } else { "NOT met" };
    let cheaper = |socket: Cost, path: Cost| socket.cpu / path.cpu;
    println!("goals (CPU, this run):");
    for (what, got, met) in [
        ("Rust raw emit <= 100 ns", raw.cpu, raw.cpu <= 100.0),
        ("tracing layer <= 150 ns", layer.cpu, layer.cpu <= 150.0),
        ("C eventd_emit_kv <= 150 ns", c.kv.cpu, c.kv.cpu <= 150.0),
    ] {
        println!("  {what:<54} {got:>9.1} ns  {}", ok(met));
    }
    for (what, ratio, at_least) in [
        (
            "Rust syslog datagram / raw emit >= 10x",
            cheaper(syslog, raw),
            10.0,
        ),
        (
            "Rust syslog datagram / tracing layer >= 10x",
            cheaper(syslog, layer),
            10.0,
        ),
        (
            "C syslog send / eventd_emit_kv >= 10x",
            cheaper(c.syslog, c.kv),
            10.0,
        ),
        (
            "C syslog send / eventd_emit_fields >= 10x",
            cheaper(c.syslog, c.fields),
            10.0,
        ),
        ("tracing layer / raw emit <= 3x", layer.cpu / raw.cpu, -3.0),
    ] {
        let met = if at_least > 0.0 {
            ratio >= at_least
        } else {
            ratio <= -at_least
        };
        println!("  {what:<54} {ratio:>9.2}x     {}", ok(met));
    }
    match (py.emit, py.native_handler) {
        (Some(emit), Some(h)) => {
            println!(
                "  {:<54} {:>9.1} ns  {}",
                "Python eventd.emit <= 1 us",
                emit.cpu,
                ok(emit.cpu <= 1000.0)
            );
            for (what, ratio, at_least) in [
                (
                    "SysLogHandler / eventd.emit >= 10x",
                    cheaper(py.syslog, emit),
                    10.0,
                ),
                (
                    "SysLogHandler / logging + eventd.Handler >= 1.5x",
                    cheaper(py.syslog, h),
                    1.5,
                ),
            ] {
                println!("  {what:<54} {ratio:>9.2}x     {}", ok(ratio >= at_least));
            }
            println!(
                "  {:<54} {:>9.1} ns",
                "eventd.Handler above the floor (handler - floor)",
                h.cpu - py.floor.cpu
            );
        }
        _ => println!("  Python native package: not installed, its goals not measured"),
    }
    println!(
        "  {:<54} {:>9.2}x",
        "SysLogHandler / EventdHandler (ctypes)",
        cheaper(py.syslog, py.ctypes_handler)
    );
    // The C paths whose caller formats its numbers first: no goal (a C
    // program after 10x has eventd_emit_fields), the ratio said all the same.
    for (what, path) in [
        (
            "C syslog send / eventd_emit_kv after snprintf",
            c.kv_snprintf,
        ),
        ("C syslog send / eventd_emit (JSON by snprintf)", c.json),
    ] {
        println!("  {what:<54} {:>9.2}x", cheaper(c.syslog, path));
    }

    let mut last = format!(
        "clients cpu_ns raw={:.1} layer={:.1} fmt_file={:.1} syslog={:.1} c={:.1} c_kv={:.1} \
         c_kv_snprintf={:.1} c_snprintf={:.1} c_fields={:.1} c_syslog={:.1} py={:.1} \
         py_syslog={:.1} py_floor={:.1} py_ctypes_call={:.1}",
        raw.cpu,
        layer.cpu,
        fmt.cpu,
        syslog.cpu,
        c.json.cpu,
        c.kv.cpu,
        c.kv_snprintf.cpu,
        c.snprintf.cpu,
        c.fields.cpu,
        c.syslog.cpu,
        py.ctypes_handler.cpu,
        py.syslog.cpu,
        py.floor.cpu,
        py.ctypes_call.cpu
    );
    if let (Some(emit), Some(h)) = (py.emit, py.native_handler) {
        use std::fmt::Write;
        let _ = write!(last, " py_emit={:.1} py_handler={:.1}", emit.cpu, h.cpu);
    }
    Ok(last)
}
