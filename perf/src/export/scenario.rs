//! The export scenario's phases in the order they run.

use super::bare::{bare, encode_all};
use super::ch::Ch;
use super::export_run::export_run;
use super::ingest::ingest;
use super::lag::lag_run;
use super::options::{split_cpus, Args, CpuSplit};
use super::pairs::{batch_choice, median_pair, Pair};
use super::report::{print_tables, ExportReportFile};
use super::store::fill;
use super::{elapsed, require_cluster, BATCH_DEFAULT, HOST};
use crate::load::Sizes;
use crate::pipeline;
use crate::runner;
use anyhow::Context;
use eventd::export::clickhouse::quote;
use eventd::export::format::Format;
use std::path::Path;
use std::time::{Duration, Instant};

// Longer than the ~70 lines a function should be: the scenario's phases in
// the order they run, each a call and a progress line.
/// Runs the scenario; prints its tables; writes `export.json`; returns the
/// machine-readable summary line.
pub(crate) fn run(
    args: &Args,
    setup: &pipeline::Setup,
    sizes: Sizes,
    work: &Path,
) -> anyhow::Result<String> {
    require_cluster()?;
    elapsed();
    // The cluster's directory goes under the work directory (absolute: the
    // servers run in their own directories), where its processes are easy
    // to tell from anyone else's.
    let work = work.canonicalize()?;
    // Fails only when already set, to this same directory.
    let _ = tempfile::env::override_temp_dir(&work);
    let progress = indicatif::ProgressBar::new_spinner();
    progress.enable_steady_tick(Duration::from_millis(200));
    progress.set_message(format!(
        "starting 2 × {} ClickHouse and ZooKeeper",
        args.replicas
    ));
    let t = Instant::now();
    let split = split_cpus(args)?;
    if let Some(s) = &split {
        crate::load::run_on(&s.cluster).context("--cluster-cpus")?;
    }
    let mut ch = Ch::start(args.replicas, args.single)?;
    // Whatever this thread starts from here on (eventd, the bare loop's
    // threads, producers) runs on the other CPUs.
    if let Some(s) = &split {
        crate::load::run_on(&s.client).context("--cluster-cpus")?;
        s.check(&ch.pids())?;
    }
    ch.split = split;
    let shards = ch.cluster.shards();
    let host_shard = ch
        .client
        .text(
            &format!("SELECT cityHash64({}) % {shards} + 1", quote(HOST)),
            &[],
        )?
        .trim()
        .to_string();
    progress.suspend(|| {
        eprintln!(
            "[{:3.0} s] ClickHouse {} {} in {} ({:.1} s); host {HOST} goes to shard \
             {host_shard}; {}",
            elapsed(),
            ch.version,
            ch.layout(),
            ch.cluster.dir().display(),
            t.elapsed().as_secs_f64(),
            CpuSplit::describe(ch.split.as_ref())
        )
    });
    let filled = fill(&work, setup, sizes, args.rows, &progress)?;
    progress.suspend(|| {
        eprintln!(
            "[{:3.0} s] store: {} events and {} gaps in {} files ({:.0} events/s), export off",
            elapsed(),
            filled.events,
            filled.gaps,
            filled.files.len(),
            filled.events_per_s
        )
    });
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
    runner::interleave(
        &points,
        args.common.repeat,
        order,
        |round, &(format, batch)| {
            progress.set_message(format!("bare {} {batch}", format.name()));
            let (bodies, encode_secs) = encode_all(&filled.files, format, batch)?;
            let bare_encoded = bare(&mut ch, &filled, format, batch, Some(&bodies))?;
            drop(bodies);
            progress.set_message(format!(
                "bare {} {batch}, reading in the loop",
                format.name()
            ));
            let bare_inline = bare(&mut ch, &filled, format, batch, None)?;
            let mut export = export_run(
                &mut ch,
                setup,
                &filled,
                (format, batch, args.export_nice),
                &progress,
            )?;
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
            progress.suspend(|| {
            eprintln!(
                "[{:3.0} s] round {round}, {} {batch}: export {:.0} rows/s, bare {:.0} rows/s (ratio {:.2}), bare reading \
                 in the loop {:.0} rows/s (ratio {:.2}); export CPU {:.0} ns/row; files per worker \
                 {:?}, done at {:.2?} s; in ClickHouse {}/{} and {}/{}",
                elapsed(),
                format.name(),
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
        });
            pairs.push(p);
            Ok(())
        },
    )?;
    let ingest = ingest(&mut ch, args, setup, sizes, &work, &progress)?;
    let ratios: Vec<f64> = ingest.iter().map(|r| r.ratio).collect();
    let median = runner::median(&ratios);
    let niced: Vec<f64> = ingest.iter().map(|r| r.ratio_cluster_niced).collect();
    let median_niced = runner::median(&niced);
    // Half of what the pipeline takes with export on: with the cluster on
    // the same CPUs, half the export-off rate can be more than that.
    let on_rate = ingest
        .iter()
        .map(|r| r.on.events_per_s)
        .fold(0f64, f64::max);
    let half = ((on_rate / 2.0) as u64).max(1);
    let lag = lag_run(
        &mut ch,
        setup,
        &work,
        sizes,
        (
            half,
            Duration::from_secs_f64(args.lag_secs),
            args.export_nice,
        ),
        &progress,
    )?;
    progress.finish_and_clear();
    let choice = batch_choice(&pairs);
    print_tables(&ch, args, &filled, &pairs, &ingest, &lag, choice);
    let report = ExportReportFile {
        clickhouse: ch.version.clone(),
        shards: ch.cluster.shards(),
        replicas: ch.cluster.replicas(),
        host_shard,
        system: setup.system.clone(),
        fill_events: filled.events,
        fill_gaps: filled.gaps,
        fill_events_per_s: filled.events_per_s,
        pairs: &pairs,
        ingest: &ingest,
        lag: &lag,
        batch_rows_choice: choice,
        cluster_cpus: ch
            .split
            .as_ref()
            .map(|s| s.cluster.clone())
            .unwrap_or_default(),
        client_cpus: ch
            .split
            .as_ref()
            .map(|s| s.client.clone())
            .unwrap_or_default(),
    };
    let json = runner::write_report(&args.common.output.results, "export", &report)?;
    println!("\nreport: {}", json.display());
    let headline = median_pair(&pairs, Format::RowBinary)
        .or(pairs.first())
        .context("no export point")?;
    let json_pair = median_pair(&pairs, Format::JsonEachRow);
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
