//! What each query index costs at insert: the bare-SQLite ceiling, the
//! scenario's rows, and eventd flat out.

use super::data::{Day, Row, Rows, MESSAGE_BYTES};
use super::options::{Args, CANDIDATES};
use super::shards::{ceiling_sql, fill, labels, parse_all, work_dir};
use crate::ceiling;
use crate::load::{Mode, Sizes};
use crate::pipeline::{self, Knobs, Outcome, PointIndexes};
use crate::runner::{self, median_midpoint as median};
use eventd::store::indexes::QueryIndex;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// Rows/s of one index variant in the insert-cost phase.
#[derive(Debug, Clone, Serialize)]
pub(super) struct InsertCost {
    pub(super) indexes: String,
    /// `ceiling::run_with`'s rows: one provider, one name, no fields; one
    /// thread per database.
    pub(super) ceiling_rows_per_s: f64,
    /// This scenario's rows, [`THREADS`] threads.
    pub(super) realistic_rows_per_s: f64,
    pub(super) ceiling_to_none: f64,
    pub(super) realistic_to_none: f64,
}

/// No query index, each candidate alone, the default set.
fn variants() -> anyhow::Result<Vec<(String, Vec<QueryIndex>)>> {
    let mut v = vec![("none".to_string(), Vec::new())];
    for c in CANDIDATES {
        v.push((c.to_string(), parse_all(&[c])?));
    }
    let d = eventd::config::query_indexes_default();
    v.push((format!("default ({})", labels(&d)), d));
    Ok(v)
}

/// Phase 1a: the ceiling's and the realistic rows' insert rate for every
/// variant, interleaved over `--repeat` rounds (medians reported).
pub(super) fn insert_costs(
    args: &Args,
    work: &Path,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<InsertCost>> {
    let day = Day::new(args.insert_rows, eventd::rings::now_ns());
    progress.set_message(format!("insert cost: making {} rows", day.events));
    // Made before any clock starts, once for every variant.
    let built: Vec<Vec<Row>> = (0..day.stripes()).map(|k| day.stripe(k)).collect();
    let rows = Rows {
        day: &day,
        built: Some(&built),
    };
    let variants = variants()?;
    let order = runner::Order::Same;
    let samples = runner::interleave(&variants, args.common.repeat, order, |_, variant| {
        let (label, wanted) = variant;
        progress.set_message(format!("insert cost: {label}"));
        let c = ceiling_rate(work, args, wanted)?;
        let dir = work_dir(work, "fields-insert-")?;
        let r = day.events as f64 / fill(dir.path(), args.day_shards, &rows, wanted)?;
        progress.suspend(|| {
            eprintln!("insert cost, {label}: ceiling {c:.0} rows/s, realistic {r:.0} rows/s")
        });
        Ok((c, r))
    })?;
    let medians: Vec<(f64, f64)> = samples
        .iter()
        .map(|runs| {
            let (c, r): (Vec<f64>, Vec<f64>) = runs.iter().copied().unzip();
            (median(&c), median(&r))
        })
        .collect();
    let (c0, r0) = medians[0];
    Ok(variants
        .into_iter()
        .zip(medians)
        .map(|((indexes, _), (c, r))| InsertCost {
            indexes,
            ceiling_rows_per_s: c,
            realistic_rows_per_s: r,
            ceiling_to_none: c / c0,
            realistic_to_none: r / r0,
        })
        .collect())
}

fn ceiling_rate(work: &Path, args: &Args, wanted: &[QueryIndex]) -> anyhow::Result<f64> {
    let dir = work_dir(work, "fields-ceiling-")?;
    let sql = ceiling_sql(wanted);
    let sql: Vec<&str> = sql.iter().map(String::as_str).collect();
    ceiling::run_with(
        dir.path(),
        args.day_shards,
        args.insert_rows,
        eventd::config::MAX_BATCH_SIZE_DEFAULT,
        MESSAGE_BYTES,
        &sql,
    )
}

/// One flat-out point of eventd with some `QueryIndexes`.
#[derive(Debug, Clone, Serialize)]
pub(super) struct DaemonPoint {
    pub(super) indexes: String,
    pub(super) outcome: Outcome,
}

/// Phase 1b: eventd flat out with the default `QueryIndexes` and with
/// none, each beside a ceiling whose databases have the same indexes.
pub(super) fn daemon_points(
    args: &Args,
    setup: &pipeline::Setup,
    sizes: Sizes,
    work: &Path,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<DaemonPoint>> {
    let duration = Duration::from_secs_f64(args.duration.unwrap_or(10.0));
    let configs = [eventd::config::query_indexes_default(), Vec::new()];
    let mut points = Vec::new();
    let order = runner::Order::Same;
    runner::interleave(&configs, args.common.repeat, order, |_, wanted| {
        let sql = ceiling_sql(wanted);
        let sql: Vec<&str> = sql.iter().map(String::as_str).collect();
        let label = format!("QueryIndexes {}", labels(wanted));
        let point = pipeline::Point {
            label: &label,
            knobs: Knobs::defaults(),
            mode: Mode::FlatOut,
            sizes,
            duration,
            with_ceiling: true,
            export: None,
        };
        let indexes = PointIndexes {
            wanted,
            ceiling_sql: &sql,
        };
        let o = pipeline::run_indexed(work, setup, &point, Some(indexes), progress)?;
        progress.suspend(|| {
            eprintln!(
                "{label}: {:.0} events/s, ceiling {:.0}, ratio {:.2}, lost {}",
                o.events_per_s, o.ceiling_per_s, o.ratio_to_ceiling, o.lost
            )
        });
        points.push(DaemonPoint {
            indexes: labels(wanted),
            outcome: o,
        });
        Ok(())
    })?;
    Ok(points)
}
