//! Instructions per event, counted by callgrind (valgrind's tool): the one
//! measure of a client's cost that does not move with this shared
//! machine's load, its other tenants or its clock speed. The CPU times are
//! what a program pays here and now; the counts say whether a change made
//! the path shorter, and how it stands against LTTng-UST's tracepoint
//! (the raw emit's goal was set by it) on any machine.
//!
//! Each path runs twice under callgrind, emitting [`FEW`] and [`MANY`]
//! events into the harness's eventd: the difference in instructions over
//! the difference in events is one event's share, start-up, the rings'
//! opening and exit left out. Only user-space instructions are counted:
//! under valgrind the clock is read with a system call (valgrind keeps the
//! vDSO from the program) on every side alike, and the kernel's part of
//! that call, like any other, is not counted.

use super::c::build_with_libeventd;
use super::cost::warm;
use super::daemon::Daemon;
use super::lttng::Lttng;
use anyhow::{bail, Context};
use std::path::Path;
use std::process::{Command, Stdio};

/// What to install when valgrind is missing.
pub(super) const VALGRIND_PACKAGE: &str = "apt-get install valgrind";

/// The events of a path's two counted runs (before the Rust and LTTng
/// paths' quarter of untimed ones).
const FEW: u64 = 8_000;
const MANY: u64 = 40_000;

/// callgrind, its profile thrown away: the total goes to stderr.
const CALLGRIND: [&str; 2] = ["--tool=callgrind", "--callgrind-out-file=/dev/null"];

/// Whether valgrind is on the PATH.
pub(super) fn valgrind_installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join("valgrind").is_file()))
}

/// Instructions per event of each path counted.
pub(super) struct Instructions {
    raw: f64,
    layer: f64,
    layer_floor: f64,
    c_kv: f64,
    c_fields: f64,
    lttng: Option<f64>,
}

/// Prints the counts, each beside LTTng-UST's, and the per-event goals
/// read in them (LTTng parity for the raw emit, 1.5 times it for the layer
/// and `eventd_emit_kv`, as the CPU goals are read in `clients`).
pub(super) fn print(counts: Option<&Instructions>) {
    let Some(counts) = counts else {
        println!(
            "instructions per event: valgrind not installed ({VALGRIND_PACKAGE}), not counted"
        );
        return;
    };
    println!(
        "instructions per event (callgrind, user space; the clock's system call is counted on \
         no side):"
    );
    for (what, n) in [
        ("Rust: raw Emitter::emit, 3 typed fields", counts.raw),
        ("Rust: tracing::info! through eventd's layer", counts.layer),
        (
            "Rust: tracing with a do-nothing layer (the floor)",
            counts.layer_floor,
        ),
        ("C: eventd_emit_kv (values text already)", counts.c_kv),
        ("C: eventd_emit_fields (typed)", counts.c_fields),
    ] {
        match counts.lttng {
            Some(lt) => println!("  {what:<54} {n:>9.0}  vs LTTng-UST {:>6.2}x", n / lt),
            None => println!("  {what:<54} {n:>9.0}"),
        }
    }
    let Some(lt) = counts.lttng else {
        println!("  LTTng-UST not installed: the goals in instructions not read");
        return;
    };
    println!("  {:<54} {lt:>9.0}", "LTTng-UST tracepoint, the same event");
    println!("goals (instructions, the same on any machine):");
    for (what, n, at_most) in [
        ("Rust raw emit / LTTng-UST <= 1x", counts.raw, 1.0),
        ("tracing layer / LTTng-UST <= 1.5x", counts.layer, 1.5),
        ("C eventd_emit_kv / LTTng-UST <= 1.5x", counts.c_kv, 1.5),
    ] {
        let ratio = n / lt;
        let met = if ratio <= at_most { "met" } else { "NOT met" };
        println!("  {what:<54} {ratio:>9.2}x     {met}");
    }
}

/// The Rust paths `emit-loop` runs (see [`emit_loop`]).
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum RustPath {
    Raw,
    Layer,
    LayerFloor,
}

/// `eventd-perf emit-loop`'s options (an internal command: the Rust paths
/// as a program of their own, for callgrind).
#[derive(clap::Args)]
pub(crate) struct EmitLoopArgs {
    #[arg(long, value_enum)]
    path: RustPath,
    /// The rings' directory (DATA_DIR/kmes).
    #[arg(long)]
    kmes: std::path::PathBuf,
    /// Events after the quarter as many untimed.
    #[arg(long)]
    events: u64,
}

/// Runs one Rust path as `clients` does (its untimed quarter, then
/// `events`), its timing not printed: callgrind is counting.
pub(crate) fn emit_loop(args: &EmitLoopArgs) -> anyhow::Result<()> {
    match args.path {
        RustPath::Raw => super::rust::rust_raw(&args.kmes, args.events)?,
        RustPath::Layer => super::rust::rust_layer(&args.kmes, args.events)?,
        RustPath::LayerFloor => super::rust::rust_layer_floor(args.events)?,
    };
    Ok(())
}

/// Counts every path against `daemon` (eventd idle before each run);
/// LTTng's in its session when there is one. `work` takes the C program.
pub(super) fn count(
    work: &Path,
    lib: &Path,
    daemon: &Daemon,
    lttng: Option<&Lttng>,
) -> anyhow::Result<Instructions> {
    let kmes = daemon.kmes();
    let this = std::env::current_exe()?;
    let rust = |path: &str| {
        per_event(
            |n| {
                daemon.settle();
                counted(
                    callgrind(&this)
                        .args(["emit-loop", "--path", path, "--kmes"])
                        .arg(&kmes)
                        .args(["--events", &n.to_string()]),
                )
            },
            |n| n + warm(n),
        )
        .with_context(|| format!("counting the Rust {path} path"))
    };
    let exe = work.join("clients-count");
    build_with_libeventd("perf/clients/count.c", &exe, lib)?;
    let c = |path: &str| {
        per_event(
            |n| {
                daemon.settle();
                counted(callgrind(&exe).arg(&kmes).args([path, &n.to_string()]))
            },
            |n| n,
        )
        .with_context(|| format!("counting the C {path} path"))
    };
    let lttng = match lttng {
        Some(lt) => Some(
            per_event(
                |n| {
                    daemon.settle();
                    counted(&mut lt.under_valgrind(&CALLGRIND, n))
                },
                |n| n + warm(n),
            )
            .context("counting the LTTng-UST tracepoint")?,
        ),
        None => None,
    };
    Ok(Instructions {
        raw: rust("raw")?,
        layer: rust("layer")?,
        layer_floor: rust("layer-floor")?,
        c_kv: c("kv")?,
        c_fields: c("fields")?,
        lttng,
    })
}

/// `program` under callgrind (its arguments to follow).
fn callgrind(program: &Path) -> Command {
    let mut cmd = Command::new("valgrind");
    cmd.args(CALLGRIND).arg(program);
    cmd
}

/// One event's instructions: `run(n)` counts a program that emits
/// `events(n)` events, run for [`FEW`] and [`MANY`].
fn per_event(
    run: impl Fn(u64) -> anyhow::Result<u64>,
    events: impl Fn(u64) -> u64,
) -> anyhow::Result<f64> {
    let (few, many) = (run(FEW)?, run(MANY)?);
    let more = events(MANY) - events(FEW);
    if many <= few {
        bail!("{many} instructions for {MANY} events, {few} for {FEW}: no cost per event");
    }
    Ok((many - few) as f64 / more as f64)
}

/// Runs `cmd` (valgrind with [`CALLGRIND`] in front of a program) and
/// returns the instructions callgrind counted.
fn counted(cmd: &mut Command) -> anyhow::Result<u64> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .context("running valgrind")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("{cmd:?} failed ({}): {stderr}", out.status);
    }
    refs(&stderr).with_context(|| format!("no instruction count from {cmd:?} in {stderr}"))
}

/// The total in callgrind's summary line (`==PID== I   refs:  1,234,567`).
fn refs(stderr: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.contains(" refs:"))?;
    let digits: String = line
        .rsplit("refs:")
        .next()?
        .chars()
        .filter(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::refs;

    #[test]
    fn the_summary_line_gives_the_total() {
        let stderr = "==25423== Command: ./lttng_bench 10000\n==25423== \n\
                      ==25423== Events    : Ir\n==25423== Collected : 17407321\n\
                      ==25423== \n==25423== I   refs:      17,407,321\n";
        assert_eq!(refs(stderr), Some(17_407_321));
        assert_eq!(refs("==1== Command: x\n"), None);
    }
}
