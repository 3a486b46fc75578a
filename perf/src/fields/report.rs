//! The fields scenario's tables, its JSON report and its summary line.

use super::inserts::{DaemonPoint, InsertCost};
use super::options::{Args, LIMIT, RUNS, THREADS};
use super::queries::{QueryFigures, SyncFigures};
use super::store::{IndexBuild, StoreFigures};
use crate::pipeline::Outcome;
use crate::runner::median_midpoint as median;

pub(super) fn print_insert_costs(costs: &[InsertCost], rows: u64, shards: usize) {
    println!(
        "\n### Insert cost: {rows} rows into {shards} fresh databases\n\n\
         | query indexes | ceiling rows/s (constant keys, 1 thread/db) | / none \
         | realistic rows/s ({THREADS} threads) | / none |\n|---|---|---|---|---|"
    );
    for c in costs {
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {:.2} |",
            c.indexes,
            c.ceiling_rows_per_s,
            c.ceiling_to_none,
            c.realistic_rows_per_s,
            c.realistic_to_none
        );
    }
}

pub(super) fn print_daemon(points: &[DaemonPoint]) {
    println!(
        "\n### eventd flat out, beside a ceiling with the same indexes\n\n\
         | QueryIndexes | shards | events/s | ceiling/s | ratio | lost | p99 µs |\n\
         |---|---|---|---|---|---|---|"
    );
    for p in points {
        let o = &p.outcome;
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {} | {} |",
            p.indexes,
            o.shards,
            o.events_per_s,
            o.ceiling_per_s,
            o.ratio_to_ceiling,
            o.lost,
            o.latency_us_p99
        );
    }
}

pub(super) fn print_store(store: &StoreFigures, builds: &[IndexBuild], syncs: &[SyncFigures]) {
    println!(
        "\n### Store: {} events in {} shards: {:.1} s, {:.0} rows/s ({THREADS} threads, no \
         query index, rows made on the fly), {:.1} MiB\n\n\
         | index built over the store | s | s per million rows | MiB added |\n|---|---|---|---|",
        store.events,
        store.shards,
        store.fill_secs,
        store.rows_per_s,
        store.bytes as f64 / 1048576.0
    );
    for b in builds {
        println!(
            "| {} | {:.2} | {:.3} | {:.1} |",
            b.index,
            b.secs,
            b.secs_per_million_rows,
            b.bytes_added as f64 / 1048576.0
        );
    }
    for s in syncs {
        println!(
            "\nstore brought to QueryIndexes {} in {:.2} s",
            s.indexes, s.secs
        );
    }
}

pub(super) fn print_queries(figures: &[QueryFigures]) {
    println!(
        "\n### Queries through eventd (limit {LIMIT}; warm = median of runs 2-{RUNS}, cold = run 1)\n\n\
         | query | order | query indexes | first result ms | {LIMIT}th result ms | cold first / \
         {LIMIT}th ms | found | same without indexes |\n|---|---|---|---|---|---|---|---|"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    for f in figures {
        println!(
            "| {} | {} | {} | {} | {:.1} | {} / {:.1} | {} | {} |",
            f.shown,
            f.order,
            f.indexes,
            opt(f.first_ms),
            f.hundredth_ms,
            opt(f.cold_first_ms),
            f.cold_hundredth_ms,
            f.found,
            match f.identical_across_configs {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "?",
            }
        );
    }
}

/// Everything measured, for the report and the summary line.
pub(super) struct Measured {
    pub(super) costs: Vec<InsertCost>,
    pub(super) daemon: Vec<DaemonPoint>,
    pub(super) store: StoreFigures,
    pub(super) builds: Vec<IndexBuild>,
    pub(super) syncs: Vec<SyncFigures>,
    pub(super) queries: Vec<QueryFigures>,
    pub(super) mismatched: usize,
    pub(super) rare_provider_expected: u64,
    pub(super) grep_expected: u64,
}

impl Measured {
    /// Both orders of `query` in the indexed configuration.
    fn indexed<'a>(&'a self, query: &'a str) -> impl Iterator<Item = &'a QueryFigures> + 'a {
        self.queries
            .iter()
            .filter(move |f| f.config == "indexes" && f.query == query)
    }

    fn found(&self, query: &str) -> usize {
        self.indexed(query).map(|f| f.found).min().unwrap_or(0)
    }

    /// The worse order's warm time to the first result, with indexes.
    fn first_ms(&self, query: &str) -> f64 {
        self.indexed(query)
            .map(|f| f.first_ms.unwrap_or(f64::NAN))
            .fold(f64::NAN, f64::max)
    }

    fn insert_ratio(&self, pick: fn(&InsertCost) -> f64) -> f64 {
        self.costs
            .iter()
            .find(|c| c.indexes.starts_with("default"))
            .map_or(f64::NAN, pick)
    }

    fn daemon_median(&self, indexes_none: bool, pick: fn(&Outcome) -> f64) -> f64 {
        let v: Vec<f64> = self
            .daemon
            .iter()
            .filter(|p| (p.indexes == "none") == indexes_none)
            .map(|p| pick(&p.outcome))
            .collect();
        median(&v)
    }

    pub(super) fn summary_line(&self) -> String {
        format!(
            "rare_provider_first_ms={:.1} insert_ratio_default_to_none={:.2} \
             ceiling_ratio_default_to_none={:.2} daemon_ratio_to_ceiling={:.2} \
             daemon_default_to_none={:.2} mismatched_queries={} rare_provider_found={} \
             rare_provider_expected={} grep_found={} grep_expected={}",
            self.first_ms("rare_provider"),
            self.insert_ratio(|c| c.realistic_to_none),
            self.insert_ratio(|c| c.ceiling_to_none),
            self.daemon_median(false, |o| o.ratio_to_ceiling),
            self.daemon_median(false, |o| o.events_per_s)
                / self.daemon_median(true, |o| o.events_per_s),
            self.mismatched,
            self.found("rare_provider"),
            self.rare_provider_expected,
            self.found("grep"),
            self.grep_expected,
        )
    }
}

pub(super) fn write_json(args: &Args, m: &Measured) -> anyhow::Result<()> {
    let report = serde_json::json!({
        "day_events": args.day_events,
        "day_shards": args.day_shards,
        "insert_rows": args.insert_rows,
        "insert_costs": m.costs,
        "daemon": m.daemon,
        "store": m.store,
        "index_builds": m.builds,
        "syncs": m.syncs,
        "queries": m.queries,
        "mismatched_queries": m.mismatched,
        "rare_provider_expected": m.rare_provider_expected,
        "grep_expected": m.grep_expected,
        "summary": m.summary_line(),
    });
    let path = crate::runner::write_report(&args.common.output.results, "fields", &report)?;
    println!("\nreport: {}", path.display());
    Ok(())
}
