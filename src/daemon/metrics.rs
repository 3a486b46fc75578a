//! The daemon's figures in the Prometheus text format: what `eventctl stats
//! --prometheus` prints and the MetricsListen listener serves.
//!
//! Families, by stage (labels in braces):
//! - rings {cpu}: drained, lost (stored as gaps), producer refusals, backlog
//!   (bytes of whole pages not yet drained: the drain's lag), committed
//!   sequence watermark;
//! - channels {shard}: capacity and occupancy in slots and bytes, full stalls;
//! - shards {shard}: commits, events, event bytes, gap sequences, commit
//!   errors; histograms of items per commit, commit time and emit-to-commit
//!   latency;
//! - queries: running, answered, refused {reason}, failed;
//! - retention: passes, deleted events, bytes, gaps and receipts, compacted
//!   receipts, vacuumed pages, errors, store bytes in use.

use super::DaemonState;
use crate::metrics::{Exposition, Kind};
use std::sync::atomic::{AtomicU64, Ordering};

fn load(a: &AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
}

pub fn render(state: &DaemonState) -> String {
    let mut e = Exposition::new();
    rings(&mut e, state);
    channels(&mut e, state);
    shards(&mut e, state);
    queries(&mut e, state);
    syslog(&mut e, state);
    rate_limits(&mut e, state);
    super::sources::metrics(&mut e, state);
    retention(&mut e, state);
    export(&mut e, state);
    e.finish()
}

/// Sources the drains' rate limits suppressed most, at most this many
/// series (never one per source).
const TOP_SUPPRESSED: usize = 5;

/// The drains' rate limits: totals, and the few sources suppressed most.
fn rate_limits(e: &mut Exposition, state: &DaemonState) {
    let s = &state.suppression;
    for (name, help, value) in [
        (
            "eventd_rate_limit_suppressed_total",
            "Events past their source's rate limit, stored as suppressed gaps.",
            &s.suppressed,
        ),
        (
            "eventd_rate_limit_evictions_total",
            "Sources' windows given up early because a drain tracked too many sources.",
            &s.evictions,
        ),
        (
            "eventd_rate_limit_reports_total",
            "Reports of suppressed events written when a source's window ended.",
            &s.reports,
        ),
        (
            "eventd_rate_limit_reported_total",
            "Suppressed events counted in the reports written so far.",
            &s.reported,
        ),
        (
            "eventd_rate_limit_refused_at_source_total",
            "Events producers' own budgets refused before writing them, as their reports say.",
            &s.refused_at_source,
        ),
    ] {
        e.single(name, help, Kind::Counter, load(value));
    }
    let top = s.top(TOP_SUPPRESSED);
    let labels: Vec<[(&'static str, String); 2]> = top
        .iter()
        .enumerate()
        .map(|(i, (source, _))| [("rank", (i + 1).to_string()), ("source", source.clone())])
        .collect();
    e.family(
        "eventd_rate_limit_top_suppressed",
        "Events suppressed (in ended windows) or refused at the source, of the sources limited most, by rank.",
        Kind::Gauge,
        labels
            .iter()
            .zip(&top)
            .map(|(l, (_, n))| (&l[..], *n as f64)),
    );
}

/// The export stage, per shard file and table (nothing when export is
/// off).
fn export(e: &mut Exposition, state: &DaemonState) {
    use crate::export::status::{SourceStatus, StreamStatus};
    let Some(status) = &state.export else {
        return;
    };
    let report = status.report();
    let mut labels: Vec<[(&str, String); 2]> = Vec::new();
    let mut streams = Vec::new();
    for s in &report.shards {
        for (table, st) in [("events", &s.events), ("gaps", &s.gaps)] {
            labels.push([("shard", s.file.clone()), ("table", table.to_string())]);
            streams.push((st, s));
        }
    }
    type Value = fn(&StreamStatus, &SourceStatus) -> f64;
    let families: [(&str, &str, Kind, Value); 10] = [
        (
            "eventd_export_exported_through",
            "Every row with an id at or below this is in the cluster.",
            Kind::Gauge,
            |st, _| st.exported_through as f64,
        ),
        (
            "eventd_export_lag_rows",
            "Rows committed but not exported yet.",
            Kind::Gauge,
            |st, _| st.lag_rows as f64,
        ),
        (
            "eventd_export_lag_seconds",
            "Age of the oldest row not exported yet.",
            Kind::Gauge,
            |st, _| st.lag_seconds,
        ),
        (
            "eventd_export_batches_sent_total",
            "Batches the cluster accepted on their first send.",
            Kind::Counter,
            |st, _| st.batches_sent as f64,
        ),
        (
            "eventd_export_rows_sent_total",
            "Rows in the batches accepted on their first send.",
            Kind::Counter,
            |st, _| st.rows_sent as f64,
        ),
        (
            "eventd_export_batches_deduplicated_total",
            "Batches whose send was not confirmed, found in the cluster whole: not resent.",
            Kind::Counter,
            |st, _| st.batches_deduplicated as f64,
        ),
        (
            "eventd_export_batches_resent_total",
            "Batches found missing after a failure and sent again (their missing rows).",
            Kind::Counter,
            |st, _| st.batches_resent as f64,
        ),
        (
            "eventd_export_rows_resent_total",
            "Rows sent again after a failure.",
            Kind::Counter,
            |st, _| st.rows_resent as f64,
        ),
        (
            "eventd_export_failures",
            "Failed sends and checks of the shard file in a row (0 when it exports).",
            Kind::Gauge,
            |_, s| s.failures as f64,
        ),
        (
            "eventd_export_wal_holds_total",
            "Times reads of the shard file were held to let its WAL start over.",
            Kind::Counter,
            |_, s| s.wal_holds as f64,
        ),
    ];
    for (name, help, kind, value) in families {
        let samples: Vec<(&[(&str, String)], f64)> = labels
            .iter()
            .zip(&streams)
            .map(|(l, (st, source))| (&l[..], value(st, source)))
            .collect();
        e.family(name, help, kind, samples);
    }
}

fn rings(e: &mut Exposition, state: &DaemonState) {
    let labels: Vec<[(&str, String); 1]> = state
        .rings
        .iter()
        .map(|r| [("cpu", super::ring_label(r.ring().cpu()))])
        .collect();
    let per_ring = |f: &dyn Fn(usize) -> f64| -> Vec<(&[(&str, String)], f64)> {
        labels
            .iter()
            .enumerate()
            .map(|(i, l)| (&l[..], f(i)))
            .collect()
    };
    e.family(
        "eventd_ring_drained_events_total",
        "Events the drain read from the ring and handed to a shard writer.",
        Kind::Counter,
        per_ring(&|i| load(&state.rings[i].drain.events)),
    );
    e.family(
        "eventd_ring_lost_events_total",
        "Sequence numbers the drain found lost (overwritten, abandoned or corrupt), \
         stored as gaps.",
        Kind::Counter,
        per_ring(&|i| load(&state.rings[i].drain.lost)),
    );
    e.family(
        "eventd_ring_skipped_events_total",
        "Events read again after a restart that were already committed.",
        Kind::Counter,
        per_ring(&|i| load(&state.rings[i].drain.skipped)),
    );
    e.family(
        "eventd_ring_producer_refusals_total",
        "Emits producers refused before taking a sequence number (no gap accounts for them).",
        Kind::Counter,
        per_ring(&|i| state.rings[i].ring().producer_refusals() as f64),
    );
    e.family(
        "eventd_ring_backlog_bytes",
        "Bytes of whole pages written by producers and not yet drained (the drain's lag).",
        Kind::Gauge,
        per_ring(&|i| {
            let r = state.rings[i].ring();
            (r.backlog_pages() * r.geometry().page_size as u64) as f64
        }),
    );
    e.family(
        "eventd_ring_replacements_total",
        "Times the ring was given up and made anew (its file truncated, removed or \
         replaced, or its words wedged by a scribble).",
        Kind::Counter,
        per_ring(&|i| load(&state.rings[i].drain.replacements)),
    );
    e.family(
        "eventd_ring_header_repairs_total",
        "Header words of the ring found scribbled and written back.",
        Kind::Counter,
        per_ring(&|i| load(&state.rings[i].drain.header_repairs)),
    );
    e.family(
        "eventd_ring_size_bytes",
        "Bytes of the ring's pages.",
        Kind::Gauge,
        per_ring(&|i| {
            let g = state.rings[i].ring().geometry();
            (g.page_size * g.page_count) as f64
        }),
    );
    e.family(
        "eventd_ring_committed_through_seq",
        "Every sequence number of the ring up to this one is committed or stored as a gap.",
        Kind::Gauge,
        per_ring(&|i| state.rings[i].committed_through() as f64),
    );
}

fn shard_labels(state: &DaemonState) -> Vec<[(&'static str, String); 1]> {
    (0..state.shards.len())
        .map(|j| [("shard", j.to_string())])
        .collect()
}

fn channels(e: &mut Exposition, state: &DaemonState) {
    let labels = shard_labels(state);
    let stats: Vec<_> = state.shards.iter().map(|s| s.channel.stats()).collect();
    let per = |f: &dyn Fn(&crate::channel::ChannelStats) -> u64| -> Vec<(&[(&str, String)], f64)> {
        labels
            .iter()
            .zip(&stats)
            .map(|(l, s)| (&l[..], f(s) as f64))
            .collect()
    };
    e.family(
        "eventd_channel_capacity_slots",
        "Slots of the shard's handoff channel (fixed at start).",
        Kind::Gauge,
        per(&|s| s.capacity.slots as u64),
    );
    e.family(
        "eventd_channel_capacity_bytes",
        "Payload bytes the shard's handoff channel may hold (fixed at start).",
        Kind::Gauge,
        per(&|s| s.capacity.bytes),
    );
    e.family(
        "eventd_channel_occupied_slots",
        "Slots admitted and not yet released by the writer.",
        Kind::Gauge,
        per(&|s| s.occupied_slots),
    );
    e.family(
        "eventd_channel_occupied_bytes",
        "Payload bytes admitted and not yet released by the writer.",
        Kind::Gauge,
        per(&|s| s.occupied_bytes),
    );
    e.family(
        "eventd_channel_full_stalls_total",
        "Times a drain found the channel full and waited (the ring absorbed the backlog).",
        Kind::Counter,
        per(&|s| s.full_stalls),
    );
}

fn shards(e: &mut Exposition, state: &DaemonState) {
    let labels = shard_labels(state);
    let per = |f: &dyn Fn(&crate::store::WriterStats) -> f64| -> Vec<(&[(&str, String)], f64)> {
        labels
            .iter()
            .zip(&state.shards)
            .map(|(l, s)| (&l[..], f(&s.writer)))
            .collect()
    };
    e.family(
        "eventd_shard_commits_total",
        "Transactions committed (events, gaps and receipts together).",
        Kind::Counter,
        per(&|w| load(&w.commits)),
    );
    e.family(
        "eventd_shard_events_total",
        "Event rows committed.",
        Kind::Counter,
        per(&|w| load(&w.events)),
    );
    e.family(
        "eventd_shard_event_bytes_total",
        "Payload bytes (provider, name, message, fields) of the committed events.",
        Kind::Counter,
        per(&|w| load(&w.event_bytes)),
    );
    e.family(
        "eventd_shard_gap_events_total",
        "Lost sequence numbers committed as gap rows.",
        Kind::Counter,
        per(&|w| load(&w.lost)),
    );
    e.family(
        "eventd_shard_commit_errors_total",
        "Commits that failed and were retried.",
        Kind::Counter,
        per(&|w| load(&w.commit_errors)),
    );
    e.family(
        "eventd_shard_checkpoints_total",
        "WAL checkpoints the writer ran (between batches, see docs/design/storage.md).",
        Kind::Counter,
        per(&|w| load(&w.checkpoints)),
    );
    e.family(
        "eventd_shard_checkpoint_seconds_total",
        "Time the writer spent in those checkpoints, syncs included.",
        Kind::Counter,
        per(&|w| load(&w.checkpoint_us) / 1e6),
    );
    let histograms: Vec<_> = state
        .shards
        .iter()
        .map(|s| {
            s.writer
                .histograms
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        })
        .collect();
    e.histogram(
        "eventd_shard_commit_items",
        "Items (events and gaps) per commit.",
        labels
            .iter()
            .zip(&histograms)
            .map(|(l, h)| (&l[..], &h.batch_items_buckets)),
    );
    e.histogram(
        "eventd_shard_commit_seconds",
        "Time each commit's transaction took.",
        labels
            .iter()
            .zip(&histograms)
            .map(|(l, h)| (&l[..], &h.commit_buckets)),
    );
    e.histogram(
        "eventd_shard_emit_to_commit_seconds",
        "From an event's timestamp to the end of the commit that stored it.",
        labels
            .iter()
            .zip(&histograms)
            .map(|(l, h)| (&l[..], &h.latency_buckets)),
    );
}

fn queries(e: &mut Exposition, state: &DaemonState) {
    let q = &state.queries;
    e.single(
        "eventd_queries_running",
        "Query connections holding a slot (queries, follows, reports).",
        Kind::Gauge,
        load(&q.running),
    );
    e.single(
        "eventd_queries_total",
        "Requests accepted: a slot taken and the request understood (reports included).",
        Kind::Counter,
        load(&q.served),
    );
    let reasons = [
        [("reason", "busy".to_string())],
        [("reason", "denied".to_string())],
        [("reason", "bad_request".to_string())],
    ];
    let counts = [&q.refused_busy, &q.refused_denied, &q.refused_bad_request];
    e.family(
        "eventd_queries_refused_total",
        "Requests refused: MaxConcurrentQueries reached, credentials, or not understood.",
        Kind::Counter,
        reasons.iter().zip(counts).map(|(l, c)| (&l[..], load(c))),
    );
    e.single(
        "eventd_queries_failed_total",
        "Queries that failed in the daemon.",
        Kind::Counter,
        load(&q.failed),
    );
}

fn syslog(e: &mut Exposition, state: &DaemonState) {
    let y = &state.syslog;
    for (name, help, value) in [
        (
            "eventd_syslog_received_total",
            "Syslog messages received on the datagram and stream sockets.",
            &y.received,
        ),
        (
            "eventd_syslog_stored_total",
            "Syslog messages written into eventd's own syslog ring (malformed and truncated \
             ones included).",
            &y.stored,
        ),
        (
            "eventd_syslog_dropped_total",
            "Syslog messages received and not kept (the syslog ring stayed full while the \
             store could not commit); recorded as dropped gaps.",
            &y.dropped,
        ),
        (
            "eventd_syslog_malformed_total",
            "Syslog messages stored with parse problems and their raw bytes.",
            &y.malformed,
        ),
        (
            "eventd_syslog_unstructured_total",
            "Syslog messages stored whole as plain text: neither an RFC 5424 nor an RFC 3164 \
             header was found.",
            &y.unstructured,
        ),
        (
            "eventd_syslog_truncated_total",
            "Syslog messages stored cut to fit a ring record or the receive buffer.",
            &y.truncated,
        ),
        (
            "eventd_syslog_emit_failures_total",
            "Syslog messages the ring refused (contended, or lapped while written).",
            &y.emit_failures,
        ),
        (
            "eventd_syslog_ring_waits_total",
            "Times a syslog receiver waited for its ring's drain to make room.",
            &y.ring_waits,
        ),
        (
            "eventd_syslog_receive_calls_total",
            "Receive system calls that returned messages (several messages each under load).",
            &y.receive_calls,
        ),
        (
            "eventd_syslog_receive_errors_total",
            "Receive calls that failed.",
            &y.receive_errors,
        ),
    ] {
        e.single(name, help, Kind::Counter, load(value));
    }
    let reasons = [
        [("reason", "empty".to_string())],
        [("reason", "too_large".to_string())],
        [("reason", "connections".to_string())],
        [("reason", "connection_share".to_string())],
        [("reason", "stopping".to_string())],
    ];
    let counts = [
        &y.rejected_empty,
        &y.rejected_too_large,
        &y.rejected_connections,
        &y.rejected_connections_share,
        &y.rejected_stopping,
    ];
    e.family(
        "eventd_syslog_rejected_total",
        "Syslog messages (or stream connections) refused, by reason.",
        Kind::Counter,
        reasons.iter().zip(counts).map(|(l, c)| (&l[..], load(c))),
    );
}

fn retention(e: &mut Exposition, state: &DaemonState) {
    let r = &state.retention;
    for (name, help, value) in [
        (
            "eventd_retention_passes_total",
            "Retention passes made with a limit set.",
            &r.passes,
        ),
        (
            "eventd_retention_deleted_events_total",
            "Events deleted by retention.",
            &r.events_deleted,
        ),
        (
            "eventd_retention_deleted_event_bytes_total",
            "Payload bytes of the events deleted by retention.",
            &r.event_bytes_deleted,
        ),
        (
            "eventd_retention_deleted_unexported_events_total",
            "Events the size limit forced out before the export stage sent them \
             (each counted in an `unexported` gap row).",
            &r.events_deleted_unexported,
        ),
        (
            "eventd_retention_deleted_gaps_total",
            "Gap rows deleted by retention.",
            &r.gaps_deleted,
        ),
        (
            "eventd_retention_deleted_receipts_total",
            "Receipts of rings that no longer exist deleted by retention.",
            &r.receipts_deleted,
        ),
        (
            "eventd_retention_compacted_receipts_total",
            "Receipts of live rings replaced by summary rows.",
            &r.receipts_compacted,
        ),
        (
            "eventd_retention_vacuumed_pages_total",
            "Database pages given back to the filesystem.",
            &r.pages_vacuumed,
        ),
        (
            "eventd_retention_errors_total",
            "Retention steps that failed (the pass went on with the other shards).",
            &r.errors,
        ),
    ] {
        e.single(name, help, Kind::Counter, load(value));
    }
    e.single(
        "eventd_store_used_bytes",
        "Bytes in database pages in use over the whole store, at the last size check.",
        Kind::Gauge,
        load(&r.store_used_bytes),
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The metric names written as string literals in `text` ("eventd_...").
    fn names_in(text: &str) -> BTreeSet<String> {
        text.split("\"eventd_")
            .skip(1)
            .filter_map(|rest| {
                let name = rest.split('"').next()?;
                let word = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
                let ok = !name.is_empty() && name.chars().all(word);
                ok.then(|| format!("eventd_{name}"))
            })
            .collect()
    }

    #[test]
    fn the_metrics_reference_lists_every_metric() {
        // The files whose functions add families to the exposition.
        let mut code = names_in(include_str!("metrics.rs"));
        code.extend(names_in(include_str!("sources.rs")));
        code.retain(|n| !n.starts_with("eventd_test"));
        assert!(code.contains("eventd_rate_limit_refused_at_source_total"));
        assert!(code.len() > 60, "{code:?}");
        let page = include_str!("../../docs/reference/metrics.md");
        // Its tables' rows: "| `name` | type | labels | meaning |".
        let documented: BTreeSet<String> = page
            .lines()
            .filter_map(|l| l.strip_prefix("| `eventd_"))
            .filter_map(|l| l.split('`').next())
            .map(|n| format!("eventd_{n}"))
            .collect();
        let missing: Vec<_> = code.difference(&documented).collect();
        let stale: Vec<_> = documented.difference(&code).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "docs/reference/metrics.md: missing {missing:?}, not exposed {stale:?}"
        );
    }
}
