//! A ring replaced while producers still wrote into it, and the report one
//! of them writes about it.
//!
//! A producer keeps a ring mapped for as long as it runs. If the ring's
//! file is taken from under it while eventd is stopped (moved aside as
//! unusable, or the operator emptied the KMES directory), eventd makes a new
//! ring at that name when it starts, and nothing would ever read the old
//! one: a producer writing into it would be told `Ok` for events that are
//! lost. So producers look at the ring's name now and then (see
//! [`Emitter`](super::Emitter)); the first to find another file there (or
//! none) retires the old ring (the claim is the RETIRED mark: exactly one
//! process wins it), which freezes what it holds, and writes a report into
//! the new ring saying which ring it was and the last sequence number
//! reserved in it. The daemon turns the report into a `ring_lost` gap for
//! the old ring's epoch, covering every sequence number it had not stored
//! (its receipts say which), so that events written into the old ring after
//! eventd last read it are counted, once.
//!
//! The report is an ordinary record (stored as an event of the new ring,
//! which also covers its own sequence number) with a known provider and
//! name; its fields say the rest.

use super::Event;

/// The provider and name of a report.
pub const ORPHAN_PROVIDER: &str = "eventd";
pub const ORPHAN_NAME: &str = "ring.replaced_in_use";

/// What a producer found of a ring taken from under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrphanReport {
    /// The old ring's epoch and CPU.
    pub epoch: u64,
    pub cpu: u32,
    /// The last sequence number reserved in it (its frozen front).
    pub last_seq: u64,
}

impl OrphanReport {
    /// The report's fields (a JSON object's text; written without a JSON
    /// library, as producers have none).
    pub fn fields(&self) -> String {
        format!(
            "{{\"lost_ring_epoch\":\"{:016x}\",\"cpu\":{},\"last_seq\":{}}}",
            self.epoch, self.cpu, self.last_seq
        )
    }

    pub fn message(&self) -> String {
        format!(
            "cpu {}'s ring (epoch {:016x}) was replaced while producers still wrote into it; \
             what eventd had not read of its sequence numbers 1..={} is lost",
            self.cpu, self.epoch, self.last_seq
        )
    }

    /// The report `event` is, if it is one. Only the daemon parses.
    #[cfg(not(loom))]
    pub fn parse(event: &Event<'_>) -> Option<OrphanReport> {
        if event.provider != ORPHAN_PROVIDER || event.name != ORPHAN_NAME {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(event.fields).ok()?;
        Some(OrphanReport {
            epoch: u64::from_str_radix(v.get("lost_ring_epoch")?.as_str()?, 16).ok()?,
            cpu: u32::try_from(v.get("cpu")?.as_u64()?).ok()?,
            last_seq: v.get("last_seq")?.as_u64()?,
        })
    }

    /// The report as an event, with `fields` and `message` from
    /// [`fields`](Self::fields) and [`message`](Self::message).
    pub fn event<'a>(
        &self,
        ts_ns: i64,
        ids: (u32, u32, u32),
        message: &'a str,
        fields: &'a str,
    ) -> Event<'a> {
        let (pid, tid, uid) = ids;
        Event {
            ts_ns,
            pid,
            tid,
            uid,
            level: super::Level::Warning,
            provider: ORPHAN_PROVIDER,
            name: ORPHAN_NAME,
            message,
            fields,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_as_written() {
        let report = OrphanReport {
            epoch: 0xfeed_0000_0000_beef,
            cpu: 7,
            last_seq: 123_456,
        };
        let (message, fields) = (report.message(), report.fields());
        let event = report.event(1, (2, 3, 4), &message, &fields);
        assert_eq!(OrphanReport::parse(&event), Some(report));
        let other = Event {
            name: "something.else",
            ..event
        };
        assert_eq!(OrphanReport::parse(&other), None);
        let broken = Event {
            fields: "{\"cpu\":7}",
            ..event
        };
        assert_eq!(OrphanReport::parse(&broken), None);
    }
}
