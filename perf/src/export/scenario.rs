//! The export scenario's phases in the order they run.

use super::ch::Ch;
use super::ingest::ingest;
use super::lag::lag_run;
use super::options::{split_cpus, Args, CpuSplit};
use super::pairs::{batch_choice, pair_rounds};
use super::report::{print_tables, summary_line, ExportReportFile};
use super::store::fill;
use super::{elapsed, require_cluster, HOST};
use crate::load::Sizes;
use crate::pipeline;
use crate::runner;
use anyhow::Context;
use eventd::export::clickhouse::quote;
use indicatif::ProgressBar;
use std::path::Path;
use std::time::{Duration, Instant};

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
    let (mut ch, host_shard) = start_cluster(args, &progress)?;
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
    let pairs = pair_rounds(&mut ch, args, setup, &filled, &progress)?;
    let ingest = ingest(&mut ch, args, setup, sizes, &work, &progress)?;
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
    let measured = (pairs.as_slice(), ingest.as_slice(), &lag);
    let report = ExportReportFile::new(&ch, setup, &filled, host_shard, measured, choice);
    let json = runner::write_report(&args.common.output.results, "export", &report)?;
    println!("\nreport: {}", json.display());
    summary_line(&pairs, &ingest, &lag, choice)
}

/// Starts the cluster (on `--cluster-cpus`, the rest of the scenario on
/// the others); returns it and the shard `HOST`'s rows go to.
fn start_cluster(args: &Args, progress: &ProgressBar) -> anyhow::Result<(Ch, String)> {
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
    Ok((ch, host_shard))
}
