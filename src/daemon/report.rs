//! What `eventctl stats`, `shards` and `config` show: built from the
//! daemon's live state for the query server.

use super::DaemonState;
use crate::config::Settings;
use crate::query::Request;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

pub fn answer(
    state: &DaemonState,
    settings: &Settings,
    live: &crate::config::live::LiveConfig,
    request: &Request,
) -> Value {
    match request {
        Request::Stats => json!({ "stats": stats(state) }),
        Request::Shards => json!({ "shards": shards(state, settings) }),
        Request::Config => {
            let live = live.state();
            json!({ "config": {
                "file": settings.config_file,
                "effective": live.effective,
                "deferred_to_restart": live.deferred,
                "last_reload_error": live.last_error,
            }})
        }
        Request::Metrics => json!({ "metrics": super::metrics::render(state) }),
        Request::Export => json!({ "export": state.export.as_ref().map(|e| e.report()) }),
        Request::Query { .. } => {
            json!({ "error": { "code": "internal", "message": "not a report" } })
        }
    }
}

fn stats(state: &DaemonState) -> Value {
    let rings: Vec<Value> = state.rings.iter().enumerate().map(ring_stats).collect();
    let shards: Vec<Value> = state.shards.iter().enumerate().map(shard_stats).collect();
    let (stdout, kernel, senders) = super::sources::report(state);
    json!({
        "stdout": stdout,
        "kernel": kernel,
        "senders": senders,
        "rings": rings,
        "shards": shards,
        "queries": query_stats(&state.queries),
        "syslog": syslog_stats(state),
        "rate_limits": rate_limit_stats(&state.suppression),
        "retention": retention_stats(&state.retention),
        "descriptor_allowance": state.needed_descriptors,
        "max_concurrent_queries": state.max_concurrent_queries,
        "failing_writers": state.failing_writers.load(Ordering::Relaxed),
        "damaged_shard_files": state.health.damaged(),
        "access": state.policy,
    })
}

/// What the rate limits suppressed: totals and the top sources (what
/// the drains suppressed in windows that have ended, and what producers
/// reported their own budgets refused).
fn rate_limit_stats(s: &crate::drain::Suppression) -> Value {
    let top: Vec<Value> = s
        .top(10)
        .into_iter()
        .map(|(source, suppressed)| json!({ "source": source, "suppressed": suppressed }))
        .collect();
    // Acquire, and first: the reports it counts are in `reports` (see
    // `Limiter::written`).
    let reported = s.reported.load(Ordering::Acquire);
    json!({
        "suppressed": s.suppressed.load(Ordering::Relaxed),
        "reported": reported,
        "evictions": s.evictions.load(Ordering::Relaxed),
        "reports": s.reports.load(Ordering::Relaxed),
        "refused_at_source": s.refused_at_source.load(Ordering::Relaxed),
        "top_sources": top,
    })
}

fn ring_stats((ordinal, r): (usize, &super::RingState)) -> Value {
    let (ring, drain) = (r.ring(), &r.drain);
    json!({
        "ordinal": ordinal,
        "cpu": ring.cpu(),
        "ring": ring.path(),
        "replacements": drain.replacements.load(Ordering::Relaxed),
        "header_repairs": drain.header_repairs.load(Ordering::Relaxed),
        "epoch": format!("{:016x}", ring.epoch()),
        "page_count": ring.geometry().page_count,
        "backlog_pages": ring.backlog_pages(),
        "producer_refusals": ring.producer_refusals(),
        "drained_events": drain.events.load(Ordering::Relaxed),
        "lost": drain.lost.load(Ordering::Relaxed),
        "skipped_after_restart": drain.skipped.load(Ordering::Relaxed),
        "suppressed": drain.suppressed.load(Ordering::Relaxed),
        "shards": r.shards,
        "committed_through": r.committed_through(),
    })
}

fn shard_stats((j, s): (usize, &super::ShardState)) -> Value {
    let (w, c) = (&s.writer, s.channel.stats());
    let h = w.histograms.lock().unwrap_or_else(|p| p.into_inner());
    json!({
        "shard": j,
        "path": *w.path.lock().unwrap_or_else(|p| p.into_inner()),
        "damaged_files": w.damaged_files.load(Ordering::Relaxed),
        "events": w.events.load(Ordering::Relaxed),
        "event_bytes": w.event_bytes.load(Ordering::Relaxed),
        "lost": w.lost.load(Ordering::Relaxed),
        "commits": w.commits.load(Ordering::Relaxed),
        "batch_max": w.batch_max.load(Ordering::Relaxed),
        "commit_errors": w.commit_errors.load(Ordering::Relaxed),
        "checkpoints": w.checkpoints.load(Ordering::Relaxed),
        "checkpoint_us": w.checkpoint_us.load(Ordering::Relaxed),
        "last_error": *w.last_error.lock().unwrap_or_else(|p| p.into_inner()),
        "latency_us_p50": h.latency_us.value_at_quantile(0.5),
        "latency_us_p99": h.latency_us.value_at_quantile(0.99),
        "commit_us_p50": h.commit_us.value_at_quantile(0.5),
        "commit_us_p99": h.commit_us.value_at_quantile(0.99),
        "batch_items_p50": h.batch_items.value_at_quantile(0.5),
        "channel": {
            "slots": c.capacity.slots,
            "bytes": c.capacity.bytes,
            "occupied_slots": c.occupied_slots,
            "occupied_bytes": c.occupied_bytes,
            "full_stalls": c.full_stalls,
            "receiver_sleeps": c.receiver_sleeps,
        },
    })
}

fn retention_stats(r: &crate::retention::RetentionStats) -> Value {
    json!({
        "passes": r.passes.load(Ordering::Relaxed),
        "events_deleted": r.events_deleted.load(Ordering::Relaxed),
        "event_bytes_deleted": r.event_bytes_deleted.load(Ordering::Relaxed),
        "events_deleted_unexported": r.events_deleted_unexported.load(Ordering::Relaxed),
        "gaps_deleted": r.gaps_deleted.load(Ordering::Relaxed),
        "receipts_deleted": r.receipts_deleted.load(Ordering::Relaxed),
        "receipts_compacted": r.receipts_compacted.load(Ordering::Relaxed),
        "pages_vacuumed": r.pages_vacuumed.load(Ordering::Relaxed),
        "store_used_bytes": r.store_used_bytes.load(Ordering::Relaxed),
        "errors": r.errors.load(Ordering::Relaxed),
        "last_error": *r.last_error.lock().unwrap_or_else(|p| p.into_inner()),
    })
}

fn query_stats(q: &crate::query::QueryStats) -> Value {
    json!({
        "running": q.running.load(Ordering::Relaxed),
        "connections": q.connections.load(Ordering::Relaxed),
        "answered": q.served.load(Ordering::Relaxed),
        "refused_busy": q.refused_busy.load(Ordering::Relaxed),
        "refused_denied": q.refused_denied.load(Ordering::Relaxed),
        "refused_bad_request": q.refused_bad_request.load(Ordering::Relaxed),
        "failed": q.failed.load(Ordering::Relaxed),
    })
}

fn syslog_stats(state: &DaemonState) -> Value {
    let y = &state.syslog;
    json!({
        "path": y.path_name(),
        "received": y.received.load(Ordering::Relaxed),
        "stored": y.stored.load(Ordering::Relaxed),
        "malformed": y.malformed.load(Ordering::Relaxed),
        "unstructured": y.unstructured.load(Ordering::Relaxed),
        "truncated": y.truncated.load(Ordering::Relaxed),
        "rejected_empty": y.rejected_empty.load(Ordering::Relaxed),
        "rejected_too_large": y.rejected_too_large.load(Ordering::Relaxed),
        "rejected_connections": y.rejected_connections.load(Ordering::Relaxed),
        "rejected_connections_share": y.rejected_connections_share.load(Ordering::Relaxed),
        "rejected_stopping": y.rejected_stopping.load(Ordering::Relaxed),
        "emit_failures": y.emit_failures.load(Ordering::Relaxed),
        "dropped": y.dropped.load(Ordering::Relaxed),
        "dropped_not_reported_yet": state.syslog_drops.pending(),
        "drop_reports": state.syslog_drops.reports.load(Ordering::Relaxed),
        "ring_waits": y.ring_waits.load(Ordering::Relaxed),
        "receive_calls": y.receive_calls.load(Ordering::Relaxed),
        "receive_errors": y.receive_errors.load(Ordering::Relaxed),
    })
}

fn shards(state: &DaemonState, settings: &Settings) -> Value {
    let paths = crate::store::list_databases(&settings.store_dir).unwrap_or_default();
    let list: Vec<Value> = paths
        .iter()
        .map(|p| {
            let size = |suffix: &str| {
                std::fs::metadata(crate::store::side_file(p, suffix)).map_or(0, |m| m.len())
            };
            let events = crate::store::open_read_only(p).and_then(|c| {
                c.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))
            });
            json!({
                "path": p,
                "bytes": size(""),
                "wal_bytes": size("-wal"),
                "events": events.as_ref().ok(),
                "error": events.err().map(|e| e.to_string()),
                "active": state.health.actives().contains(p),
                "damaged": state.health.is_damaged(p),
            })
        })
        .collect();
    Value::Array(list)
}
