//! What a drain thread hands a shard writer through the channel: a fixed
//! [`Handoff`] header and, for an event, its strings packed back to back.

use crate::rings::{Event, Gap, Level, LossReason, ReadPosition};

/// The header beside each payload in a shard writer's channel.
///
/// Every item covers the ring sequence numbers `first_seq..=last_seq` (one
/// for an event, the whole range for a gap) and carries the reader position
/// after it, which becomes the receipt's resume position when the item is
/// the last of a committed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Handoff {
    /// Dense ordinal of the ring (index into the daemon's ring table).
    pub ring: u32,
    /// Logical CPU id of the ring.
    pub cpu: u32,
    pub ring_epoch: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    /// For a gap: the events it stands for (`last_seq - first_seq + 1`, or,
    /// for messages dropped before they reached a ring, their number).
    pub lost: u64,
    /// Reader position after this item ([`ReadPosition::position_word`]).
    pub position: u64,
    /// Sequence number expected after this item.
    pub next_seq: u64,
    /// Event timestamp; for a gap, the timestamp of the last event before it.
    pub ts_ns: i64,
    pub pid: u32,
    pub tid: u32,
    pub uid: u32,
    pub kind: Kind,
    /// Syslog level of an event.
    pub level: u8,
    pub provider_len: u8,
    pub name_len: u8,
    pub message_len: u32,
}

/// What a channel item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    #[default]
    Event,
    Gap(LossReason),
    /// Not ring data: the retention coordinator has left a request in the
    /// writer's [`WriterControl`](crate::store::retention::WriterControl) and wakes
    /// the writer with this item (it carries no sequence numbers).
    Control,
}

impl Handoff {
    /// The header of `event`, read at `seq`; the payload is `payload_len`.
    pub fn event(ring: u32, cpu: u32, ring_epoch: u64, seq: u64, event: &Event<'_>) -> Self {
        Handoff {
            ring,
            cpu,
            ring_epoch,
            first_seq: seq,
            last_seq: seq,
            lost: 0,
            position: 0,
            next_seq: seq + 1,
            ts_ns: event.ts_ns,
            pid: event.pid,
            tid: event.tid,
            uid: event.uid,
            kind: Kind::Event,
            level: event.level as u8,
            // Casts: the ring format limits provider and name to 255 bytes,
            // and a whole record to one page (at most 32 KiB).
            provider_len: event.provider.len() as u8,
            name_len: event.name.len() as u8,
            message_len: event.message.len() as u32,
        }
    }

    /// The header of a gap; `last_ts_ns` is the timestamp of the ring's last
    /// event before it (0 if none was seen).
    pub fn gap(ring: u32, cpu: u32, ring_epoch: u64, gap: Gap, last_ts_ns: i64) -> Self {
        Handoff {
            ring,
            cpu,
            ring_epoch,
            first_seq: gap.from_seq,
            last_seq: gap.to_seq,
            lost: gap.count(),
            position: 0,
            next_seq: gap.to_seq + 1,
            ts_ns: last_ts_ns,
            kind: Kind::Gap(gap.reason),
            ..Handoff::default()
        }
    }

    /// The header of a report of `count` messages dropped before they
    /// reached a ring, or kernel records overwritten before eventd read
    /// them (`reason`; the report itself took sequence number `seq`), the
    /// first of them at `since_ns`.
    pub fn dropped(
        ring: u32,
        cpu: u32,
        ring_epoch: u64,
        seq: u64,
        report: crate::rings::drops::DropReport,
    ) -> Self {
        let (count, since_ns) = (report.count, report.since_ns);
        Handoff {
            ring,
            cpu,
            ring_epoch,
            first_seq: seq,
            last_seq: seq,
            lost: count,
            position: 0,
            next_seq: seq + 1,
            ts_ns: since_ns,
            kind: Kind::Gap(report.reason),
            ..Handoff::default()
        }
    }

    /// Sets the resume position after this item.
    pub fn after(mut self, position: ReadPosition) -> Self {
        self.position = position.position_word();
        self.next_seq = position.next_seq;
        self
    }

    pub fn level(&self) -> Level {
        Level::from_u8(self.level).unwrap_or(Level::Info)
    }
}

/// Payload bytes of `event`: provider, name, message, fields.
pub fn payload_len(event: &Event<'_>) -> usize {
    event.payload_len()
}

/// Writes `event`'s strings into `buf` (exactly [`payload_len`] bytes).
pub fn write_payload(event: &Event<'_>, buf: &mut [u8]) {
    let mut at = 0;
    for part in [event.provider, event.name, event.message, event.fields] {
        buf[at..at + part.len()].copy_from_slice(part.as_bytes());
        at += part.len();
    }
}

/// The four strings of an event payload, split by the header's lengths.
/// `None` if the lengths do not fit or a part is not UTF-8 (neither can
/// happen for payloads written by [`write_payload`] from a valid event).
pub fn split_payload<'a>(h: &Handoff, payload: &'a [u8]) -> Option<[&'a str; 4]> {
    let p = usize::from(h.provider_len);
    let n = usize::from(h.name_len);
    let m = h.message_len as usize;
    let fields_at = p.checked_add(n)?.checked_add(m)?;
    if fields_at > payload.len() {
        return None;
    }
    let s = |a: usize, b: usize| std::str::from_utf8(&payload[a..b]).ok();
    Some([
        s(0, p)?,
        s(p, p + n)?,
        s(p + n, fields_at)?,
        s(fields_at, payload.len())?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips() {
        let e = Event {
            ts_ns: 5,
            pid: 1,
            tid: 2,
            uid: 3,
            level: Level::Warning,
            provider: "kernel",
            name: "oom",
            message: "killed process 42 ✓",
            fields: r#"{"pid":42}"#,
        };
        let h = Handoff::event(0, 3, 9, 77, &e);
        let mut buf = vec![0u8; payload_len(&e)];
        write_payload(&e, &mut buf);
        assert_eq!(
            split_payload(&h, &buf),
            Some(["kernel", "oom", "killed process 42 ✓", r#"{"pid":42}"#])
        );
        assert_eq!(h.level(), Level::Warning);
        assert_eq!(split_payload(&h, &buf[..5]), None);
    }
}
