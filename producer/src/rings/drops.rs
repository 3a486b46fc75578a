//! Events that never got into a ring, counted and reported into one.
//!
//! eventd's syslog listener drops a message it cannot keep (its ring stays
//! full while the store cannot commit: a full disk) rather than hold every
//! sender on the host. [`Drops`] counts them; the syslog drain writes one
//! report of them into the syslog ring when the ring is idle, an ordinary
//! record with a known provider and name, and turns the report back into a
//! `dropped` gap when it reads it ([`DropReport`]). Only eventd writes the
//! syslog ring (no producer can open it), so only there is such a record a
//! report.
//!
//! The kernel log reader reports kernel records the kernel overwrote
//! before eventd read them the same way, into eventd's kernel ring
//! ([`KernelLoss`]): a record that its drain turns into a
//! `kernel_overwritten` gap.

use super::{Event, Level, LossReason, Ring};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Messages the listeners received and could not put into the syslog ring,
/// since the last report of them. The syslog drain writes the report into
/// the ring when it is idle (so the ring has room): one event that the
/// drain turns into a `dropped` gap whose `lost` is their number.
#[derive(Debug)]
pub struct Drops {
    count: AtomicU64,
    /// Time of the first message dropped since the last report
    /// (`i64::MAX`: none).
    since_ns: AtomicI64,
    /// When a drop was last logged (ms, `sync` clock).
    logged_ms: AtomicU64,
    /// Reports written, and messages they counted.
    pub reports: AtomicU64,
    pub reported: AtomicU64,
}

impl Default for Drops {
    fn default() -> Self {
        Drops {
            count: AtomicU64::new(0),
            since_ns: AtomicI64::new(i64::MAX),
            logged_ms: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            reported: AtomicU64::new(0),
        }
    }
}

/// Drops are logged at most this often.
const DROP_LOG_INTERVAL_MS: u64 = 10_000;
/// The provider and name of a report of dropped messages.
const DROP_PROVIDER: &str = "eventd";
const DROP_NAME: &str = "syslog.dropped";
/// The name of a report of kernel records lost before eventd read them.
const KERNEL_LOSS_NAME: &str = "kernel.overwritten";

impl Drops {
    /// Counts one message dropped at `ts_ns`.
    pub fn add(&self, ts_ns: i64) {
        // Relaxed: counters; the report takes them with a swap.
        let before = self.count.fetch_add(1, Ordering::Relaxed);
        self.since_ns.fetch_min(ts_ns, Ordering::Relaxed);
        let now = crate::sync::monotonic_ms();
        let last = self.logged_ms.load(Ordering::Relaxed);
        if (before == 0 || now.saturating_sub(last) >= DROP_LOG_INTERVAL_MS)
            && self
                .logged_ms
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::error!(
                dropped_pending = before + 1,
                "syslog messages dropped: the syslog ring is full and the store cannot take \
                 them (a full disk?); they are counted and recorded as a gap when it can"
            );
        }
    }

    /// Messages dropped and not reported yet.
    pub fn pending(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Writes the report of the messages dropped since the last one into
    /// `ring`, if there are any; put back if the ring refuses it.
    pub fn report_into(&self, ring: &Ring) {
        let count = self.count.swap(0, Ordering::Relaxed);
        if count == 0 {
            return;
        }
        let since = self.since_ns.swap(i64::MAX, Ordering::Relaxed);
        let fields = serde_json::json!({ "dropped": count, "since_ns": since }).to_string();
        let message =
            format!("{count} syslog messages dropped: the store could not take them in time");
        let event = Event {
            ts_ns: crate::rings::now_ns(),
            pid: std::process::id(),
            tid: 0,
            uid: crate::access::own_uid(),
            level: Level::Warning,
            provider: DROP_PROVIDER,
            name: DROP_NAME,
            message: &message,
            fields: &fields,
        };
        match ring.emit(&event) {
            Ok(()) => {
                self.reports.fetch_add(1, Ordering::Relaxed);
                self.reported.fetch_add(count, Ordering::Relaxed);
                tracing::warn!(
                    dropped = count,
                    "syslog messages dropped while the store could not take them; recorded as a gap"
                );
            }
            Err(_) => {
                self.count.fetch_add(count, Ordering::Relaxed);
                self.since_ns.fetch_min(since, Ordering::Relaxed);
            }
        }
    }
}

/// A report of lost messages or records, read back from one of eventd's
/// own rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropReport {
    pub count: u64,
    pub since_ns: i64,
    /// `Dropped` (syslog messages) or `KernelOverwritten`.
    pub reason: LossReason,
}

impl DropReport {
    /// The report `event` is, if it is one (written by [`Drops`] or as a
    /// [`KernelLoss`]). Only for events of eventd's own rings: anywhere
    /// else such an event is an ordinary one.
    pub fn parse(event: &Event<'_>) -> Option<DropReport> {
        let reason = match (event.provider, event.name) {
            (DROP_PROVIDER, DROP_NAME) => LossReason::Dropped,
            (DROP_PROVIDER, KERNEL_LOSS_NAME) => LossReason::KernelOverwritten,
            _ => return None,
        };
        let v: serde_json::Value = serde_json::from_str(event.fields).ok()?;
        let count = match reason {
            LossReason::Dropped => v.get("dropped")?,
            _ => v.get("lost")?,
        };
        Some(DropReport {
            count: count.as_u64()?,
            since_ns: v.get("since_ns")?.as_i64()?,
            reason,
        })
    }
}

/// Kernel records `from..=to` (the kernel's sequence numbers) that the
/// kernel overwrote before eventd read them, in boot `boot_id`; the last
/// record before them is of `since_ns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLoss<'a> {
    pub from: u64,
    pub to: u64,
    pub since_ns: i64,
    pub boot_id: &'a str,
}

impl KernelLoss<'_> {
    /// The report's record, for eventd's kernel ring, its message and
    /// fields written into `message` and `fields`.
    pub fn event<'b>(&self, message: &'b mut String, fields: &'b mut String) -> Event<'b> {
        let lost = self.to - self.from + 1;
        *message = format!(
            "{lost} kernel log records overwritten by the kernel before eventd read them \
             (kernel sequence numbers {}..={})",
            self.from, self.to
        );
        *fields = serde_json::json!({
            "lost": lost,
            "since_ns": self.since_ns,
            "kernel_seq_from": self.from,
            "kernel_seq_to": self.to,
            "boot_id": self.boot_id,
        })
        .to_string();
        Event {
            ts_ns: crate::rings::now_ns(),
            pid: std::process::id(),
            tid: 0,
            uid: crate::access::own_uid(),
            level: Level::Warning,
            provider: DROP_PROVIDER,
            name: KERNEL_LOSS_NAME,
            message,
            fields,
        }
    }

    /// If `event` is such a report: its boot and the last kernel sequence
    /// number it accounts for.
    pub fn covered(event: &Event<'_>) -> Option<(String, u64)> {
        if event.provider != DROP_PROVIDER || event.name != KERNEL_LOSS_NAME {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(event.fields).ok()?;
        Some((
            v.get("boot_id")?.as_str()?.to_string(),
            v.get("kernel_seq_to")?.as_u64()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_loss_report_reads_back_as_an_exact_gap() {
        let (mut message, mut fields) = (String::new(), String::new());
        let loss = KernelLoss {
            from: 7,
            to: 9,
            since_ns: 55,
            boot_id: "b0",
        };
        let event = loss.event(&mut message, &mut fields);
        assert_eq!(
            DropReport::parse(&event),
            Some(DropReport {
                count: 3,
                since_ns: 55,
                reason: LossReason::KernelOverwritten
            })
        );
        assert_eq!(KernelLoss::covered(&event), Some(("b0".to_string(), 9)));
        let ordinary = Event {
            provider: "kernel",
            ..event
        };
        assert_eq!(DropReport::parse(&ordinary), None);
        assert_eq!(KernelLoss::covered(&ordinary), None);
    }
}
