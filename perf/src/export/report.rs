//! The export scenario's tables, summary and JSON report.

use super::ch::Ch;
use super::ingest::IngestFigures;
use super::lag::LagFigures;
use super::options::{Args, CpuSplit};
use super::pairs::{median_pair, Pair};
use super::store::Filled;
use super::BATCH_DEFAULT;
use crate::{pipeline, runner};
use anyhow::Context;
use eventd::export::format::Format;
use serde::Serialize;

#[derive(Serialize)]
pub(super) struct ExportReportFile<'a> {
    pub(super) clickhouse: String,
    pub(super) shards: usize,
    pub(super) replicas: usize,
    pub(super) host_shard: String,
    pub(super) system: crate::system::SystemKind,
    pub(super) fill_events: u64,
    pub(super) fill_gaps: u64,
    pub(super) fill_events_per_s: f64,
    pub(super) pairs: &'a [Pair],
    pub(super) ingest: &'a [IngestFigures],
    pub(super) lag: &'a LagFigures,
    pub(super) batch_rows_choice: u64,
    /// `--cluster-cpus`: the CPUs of ClickHouse and ZooKeeper, and of
    /// everything else; both empty when all share every CPU.
    pub(super) cluster_cpus: Vec<u32>,
    pub(super) client_cpus: Vec<u32>,
}

impl<'a> ExportReportFile<'a> {
    pub(super) fn new(
        ch: &Ch,
        setup: &pipeline::Setup,
        filled: &Filled,
        host_shard: String,
        (pairs, ingest, lag): (&'a [Pair], &'a [IngestFigures], &'a LagFigures),
        choice: u64,
    ) -> ExportReportFile<'a> {
        let cpus = |pick: fn(&CpuSplit) -> &Vec<u32>| ch.split.as_ref().map(pick).cloned();
        ExportReportFile {
            clickhouse: ch.version.clone(),
            shards: ch.cluster.shards(),
            replicas: ch.cluster.replicas(),
            host_shard,
            system: setup.system.clone(),
            fill_events: filled.events,
            fill_gaps: filled.gaps,
            fill_events_per_s: filled.events_per_s,
            pairs,
            ingest,
            lag,
            batch_rows_choice: choice,
            cluster_cpus: cpus(|s| &s.cluster).unwrap_or_default(),
            client_cpus: cpus(|s| &s.client).unwrap_or_default(),
        }
    }
}

/// The scenario's tables, in the order it measured them.
pub(super) fn print_tables(
    ch: &Ch,
    args: &Args,
    filled: &Filled,
    pairs: &[Pair],
    ingest: &[IngestFigures],
    lag: &LagFigures,
    choice: u64,
) {
    let machine = runner::Machine::describe();
    println!(
        "\n## export ({} CPUs, {}; ClickHouse {} {}; {}; {} rows, \
         messages of {} bytes; eventd {:?})\n",
        machine.cpus,
        machine.model,
        ch.version,
        ch.layout(),
        CpuSplit::describe(ch.split.as_ref()),
        filled.rows(),
        args.bytes.event_bytes,
        args.system.system
    );
    print_pairs(pairs);
    if args.common.repeat > 1 {
        print_rounds(pairs);
    }
    print_formats(pairs);
    print_ingest(ingest);
    print_lag(lag);
    println!(
        "\nExportBatchRows by measurement: {choice} (the smallest RowBinary batch within 10 % \
         of the best export rate)"
    );
    print_summary(pairs, ingest);
}

/// The two judgements of this run, each side's format named: ingest with
/// export on against off, and export against ClickHouse's bare insert.
fn print_summary(pairs: &[Pair], ingest: &[IngestFigures]) {
    let median = |v: Vec<f64>| runner::median(&v);
    let on_off = median(ingest.iter().map(|r| r.ratio).collect());
    let niced = median(ingest.iter().map(|r| r.ratio_cluster_niced).collect());
    println!(
        "\nsummary: ingest with export on / off {on_off:.2} (on: RowBinary, ExportBatchRows \
         {BATCH_DEFAULT}; off: no export; median of {} rounds), {niced:.2} with ClickHouse at \
         nice 19",
        ingest.len()
    );
    for format in [Format::RowBinary, Format::JsonEachRow] {
        if let Some(p) = median_pair(pairs, format) {
            println!(
                "summary: export / bare insert {:.2} (export: eventd, {} batches of {}; bare: \
                 the same rows as {} batches of {}, encoded before the clock, with the \
                 exporter's insert settings)",
                p.ratio,
                p.format.name(),
                p.batch_rows,
                p.format.name(),
                p.batch_rows
            );
        }
    }
}

/// The scenario's machine-readable summary line.
pub(super) fn summary_line(
    pairs: &[Pair],
    ingest: &[IngestFigures],
    lag: &LagFigures,
    choice: u64,
) -> anyhow::Result<String> {
    let ratios: Vec<f64> = ingest.iter().map(|r| r.ratio).collect();
    let median = runner::median(&ratios);
    let niced: Vec<f64> = ingest.iter().map(|r| r.ratio_cluster_niced).collect();
    let median_niced = runner::median(&niced);
    let headline = median_pair(pairs, Format::RowBinary)
        .or(pairs.first())
        .context("no export point")?;
    let json_pair = median_pair(pairs, Format::JsonEachRow);
    let lost_rows: u64 = pairs
        .iter()
        .map(|p| {
            [&p.export, &p.bare, &p.bare_inline]
                .iter()
                .map(|r| r.rows.abs_diff(r.rows_in_clickhouse))
                .sum::<u64>()
        })
        .sum::<u64>()
        + lag.stored.abs_diff(lag.rows_in_clickhouse);
    Ok(format!(
        "export_rows_per_s={:.0} bare_rows_per_s={:.0} export_ratio_to_bare={:.2} \
         json_to_rowbinary={:.2} ingest_on_to_off={median:.2} \
         ingest_on_to_off_cluster_niced={median_niced:.2} lag_p99_ms={:.0} \
         cpu_ns_per_row={:.0} batch_rows_choice={choice} mismatched_rows={lost_rows}",
        headline.export.rows_per_s,
        headline.bare.rows_per_s,
        headline.ratio,
        json_pair.map_or(f64::NAN, |j| j.export.rows_per_s
            / headline.export.rows_per_s),
        lag.cursor_lag_ms_p99,
        headline.export.client_cpu_ns_per_row,
    ))
}

/// Every pair of every round: export beside the bare insert.
fn print_pairs(pairs: &[Pair]) {
    println!(
        "| round | format | ExportBatchRows | export rows/s | export rows/s, first to last full batch \
         | bare rows/s | export / bare | bare, \
         read+encode in the loop, rows/s | export / that | export s | first batch s | batches | files per export worker \
         | export threads CPU ns/row | eventd process CPU ns/row | bare client CPU ns/row \
         (encoded / in the loop) | ClickHouse CPU ns/row (export / bare) | read+encode rows/s, \
         1 thread | rows in ClickHouse (export, bare, bare in the loop) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in pairs {
        println!(
            "| {} | {} | {} | {:.0} | {} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {} | {} | {:?} | {:.0} | {} | \
             {:.0} / {:.0} | {:.0} / {:.0} | {:.0} | {}, {}, {} of {} |",
            p.round,
            p.format.name(),
            p.batch_rows,
            p.export.rows_per_s,
            p.export
                .steady_rows_per_s
                .map_or("-".to_string(), |r| format!("{r:.0}")),
            p.bare.rows_per_s,
            p.ratio,
            p.bare_inline.rows_per_s,
            p.ratio_inline,
            p.export.secs,
            p.export
                .first_batch_secs
                .map_or("-".to_string(), |s| format!("{s:.2}")),
            p.export.batches,
            p.export.files_per_worker,
            p.export.client_cpu_ns_per_row,
            p.export
                .process_cpu_ns_per_row
                .map_or("n/a (in-process)".to_string(), |n| format!("{n:.0}")),
            p.bare.client_cpu_ns_per_row,
            p.bare_inline.client_cpu_ns_per_row,
            p.export.server_cpu_ns_per_row,
            p.bare.server_cpu_ns_per_row,
            p.read_encode_rows_per_s,
            p.export.rows_in_clickhouse,
            p.bare.rows_in_clickhouse,
            p.bare_inline.rows_in_clickhouse,
            p.export.rows,
        );
    }
}

/// Each point's export / bare ratio by round (with `--repeat`).
fn print_rounds(pairs: &[Pair]) {
    let points = pairs
        .iter()
        .filter(|p| p.round == 1)
        .map(|p| (p.format, p.batch_rows));
    for (format, batch) in points {
        let mut ratios: Vec<f64> = pairs
            .iter()
            .filter(|p| p.format == format && p.batch_rows == batch)
            .map(|p| p.ratio)
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "\n{} {batch}: export / bare by round, sorted: {:.2?} (median {:.2})",
            format.name(),
            ratios,
            runner::median(&ratios)
        );
    }
}

/// RowBinary beside JSONEachRow at the default batch (the median pairs).
fn print_formats(pairs: &[Pair]) {
    let at = |f: Format| median_pair(pairs, f);
    if let (Some(rb), Some(js)) = (at(Format::RowBinary), at(Format::JsonEachRow)) {
        println!(
            "\nformats at {BATCH_DEFAULT}: export RowBinary {:.0} vs JSONEachRow {:.0} rows/s \
             (JSON / RowBinary {:.2}); bare {:.0} vs {:.0} ({:.2}); bare reading in the loop \
             {:.0} vs {:.0} ({:.2}); export threads' CPU {:.0} vs {:.0} ns/row; read+encode \
             {:.0} vs {:.0} rows/s",
            rb.export.rows_per_s,
            js.export.rows_per_s,
            js.export.rows_per_s / rb.export.rows_per_s,
            rb.bare.rows_per_s,
            js.bare.rows_per_s,
            js.bare.rows_per_s / rb.bare.rows_per_s,
            rb.bare_inline.rows_per_s,
            js.bare_inline.rows_per_s,
            js.bare_inline.rows_per_s / rb.bare_inline.rows_per_s,
            rb.export.client_cpu_ns_per_row,
            js.export.client_cpu_ns_per_row,
            rb.read_encode_rows_per_s,
            js.read_encode_rows_per_s,
        );
    }
}

/// Ingest with export off and on, by round: rates, then latency and WAL.
fn print_ingest(ingest: &[IngestFigures]) {
    println!(
        "\n| ingest round | export off events/s | export on (RowBinary, ExportBatchRows \
         {BATCH_DEFAULT}) events/s | on / off | on, ClickHouse at nice 19 | that / off | lost off / \
         on / niced | ClickHouse CPUs busy off / on / niced | events in ClickHouse when the on / \
         niced point ended |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (i, r) in ingest.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {} / {} / {} | {:.2} / {:.2} / {:.2} \
             | {} / {} |",
            i + 1,
            r.off.events_per_s,
            r.on.events_per_s,
            r.ratio,
            r.on_cluster_niced.events_per_s,
            r.ratio_cluster_niced,
            r.off.lost,
            r.on.lost,
            r.on_cluster_niced.lost,
            r.clickhouse_cpus_off,
            r.clickhouse_cpus_on,
            r.clickhouse_cpus_niced,
            r.exported_during_point,
            r.exported_during_niced_point
        );
    }
    println!(
        "\n| ingest round | p99 emit→commit off / on / niced (ms) | largest WAL file during \
         the point off / on / niced (MiB) | after the drain (MiB) |"
    );
    println!("|---|---|---|---|");
    for (i, r) in ingest.iter().enumerate() {
        let [off, on, niced] = [&r.off, &r.on, &r.on_cluster_niced];
        println!(
            "| {} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} |",
            i + 1,
            off.latency_us_p99 as f64 / 1e3,
            on.latency_us_p99 as f64 / 1e3,
            niced.latency_us_p99 as f64 / 1e3,
            off.wal_peak_mib,
            on.wal_peak_mib,
            niced.wal_peak_mib,
            off.wal_end_mib,
            on.wal_end_mib,
            niced.wal_end_mib,
        );
    }
}

/// The lag phase in one paragraph.
fn print_lag(lag: &LagFigures) {
    println!(
        "\nlag at {} events/s (half the export-on ingest rate) for {:.0} s, ExportBatchRows \
         {BATCH_DEFAULT}: oldest stored event ClickHouse has not confirmed (exporter's cursor, \
         {} samples every 100 ms) p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; status lag_seconds \
         p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; caught up {:.2} s after the load; lost {}; \
         {} stored, {} in ClickHouse",
        lag.rate,
        lag.secs,
        lag.samples,
        lag.cursor_lag_ms_p50,
        lag.cursor_lag_ms_p99,
        lag.cursor_lag_ms_max,
        lag.status_lag_ms_p50,
        lag.status_lag_ms_p99,
        lag.status_lag_ms_max,
        lag.catch_up_secs,
        lag.lost,
        lag.stored,
        lag.rows_in_clickhouse
    );
}
