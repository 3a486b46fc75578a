//! `eventd-perf`: the load harness. Runs eventd's real pipeline in-process
//! under a generated load and, in the same run, the bare-SQLite ceiling with
//! the same rows; prints a table and a machine-readable last line and writes
//! a JSON report and an SVG chart. Each scenario is a subcommand with its
//! own options (`eventd-perf SCENARIO --help`).
//!
//! ```text
//! cargo run --release -p eventd-perf -- quick
//! cargo run --release -p eventd-perf -- baseline      # 30 s flat out, then half rate
//! cargo run --release -p eventd-perf -- shards|batch|stripe|channel|all
//! cargo run --release -p eventd-perf -- export        # into a private ClickHouse cluster
//! cargo run --release -p eventd-perf -- clients --messages 200000
//! cargo run --release -p eventd-perf -- fields        # 100 M events queried by field
//! cargo run --release -p eventd-perf -- host-sources --messages 200000
//! cargo run --release -p eventd-perf -- limits --repeat 5  # fair share: cost and effect
//! ```

mod ceiling;
mod cli;
mod clients;
mod export;
mod fields;
mod hostbench;
mod limitsbench;
mod limitsdaemon;
mod limitsflood;
mod load;
mod pipeline;
mod querybench;
mod report;
mod runner;
mod running;
mod scale;
mod scenarios;
mod syslog;
mod syslogfloor;
mod system;

use clap::{CommandFactory, Parser, Subcommand};
use scenarios::Sweep;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    about = "Load harness: eventd end to end beside the bare-SQLite ceiling",
    subcommand_value_name = "SCENARIO",
    subcommand_help_heading = "Scenarios"
)]
struct Cli {
    #[command(subcommand)]
    scenario: Option<Scenario>,
    /// Internal: run as a producer process emitting into this ring file
    /// (`--producers processes` starts these).
    #[arg(long, hide = true)]
    produce_ring: Option<PathBuf>,
    /// Internal: the producer process's message sizes.
    #[arg(long, hide = true, default_value = "64-256")]
    event_bytes: String,
    /// Internal: the producer process's rate in events/s.
    #[arg(long, hide = true)]
    rate: Option<u64>,
}

#[derive(Subcommand)]
enum Scenario {
    /// Defaults, 3 s flat out, with the ceiling (under a minute; used by tests).
    Quick(scenarios::SweepArgs),
    /// Defaults, flat out, then at half the measured rate for latency.
    Baseline(scenarios::SweepArgs),
    /// StorageShards: 1, #CPUs, 2×#CPUs, 16, 256.
    Shards(scenarios::SweepArgs),
    /// MaxBatchSize sweep.
    Batch(scenarios::SweepArgs),
    /// Stripe length L sweep (with 2 shards per ring).
    Stripe(scenarios::SweepArgs),
    /// Channel slots and bytes sweep.
    Channel(scenarios::SweepArgs),
    /// SQLite settings measured on the bare ceiling (no pipeline).
    Pragmas(scenarios::PragmasArgs),
    /// Time to the first and the 100th result of a time-range query over 1,
    /// 16 and 256 databases holding the same events.
    Query(scenarios::QueryArgs),
    /// The same syslog datagrams into eventd, rsyslog, journald and
    /// syslog-ng, one after the other.
    Syslog(scenarios::SyslogArgs),
    /// What one event costs the emitting program through eventd's clients
    /// (Rust tracing layer, C, Python) beside syslog and a log file, in
    /// ns per event.
    Clients(clients::Args),
    /// Export into a private ClickHouse cluster beside ClickHouse's bare
    /// insert rate: rows/s by format and ExportBatchRows, ingest with
    /// export on and off, export lag at half rate, CPU per row.
    Export(export::Args),
    /// eventd as on a bigger machine: N simulated rings × StorageShards:
    /// start-up, threads, RSS, descriptors, events/s beside the ceiling,
    /// p99, and concurrent queries while it runs. Always the eventd binary.
    Scale(scale::Args),
    /// A day of events queried by field: what each query index
    /// (QueryIndexes) costs at insert (ceiling, realistic rows, eventd) and
    /// saves at query: time to the first and the 100th result through the
    /// eventd binary, with and without indexes.
    Fields(fields::Args),
    /// The host's own sources: kernel records (/dev/kmsg) read and stored
    /// beside syslog datagrams, and the CPU per captured line of
    /// `eventctl run` beside `systemd-cat` into journald and `logger`
    /// (root).
    HostSources(hostbench::Args),
    /// The fair-share rate limits, on (the defaults) beside off
    /// (RateLimitBurst = 0), against the eventd binary: events/s without a
    /// flood from many sources under the burst (rounds, medians), and
    /// under a flood from every CPU what a quiet provider keeps and what
    /// becomes of the flood.
    Limits(limitsbench::Args),
    /// Baseline and every sweep, then the pragmas.
    All(scenarios::SweepArgs),
    /// Internal: one Rust client path's emit loop as a program of its own
    /// (`clients` counts its instructions under callgrind).
    #[command(hide = true)]
    EmitLoop(clients::EmitLoopArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(ring) = &cli.produce_ring {
        let sizes = cli::parse_sizes(&cli.event_bytes)?;
        return system::producer_process(ring, cli.rate, sizes);
    }
    let Some(scenario) = cli.scenario else {
        Cli::command()
            .error(
                clap::error::ErrorKind::MissingSubcommand,
                "a scenario is required",
            )
            .exit()
    };
    let line = match scenario {
        Scenario::Quick(a) => scenarios::run_sweep(Sweep::Quick, &a)?,
        Scenario::Baseline(a) => scenarios::run_sweep(Sweep::Baseline, &a)?,
        Scenario::Shards(a) => scenarios::run_sweep(Sweep::Shards, &a)?,
        Scenario::Batch(a) => scenarios::run_sweep(Sweep::Batch, &a)?,
        Scenario::Stripe(a) => scenarios::run_sweep(Sweep::Stripe, &a)?,
        Scenario::Channel(a) => scenarios::run_sweep(Sweep::Channel, &a)?,
        Scenario::All(a) => scenarios::run_all(&a)?,
        Scenario::Pragmas(a) => {
            scenarios::run_pragmas(&a)?;
            return Ok(());
        }
        Scenario::Query(a) => scenarios::run_query_bench(&a)?,
        Scenario::Syslog(a) => scenarios::run_syslog_bench(&a)?,
        Scenario::Clients(a) => clients::main(&a)?,
        Scenario::Export(a) => export::main(&a)?,
        Scenario::Scale(a) => scale::main(&a)?,
        Scenario::Fields(a) => fields::main(&a)?,
        Scenario::HostSources(a) => hostbench::main(&a)?,
        Scenario::Limits(a) => limitsbench::main(&a)?,
        Scenario::EmitLoop(a) => {
            clients::emit_loop(&a)?;
            return Ok(());
        }
    };
    println!("{line}");
    Ok(())
}
