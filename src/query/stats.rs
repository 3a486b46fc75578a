//! What the query server counts, for `eventctl stats` and the metrics.

use std::sync::atomic::AtomicU64;

/// What the query server counts, for `eventctl stats` and the metrics.
#[derive(Debug, Default)]
pub struct QueryStats {
    /// Queries (follows included) holding a query slot now: kept by the
    /// slots ([`super::slots`]), under their lock.
    pub running: AtomicU64,
    /// Connections with a thread now (running a query or answering a
    /// report): at most MaxConcurrentQueries +
    /// [`REPORT_CONNECTIONS`](super::server::REPORT_CONNECTIONS).
    /// Connections waiting for their request have none.
    pub connections: AtomicU64,
    /// Requests answered (a slot taken, the request understood). Relaxed,
    /// like the refusals: monitoring only.
    pub served: AtomicU64,
    /// Refused as busy: no query slot for the peer's uid (all taken, its
    /// share held, or the rest kept for root and eventd's own user), every
    /// report thread taken, or cut while waiting for its request (its uid
    /// had too many waiting).
    pub refused_busy: AtomicU64,
    /// Refused because of the peer's credentials.
    pub refused_denied: AtomicU64,
    /// Requests that could not be understood, or did not come in time.
    pub refused_bad_request: AtomicU64,
    /// Queries that failed in the daemon (an unreadable store, say).
    pub failed: AtomicU64,
}
