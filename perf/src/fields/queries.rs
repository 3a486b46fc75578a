//! The queries of the scenario, timed over eventd's query socket with and
//! without query indexes.

use super::data::{
    Day, COMMON_PROVIDER, DAY_NS, MINUTE_NS, RARE_PROVIDER, RARE_WORD, UNIT_QUERIED,
};
use super::options::{LIMIT, QUERIED, RUNS};
use super::shards::{labels, on_shards, parse_all};
use crate::runner::{self, median_midpoint as median};
use crate::system::{Running, SystemKind};
use anyhow::{bail, Context};
use eventd::config::ConfigFile;
use eventd::daemon::Tunables;
use eventd::query::{Cursor, EventRow, Filter, Order, Request};
use eventd::store::indexes::{self, QueryIndex};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

/// One query of the query phase.
struct Query {
    key: &'static str,
    /// As `eventctl query` would be given it.
    shown: String,
    filter: Filter,
}

/// The queries, over the whole store except the time window.
fn queries(day: &Day) -> Vec<Query> {
    let mid = day.t0 + DAY_NS / 2;
    let q = |key, shown: String, filter| Query { key, shown, filter };
    vec![
        q(
            "window",
            "--since/--until (10 min, mid-day)".into(),
            Filter {
                since_ns: Some(mid - 5 * MINUTE_NS),
                until_ns: Some(mid + 5 * MINUTE_NS),
                ..Filter::default()
            },
        ),
        q(
            "rare_provider",
            format!("--provider {RARE_PROVIDER}"),
            Filter {
                provider: Some(RARE_PROVIDER.into()),
                ..Filter::default()
            },
        ),
        q(
            "common_provider",
            format!("--provider {COMMON_PROVIDER}"),
            Filter {
                provider: Some(COMMON_PROVIDER.into()),
                ..Filter::default()
            },
        ),
        q(
            "level_err",
            "--level err".into(),
            Filter {
                level: Some(3),
                ..Filter::default()
            },
        ),
        q(
            "grep",
            format!("--grep {RARE_WORD}"),
            Filter {
                text: Some(RARE_WORD.into()),
                ..Filter::default()
            },
        ),
        q(
            "field",
            format!("--field unit={UNIT_QUERIED}"),
            Filter {
                fields: vec![("unit".into(), UNIT_QUERIED.into())],
                ..Filter::default()
            },
        ),
    ]
}

/// One timed query.
struct Run {
    /// `None` when nothing matched.
    first: Option<Duration>,
    /// To the 100th event, or to the end when fewer matched.
    hundredth: Duration,
    keys: Vec<Cursor>,
}

/// Asks the daemon at `socket`, timing the answer lines as they come.
fn time_query(socket: &Path, filter: &Filter) -> anyhow::Result<Run> {
    let request = Request::Query {
        filter: filter.clone(),
        follow: false,
    };
    let (mut first, mut hundredth, mut keys, mut problem) = (None, None, Vec::new(), None);
    let start = Instant::now();
    eventd::query::client::call(socket, &request, |line| {
        if let Some(e) = line.get("event") {
            let row: EventRow = serde_json::from_value(e.clone()).map_err(std::io::Error::other)?;
            keys.push(row.cursor());
            first.get_or_insert_with(|| start.elapsed());
            if keys.len() == LIMIT {
                hundredth = Some(start.elapsed());
            }
        } else if line.get("error").is_some() || line.get("warning").is_some() {
            // A shard not read would make the comparison meaningless.
            problem = Some(line.to_string());
        }
        Ok(true)
    })
    .with_context(|| format!("querying eventd at {}", socket.display()))?;
    let end = start.elapsed();
    if let Some(p) = problem {
        bail!("eventd answered {p}");
    }
    Ok(Run {
        first,
        hundredth: hundredth.unwrap_or(end),
        keys,
    })
}

/// What one query in one order measured in one configuration.
#[derive(Debug, Clone, Serialize)]
pub(super) struct QueryFigures {
    pub(super) query: &'static str,
    pub(super) shown: String,
    pub(super) order: &'static str,
    pub(super) config: &'static str,
    pub(super) indexes: String,
    /// Events returned (at most [`LIMIT`]).
    pub(super) found: usize,
    /// Medians of the warm runs; `None` when nothing matched.
    pub(super) first_ms: Option<f64>,
    pub(super) hundredth_ms: f64,
    pub(super) cold_first_ms: Option<f64>,
    pub(super) cold_hundredth_ms: f64,
    /// Every run returned the same events.
    pub(super) consistent: bool,
    /// The same events as the other configuration (set once both ran).
    pub(super) identical_across_configs: Option<bool>,
    #[serde(skip)]
    pub(super) keys: Vec<Cursor>,
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn order_name(order: Order) -> &'static str {
    match order {
        Order::OldestFirst => "oldest first",
        Order::NewestFirst => "newest first (--reverse)",
    }
}

fn summarise(
    q: &Query,
    order: Order,
    (config, wanted): (&'static str, &[QueryIndex]),
    runs: Vec<Run>,
) -> QueryFigures {
    let warm = &runs[1..];
    let firsts: Vec<f64> = warm.iter().filter_map(|r| r.first.map(ms)).collect();
    let hundredths: Vec<f64> = warm.iter().map(|r| ms(r.hundredth)).collect();
    QueryFigures {
        query: q.key,
        shown: q.shown.clone(),
        order: order_name(order),
        config,
        indexes: labels(wanted),
        found: runs[0].keys.len(),
        first_ms: (!firsts.is_empty()).then(|| median(&firsts)),
        hundredth_ms: median(&hundredths),
        cold_first_ms: runs[0].first.map(ms),
        cold_hundredth_ms: ms(runs[0].hundredth),
        consistent: runs.iter().all(|r| r.keys == runs[0].keys),
        identical_across_configs: None,
        keys: runs.into_iter().next().map(|r| r.keys).unwrap_or_default(),
    }
}

/// Every query in both orders, [`RUNS`] times each, against the daemon
/// at `socket`.
fn time_queries(
    socket: &Path,
    config: (&'static str, &[QueryIndex]),
    day: &Day,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<QueryFigures>> {
    let mut out = Vec::new();
    for q in queries(day) {
        for order in [Order::OldestFirst, Order::NewestFirst] {
            progress.set_message(format!(
                "queries, {}: {}, {}",
                config.0,
                q.shown,
                order_name(order)
            ));
            let filter = Filter {
                order,
                limit: Some(LIMIT as u64),
                ..q.filter.clone()
            };
            // Back to back: the first run cold, the others warm.
            let runs = runner::interleave(&[()], RUNS, runner::Order::Same, |_, _| {
                time_query(socket, &filter)
            })?;
            let runs = runs.into_iter().flatten().collect();
            out.push(summarise(&q, order, config, runs));
        }
    }
    Ok(out)
}

/// Waits until the daemon at `socket` answers.
fn wait_answering(socket: &Path) -> anyhow::Result<()> {
    let start = Instant::now();
    while eventd::query::client::call(socket, &Request::Stats, |_| Ok(false)).is_err() {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(120),
            "eventd did not answer at {} within 120 s",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Starts the eventd binary on the store in `data_dir/store` with
/// `QueryIndexes` matching what the files have (so its writers' `sync`
/// has nothing to do), runs the queries, stops it with SIGTERM.
fn query_daemon(
    eventd: &Path,
    data_dir: &Path,
    shards: usize,
    config: (&'static str, &[QueryIndex]),
    day: &Day,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<QueryFigures>> {
    let file = ConfigFile {
        storage_shards: Some(shards as i64),
        // Ceilings are measured unlimited: one source emits everything.
        rate_limit_burst: Some(0),
        max_concurrent_queries: Some(4),
        query_indexes: Some(config.1.iter().map(QueryIndex::label).collect()),
        ..ConfigFile::default()
    };
    let settings = file.resolve(data_dir)?;
    progress.set_message(format!("queries, {}: starting eventd", config.0));
    let running = Running::start(&SystemKind::Binary, eventd, &settings, Tunables::default())?;
    let socket = settings.run_dir.join("query.sock");
    let timed = wait_answering(&socket).and_then(|()| time_queries(&socket, config, day, progress));
    // Stopped whatever the queries did, so that no eventd outlives the run.
    let stopped = running.stop();
    let timed = timed?;
    stopped.context("stopping eventd after the queries")?;
    Ok(timed)
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct SyncFigures {
    pub(super) indexes: String,
    pub(super) secs: f64,
}

/// Phase 3: the queries with the indexes of [`QUERIED`], then with none
/// (the store's files brought to each set by the harness first, timed).
pub(super) fn query_phase(
    eventd: &Path,
    data_dir: &Path,
    shards: usize,
    day: &Day,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<(Vec<QueryFigures>, Vec<SyncFigures>)> {
    let configs = [("indexes", parse_all(QUERIED)?), ("none", Vec::new())];
    let store = data_dir.join("store");
    let (mut figures, mut syncs) = (Vec::new(), Vec::new());
    for (name, wanted) in &configs {
        progress.set_message(format!("store to QueryIndexes {}", labels(wanted)));
        let secs = on_shards(&store, shards, |conn, path| {
            indexes::sync(conn, wanted, path)?;
            Ok(())
        })?;
        syncs.push(SyncFigures {
            indexes: labels(wanted),
            secs,
        });
        figures.extend(query_daemon(
            eventd,
            data_dir,
            shards,
            (name, wanted),
            day,
            progress,
        )?);
    }
    Ok((figures, syncs))
}

/// Marks each query × order as identical or not across the two
/// configurations; returns how many were not (or were not the same from
/// one run to the next).
pub(super) fn compare(figures: &mut [QueryFigures]) -> usize {
    let verdicts: Vec<bool> = figures
        .iter()
        .map(|a| {
            figures
                .iter()
                .filter(|b| b.config != a.config && b.query == a.query && b.order == a.order)
                .all(|b| b.keys == a.keys && a.consistent && b.consistent)
        })
        .collect();
    for (f, same) in figures.iter_mut().zip(&verdicts) {
        f.identical_across_configs = Some(*same);
    }
    figures
        .iter()
        .zip(&verdicts)
        .filter(|(f, same)| f.config == "indexes" && !**same)
        .count()
}
