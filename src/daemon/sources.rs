//! The host's sources beside the rings and the syslog sockets, as the
//! daemon starts, stops and reports them: the kernel log (`KernelLog`,
//! into eventd's kernel ring), the service-output socket (`StdoutSocket`,
//! into the syslog ring), the senders' cache that every socket source
//! shares, and the boot marker stored at each start.

use super::{DaemonError, DaemonState};
use crate::config::Settings;
use crate::kmsg::{KernelLog, KernelParts, KernelStats};
use crate::metrics::{Exposition, Kind};
use crate::rings::{KmesDir, Ring, KERNEL_RING_CPU};
use crate::trusted::Senders;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What these sources share with the rest of the daemon and monitoring.
#[derive(Default)]
pub struct SourceState {
    /// What eventd read of senders in `/proc`, for every socket source.
    pub senders: Arc<Senders>,
    pub kernel: Arc<KernelStats>,
    /// The service-output socket's lines and connections.
    pub stdout: Arc<crate::syslog::SyslogStats>,
}

/// The running sources; stopped (their threads joined) when dropped.
#[derive(Default)]
pub(super) struct Running {
    _kernel: Option<KernelLog>,
    _stdout: Option<crate::stream::StreamListener>,
}

/// eventd's kernel ring, when `KernelLog` is on.
pub(super) fn attach_kernel_ring(
    settings: &Settings,
    kmes: &KmesDir,
) -> Result<Option<Arc<Ring>>, DaemonError> {
    if !settings.kernel_log {
        return Ok(None);
    }
    let mut repairs = Vec::new();
    let ring = kmes.attach_kernel(settings.ring_bytes as usize, &mut repairs);
    for repair in &repairs {
        tracing::warn!(repair = %repair, "kernel ring mended at attach");
    }
    Ok(Some(Arc::new(ring?)))
}

/// Stores the boot marker, then starts the kernel log reader and the
/// service-output socket (`passed`: the one the service manager made).
pub(super) fn start(
    settings: &Settings,
    state: &DaemonState,
    passed: Option<crate::syslog::Passed<std::os::unix::net::UnixListener>>,
) -> Result<Running, DaemonError> {
    store_boot_marker(state);
    let mut running = Running::default();
    let syslog_ring = ring_of(state, crate::rings::SYSLOG_RING_CPU);
    if let (Some(path), Some(ring)) = (&settings.stdout_socket, syslog_ring) {
        let parts = crate::syslog::IngestParts {
            ring,
            store_failing: state.failing_writers.clone(),
            drops: state.syslog_drops.clone(),
            senders: state.sources.senders.clone(),
        };
        running._stdout = Some(crate::stream::StreamListener::start(
            path,
            passed.map(|p| p.socket),
            parts,
            state.sources.stdout.clone(),
        )?);
    }
    if let Some(ring) = ring_of(state, KERNEL_RING_CPU) {
        running._kernel = KernelLog::start(KernelParts {
            ring,
            run_dir: settings.run_dir.clone(),
            stats: state.sources.kernel.clone(),
        });
    }
    Ok(running)
}

/// Where the daemon finds one of its own rings now.
fn ring_of(state: &DaemonState, cpu: u32) -> Option<Arc<crate::rings::CurrentRing>> {
    state
        .rings
        .iter()
        .find(|r| r.ring().cpu() == cpu)
        .map(|r| r.current.clone())
}

/// One event per start (provider `eventd`, name `boot`) in eventd's syslog
/// ring, or its kernel ring when it has no syslog ring: queries list
/// boots and take a boot's time range from them.
fn store_boot_marker(state: &DaemonState) {
    let own =
        ring_of(state, crate::rings::SYSLOG_RING_CPU).or_else(|| ring_of(state, KERNEL_RING_CPU));
    let Some(ring) = own else {
        tracing::info!("no ring of eventd's own (no socket, no KernelLog): no boot marker stored");
        return;
    };
    if let Err(e) = crate::trusted::boot::write_marker(&ring.get()) {
        tracing::warn!(error = %e, "the boot marker was not stored");
    }
}

/// `eventctl stats`: the service-output socket, the kernel log and the
/// senders' cache.
pub(super) fn report(state: &DaemonState) -> (Value, Value, Value) {
    let o = &state.sources.stdout;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let stdout = json!({
        "lines": load(&o.received),
        "stored": load(&o.stored),
        "truncated": load(&o.truncated),
        "dropped": load(&o.dropped),
        "ring_waits": load(&o.ring_waits),
        "rejected_connections": load(&o.rejected_connections),
        "rejected_connections_share": load(&o.rejected_connections_share),
        "rejected_stopping": load(&o.rejected_stopping),
        "emit_failures": load(&o.emit_failures),
    });
    let k = &state.sources.kernel;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let kernel = json!({
        "state": k.state_name(),
        "read": get(&k.read),
        "stored": get(&k.stored),
        "skipped": get(&k.skipped),
        "lost": get(&k.lost),
        "loss_reports": get(&k.loss_reports),
        "epipe": get(&k.epipe),
        "malformed": get(&k.malformed),
        "emit_failures": get(&k.emit_failures),
        "ring_waits": get(&k.ring_waits),
        "read_errors": get(&k.read_errors),
        "backlog": get(&k.backlog),
        "next_seq": get(&k.next_seq),
    });
    let s = &state.sources.senders;
    let senders = json!({
        "entries": s.len(),
        "hits": get(&s.stats.hits),
        "reads": get(&s.stats.reads),
        "reused": get(&s.stats.reused),
        "gone": get(&s.stats.gone),
        "flushes": get(&s.stats.flushes),
    });
    (stdout, kernel, senders)
}

/// The Prometheus families of these sources.
pub(super) fn metrics(e: &mut Exposition, state: &DaemonState) {
    let k = &state.sources.kernel;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    for (name, help, value) in [
        (
            "eventd_kernel_records_read_total",
            "Kernel log records read from /dev/kmsg (those already stored included).",
            &k.read,
        ),
        (
            "eventd_kernel_records_stored_total",
            "Kernel log records written into eventd's kernel ring.",
            &k.stored,
        ),
        (
            "eventd_kernel_records_lost_total",
            "Kernel log records the kernel overwrote before eventd read them (stored as \
             kernel_overwritten gaps).",
            &k.lost,
        ),
        (
            "eventd_kernel_ring_waits_total",
            "Times the kernel log reader waited for its ring's drain to make room.",
            &k.ring_waits,
        ),
        (
            "eventd_stdout_lines_total",
            "Lines received on the service output socket.",
            &state.sources.stdout.received,
        ),
        (
            "eventd_stdout_stored_total",
            "Lines of service output written into eventd's syslog ring.",
            &state.sources.stdout.stored,
        ),
    ] {
        e.single(name, help, Kind::Counter, load(value));
    }
    let s = &state.sources.senders.stats;
    e.family(
        "eventd_sender_lookups_total",
        "Lookups of a sender's /proc facts, by outcome (hit: from the cache; read: /proc \
         read; gone: the process had exited and was not known).",
        Kind::Counter,
        [
            ([("outcome", "hit".to_string())], load(&s.hits)),
            ([("outcome", "read".to_string())], load(&s.reads)),
            ([("outcome", "gone".to_string())], load(&s.gone)),
        ]
        .iter()
        .map(|(l, v)| (&l[..], *v)),
    );
}
