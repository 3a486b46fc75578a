//! The row shapes of the shard tables, in one place: the column lists, the
//! statements that write rows, and the row types with their conversions.
//! Every other module names columns through here, so adding a column is
//! this file plus a migration (`schema.rs`). The tables themselves are
//! described in `docs/design/storage.md`.

use rusqlite::{params, Row, Statement};
use serde::{Deserialize, Serialize};

/// The `events` columns every reader selects, in [`EventRow`]'s order.
pub const EVENT_COLUMNS: &str =
    "ts, cpu, seq, ring_epoch, pid, tid, uid, level, provider, name, message, fields";

/// The statement that stores one event (the load harness's ceiling runs the
/// same one); parameters in [`EVENT_COLUMNS`] order.
pub const INSERT_EVENT: &str = "INSERT INTO events (ts, cpu, seq, ring_epoch, pid, tid, uid, \
     level, provider, name, message, fields) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";

/// The `gaps` columns readers select, in [`GapRow`]'s order.
pub const GAP_COLUMNS: &str =
    "ring_epoch, cpu, from_seq, to_seq, lost, reason, ts_before, detected_at";

/// The statement that stores one gap; parameters in [`GAP_COLUMNS`] order.
pub const INSERT_GAP: &str = "INSERT INTO gaps (ring_epoch, cpu, from_seq, to_seq, lost, reason, \
     ts_before, detected_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// The `receipts` columns, in [`Receipt`]'s order.
pub const RECEIPT_COLUMNS: &str =
    "ring_epoch, cpu, first_seq, last_seq, position, next_seq, committed_through, committed_at";

/// The statement that stores one receipt; parameters in
/// [`RECEIPT_COLUMNS`] order.
pub const INSERT_RECEIPT: &str = "INSERT INTO receipts (ring_epoch, cpu, first_seq, last_seq, \
     position, next_seq, committed_through, committed_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// Where a page ended: the sort key of its last event. The next page starts
/// strictly after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cursor {
    pub ts: i64,
    pub cpu: u32,
    pub seq: u64,
    pub ring_epoch: i64,
}

impl Cursor {
    /// The cursor as an opaque token for the command line.
    pub fn token(&self) -> String {
        format!("{}.{}.{}.{}", self.ts, self.cpu, self.seq, self.ring_epoch)
    }

    pub fn parse(token: &str) -> Option<Cursor> {
        let mut parts = token.split('.');
        let cursor = Cursor {
            ts: parts.next()?.parse().ok()?,
            cpu: parts.next()?.parse().ok()?,
            seq: parts.next()?.parse().ok()?,
            ring_epoch: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(cursor)
    }
}

/// Where a page's gaps ended: the sort key of its last gap row. Gaps are
/// listed in `(detected_at, cpu, from_seq, ring_epoch)` order (newest first
/// with [`Order::NewestFirst`]), and the next page's gaps start strictly
/// after this key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GapCursor {
    pub detected_at: i64,
    pub cpu: u32,
    pub from_seq: u64,
    pub ring_epoch: i64,
}

impl GapCursor {
    /// The gap cursor as four numbers joined by dots, like [`Cursor::token`].
    pub fn token(&self) -> String {
        format!(
            "{}.{}.{}.{}",
            self.detected_at, self.cpu, self.from_seq, self.ring_epoch
        )
    }

    pub fn parse(token: &str) -> Option<GapCursor> {
        let c = Cursor::parse(token)?;
        Some(GapCursor {
            detected_at: c.ts,
            cpu: c.cpu,
            from_seq: c.seq,
            ring_epoch: c.ring_epoch,
        })
    }
}

/// One stored event, as queries return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRow {
    pub ts: i64,
    pub cpu: u32,
    pub seq: u64,
    pub ring_epoch: i64,
    pub pid: u32,
    pub tid: u32,
    pub uid: u32,
    pub level: u8,
    pub provider: String,
    pub name: String,
    pub message: String,
    /// JSON object text, or absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<String>,
}

impl EventRow {
    pub fn cursor(&self) -> Cursor {
        Cursor {
            ts: self.ts,
            cpu: self.cpu,
            seq: self.seq,
            ring_epoch: self.ring_epoch,
        }
    }

    /// The row `r` of a statement selecting [`EVENT_COLUMNS`] (first).
    pub fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRow> {
        EventView::from_row(r).map(|v| v.to_row())
    }

    /// The event's columns, borrowed.
    pub fn view(&self) -> EventView<'_> {
        EventView {
            ts: self.ts,
            cpu: self.cpu,
            seq: self.seq,
            ring_epoch: self.ring_epoch,
            pid: self.pid,
            tid: self.tid,
            uid: self.uid,
            level: self.level,
            provider: &self.provider,
            name: &self.name,
            message: &self.message,
            fields: self.fields.as_deref(),
        }
    }
}

/// The current row of a statement, column by column: rusqlite's [`Row`], or
/// the export's [`RawSelect`](super::raw_select::RawSelect). Both check
/// the column's type (an integer is `INTEGER`, text is `TEXT` or `NULL`)
/// and that text is UTF-8.
pub trait Columns<'a> {
    /// An `INTEGER` column.
    fn int(&self, i: usize) -> rusqlite::Result<i64>;
    /// A `TEXT` column, `None` for `NULL`; borrowed for as long as the row.
    fn text(&self, i: usize) -> rusqlite::Result<Option<&'a str>>;
    /// The column's name, for errors.
    fn name(&self, i: usize) -> String;
}

impl<'a> Columns<'a> for &'a Row<'_> {
    fn int(&self, i: usize) -> rusqlite::Result<i64> {
        self.get(i)
    }

    fn text(&self, i: usize) -> rusqlite::Result<Option<&'a str>> {
        let v = self.get_ref(i)?;
        match v {
            rusqlite::types::ValueRef::Null => Ok(None),
            rusqlite::types::ValueRef::Text(t) => std::str::from_utf8(t)
                .map(Some)
                .map_err(|e| rusqlite::Error::Utf8Error(i, e)),
            other => Err(rusqlite::Error::InvalidColumnType(
                i,
                self.name(i),
                other.data_type(),
            )),
        }
    }

    fn name(&self, i: usize) -> String {
        self.as_ref().column_name(i).unwrap_or("?").to_string()
    }
}

/// An integer column that must fit `T` (a cpu, pid, level...).
fn narrow<'a, T: TryFrom<i64>>(c: &impl Columns<'a>, i: usize) -> rusqlite::Result<T> {
    let v = c.int(i)?;
    T::try_from(v).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(i, v))
}

/// One stored event with its strings borrowed, from a statement's row or
/// an [`EventRow`]: what the export stage encodes batches from, without a
/// copy of each row's strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventView<'a> {
    pub ts: i64,
    pub cpu: u32,
    pub seq: u64,
    pub ring_epoch: i64,
    pub pid: u32,
    pub tid: u32,
    pub uid: u32,
    pub level: u8,
    pub provider: &'a str,
    pub name: &'a str,
    pub message: &'a str,
    pub fields: Option<&'a str>,
}

impl<'a> EventView<'a> {
    /// The row `r` of a statement selecting [`EVENT_COLUMNS`] (first), its
    /// strings borrowed from the statement.
    pub fn from_row(r: &'a Row<'_>) -> rusqlite::Result<EventView<'a>> {
        EventView::from_columns(r)
    }

    /// The current row of any reader of a statement selecting
    /// [`EVENT_COLUMNS`] (first): a text column holding something else, or
    /// an integer out of its field's range, is an error naming the column.
    pub fn from_columns<C: Columns<'a>>(c: C) -> rusqlite::Result<EventView<'a>> {
        let required = |i: usize| -> rusqlite::Result<&'a str> {
            c.text(i)?.ok_or_else(|| {
                rusqlite::Error::InvalidColumnType(i, c.name(i), rusqlite::types::Type::Null)
            })
        };
        Ok(EventView {
            ts: c.int(0)?,
            cpu: narrow(&c, 1)?,
            seq: c.int(2)? as u64,
            ring_epoch: c.int(3)?,
            pid: narrow(&c, 4)?,
            tid: narrow(&c, 5)?,
            uid: narrow(&c, 6)?,
            level: narrow(&c, 7)?,
            provider: required(8)?,
            name: required(9)?,
            message: required(10)?,
            fields: c.text(11)?,
        })
    }

    /// The event with its strings copied.
    pub fn to_row(&self) -> EventRow {
        EventRow {
            ts: self.ts,
            cpu: self.cpu,
            seq: self.seq,
            ring_epoch: self.ring_epoch,
            pid: self.pid,
            tid: self.tid,
            uid: self.uid,
            level: self.level,
            provider: self.provider.to_string(),
            name: self.name.to_string(),
            message: self.message.to_string(),
            fields: self.fields.map(str::to_string),
        }
    }
}

/// Sequence numbers lost, as stored by the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GapRow {
    pub ring_epoch: i64,
    pub cpu: u32,
    pub from_seq: u64,
    pub to_seq: u64,
    pub lost: u64,
    pub reason: String,
    /// Last event seen before the gap (0 if none) and when it was found: the
    /// lost events lie between.
    pub ts_before: i64,
    pub detected_at: i64,
}

impl GapRow {
    pub fn cursor(&self) -> GapCursor {
        GapCursor {
            detected_at: self.detected_at,
            cpu: self.cpu,
            from_seq: self.from_seq,
            ring_epoch: self.ring_epoch,
        }
    }

    /// The row `r` of a statement selecting [`GAP_COLUMNS`] (first).
    pub fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<GapRow> {
        Ok(GapRow {
            ring_epoch: r.get(0)?,
            cpu: r.get(1)?,
            from_seq: r.get::<_, i64>(2)? as u64,
            to_seq: r.get::<_, i64>(3)? as u64,
            lost: r.get::<_, i64>(4)? as u64,
            reason: r.get(5)?,
            ts_before: r.get(6)?,
            detected_at: r.get(7)?,
        })
    }
}

/// An event about to be stored (borrowed from the writer's batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewEvent<'a> {
    pub ts: i64,
    pub cpu: u32,
    pub seq: u64,
    pub ring_epoch: u64,
    pub pid: u32,
    pub tid: u32,
    pub uid: u32,
    pub level: u8,
    pub provider: &'a str,
    pub name: &'a str,
    pub message: &'a str,
    /// The JSON object text, or `None`.
    pub fields: Option<&'a str>,
}

impl NewEvent<'_> {
    /// Runs `stmt` (prepared from [`INSERT_EVENT`]) for this event.
    pub fn insert(&self, stmt: &mut Statement<'_>) -> rusqlite::Result<()> {
        stmt.execute(params![
            self.ts,
            self.cpu,
            self.seq as i64,
            self.ring_epoch as i64,
            self.pid,
            self.tid,
            self.uid,
            self.level,
            self.provider,
            self.name,
            self.message,
            self.fields,
        ])?;
        Ok(())
    }

    /// Bytes of its text columns as stored.
    pub fn payload_bytes(&self) -> u64 {
        (self.provider.len()
            + self.name.len()
            + self.message.len()
            + self.fields.map_or(0, str::len)) as u64
    }
}

/// How many columns [`EVENT_COLUMNS`] names: a statement that selects more
/// after them finds the first extra one at this index.
pub const EVENT_COLUMN_COUNT: usize = 12;

/// A gap about to be stored (the writer's view: the ring's epoch as the
/// ring has it, unsigned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewGap<'a> {
    pub ring_epoch: u64,
    pub cpu: u32,
    pub from_seq: u64,
    pub to_seq: u64,
    pub lost: u64,
    pub reason: &'a str,
    pub ts_before: i64,
    pub detected_at: i64,
}

impl NewGap<'_> {
    /// Runs `stmt` (prepared from [`INSERT_GAP`]) for this gap.
    pub fn insert(&self, stmt: &mut Statement<'_>) -> rusqlite::Result<()> {
        stmt.execute(params![
            self.ring_epoch as i64,
            self.cpu,
            self.from_seq as i64,
            self.to_seq as i64,
            self.lost as i64,
            self.reason,
            self.ts_before,
            self.detected_at,
        ])?;
        Ok(())
    }
}

/// One receipt: a contiguous run of one ring epoch's sequence numbers
/// committed in one transaction, the reader position just after it, and
/// the ring's commit watermark as it was before that commit (see
/// `docs/design/storage.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    pub ring_epoch: u64,
    pub cpu: u32,
    pub first_seq: u64,
    pub last_seq: u64,
    /// Reader position after `last_seq` (`ReadPosition::position_word`).
    pub position: u64,
    pub next_seq: u64,
    pub committed_through: u64,
    /// When the commit began, ns since the Unix epoch.
    pub committed_at: i64,
}

impl Receipt {
    /// Runs `stmt` (prepared from [`INSERT_RECEIPT`]) for this receipt.
    pub fn insert(&self, stmt: &mut Statement<'_>) -> rusqlite::Result<()> {
        stmt.execute(params![
            self.ring_epoch as i64,
            self.cpu,
            self.first_seq as i64,
            self.last_seq as i64,
            self.position as i64,
            self.next_seq as i64,
            self.committed_through as i64,
            self.committed_at,
        ])?;
        Ok(())
    }

    /// The row `r` of a statement selecting [`RECEIPT_COLUMNS`] (first).
    pub fn from_row(r: &Row<'_>) -> rusqlite::Result<Receipt> {
        Ok(Receipt {
            ring_epoch: r.get::<_, i64>(0)? as u64,
            cpu: r.get(1)?,
            first_seq: r.get::<_, i64>(2)? as u64,
            last_seq: r.get::<_, i64>(3)? as u64,
            position: r.get::<_, i64>(4)? as u64,
            next_seq: r.get::<_, i64>(5)? as u64,
            committed_through: r.get::<_, i64>(6)? as u64,
            committed_at: r.get(7)?,
        })
    }
}
