//! What a run measures (wall and CPU time per event) and how runs make
//! one figure.

use crate::runner;
use anyhow::Context;
use std::time::Instant;

/// Wall and CPU time (this thread's) per event, ns.
#[derive(Clone, Copy)]
pub(super) struct Cost {
    pub(super) wall: f64,
    pub(super) cpu: f64,
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

pub(super) struct Clock(Instant, f64);

pub(super) fn start() -> Clock {
    Clock(Instant::now(), thread_cpu_ns())
}

pub(super) fn per_event(clock: Clock, n: u64) -> Cost {
    Cost {
        wall: clock.0.elapsed().as_nanos() as f64 / n as f64,
        cpu: (thread_cpu_ns() - clock.1) / n as f64,
    }
}

/// Runs of each measurement. Each is short (tens of milliseconds for the
/// native paths): five keep one burst of another tenant's load on this
/// shared machine, which can span two runs, out of the median.
pub(super) const RUNS: usize = 5;

/// Median of [`RUNS`] runs of `f` (by CPU time, each figure its own median).
pub(super) fn median(mut f: impl FnMut() -> anyhow::Result<Cost>) -> anyhow::Result<Cost> {
    let runs = runner::interleave(&[()], RUNS, runner::Order::Same, |_, _| f())?;
    let runs: Vec<Cost> = runs.into_iter().flatten().collect();
    Ok(median_of(&runs))
}

pub(super) fn median_of(runs: &[Cost]) -> Cost {
    let mid = |v: Vec<f64>| runner::median(&v);
    Cost {
        wall: mid(runs.iter().map(|c| c.wall).collect()),
        cpu: mid(runs.iter().map(|c| c.cpu).collect()),
    }
}

/// The median over rounds of `a`'s CPU time over `b`'s in the same round
/// (runs of two paths taken side by side, so a round that caught a loaded
/// moment moves both sides of its ratio).
pub(super) fn ratio_median(a: &[Cost], b: &[Cost]) -> f64 {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a.cpu / b.cpu).collect();
    runner::median(&ratios)
}

/// How long each run keeps its CPU busy, emitting nothing, before its
/// untimed events: [`busy_before`]. The C, LTTng and Python bench programs
/// are given the same (their BUSY_MS argument).
pub(super) const BUSY_BEFORE_MS: u64 = 200;

/// Spins on the clock for [`BUSY_BEFORE_MS`]. On this machine (a VM) a
/// CPU back from being idle runs slow for a while: the harness lets eventd
/// settle before every run, so every run would start on an idle CPU, and
/// a loop of adds with no memory, no system call and nothing of eventd's
/// took 1.3-1.8 times as long right after a 0.8 s pause as after 0.2 s of
/// spinning (perf/runs/notebook.md, 2026-12-07). A program that emits
/// hundreds of thousands of events is busy, not waking: each run, of
/// every path alike, starts busy.
pub(super) fn busy_before() {
    let start = Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(BUSY_BEFORE_MS) {
        std::hint::spin_loop();
    }
}

/// Events each run emits before its clock starts: a quarter of the timed
/// ones. A program opens and maps the rings once (and touches each of
/// their pages once) however many events it emits: the figures are what
/// each event costs after that, the way other tools' per-event figures
/// are given.
pub(super) fn warm(n: u64) -> u64 {
    n / 4
}

/// A "NAME WALL CPU" line of a client bench's output.
pub(super) fn cost(out: &str, name: &str) -> anyhow::Result<Cost> {
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

/// The medians of [`RUNS`] runs of a bench program, by the names it prints.
pub(super) fn medians(
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
