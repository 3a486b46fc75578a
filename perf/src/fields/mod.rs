//! The fields scenario, "a day of events, queried by field": what each
//! query index (`QueryIndexes`) costs at insert and saves at query, both
//! measured in the same run.
//!
//! 1. **Insert cost.** The bare-SQLite ceiling (`ceiling::run_with`) with
//!    no query index, with each candidate alone and with the default set;
//!    then the same variants with this scenario's realistic rows, because
//!    the ceiling's rows have one provider, one name and no fields, which
//!    makes an index on them artificially cheap (every insert lands at the
//!    same end of the b-tree). Then eventd itself flat out with the default
//!    `QueryIndexes` and with none, each beside a ceiling with the same
//!    indexes.
//! 2. **Store.** `--day-events` rows in `--day-shards` shard files without
//!    query indexes, then each candidate index built over the whole store,
//!    one at a time: what a writer's first `indexes::sync` costs on a store
//!    that already holds its rows.
//! 3. **Queries.** The eventd binary on that store, first with the indexes of
//!    [`options::QUERIED`], then with none: each query of [`queries`] in both
//!    orders, [`options::RUNS`] times, timed over the query socket to its
//!    first and its 100th result. The events returned with and without
//!    indexes must be the same ones.

mod data;
mod inserts;
mod options;
mod queries;
mod report;
mod shards;
mod store;

use crate::load::Sizes;
use crate::pipeline;
use data::{RARE_PROVIDER_AT, RARE_WORD_AT};
use inserts::{daemon_points, insert_costs};
pub(crate) use options::Args;
use options::{check_args, LIMIT};
use queries::{compare, query_phase};
use report::{print_daemon, print_insert_costs, print_queries, print_store, write_json, Measured};
use shards::work_dir;
use std::path::Path;
use std::time::Duration;
use store::{build_indexes, fill_store};

pub(crate) fn main(args: &Args) -> anyhow::Result<String> {
    let work = args.common.output.work()?;
    run(args, &args.system.setup()?, args.bytes.sizes()?, &work)
}

/// The whole scenario; returns the machine-readable summary line.
pub(crate) fn run(
    args: &Args,
    setup: &pipeline::Setup,
    sizes: Sizes,
    work: &Path,
) -> anyhow::Result<String> {
    check_args(args)?;
    let progress = indicatif::ProgressBar::new_spinner();
    progress.enable_steady_tick(Duration::from_millis(200));
    let costs = insert_costs(args, work, &progress)?;
    let daemon = daemon_points(args, setup, sizes, work, &progress)?;
    // The store lives where the daemon's data directory expects it.
    let data_dir = work_dir(work, "fields-")?;
    let store = data_dir.path().join("store");
    let (day, store_figures) = fill_store(args, &store, &progress)?;
    let builds = build_indexes(&store, args.day_shards, day.events, &progress)?;
    let (mut queries, syncs) = query_phase(
        &setup.eventd,
        data_dir.path(),
        args.day_shards,
        &day,
        &progress,
    )?;
    progress.finish_and_clear();
    let mismatched = compare(&mut queries);
    let m = Measured {
        costs,
        daemon,
        store: store_figures,
        builds,
        syncs,
        queries,
        mismatched,
        rare_provider_expected: day.rare_rows(RARE_PROVIDER_AT).min(LIMIT as u64),
        grep_expected: day.rare_rows(RARE_WORD_AT).min(LIMIT as u64),
    };
    print_insert_costs(&m.costs, args.insert_rows, args.day_shards);
    print_daemon(&m.daemon);
    print_store(&m.store, &m.builds, &m.syncs);
    print_queries(&m.queries);
    write_json(args, &m)?;
    Ok(m.summary_line())
}
