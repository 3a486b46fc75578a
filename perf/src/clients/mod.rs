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
//! Every figure is the median of five runs of `--messages` events (one
//! thread, after a quarter as many untimed: see [`warm`]), in nanoseconds
//! per event, printed beside the goal or a
//! published figure of another tool (an anchor), with the ratio.

mod c;
mod cost;
mod daemon;
mod python;
mod rust;

use c::{c_bench, libeventd};
use cost::{median, Cost, RUNS};
use daemon::Daemon;
use python::{python_bench, python_with_package};
use rust::{rust_fmt_file, rust_layer, rust_raw, rust_syslog};
use std::path::{Path, PathBuf};

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
    // Each run starts with eventd idle (see `Daemon::settle`).
    let settled = |run: &dyn Fn() -> anyhow::Result<Cost>| {
        median(|| {
            daemon.settle();
            run()
        })
    };
    let raw = settled(&|| rust_raw(&kmes, n))?;
    let layer = settled(&|| rust_layer(&kmes, n))?;
    let fmt = settled(&|| rust_fmt_file(&dir, n))?;
    let syslog = settled(&|| rust_syslog(&daemon.syslog_socket(), n))?;
    let lib = libeventd()?;
    let c = c_bench(&dir, &lib, &daemon, n)?;
    let python = native.clone().unwrap_or_else(|| PathBuf::from("python3"));
    let py = python_bench(&python, &lib, &daemon, n_py)?;
    drop(daemon);

    println!(
        "per event, median of {RUNS} runs, one thread ({n} events; Python {n_py}); CPU: the \
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
