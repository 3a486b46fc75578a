//! The ClickHouse tables' columns and the two wire formats rows travel in:
//! RowBinary (what the export stage sends, the measured choice, see
//! perf/runs/notebook.md#a-raw-reader-2026-12-02-night) and JSONEachRow (kept
//! for the comparison and for people reading a batch). One place owns the
//! column order of both ClickHouse tables; `packaging/clickhouse/schema.sql`
//! declares them.
//!
//! A batch is a pure function of its rows: the same rows always encode to
//! the same bytes, which is what lets ClickHouse recognise a resent block
//! (its deduplication hashes the block's data).

use crate::store::rows::{EventRow, EventView, GapRow};

/// The columns of `events` in ClickHouse, in the order batches carry them.
pub const EVENT_COLUMNS: &str = "host, source, source_id, ts, cpu, seq, ring_epoch, pid, tid, \
     uid, level, provider, name, message, fields";

/// The columns of `gaps` in ClickHouse, in the order batches carry them.
pub const GAP_COLUMNS: &str = "host, source, source_id, ring_epoch, cpu, from_seq, to_seq, lost, \
     reason, ts_before, detected_at";

/// The columns a fleet query reads back from `events`, in [`EventRow`]'s
/// order after the host.
pub const EVENT_READ_COLUMNS: &str =
    "host, ts, cpu, seq, ring_epoch, pid, tid, uid, level, provider, name, message, fields";

/// The columns a fleet query reads back from `gaps`, in [`GapRow`]'s order
/// after the host.
pub const GAP_READ_COLUMNS: &str =
    "host, ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, detected_at";

/// How a batch is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    RowBinary,
    JsonEachRow,
}

impl Format {
    /// The name ClickHouse knows it by.
    pub fn name(self) -> &'static str {
        match self {
            Format::RowBinary => "RowBinary",
            Format::JsonEachRow => "JSONEachRow",
        }
    }
}

/// Who a row comes from: the host, the shard instance, the row's id there.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub host: &'a str,
    pub source: &'a str,
    pub id: i64,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn origin(out: &mut Vec<u8>, o: &Origin<'_>) {
    string(out, o.host);
    string(out, o.source);
    out.extend_from_slice(&(o.id as u64).to_le_bytes());
}

/// Appends one event in RowBinary ([`EVENT_COLUMNS`]; no fields is "").
pub fn event_row_binary(out: &mut Vec<u8>, o: &Origin<'_>, e: &EventView<'_>) {
    origin(out, o);
    out.extend_from_slice(&e.ts.to_le_bytes());
    out.extend_from_slice(&e.cpu.to_le_bytes());
    out.extend_from_slice(&e.seq.to_le_bytes());
    out.extend_from_slice(&e.ring_epoch.to_le_bytes());
    out.extend_from_slice(&e.pid.to_le_bytes());
    out.extend_from_slice(&e.tid.to_le_bytes());
    out.extend_from_slice(&e.uid.to_le_bytes());
    out.push(e.level);
    string(out, e.provider);
    string(out, e.name);
    string(out, e.message);
    string(out, e.fields.unwrap_or(""));
}

/// Appends one gap in RowBinary ([`GAP_COLUMNS`]).
pub fn gap_row_binary(out: &mut Vec<u8>, o: &Origin<'_>, g: &GapRow) {
    origin(out, o);
    out.extend_from_slice(&g.ring_epoch.to_le_bytes());
    out.extend_from_slice(&g.cpu.to_le_bytes());
    out.extend_from_slice(&g.from_seq.to_le_bytes());
    out.extend_from_slice(&g.to_seq.to_le_bytes());
    out.extend_from_slice(&g.lost.to_le_bytes());
    string(out, &g.reason);
    out.extend_from_slice(&g.ts_before.to_le_bytes());
    out.extend_from_slice(&g.detected_at.to_le_bytes());
}

/// One event's JSONEachRow line: its keys in alphabetical order, as a
/// `serde_json::Value` object writes them (the bytes batches have always
/// had), from borrowed columns without building a map per row.
#[derive(serde::Serialize)]
struct EventLine<'a> {
    cpu: u32,
    fields: &'a str,
    host: &'a str,
    level: u8,
    message: &'a str,
    name: &'a str,
    pid: u32,
    provider: &'a str,
    ring_epoch: i64,
    seq: u64,
    source: &'a str,
    source_id: i64,
    tid: u32,
    ts: i64,
    uid: u32,
}

/// Appends one event as a JSONEachRow line.
pub fn event_json(out: &mut Vec<u8>, o: &Origin<'_>, e: &EventView<'_>) {
    let line = EventLine {
        cpu: e.cpu,
        fields: e.fields.unwrap_or(""),
        host: o.host,
        level: e.level,
        message: e.message,
        name: e.name,
        pid: e.pid,
        provider: e.provider,
        ring_epoch: e.ring_epoch,
        seq: e.seq,
        source: o.source,
        source_id: o.id,
        tid: e.tid,
        ts: e.ts,
        uid: e.uid,
    };
    // Numbers and strings into a Vec: serializing cannot fail.
    let _ = serde_json::to_writer(&mut *out, &line);
    out.push(b'\n');
}

/// Appends one gap as a JSONEachRow line.
pub fn gap_json(out: &mut Vec<u8>, o: &Origin<'_>, g: &GapRow) {
    let line = serde_json::json!({
        "host": o.host, "source": o.source, "source_id": o.id,
        "ring_epoch": g.ring_epoch, "cpu": g.cpu, "from_seq": g.from_seq,
        "to_seq": g.to_seq, "lost": g.lost, "reason": g.reason,
        "ts_before": g.ts_before, "detected_at": g.detected_at,
    });
    out.extend_from_slice(line.to_string().as_bytes());
    out.push(b'\n');
}

/// A RowBinary result the server sent did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a RowBinary result from ClickHouse ends or breaks at byte {offset}: {what}")]
pub struct DecodeError {
    pub offset: usize,
    pub what: &'static str,
}

/// Reads RowBinary values off a result body, every length checked.
pub struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, at: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.at >= self.data.len()
    }

    fn fail<T>(&self, what: &'static str) -> Result<T, DecodeError> {
        Err(DecodeError {
            offset: self.at,
            what,
        })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        match self.data.get(self.at..self.at.saturating_add(n)) {
            Some(s) if self.at.checked_add(n).is_some() => {
                self.at += n;
                Ok(s)
            }
            _ => self.fail("truncated value"),
        }
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.fixed::<1>()?[0])
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.fixed()?))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.fixed()?))
    }
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.fixed()?))
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        self.fail("a length longer than 64 bits")
    }

    pub fn string(&mut self) -> Result<String, DecodeError> {
        let len = self.varint()?;
        let len = usize::try_from(len).or_else(|_| self.fail("a length beyond memory"))?;
        let bytes = self.take(len)?;
        // Producers' text was valid UTF-8 when stored; anything else is
        // shown, not refused.
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// One row of [`EVENT_READ_COLUMNS`].
    pub fn event(&mut self) -> Result<(String, EventRow), DecodeError> {
        let host = self.string()?;
        let row = EventRow {
            ts: self.i64()?,
            cpu: self.u32()?,
            seq: self.u64()?,
            ring_epoch: self.i64()?,
            pid: self.u32()?,
            tid: self.u32()?,
            uid: self.u32()?,
            level: self.u8()?,
            provider: self.string()?,
            name: self.string()?,
            message: self.string()?,
            fields: Some(self.string()?).filter(|f| !f.is_empty()),
        };
        Ok((host, row))
    }

    /// One row of [`GAP_READ_COLUMNS`].
    pub fn gap(&mut self) -> Result<(String, GapRow), DecodeError> {
        let host = self.string()?;
        let row = GapRow {
            ring_epoch: self.i64()?,
            cpu: self.u32()?,
            from_seq: self.u64()?,
            to_seq: self.u64()?,
            lost: self.u64()?,
            reason: self.string()?,
            ts_before: self.i64()?,
            detected_at: self.i64()?,
        };
        Ok((host, row))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> EventRow {
        EventRow {
            ts: 1_700_000_000_123_456_789,
            cpu: 3,
            seq: 99,
            ring_epoch: -5,
            pid: 10,
            tid: 11,
            uid: 1000,
            level: 3,
            provider: "backup".into(),
            name: "done".into(),
            message: "x".repeat(200),
            fields: Some(r#"{"k":"v"}"#.into()),
        }
    }

    #[test]
    fn row_binary_reads_back_what_was_written_less_the_origin() {
        let o = Origin {
            host: "web-1",
            source: "0123456789abcdef",
            id: 42,
        };
        let mut out = Vec::new();
        event_row_binary(&mut out, &o, &event().view());
        // The read columns skip source and source_id: drop them here.
        let mut r = Reader::new(&out);
        assert_eq!(r.string().unwrap(), "web-1");
        assert_eq!(r.string().unwrap(), "0123456789abcdef");
        assert_eq!(r.u64().unwrap(), 42);
        let rest = &out[out.len() - (out.len() - r.at)..];
        let mut with_host = Vec::new();
        string(&mut with_host, "web-1");
        with_host.extend_from_slice(rest);
        let (host, back) = Reader::new(&with_host).event().unwrap();
        assert_eq!((host.as_str(), back), ("web-1", event()));
        // Deterministic: the same rows, the same bytes.
        let mut again = Vec::new();
        event_row_binary(&mut again, &o, &event().view());
        assert_eq!(out, again);
    }

    #[test]
    fn a_truncated_or_hostile_result_is_an_error_not_a_panic() {
        let mut out = Vec::new();
        string(&mut out, "h");
        out.extend_from_slice(&[0u8; 30]);
        for cut in 0..out.len() {
            assert!(Reader::new(&out[..cut]).event().is_err(), "cut {cut}");
        }
        // A length of 2^63 bytes.
        let hostile = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        assert!(Reader::new(&hostile).string().is_err());
        let endless = [0xffu8; 20];
        assert!(Reader::new(&endless).string().is_err());
    }

    #[test]
    fn json_lines_carry_every_column() {
        let o = Origin {
            host: "h",
            source: "s",
            id: 7,
        };
        let mut out = Vec::new();
        event_json(&mut out, &o, &event().view());
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let names: Vec<&str> = EVENT_COLUMNS.split(", ").collect();
        assert_eq!(v.as_object().unwrap().len(), names.len());
        for n in names {
            assert!(v.get(n).is_some(), "{n}");
        }
        // The same bytes as a JSON object of the columns writes (what
        // batches held before the borrowed encoder): a batch resent by a
        // newer eventd is still the same block.
        let e = event();
        let object = serde_json::json!({
            "host": o.host, "source": o.source, "source_id": o.id,
            "ts": e.ts, "cpu": e.cpu, "seq": e.seq, "ring_epoch": e.ring_epoch,
            "pid": e.pid, "tid": e.tid, "uid": e.uid, "level": e.level,
            "provider": e.provider, "name": e.name, "message": e.message,
            "fields": e.fields.as_deref().unwrap_or(""),
        });
        assert_eq!(out, format!("{object}\n").into_bytes());
        let gap = GapRow {
            ring_epoch: 1,
            cpu: 0,
            from_seq: 2,
            to_seq: 3,
            lost: 2,
            reason: "overwritten".into(),
            ts_before: 5,
            detected_at: 6,
        };
        let mut out = Vec::new();
        gap_json(&mut out, &o, &gap);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v.as_object().unwrap().len(),
            GAP_COLUMNS.split(", ").count()
        );
    }
}
