//! `eventd-perf`: the load harness. Runs eventd's real pipeline in-process
//! under a generated load and, in the same run, the bare-SQLite ceiling with
//! the same rows; prints a table and a machine-readable last line and writes
//! a JSON report and an SVG chart.
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
mod clients;
// The tests' private ClickHouse cluster and ZooKeeper (the export scenario).
#[path = "../../tests/common/cluster.rs"]
mod cluster;
mod exportbench;
mod fieldsbench;
mod hostbench;
mod limitsbench;
mod limitsflood;
mod load;
mod pipeline;
mod querybench;
mod report;
mod running;
mod scale;
mod scenarios;
mod syslogbench;
mod syslogfloor;
mod system;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use load::Sizes;
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "Load harness: eventd end to end beside the bare-SQLite ceiling")]
pub(crate) struct Args {
    #[arg(required_unless_present = "produce_ring")]
    pub(crate) scenario: Option<Scenario>,
    /// The system under test: the pipeline in this process, or the eventd
    /// binary as a child process.
    #[arg(long, value_enum, default_value = "in-process")]
    pub(crate) system: system::SystemKind,
    /// The eventd binary for `--system binary` (default: next to this program).
    #[arg(long)]
    pub(crate) eventd: Option<PathBuf>,
    /// Producers as threads of this process or as one process per ring.
    #[arg(long, value_enum, default_value = "threads")]
    pub(crate) producers: system::ProducerKind,
    /// Internal: run as a producer process emitting into this ring file.
    #[arg(long, hide = true)]
    pub(crate) produce_ring: Option<PathBuf>,
    /// Seconds of load per point (default: quick 3, baseline 30, sweeps 10).
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Message bytes per event: N, or MIN-MAX for a uniform distribution.
    #[arg(long, default_value = "64-256")]
    pub(crate) event_bytes: String,
    /// A fixed total rate in events/s instead of flat out.
    #[arg(long)]
    pub(crate) rate: Option<u64>,
    /// Events stored for the query scenario (in each layout).
    #[arg(long, default_value_t = 10_000_000)]
    pub(crate) query_events: u64,
    /// Run every point this many times (interleaved) and report the median.
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: usize,
    /// Messages each peer gets in the syslog scenario.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) messages: u64,
    /// Peers of the syslog scenario, in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "eventd,floor,rsyslog,journald,syslog-ng"
    )]
    pub(crate) peers: Vec<syslogbench::Peer>,
    /// eventd's configuration file in the syslog scenario (default: the
    /// embedded defaults with rate limits off, as the peers run).
    #[arg(long)]
    pub(crate) eventd_config: Option<PathBuf>,
    /// Events stored before the export scenario exports them.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) rows: u64,
    /// ExportBatchRows values the export scenario measures (RowBinary).
    #[arg(long, value_delimiter = ',', default_value = "5000,50000,200000")]
    pub(crate) batch_rows: Vec<u64>,
    /// Replicas of each of the export scenario's two ClickHouse shards.
    #[arg(long, default_value_t = 2)]
    pub(crate) replicas: usize,
    /// The export scenario against one ClickHouse server without ZooKeeper
    /// (the single-server schema) instead of 2 shards × --replicas.
    #[arg(long)]
    pub(crate) single: bool,
    /// Seconds of the export scenario's paced load (export lag).
    #[arg(long, default_value_t = 15.0)]
    pub(crate) lag_secs: f64,
    /// ExportNice of every eventd the export scenario starts (default:
    /// eventd's own).
    #[arg(long, default_value_t = eventd::config::EXPORT_NICE_DEFAULT as i32)]
    pub(crate) export_nice: i32,
    /// CPUs the export scenario's ClickHouse servers and ZooKeeper run on
    /// (default: all, shared with eventd and the bare loop); eventd, the
    /// bare loop and the load then run on the other CPUs, as they would
    /// beside a cluster on machines of its own.
    #[arg(long, value_delimiter = ',')]
    pub(crate) cluster_cpus: Vec<u32>,
    /// Rings the scale scenario attaches (simulated CPUs), in order.
    #[arg(long, value_delimiter = ',', default_value = "2,16,64,256")]
    pub(crate) scale_rings: Vec<u32>,
    /// StorageShards values the scale scenario runs at each ring count.
    #[arg(long, value_delimiter = ',', default_value = "0,256")]
    pub(crate) scale_shards: Vec<i64>,
    /// Concurrent query clients of the scale scenario.
    #[arg(long, default_value_t = 128)]
    pub(crate) queries: usize,
    /// Events of the fields scenario's day-long store.
    #[arg(long, default_value_t = 100_000_000)]
    pub(crate) day_events: u64,
    /// Shard files of the fields scenario's store (and of its insert-cost
    /// databases).
    #[arg(long, default_value_t = 16)]
    pub(crate) day_shards: usize,
    /// Rows of each insert-cost measurement of the fields scenario.
    #[arg(long, default_value_t = 4_000_000)]
    pub(crate) insert_rows: u64,
    /// Events of each of the limits scenario's runs without a flood.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) limits_events: u64,
    /// Providers those events are spread over (each must stay at or under
    /// half the default burst).
    #[arg(long, default_value_t = 400)]
    pub(crate) limits_sources: u64,
    /// The limits scenario's runs without a flood with `QueryIndexes = []`
    /// (on and off alike): each provider's place in the default
    /// `(provider, ts)` index then no longer bounds the insert rate.
    #[arg(long)]
    pub(crate) without_query_indexes: bool,
    /// Events of the limits scenario's quiet provider beside the flood.
    #[arg(long, default_value_t = 1000)]
    pub(crate) quiet_events: u64,
    /// The quiet provider's events per second.
    #[arg(long, default_value_t = 200)]
    pub(crate) quiet_rate: u64,
    /// Where the JSON report and the SVG chart go.
    #[arg(long, default_value = "perf/results")]
    pub(crate) results: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// Defaults, 3 s flat out, with the ceiling (under a minute; used by tests).
    Quick,
    /// Defaults, flat out, then at half the measured rate for latency.
    Baseline,
    /// StorageShards: 1, #CPUs, 2×#CPUs, 16, 256.
    Shards,
    /// MaxBatchSize sweep.
    Batch,
    /// Stripe length L sweep (with 2 shards per ring).
    Stripe,
    /// Channel slots and bytes sweep.
    Channel,
    /// SQLite settings measured on the bare ceiling (no pipeline).
    Pragmas,
    /// Time to the first and the 100th result of a time-range query over 1,
    /// 16 and 256 databases holding the same events (--query-events).
    Query,
    /// The same syslog datagrams into eventd, rsyslog, journald and
    /// syslog-ng, one after the other (--messages, --peers).
    Syslog,
    /// What one event costs the emitting program through eventd's clients
    /// (Rust tracing layer, C, Python) beside syslog and a log file, in
    /// ns per event (--messages events).
    Clients,
    /// Export into a private ClickHouse cluster beside ClickHouse's bare
    /// insert rate: rows/s by format and ExportBatchRows, ingest with
    /// export on and off, export lag at half rate, CPU per row (--rows,
    /// --batch-rows, --replicas, --duration for ingest, --lag-secs).
    Export,
    /// eventd as on a bigger machine: N simulated rings (--scale-rings)
    /// × StorageShards (--scale-shards): start-up, threads, RSS,
    /// descriptors, events/s beside the ceiling, p99, and --queries
    /// concurrent queries while it runs. Always the eventd binary.
    Scale,
    /// A day of events queried by field: what each query index
    /// (QueryIndexes) costs at insert (ceiling, realistic rows, eventd; the
    /// eventd points use --duration) and saves at query: time to the first
    /// and the 100th result through the eventd binary on a store of
    /// --day-events over --day-shards, with and without indexes
    /// (--insert-rows for the insert cost).
    Fields,
    /// The host's own sources: kernel records (/dev/kmsg) read and stored
    /// beside syslog datagrams, and the CPU per captured line of
    /// `eventctl run` beside `systemd-cat` into journald and `logger`
    /// (--messages records per path; root).
    HostSources,
    /// The fair-share rate limits, on (the defaults) beside off
    /// (RateLimitBurst = 0), against the eventd binary: events/s without a
    /// flood from many sources under the burst (--limits-events,
    /// --limits-sources; --repeat rounds, medians), and under a flood from
    /// every CPU what a quiet provider keeps (--quiet-events,
    /// --quiet-rate) and what becomes of the flood.
    Limits,
    /// Baseline and every sweep.
    All,
}

impl Scenario {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Quick => "quick",
            Scenario::Baseline => "baseline",
            Scenario::Shards => "shards",
            Scenario::Batch => "batch",
            Scenario::Stripe => "stripe",
            Scenario::Channel => "channel",
            Scenario::Pragmas => "pragmas",
            Scenario::Query => "query",
            Scenario::Syslog => "syslog",
            Scenario::Export => "export",
            Scenario::Clients => "clients",
            Scenario::Scale => "scale",
            Scenario::Fields => "fields",
            Scenario::HostSources => "host-sources",
            Scenario::Limits => "limits",
            Scenario::All => "all",
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let sizes = parse_sizes(&args.event_bytes)?;
    if let Some(ring) = &args.produce_ring {
        return system::producer_process(ring, args.rate, sizes);
    }
    let Some(scenario) = args.scenario else {
        bail!("a scenario is required");
    };
    let setup = pipeline::Setup {
        system: args.system.clone(),
        eventd: match &args.eventd {
            Some(p) => p.clone(),
            None => std::env::current_exe()?
                .parent()
                .context("locating eventd next to this program")?
                .join("eventd"),
        },
        producers: args.producers,
    };
    std::fs::create_dir_all(&args.results)
        .with_context(|| format!("creating {}", args.results.display()))?;
    let work = args.results.join("work");
    std::fs::create_dir_all(&work)?;
    let scenarios: Vec<Scenario> = match scenario {
        Scenario::All => vec![
            Scenario::Baseline,
            Scenario::Shards,
            Scenario::Batch,
            Scenario::Stripe,
            Scenario::Channel,
            Scenario::Pragmas,
        ],
        s => vec![s],
    };
    let mut last = None;
    for scenario in scenarios {
        if scenario == Scenario::Pragmas {
            scenarios::run_pragmas(&args, sizes, &work)?;
            continue;
        }
        if scenario == Scenario::Query {
            last = Some(scenarios::run_query_bench(&args, &work)?);
            continue;
        }
        if scenario == Scenario::Clients {
            last = Some(clients::run(&setup.eventd, &work, args.messages)?);
            continue;
        }
        if scenario == Scenario::Scale {
            last = Some(scale::run(&args, &setup.eventd, sizes, &work)?);
            continue;
        }
        if scenario == Scenario::Fields {
            last = Some(fieldsbench::run(&args, &setup, sizes, &work)?);
            continue;
        }
        if scenario == Scenario::Export {
            last = Some(exportbench::run(&args, &setup, sizes, &work)?);
            continue;
        }
        if scenario == Scenario::HostSources {
            last = Some(hostbench::run(&setup.eventd, &work, args.messages)?);
            continue;
        }
        if scenario == Scenario::Limits {
            last = Some(limitsbench::run(&args, &setup.eventd, sizes, &work)?);
            continue;
        }
        if scenario == Scenario::Syslog {
            last = Some(scenarios::run_syslog_bench(&args, &setup.eventd, &work)?);
            continue;
        }
        last = Some(scenarios::run_scenario(
            scenario, &args, &setup, sizes, &work,
        )?);
    }
    if let Some(line) = last {
        println!("{line}");
    }
    Ok(())
}

fn parse_sizes(text: &str) -> anyhow::Result<Sizes> {
    let parse = |s: &str| -> anyhow::Result<usize> {
        s.trim()
            .parse()
            .with_context(|| format!("--event-bytes: {s:?} is not a number"))
    };
    let sizes = match text.split_once('-') {
        Some((a, b)) => Sizes {
            min: parse(a)?,
            max: parse(b)?,
        },
        None => {
            let n = parse(text)?;
            Sizes { min: n, max: n }
        }
    };
    if sizes.min > sizes.max || sizes.max > 8192 {
        bail!("--event-bytes {text}: need MIN <= MAX <= 8192");
    }
    Ok(sizes)
}
