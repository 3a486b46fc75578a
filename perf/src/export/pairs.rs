//! An export run beside the bare insert of the same rows, and the choices made
//! from the pairs.

use super::bare::{bare, encode_all};
use super::ch::Ch;
use super::export_run::export_run;
use super::export_run::RunFigures;
use super::options::Args;
use super::store::Filled;
use super::{elapsed, BATCH_DEFAULT};
use crate::pipeline;
use crate::runner;
use eventd::export::format::Format;
use indicatif::ProgressBar;
use serde::Serialize;

/// One format and batch size: the bare loop, then eventd.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Pair {
    /// Which round of `--repeat` (from 1).
    pub(super) round: usize,
    pub(super) format: Format,
    pub(super) batch_rows: u64,
    pub(super) export: RunFigures,
    /// The bare loop with batches encoded before the clock: ClickHouse
    /// alone, the ceiling.
    pub(super) bare: RunFigures,
    pub(super) ratio: f64,
    /// The bare loop reading and encoding each batch before sending it:
    /// the exporter's work without its protocol.
    pub(super) bare_inline: RunFigures,
    pub(super) ratio_inline: f64,
    /// Reading the rows from the shard files and encoding them, one
    /// thread (the bare loop's preparation).
    pub(super) read_encode_rows_per_s: f64,
}

/// The round of `format` at the default batch whose export / bare ratio is
/// the median of its rounds (the upper one of an even count).
pub(super) fn median_pair(pairs: &[Pair], format: Format) -> Option<&Pair> {
    let at = pairs
        .iter()
        .filter(|p| p.format == format && p.batch_rows == BATCH_DEFAULT);
    runner::median_by(at, |p| p.ratio)
}

/// The smallest batch whose export rate is within 10 % of the best
/// (smaller batches: less memory, less lag at low rates), RowBinary.
pub(super) fn batch_choice(pairs: &[Pair]) -> u64 {
    let rb: Vec<&Pair> = pairs
        .iter()
        .filter(|p| p.format == Format::RowBinary)
        .collect();
    let best = rb.iter().map(|p| p.export.rows_per_s).fold(0f64, f64::max);
    rb.iter()
        .filter(|p| p.export.rows_per_s >= 0.9 * best)
        .map(|p| p.batch_rows)
        .min()
        .unwrap_or(BATCH_DEFAULT)
}

/// Every point of `--batch-rows` (RowBinary) and JSONEachRow at the
/// default batch, `--repeat` times, the rounds interleaved: the bare rate
/// of one point moved by up to 1.35x within minutes on this machine, so
/// the ratio is judged by its median over rounds.
pub(super) fn pair_rounds(
    ch: &mut Ch,
    args: &Args,
    setup: &pipeline::Setup,
    filled: &Filled,
    progress: &ProgressBar,
) -> anyhow::Result<Vec<Pair>> {
    let mut points: Vec<(Format, u64)> = args
        .batch_rows
        .iter()
        .map(|&b| (Format::RowBinary, b))
        .collect();
    points.push((Format::JsonEachRow, BATCH_DEFAULT));
    // Each point `--repeat` times, the rounds interleaved: the bare rate of
    // one point moved by up to 1.35x within minutes on this machine, so
    // the ratio is judged by its median over rounds.
    let mut pairs = Vec::new();
    let order = runner::Order::Same;
    runner::interleave(&points, args.common.repeat, order, |round, &point| {
        let p = pair(
            ch,
            setup,
            filled,
            (round, point, args.export_nice),
            progress,
        )?;
        progress.suspend(|| print_pair(&p));
        pairs.push(p);
        Ok(())
    })?;
    Ok(pairs)
}

/// One point of one round: the bare loop on batches encoded before the
/// clock, the bare loop reading as it goes, then eventd's export.
fn pair(
    ch: &mut Ch,
    setup: &pipeline::Setup,
    filled: &Filled,
    (round, (format, batch), nice): (usize, (Format, u64), i32),
    progress: &ProgressBar,
) -> anyhow::Result<Pair> {
    progress.set_message(format!("bare {} {batch}", format.name()));
    let (bodies, encode_secs) = encode_all(&filled.files, format, batch)?;
    let bare_encoded = bare(ch, filled, format, batch, Some(&bodies))?;
    drop(bodies);
    progress.set_message(format!(
        "bare {} {batch}, reading in the loop",
        format.name()
    ));
    let bare_inline = bare(ch, filled, format, batch, None)?;
    let mut export = export_run(ch, setup, filled, (format, batch, nice), progress)?;
    export.batches = export.batches.max(1);
    let p = Pair {
        round,
        format,
        batch_rows: batch,
        ratio: export.rows_per_s / bare_encoded.rows_per_s,
        ratio_inline: export.rows_per_s / bare_inline.rows_per_s,
        export,
        bare: bare_encoded,
        bare_inline,
        read_encode_rows_per_s: filled.rows() as f64 / encode_secs,
    };
    Ok(p)
}

/// A pair's progress line.
fn print_pair(p: &Pair) {
    eprintln!(
        "[{:3.0} s] round {}, {} {}: export {:.0} rows/s, bare {:.0} rows/s (ratio {:.2}), bare \
         reading in the loop {:.0} rows/s (ratio {:.2}); export CPU {:.0} ns/row; files per \
         worker {:?}, done at {:.2?} s; in ClickHouse {}/{} and {}/{}",
        elapsed(),
        p.round,
        p.format.name(),
        p.batch_rows,
        p.export.rows_per_s,
        p.bare.rows_per_s,
        p.ratio,
        p.bare_inline.rows_per_s,
        p.ratio_inline,
        p.export.client_cpu_ns_per_row,
        p.export.files_per_worker,
        p.export.file_done_secs,
        p.export.rows_in_clickhouse,
        p.export.rows,
        p.bare.rows_in_clickhouse,
        p.bare.rows
    )
}
