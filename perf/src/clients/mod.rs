//! `eventd-perf clients`: what one event costs the program that emits it,
//! through each client eventd offers beside what that program would use
//! today, in one run against one running eventd (the binary, as a child):
//!
//! - Rust: `tracing::info!` with three fields through eventd-tracing's
//!   layer, through `tracing-subscriber`'s fmt layer writing to a file and
//!   sending each line as a syslog datagram to eventd's own socket (how a
//!   tracing program logs to syslog), and the same event as one datagram
//!   formatted by hand (what a `syslog(3)` binding does, no tracing); the
//!   raw `Emitter` the layer is judged against; and the `Producer` the
//!   clients write through, on one thread and shared by two threads on two
//!   CPUs (what sharing its counts and budget costs each thread), without
//!   and with a rate limit judged on every event.
//! - C: `eventd_emit` (JSON fields), `eventd_emit_kv` (key/value text:
//!   values the program holds as text, and numbers it formats with
//!   `snprintf` first, beside those `snprintf` calls alone) and
//!   `eventd_emit_fields` (typed fields) against a syslog(3)-style send
//!   (perf/clients/bench.c).
//! - LTTng-UST (perf/clients/lttng_bench.c): the raw emit's event as a
//!   recorded tracepoint, in a private session (see [`lttng`]): the peer
//!   the raw emit's goal was set by, measured in the same run.
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
//! published figure of another tool (an anchor), with the ratio. The raw
//! emit, the layer, tracing with a do-nothing layer, the Rust syslog
//! paths and LTTng run in rounds, one of each per round (see
//! [`Native`]); their goals are also read as
//! ratios to each other within a round, which this shared machine's
//! loaded moments move less than the figures themselves.
//!
//! Each run starts with eventd idle (see `Daemon::settle`) and on a CPU
//! that has been busy for a while, not one waking from idle (see
//! [`cost::busy_before`]), whatever the path and its language.
//!
//! Where valgrind is installed, the raw emit, the layer, tracing's floor,
//! `eventd_emit_kv`, `eventd_emit_fields` and LTTng's tracepoint are also
//! counted in instructions per event (see [`instructions`]): the figure
//! this machine's load does not move, and the per-event goals read in it.

mod c;
mod cost;
mod daemon;
mod instructions;
mod lttng;
mod python;
mod rust;

use c::{c_bench, libeventd};
use cost::{busy_before, median, median_of, ratio_median, Cost, BUSY_BEFORE_MS, RUNS};
use daemon::Daemon;
use instructions::valgrind_installed;
pub(crate) use instructions::{emit_loop, EmitLoopArgs};
use lttng::{lttng_installed, Lttng, LTTNG_PACKAGES};
use python::{python_bench, python_with_package};
use rust::{
    rust_fmt_file, rust_layer, rust_layer_floor, rust_producer_threads, rust_raw, rust_syslog,
    rust_tracing_syslog,
};
use std::path::{Path, PathBuf};

/// A published figure, the goal or a peer measured in this run,
/// that a path is read beside, ns.
struct Anchor<'a>(&'a str, f64);

const LTTNG: Anchor<'static> = Anchor("LTTng-UST tracepoint ~100 ns", 100.0);
const SPDLOG: Anchor<'static> = Anchor("spdlog front end ~150 ns", 150.0);
const GOAL_RAW: Anchor<'static> = Anchor("goal <= 100 ns", 100.0);
const GOAL_LAYER: Anchor<'static> = Anchor("goal <= 150 ns", 150.0);
const GOAL_KV: Anchor<'static> = Anchor("goal <= 150 ns", 150.0);
const GOAL_PY_EMIT: Anchor<'static> = Anchor("goal <= 1 us", 1000.0);
const PY_LOGGING: Anchor<'static> = Anchor("Python logging alone ~6.6 us", 6600.0);
const CTYPES_CALL: Anchor<'static> = Anchor("bare ctypes call ~0.4 us", 400.0);

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
    // The Rust paths and the LTTng peer in rounds, side by side (see
    // `Native`); the rest path by path.
    let lttng_session = if lttng_installed() {
        Some(Lttng::start()?)
    } else {
        None
    };
    let rounds = native_rounds(&daemon, lttng_session.as_ref(), n)?;
    let lib = libeventd()?;
    let counts = if valgrind_installed() {
        Some(instructions::count(
            &dir,
            &lib,
            &daemon,
            lttng_session.as_ref(),
        )?)
    } else {
        None
    };
    drop(lttng_session);
    let [raw, layer, layer_floor, syslog, tracing_syslog, producer, producer_shared, budget, budget_shared] =
        Native::EVERY_RUN.map(|p| rounds.median(p));
    let lttng = rounds
        .has(Native::Lttng)
        .then(|| rounds.median(Native::Lttng));
    let fmt = median(|| {
        daemon.settle();
        busy_before();
        rust_fmt_file(&dir, n)
    })?;
    let c = c_bench(&dir, &lib, &daemon, n)?;
    let python = native.clone().unwrap_or_else(|| PathBuf::from("python3"));
    let py = python_bench(&python, &lib, &daemon, n_py)?;
    drop(daemon);

    println!(
        "per event, median of {RUNS} runs, one thread ({n} events; Python {n_py}); CPU: the \
         emitting thread's own CPU time, wall: elapsed (eventd shares the CPUs); each run \
         starts on a CPU kept busy {BUSY_BEFORE_MS} ms"
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
    // The peer measured in this run, for the Rust and C paths.
    let peer = lttng.map(|c| Anchor("LTTng-UST tracepoint, this run", c.cpu));
    if let Some(peer) = &peer {
        row("", raw, Some(peer));
    }
    if let Some(lttng) = lttng {
        row(
            "C: LTTng-UST tracepoint, the same event (the peer)",
            lttng,
            Some(&LTTNG),
        );
    }
    row(
        "Rust: Producer::emit_items, the same fields, 1 thread",
        producer,
        None,
    );
    row(
        "Rust: the same, 2 threads on 2 CPUs sharing it (each)",
        producer_shared,
        None,
    );
    row(
        "Rust: Producer, 1 thread, a rate limit judged per event",
        budget,
        None,
    );
    row(
        "Rust: the same, 2 threads on 2 CPUs sharing it (each)",
        budget_shared,
        None,
    );
    row(
        "Rust: tracing::info!, 3 fields, eventd-tracing layer",
        layer,
        Some(&GOAL_LAYER),
    );
    row("", layer, Some(&SPDLOG));
    if let Some(peer) = &peer {
        row("", layer, Some(peer));
    }
    row(
        "Rust: tracing::info!, 3 fields, a do-nothing layer (floor)",
        layer_floor,
        None,
    );
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
    row(
        "Rust: tracing::info!, 3 fields, fmt layer to that socket",
        tracing_syslog,
        None,
    );
    row("C: eventd_emit, 3 fields as JSON", c.json, Some(&LTTNG));
    row(
        "C: eventd_emit_kv, 3 fields held as text",
        c.kv,
        Some(&GOAL_KV),
    );
    row("", c.kv, Some(&SPDLOG));
    if let Some(peer) = &peer {
        row("", c.kv, Some(peer));
    }
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
            rounds.ratio(Native::Syslog, Native::Raw),
            10.0,
        ),
        (
            "Rust syslog datagram / tracing layer >= 10x",
            rounds.ratio(Native::Syslog, Native::Layer),
            10.0,
        ),
        (
            "tracing to syslog (fmt layer) / tracing layer >= 10x",
            rounds.ratio(Native::TracingSyslog, Native::Layer),
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
        (
            "tracing layer / raw emit <= 3x",
            rounds.ratio(Native::Layer, Native::Raw),
            -3.0,
        ),
    ]
    .into_iter()
    .chain(lttng.into_iter().flat_map(|lt| {
        // The ns goals are LTTng parity (raw) and spdlog's front end, 1.5
        // times it (the layer, eventd_emit_kv): read here as ratios to the
        // peer on this machine in this run.
        [
            (
                "Rust raw emit / LTTng-UST (this run) <= 1x",
                rounds.ratio(Native::Raw, Native::Lttng),
                -1.0,
            ),
            (
                "tracing layer / LTTng-UST (this run) <= 1.5x",
                rounds.ratio(Native::Layer, Native::Lttng),
                -1.5,
            ),
            (
                "C eventd_emit_kv / LTTng-UST (this run) <= 1.5x",
                c.kv.cpu / lt.cpu,
                -1.5,
            ),
        ]
    })) {
        let met = if at_least > 0.0 {
            ratio >= at_least
        } else {
            ratio <= -at_least
        };
        println!("  {what:<54} {ratio:>9.2}x     {}", ok(met));
    }
    println!(
        "  {:<54} {:>9.1} ns",
        "tracing layer above the floor (layer - floor)",
        layer.cpu - layer_floor.cpu
    );
    for (what, a, b) in [
        (
            "a Producer shared by 2 threads / 1 thread (each event)",
            Native::ProducerShared,
            Native::Producer,
        ),
        (
            "the same with a rate limit judged per event",
            Native::ProducerBudgetShared,
            Native::ProducerBudget,
        ),
        (
            "2 threads, with a rate limit / without",
            Native::ProducerBudgetShared,
            Native::ProducerShared,
        ),
    ] {
        println!("  {what:<54} {:>9.2}x", rounds.ratio(a, b));
    }
    if lttng.is_none() {
        println!("  LTTng-UST not installed ({LTTNG_PACKAGES}): the ratios to it not measured");
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
    instructions::print(counts.as_ref());

    let mut last = format!(
        "clients cpu_ns raw={:.1} layer={:.1} fmt_file={:.1} syslog={:.1} c={:.1} c_kv={:.1} \
         c_kv_snprintf={:.1} c_snprintf={:.1} c_fields={:.1} c_syslog={:.1} py={:.1} \
         py_syslog={:.1} py_floor={:.1} py_ctypes_call={:.1} layer_floor={:.1} \
         tracing_syslog={:.1} producer={:.1} producer_2t={:.1} producer_budget={:.1} \
         producer_budget_2t={:.1}",
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
        py.ctypes_call.cpu,
        layer_floor.cpu,
        tracing_syslog.cpu,
        producer.cpu,
        producer_shared.cpu,
        budget.cpu,
        budget_shared.cpu
    );
    if let (Some(emit), Some(h)) = (py.emit, py.native_handler) {
        use std::fmt::Write;
        let _ = write!(last, " py_emit={:.1} py_handler={:.1}", emit.cpu, h.cpu);
    }
    if let Some(lt) = lttng {
        use std::fmt::Write;
        let _ = write!(last, " lttng={:.1}", lt.cpu);
    }
    Ok(last)
}

/// The paths measured in rounds: each round runs every one of them once
/// (in alternating order, eventd settled before each), so that a loaded
/// moment of this shared machine lands on all of them, and the goals read
/// as ratios take each ratio within a round.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Native {
    Raw,
    Layer,
    /// `tracing` with a layer that does nothing.
    LayerFloor,
    Syslog,
    /// `tracing` through the fmt layer, one syslog datagram per event.
    TracingSyslog,
    /// A `Producer` (the clients' front: counts, budget) on one thread.
    Producer,
    /// One `Producer` shared by two threads on two CPUs.
    ProducerShared,
    /// [`Native::Producer`] and [`Native::ProducerShared`] with a rate
    /// limit judged on every event (never reached).
    ProducerBudget,
    ProducerBudgetShared,
    Lttng,
}

impl Native {
    /// The paths every run has (LTTng only where it is installed).
    const EVERY_RUN: [Native; 9] = [
        Native::Raw,
        Native::Layer,
        Native::LayerFloor,
        Native::Syslog,
        Native::TracingSyslog,
        Native::Producer,
        Native::ProducerShared,
        Native::ProducerBudget,
        Native::ProducerBudgetShared,
    ];
}

/// The runs of each [`Native`] path, round by round.
struct Rounds {
    paths: Vec<Native>,
    runs: Vec<Vec<Cost>>,
}

impl Rounds {
    fn has(&self, path: Native) -> bool {
        self.paths.contains(&path)
    }

    fn runs(&self, path: Native) -> &[Cost] {
        self.paths
            .iter()
            .position(|p| *p == path)
            .map_or(&[], |i| &self.runs[i])
    }

    fn median(&self, path: Native) -> Cost {
        median_of(self.runs(path))
    }

    /// The median over rounds of `a`'s cost over `b`'s.
    fn ratio(&self, a: Native, b: Native) -> f64 {
        ratio_median(self.runs(a), self.runs(b))
    }
}

fn native_rounds(daemon: &Daemon, lttng: Option<&Lttng>, n: u64) -> anyhow::Result<Rounds> {
    let kmes = daemon.kmes();
    let mut paths = Native::EVERY_RUN.to_vec();
    if lttng.is_some() {
        paths.push(Native::Lttng);
    }
    use crate::runner;
    let runs = runner::interleave(&paths, RUNS, runner::Order::Alternate, |_, path| {
        daemon.settle();
        // In this thread: the paths that run in it. The producer's threads
        // and LTTng's program are busy before their own clocks.
        if !matches!(
            path,
            Native::Producer
                | Native::ProducerShared
                | Native::ProducerBudget
                | Native::ProducerBudgetShared
                | Native::Lttng
        ) {
            busy_before();
        }
        match (path, lttng) {
            (Native::Raw, _) => rust_raw(&kmes, n),
            (Native::Layer, _) => rust_layer(&kmes, n),
            (Native::LayerFloor, _) => rust_layer_floor(n),
            (Native::Syslog, _) => rust_syslog(&daemon.syslog_socket(), n),
            (Native::TracingSyslog, _) => rust_tracing_syslog(&daemon.syslog_socket(), n),
            (Native::Producer, _) => rust_producer_threads(&kmes, n, 1, false),
            (Native::ProducerShared, _) => rust_producer_threads(&kmes, n / 2, 2, false),
            (Native::ProducerBudget, _) => rust_producer_threads(&kmes, n, 1, true),
            (Native::ProducerBudgetShared, _) => rust_producer_threads(&kmes, n / 2, 2, true),
            (Native::Lttng, Some(lttng)) => lttng.run(n),
            (Native::Lttng, None) => anyhow::bail!("LTTng-UST is not set up"),
        }
    })?;
    Ok(Rounds { paths, runs })
}
