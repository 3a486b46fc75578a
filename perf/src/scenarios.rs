//! The scenarios' bodies: the sweep scenarios (their points, the rounds,
//! the report), and the pragmas, query and syslog measurements, each with
//! its options. `main.rs` parses the subcommand and picks one.

use crate::cli::{Binary, Common, EventBytes, Output, System};
use crate::load::{Mode, Sizes};
use crate::pipeline::{self, Knobs, Outcome};
use crate::{ceiling, querybench, report, runner, syslog};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The options of the sweep scenarios (quick, baseline, shards, batch,
/// stripe, channel, all).
#[derive(clap::Args)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    system: System,
    /// Seconds of load per point (default: quick 3, baseline 30, sweeps 10).
    #[arg(long)]
    duration: Option<f64>,
    #[command(flatten)]
    bytes: EventBytes,
    /// A fixed total rate in events/s instead of flat out.
    #[arg(long)]
    rate: Option<u64>,
}

/// A sweep scenario: its points are a list of knobs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    Quick,
    Baseline,
    Shards,
    Batch,
    Stripe,
    Channel,
}

impl Sweep {
    fn name(self) -> &'static str {
        match self {
            Sweep::Quick => "quick",
            Sweep::Baseline => "baseline",
            Sweep::Shards => "shards",
            Sweep::Batch => "batch",
            Sweep::Stripe => "stripe",
            Sweep::Channel => "channel",
        }
    }

    /// Seconds of load per point without `--duration`.
    fn default_secs(self) -> f64 {
        match self {
            Sweep::Quick => 3.0,
            Sweep::Baseline => 30.0,
            _ => 10.0,
        }
    }
}

/// Baseline and every sweep, then the pragmas; returns the last sweep's
/// summary line.
pub(crate) fn run_all(args: &SweepArgs) -> anyhow::Result<String> {
    let mut last = String::new();
    for sweep in [
        Sweep::Baseline,
        Sweep::Shards,
        Sweep::Batch,
        Sweep::Stripe,
        Sweep::Channel,
    ] {
        last = run_sweep(sweep, args)?;
    }
    run_pragmas(&PragmasArgs {
        output: args.common.output.clone(),
        bytes: args.bytes.clone(),
    })?;
    Ok(last)
}

/// Runs one sweep's points; prints the table; writes JSON and SVG;
/// returns the machine-readable summary line.
pub(crate) fn run_sweep(scenario: Sweep, args: &SweepArgs) -> anyhow::Result<String> {
    let work = args.common.output.work()?;
    let setup = &args.system.setup()?;
    let sizes = args.bytes.sizes()?;
    let duration = Duration::from_secs_f64(args.duration.unwrap_or(scenario.default_secs()));
    let mode = args.rate.map_or(Mode::FlatOut, Mode::Rate);
    let d = Knobs::defaults();
    let points = points_of(scenario);
    let progress = indicatif::ProgressBar::new_spinner();
    progress.enable_steady_tick(Duration::from_millis(200));
    let run = |label: &str, knobs: Knobs, mode: Mode, with_ceiling: bool| {
        let point = pipeline::Point {
            label,
            knobs,
            mode,
            sizes,
            duration,
            with_ceiling,
            export: None,
        };
        pipeline::run(&work, setup, &point, &progress)
    };
    let (mut outcomes, all_runs) =
        run_rounds(&points, args.common.repeat, &progress, |label, knobs| {
            run(label, knobs, mode, true)
        })?;
    let mut extra_line = None;
    if scenario == Sweep::Baseline && mode == Mode::FlatOut {
        // Latency at half the flat-out rate.
        let half = ((outcomes[0].events_per_s / 2.0) as u64).max(1);
        let o = run("half-rate", d, Mode::Rate(half), false)?;
        progress.suspend(|| {
            eprintln!(
                "half rate ({half}/s): p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs, lost {}",
                o.latency_us_p50, o.latency_us_p99, o.latency_us_p999, o.latency_us_max, o.lost
            )
        });
        extra_line = Some(format!(
            "half_rate_events_per_s={half} half_rate_p99_us={} half_rate_lost={}",
            o.latency_us_p99, o.lost
        ));
        outcomes.push(o);
    }
    progress.finish_and_clear();
    let headline = outcomes
        .iter()
        .find(|o| o.knobs == d && o.mode == mode)
        .or_else(|| {
            outcomes
                .iter()
                .max_by(|a, b| a.ratio_to_ceiling.total_cmp(&b.ratio_to_ceiling))
        })
        .context("no point was measured")?;
    write_report(
        scenario,
        &args.common.output.results,
        sizes,
        duration,
        mode,
        &outcomes,
        &all_runs,
        headline,
    )?;
    if let Some(line) = extra_line {
        println!("{line}");
    }
    Ok(report::summary_line(headline))
}

/// The labelled knobs a sweep scenario measures.
fn points_of(scenario: Sweep) -> Vec<(String, Knobs)> {
    let cpus = eventd::rings::online_cpus().len() as i64;
    let d = Knobs::defaults();
    match scenario {
        Sweep::Quick | Sweep::Baseline => vec![("defaults".into(), d)],
        Sweep::Shards => {
            let mut counts = vec![1, cpus, 2 * cpus, 16, 256];
            counts.sort_unstable();
            counts.dedup();
            counts
                .into_iter()
                .map(|s| {
                    (
                        format!("S={s}"),
                        Knobs {
                            storage_shards: s,
                            ..d
                        },
                    )
                })
                .collect()
        }
        Sweep::Batch => [64, 256, 1024, 4096, 16384]
            .into_iter()
            .map(|b| (format!("batch={b}"), Knobs { max_batch: b, ..d }))
            .collect(),
        Sweep::Stripe => [1, 16, 64, 256, 1024, 4096]
            .into_iter()
            .map(|l| {
                (
                    format!("L={l}"),
                    Knobs {
                        stripe_len: l,
                        storage_shards: 2 * cpus,
                        ..d
                    },
                )
            })
            .collect(),
        Sweep::Channel => [
            (0, 0),
            (64, 64 << 10),
            (256, 256 << 10),
            (1024, 1 << 20),
            (4096, 4 << 20),
            (4096, 16 << 20),
            (16384, 16 << 20),
        ]
        .into_iter()
        .map(|(slots, bytes)| {
            let label = if slots == 0 {
                "auto".to_string()
            } else {
                format!("{slots}/{}K", bytes >> 10)
            };
            (
                label,
                Knobs {
                    channel_slots: slots,
                    channel_bytes: bytes,
                    ..d
                },
            )
        })
        .collect(),
    }
}

/// Runs every point `repeat` times, the whole list again each round (A B
/// C A B C ...), so slow drifts of a shared machine spread over every
/// point; each point then reports its run with the median ratio. Returns
/// those and every run.
fn run_rounds(
    points: &[(String, Knobs)],
    repeat: usize,
    progress: &indicatif::ProgressBar,
    mut run: impl FnMut(&str, Knobs) -> anyhow::Result<Outcome>,
) -> anyhow::Result<(Vec<Outcome>, Vec<Outcome>)> {
    let order = runner::Order::Same;
    let runs = runner::interleave(points, repeat, order, |round, (label, knobs)| {
        let o = run(label, *knobs)?;
        progress.suspend(|| {
            eprintln!(
                "{label} (round {round}): {:.0} events/s, ceiling {:.0}, ratio {:.2}, lost {}, \
                 p99 {} µs",
                o.events_per_s, o.ceiling_per_s, o.ratio_to_ceiling, o.lost, o.latency_us_p99
            )
        });
        Ok(o)
    })?;
    let all_runs: Vec<Outcome> = runs.iter().flatten().cloned().collect();
    let medians = runs
        .into_iter()
        .filter_map(|r| runner::median_by(r, |o| o.ratio_to_ceiling))
        .collect();
    Ok((medians, all_runs))
}

/// Prints the scenario's table and writes its JSON report and SVG chart.
#[allow(clippy::too_many_arguments)]
fn write_report(
    scenario: Sweep,
    results: &Path,
    sizes: Sizes,
    duration: Duration,
    mode: Mode,
    outcomes: &[Outcome],
    all_runs: &[Outcome],
    headline: &Outcome,
) -> anyhow::Result<()> {
    let name = scenario.name();
    let machine = runner::Machine::describe();
    println!(
        "\n## {name} ({} CPUs, {}; load {:.0} s per point, message {}-{} bytes, {})\n",
        machine.cpus,
        machine.model,
        duration.as_secs_f64(),
        sizes.min,
        sizes.max,
        match mode {
            Mode::FlatOut => "flat out".to_string(),
            Mode::Rate(r) => format!("{r} events/s"),
        }
    );
    print!("{}", report::table(outcomes));
    let body = report::Report {
        points: outcomes,
        runs: all_runs,
        headline,
    };
    let json = runner::write_report(results, name, &body)?;
    let svg = results.join(format!("{name}.svg"));
    report::chart(name, outcomes).write_svg(&svg)?;
    println!("\nreport: {}  chart: {}", json.display(), svg.display());
    Ok(())
}

/// The pragmas scenario's options.
#[derive(clap::Args)]
pub(crate) struct PragmasArgs {
    #[command(flatten)]
    output: Output,
    #[command(flatten)]
    bytes: EventBytes,
}

/// The variants of `pragmas`: a name and the statements that make it
/// from the shipped settings. A new database's page size changes through
/// a VACUUM outside WAL mode; each variant keeps the shipped ~4 MB of WAL
/// between checkpoints.
const PRAGMA_VARIANTS: [(&str, &[&str]); 9] = [
    (
        "shipped (32 KiB pages, WAL, synchronous=NORMAL, 16 MiB cache, checkpoint every ~4 MB)",
        &[],
    ),
    (
        "4 KiB pages (SQLite's default)",
        &[
            "PRAGMA journal_mode = DELETE",
            "PRAGMA page_size = 4096",
            "VACUUM",
            "PRAGMA journal_mode = WAL",
            "PRAGMA wal_autocheckpoint = 1000",
        ],
    ),
    (
        "16 KiB pages",
        &[
            "PRAGMA journal_mode = DELETE",
            "PRAGMA page_size = 16384",
            "VACUUM",
            "PRAGMA journal_mode = WAL",
            "PRAGMA wal_autocheckpoint = 250",
        ],
    ),
    (
        "64 KiB pages",
        &[
            "PRAGMA journal_mode = DELETE",
            "PRAGMA page_size = 65536",
            "VACUUM",
            "PRAGMA journal_mode = WAL",
            "PRAGMA wal_autocheckpoint = 62",
        ],
    ),
    ("synchronous=FULL", &["PRAGMA synchronous = FULL"]),
    ("synchronous=OFF", &["PRAGMA synchronous = OFF"]),
    (
        "checkpoint every ~16 MB",
        &["PRAGMA wal_autocheckpoint = 500"],
    ),
    (
        "cache_size=2 MiB (SQLite default)",
        &["PRAGMA cache_size = -2000"],
    ),
    ("without the events_ts index", &["DROP INDEX events_ts"]),
];

/// The SQLite settings eventd ships with, against alternatives, measured as
/// bare-SQLite insert rates (1M rows, one database per CPU, 4096 per
/// transaction, best of three runs each).
pub(crate) fn run_pragmas(args: &PragmasArgs) -> anyhow::Result<()> {
    let work = &args.output.work()?;
    let sizes = args.bytes.sizes()?;
    let shards = eventd::rings::online_cpus().len();
    let rows = 1_000_000;
    let mut table = String::from("| variant | rows/s | vs shipped |\n|---|---|---|\n");
    let mut results = Vec::new();
    let mut shipped = f64::NAN;
    for (name, adjust) in PRAGMA_VARIANTS {
        let rates = runner::interleave(&[()], 3, runner::Order::Same, |_, _| {
            let dir = tempfile::Builder::new()
                .prefix("pragmas-")
                .tempdir_in(work)?;
            ceiling::run_with(dir.path(), shards, rows, 4096, sizes, adjust)
        })?;
        let best = rates.into_iter().flatten().fold(0f64, f64::max);
        if shipped.is_nan() {
            shipped = best;
        }
        eprintln!("{name}: {best:.0} rows/s");
        table.push_str(&format!("| {name} | {best:.0} | {:.2} |\n", best / shipped));
        results.push(serde_json::json!({ "variant": name, "rows_per_s": best }));
    }
    println!("\n## pragmas ({shards} databases, {rows} rows, 4096 per transaction)\n");
    print!("{table}");
    let json = runner::write_json(&args.output.results, "pragmas", &results)?;
    println!("\nreport: {}", json.display());
    Ok(())
}

/// The syslog scenario's options.
#[derive(clap::Args)]
pub(crate) struct SyslogArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    binary: Binary,
    /// Messages each peer gets.
    #[arg(long, default_value_t = 1_000_000)]
    messages: u64,
    /// The peers, in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "eventd,floor,rsyslog,journald,syslog-ng"
    )]
    peers: Vec<syslog::Peer>,
    /// eventd's configuration file (default: the embedded defaults with
    /// rate limits off, as the peers run).
    #[arg(long)]
    eventd_config: Option<PathBuf>,
}

pub(crate) fn run_syslog_bench(args: &SyslogArgs) -> anyhow::Result<String> {
    let work = &args.common.output.work()?;
    let eventd = &args.binary.path()?;
    let repeat = args.common.repeat;
    // Every peer once a round (`syslog::run` takes them in turn).
    let rounds = runner::interleave(&[()], repeat, runner::Order::Same, |round, _| {
        if repeat > 1 {
            eprintln!("round {round}");
        }
        let config = args.eventd_config.as_deref();
        syslog::run(&args.peers, args.messages, work, eventd, config)
    })?;
    let all: Vec<Vec<syslog::PeerRun>> = rounds.into_iter().flatten().collect();
    let machine = runner::Machine::describe();
    println!(
        "\n## syslog ({} datagrams of 92 bytes, one blocking sender; {} CPUs)\n",
        args.messages, machine.cpus
    );
    println!(
        "| peer | stores into | stored/s | CPU s per million (by stage) | stored | lost | seconds \
         | sender seconds | version |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for round in &all {
        for r in round {
            println!(
                "| {} | {} | {:.0} | {}{} | {} | {} | {:.2} | {:.2} | {} |",
                r.peer.name(),
                r.stores_into,
                r.stored_per_s,
                r.cpu_s_per_million
                    .map_or("n/a".to_string(), |c| format!("{c:.2}")),
                syslog::stages_text(&r.cpu_by_stage),
                r.stored,
                r.lost,
                r.seconds,
                r.send_seconds,
                r.version
            );
        }
    }
    let json = runner::write_json(&args.common.output.results, "syslog", &all)?;
    println!("\nreport: {}", json.display());
    // The last round's ratio of eventd to the fastest peer.
    let last = all.last().map(Vec::as_slice).unwrap_or(&[]);
    let eventd_rate = last
        .iter()
        .find(|r| r.peer == syslog::Peer::Eventd)
        .map_or(0.0, |r| r.stored_per_s);
    let best_peer = last
        .iter()
        .filter(|r| !matches!(r.peer, syslog::Peer::Eventd | syslog::Peer::Floor))
        .map(|r| r.stored_per_s)
        .fold(0.0, f64::max);
    Ok(format!(
        "syslog eventd_per_s={eventd_rate:.0} best_peer_per_s={best_peer:.0} ratio={:.2}",
        if best_peer > 0.0 {
            eventd_rate / best_peer
        } else {
            0.0
        }
    ))
}

/// The query scenario's options.
#[derive(clap::Args)]
pub(crate) struct QueryArgs {
    // (The query scenario runs at least 5 rounds.)
    #[command(flatten)]
    common: Common,
    /// Events stored (in each layout).
    #[arg(long, default_value_t = 10_000_000)]
    query_events: u64,
}

pub(crate) fn run_query_bench(args: &QueryArgs) -> anyhow::Result<String> {
    let work = &args.common.output.work()?;
    let points = querybench::run(work, args.query_events, args.common.repeat.max(5))?;
    println!(
        "\n## query ({} events; time range over the middle fifth, 100 results)\n",
        args.query_events
    );
    println!(
        "| databases | order | time maps | first result µs | 100 results µs | vs one database | opened | 100 results, cold µs |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut worst_16 = 0f64;
    let mut worst_256 = 0f64;
    for p in &points {
        // Beside one database read the same way.
        let base = points
            .iter()
            .find(|b| b.databases == 1 && b.order == p.order && b.maps == p.maps)
            .map_or(1, |b| b.hundred_results_us.max(1));
        let ratio = p.hundred_results_us as f64 / base as f64;
        if p.maps && p.databases == 16 {
            worst_16 = worst_16.max(ratio);
        }
        if p.maps && p.databases == 256 {
            worst_256 = worst_256.max(ratio);
        }
        println!(
            "| {} | {:?} | {} | {} | {} | {:.1}× | {} | {} |",
            p.databases,
            p.order,
            if p.maps { "yes" } else { "no" },
            p.first_result_us,
            p.hundred_results_us,
            ratio,
            p.opened,
            p.cold_hundred_results_us
        );
    }
    let json = runner::write_json(&args.common.output.results, "query", &points)?;
    println!("\nreport: {}", json.display());
    Ok(format!(
        "query_16_shards_vs_one={worst_16:.1} query_256_shards_vs_one={worst_256:.1}"
    ))
}
