//! Ingest flat out with export off and on.

use super::ch::{renice_cluster, Ch};
use super::export_run::export_point;
use super::options::Args;
use super::{elapsed, BATCH_DEFAULT};
use crate::load::{Mode, Sizes};
use crate::pipeline::{self, Knobs, Outcome};
use crate::runner;
use eventd::export::format::Format;
use eventd::export::state::Table;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub(super) struct IngestFigures {
    pub(super) off: Outcome,
    pub(super) on: Outcome,
    pub(super) ratio: f64,
    /// Events ClickHouse held when the point with export on ended.
    pub(super) exported_during_point: u64,
    /// CPUs the ClickHouse servers and ZooKeeper used during each point.
    pub(super) clickhouse_cpus_off: f64,
    pub(super) clickhouse_cpus_on: f64,
    /// The export-on point again with every ClickHouse and ZooKeeper
    /// thread at niceness 19: the cluster then runs on the CPU time eventd
    /// leaves, a stand-in for a cluster on other machines.
    pub(super) on_cluster_niced: Outcome,
    pub(super) ratio_cluster_niced: f64,
    pub(super) exported_during_niced_point: u64,
    pub(super) clickhouse_cpus_niced: f64,
}

/// The ingest points of each round: (label, export on, cluster reniced).
const POINTS: [(&str, bool, bool); 3] = [
    ("export off", false, false),
    ("export on", true, false),
    ("export on, cluster at nice 19", true, true),
];

/// What one ingest point measured: the pipeline's outcome, the CPUs the
/// cluster used, and the events ClickHouse held when it ended.
type Sample = (Outcome, f64, u64);

/// The harness's flat-out point with ExportUrl unset, then set, then set
/// with the cluster reniced to 19, `--repeat` rounds; one figure per
/// round.
pub(super) fn ingest(
    ch: &mut Ch,
    args: &Args,
    setup: &pipeline::Setup,
    sizes: Sizes,
    work: &Path,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<IngestFigures>> {
    let duration = Duration::from_secs_f64(args.duration.unwrap_or(10.0));
    let order = runner::Order::Same;
    let samples = runner::interleave(&POINTS, args.common.repeat, order, |_, &point| {
        let (label, export, niced) = point;
        let run = |point: &pipeline::Point| pipeline::run(work, setup, point, progress);
        let sample = ingest_point(ch, args, (sizes, duration), (export, niced), label, run)?;
        let o = &sample.0;
        progress.suspend(|| {
            eprintln!(
                "[{:3.0} s] ingest, {label}: {:.0} events/s, lost {}, p99 {} µs, largest \
                 WAL {:.0} MiB ({:.0} after the drain), export's WAL holds {:?}",
                elapsed(),
                o.events_per_s,
                o.lost,
                o.latency_us_p99,
                o.wal_peak_mib,
                o.wal_end_mib,
                o.export_wal_holds
            )
        });
        Ok(sample)
    })?;
    let [off, on, niced]: [Vec<Sample>; 3] = samples
        .try_into()
        .map_err(|_| anyhow::anyhow!("three points"))?;
    let rounds = off.into_iter().zip(on).zip(niced);
    Ok(rounds
        .map(|((off, on), niced)| figures(off, on, niced))
        .collect())
}

/// One ingest point on a database of its own, the cluster reniced to 19
/// for it when `niced`.
fn ingest_point(
    ch: &mut Ch,
    args: &Args,
    (sizes, duration): (Sizes, Duration),
    (export, niced): (bool, bool),
    label: &'static str,
    run: impl Fn(&pipeline::Point) -> anyhow::Result<Outcome>,
) -> anyhow::Result<Sample> {
    let db = ch.fresh_database("ingest")?;
    let point_export = export_point(
        &ch.url,
        &db,
        BATCH_DEFAULT,
        Format::RowBinary,
        args.export_nice,
    );
    ch.wait_quiet();
    if niced {
        renice_cluster(ch, 19);
    }
    let (cpu0, t0) = (ch.cpu_ns(), Instant::now());
    let point = pipeline::Point {
        label,
        knobs: Knobs::defaults(),
        mode: Mode::FlatOut,
        sizes,
        duration,
        with_ceiling: false,
        export: export.then_some(&point_export),
    };
    let o = run(&point);
    let cpus = (ch.cpu_ns() - cpu0) as f64 / 1e9 / t0.elapsed().as_secs_f64();
    if niced {
        renice_cluster(ch, 0);
    }
    let o = o?;
    let exported = ch.count(&db, Table::Events)?;
    ch.drop_database(&db)?;
    Ok((o, cpus, exported))
}

/// One round's figures from its three points.
fn figures(off: Sample, on: Sample, niced: Sample) -> IngestFigures {
    IngestFigures {
        ratio: on.0.events_per_s / off.0.events_per_s,
        ratio_cluster_niced: niced.0.events_per_s / off.0.events_per_s,
        exported_during_point: on.2,
        exported_during_niced_point: niced.2,
        clickhouse_cpus_off: off.1,
        clickhouse_cpus_on: on.1,
        clickhouse_cpus_niced: niced.1,
        off: off.0,
        on: on.0,
        on_cluster_niced: niced.0,
    }
}
