//! An export run beside the bare insert of the same rows, and the choices made
//! from the pairs.

use super::export_run::RunFigures;
use super::BATCH_DEFAULT;
use crate::runner;
use eventd::export::format::Format;
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
