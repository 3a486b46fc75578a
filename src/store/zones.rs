//! What time each shard file's events cover: its time map, so that a query
//! can leave alone the files that cannot hold its next results.
//!
//! Stripes (R3) keep runs of a CPU's events in one shard: with 256 shards,
//! a file holds one stretch of time in every 256, and the 100 newest events
//! (or the first 100 of a window) are in one or two files. Asking every
//! file costs a statement each (tens of µs: a read transaction, a descent
//! of the time index), which over 256 files is 40-50 times the query on
//! one database. With each file's map the merge asks a file only once the
//! results reach the earliest time it may hold (`query::fanout`).
//!
//! Kept in two places:
//! - **The `zones` table** of each shard (this module owns its columns):
//!   one row per commit, the least and greatest `ts` of the events it
//!   stored and the highest event id, written in the commit's own
//!   transaction. A file made before the table gets one row spanning all
//!   its events when migrated; events above every row's id (stored by
//!   anything but a writer) are found by id when the map is read.
//! - **[`ZoneMaps`]**, in memory, for every file the daemon knows: sorted,
//!   disjoint spans ([`TimeMap`]), at most [`SPANS_MAX`] per file (past it
//!   the closest neighbours are merged: a coarser map is still a true one).
//!   A writer loads its file's rows before its first batch and widens the
//!   map before every commit; a file no writer owns (an older generation)
//!   is loaded by the first query that reads it.
//!
//! Every map only ever claims *more* than the file holds, never less: a
//! commit widens it before it is made (a commit that then fails leaves it
//! wider), retention's deletions leave it as it is, a merge of spans only
//! adds time. So a file a map says has no rows at a time has none there,
//! and a query that leaves it alone misses nothing.

use rusqlite::Connection;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Migration 5's statements (see `schema`): the table, and one row for the
/// events a file already holds.
pub const CREATE_ZONES: &str = "CREATE TABLE zones (
        id INTEGER PRIMARY KEY,
        ts_min INTEGER NOT NULL,      -- least ts of the events one commit stored
        ts_max INTEGER NOT NULL,      -- greatest
        id_max INTEGER NOT NULL       -- every event with an id up to this is covered
    );
    INSERT INTO zones (ts_min, ts_max, id_max)
        SELECT (SELECT min(ts) FROM events), (SELECT max(ts) FROM events),
               (SELECT max(id) FROM events)
        WHERE EXISTS (SELECT 1 FROM events);";

/// One commit's row.
pub const INSERT_ZONE: &str = "INSERT INTO zones (ts_min, ts_max, id_max) VALUES (?1, ?2, ?3)";

/// Stores one commit's zone, in its transaction: its events' least and
/// greatest `ts` and the highest event id it stored.
pub fn record(tx: &Connection, lo: i64, hi: i64, id_max: i64) -> rusqlite::Result<()> {
    tx.prepare_cached(INSERT_ZONE)?.execute([lo, hi, id_max])?;
    Ok(())
}

/// Retention, after deleting events: deletes the rows older than every
/// event left, which cover nothing (a table with no events keeps its rows,
/// which only claim more than is there). A file without the table (one
/// not migrated) has nothing to trim.
pub fn trim(conn: &Connection) -> rusqlite::Result<()> {
    let has: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'zones'",
        [],
        |r| r.get(0),
    )?;
    if has {
        conn.execute(
            "DELETE FROM zones WHERE ts_max < (SELECT min(ts) FROM events)",
            [],
        )?;
    }
    Ok(())
}

/// Spans kept per file in memory, at most: 16 KiB a file.
pub const SPANS_MAX: usize = 1024;

/// A file's time map: sorted, disjoint closed spans `[lo, hi]` of
/// nanosecond timestamps; every event of the file is in one of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimeMap {
    spans: Vec<(i64, i64)>,
}

impl TimeMap {
    pub fn spans(&self) -> &[(i64, i64)] {
        &self.spans
    }

    /// Claims `[lo, hi]` too (merged with the spans it meets).
    pub fn add(&mut self, lo: i64, hi: i64) {
        let (lo, hi) = (lo.min(hi), lo.max(hi));
        // Spans before `i` end before `lo`; spans from `j` start after `hi`.
        let i = self.spans.partition_point(|s| s.1 < lo);
        let j = self.spans.partition_point(|s| s.0 <= hi);
        if i == j {
            self.spans.insert(i, (lo, hi));
        } else {
            let merged = (lo.min(self.spans[i].0), hi.max(self.spans[j - 1].1));
            self.spans.splice(i..j, [merged]);
        }
        if self.spans.len() > SPANS_MAX {
            self.coarsen(SPANS_MAX * 3 / 4);
        }
    }

    /// Merges neighbours, those with the least time between them first,
    /// until at most `keep` spans are left.
    fn coarsen(&mut self, keep: usize) {
        let keep = keep.max(1);
        while self.spans.len() > keep {
            let mut between: Vec<i64> = self
                .spans
                .windows(2)
                .map(|w| w[1].0.saturating_sub(w[0].1))
                .collect();
            let merges = self.spans.len() - keep;
            let (_, &mut limit, _) = between.select_nth_unstable(merges - 1);
            let mut out: Vec<(i64, i64)> = Vec::with_capacity(keep);
            let mut left = merges;
            for &s in &self.spans {
                match out.last_mut() {
                    Some(last) if left > 0 && s.0.saturating_sub(last.1) <= limit => {
                        last.1 = s.1;
                        left -= 1;
                    }
                    _ => out.push(s),
                }
            }
            self.spans = out;
        }
    }

    /// The least time at or after `t` at which the file may hold an event.
    pub fn first_at_or_after(&self, t: i64) -> Option<i64> {
        let i = self.spans.partition_point(|s| s.1 < t);
        self.spans.get(i).map(|s| s.0.max(t))
    }

    /// The greatest time at or before `t` at which the file may hold an
    /// event.
    pub fn last_at_or_before(&self, t: i64) -> Option<i64> {
        let i = self.spans.partition_point(|s| s.0 <= t);
        i.checked_sub(1).map(|i| self.spans[i].1.min(t))
    }
}

/// Which file a path named: `(dev, inode)`. A file replaced under the same
/// name is another, and what was known of the old one does not apply.
pub type FileId = (u64, u64);

pub fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A file's map as read from its tables.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub file: FileId,
    pub map: TimeMap,
    /// Whether the file has any gap row.
    pub gaps: bool,
    /// Rows of its `zones` table.
    pub rows: u64,
    /// The highest event id the map covers.
    pub id_max: Option<i64>,
    /// Events no zone row covered (stored by something other than a
    /// writer, or by a commit whose zone row was lost): their span and
    /// highest id, added to `map`. A writer stores it as a row.
    pub uncovered: Option<(i64, i64, i64)>,
}

/// Reads the map of the file `conn` has open at `path`. Events with ids
/// above every zone row's `id_max` are found (by id, so only they are read)
/// and added: the map covers every event whoever stored it.
pub fn load(conn: &Connection, path: &Path) -> rusqlite::Result<Loaded> {
    use rusqlite::OptionalExtension;
    let file = file_id(path).ok_or(rusqlite::Error::InvalidPath(path.to_path_buf()))?;
    let mut map = TimeMap::default();
    let mut rows = 0u64;
    let mut covered: Option<i64> = None;
    let mut stmt = conn.prepare("SELECT ts_min, ts_max, id_max FROM zones ORDER BY ts_min")?;
    let mut it = stmt.query([])?;
    while let Some(r) = it.next()? {
        map.add(r.get(0)?, r.get(1)?);
        covered = covered.max(Some(r.get(2)?));
        rows += 1;
    }
    let newest: Option<i64> = conn.query_row("SELECT max(id) FROM events", [], |r| r.get(0))?;
    let uncovered = match (newest, covered) {
        (Some(n), c) if c.is_none_or(|c| n > c) => {
            // With nothing covered, the time index gives both ends at
            // once; otherwise the rows above `c`, by rowid.
            let (lo, hi): (Option<i64>, Option<i64>) = match c {
                None => (
                    conn.query_row("SELECT min(ts) FROM events", [], |r| r.get(0))?,
                    conn.query_row("SELECT max(ts) FROM events", [], |r| r.get(0))?,
                ),
                Some(c) => conn
                    .query_row(
                        "SELECT min(ts), max(ts) FROM events WHERE id > ?1",
                        [c],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?
                    .unwrap_or((None, None)),
            };
            lo.zip(hi).map(|(lo, hi)| (lo, hi, n))
        }
        _ => None,
    };
    if let Some((lo, hi, n)) = uncovered {
        map.add(lo, hi);
        covered = Some(n);
    }
    let gaps = conn.query_row("SELECT EXISTS (SELECT 1 FROM gaps)", [], |r| r.get(0))?;
    Ok(Loaded {
        file,
        map,
        gaps,
        rows,
        id_max: covered,
        uncovered,
    })
}

/// A writer's `zones` table after [`load`]: the events no row covered get
/// one, and the table is rewritten as the map's spans when it holds many
/// more rows than that (one per commit since the last time), so that it
/// stays small and the next load quick. The map is unchanged.
pub fn compact(conn: &mut Connection, loaded: &Loaded) -> rusqlite::Result<()> {
    let spans = loaded.map.spans();
    let id_max = loaded.id_max.unwrap_or(0);
    if loaded.rows <= 2 * spans.len() as u64 + 64 {
        if let Some((lo, hi, n)) = loaded.uncovered {
            record(conn, lo, hi, n)?;
        }
        return Ok(());
    }
    let tx = conn.transaction()?;
    tx.execute("DELETE FROM zones", [])?;
    for &(lo, hi) in spans {
        record(&tx, lo, hi, id_max)?;
    }
    tx.commit()
}

#[derive(Debug)]
struct Entry {
    file: Option<FileId>,
    /// `None`: not known; the file is read whole.
    map: Option<TimeMap>,
    gaps: bool,
}

impl Entry {
    /// Nothing known: every query reads the file whole, gaps included.
    const UNKNOWN: Entry = Entry {
        file: None,
        map: None,
        gaps: true,
    };
}

/// What a query may do with one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Nothing is known of it: read it from the start.
    Unknown,
    /// Its next event may come at `next` (none: it has no event the query
    /// can reach); `gaps` says whether it has gap rows at all.
    Known { next: Option<i64>, gaps: bool },
}

/// The time maps of the store's files (see the module docs), shared by the
/// writers, retention and the query server.
#[derive(Debug, Default)]
pub struct ZoneMaps {
    files: Mutex<HashMap<PathBuf, Entry>>,
}

impl ZoneMaps {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Entry>> {
        // Every change under the lock is one insert or one update of an
        // entry, never left half-made.
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A writer's file, as it loaded it before its first batch (replacing
    /// whatever a query may have learnt of it meanwhile); `None` if it
    /// could not: the file is then read whole by every query.
    pub fn register(&self, path: &Path, loaded: Option<Loaded>) {
        let entry = match loaded {
            Some(l) => Entry {
                file: Some(l.file),
                map: Some(l.map),
                gaps: l.gaps,
            },
            None => Entry::UNKNOWN,
        };
        self.lock().insert(path.to_path_buf(), entry);
    }

    /// What a query read of a file that no writer registered (an older
    /// generation): kept unless something is known of the file already
    /// (a writer's registration, or a mark) or it has since been replaced.
    pub fn learn(&self, path: &Path, loaded: Loaded) {
        let mut files = self.lock();
        match files.get(path) {
            None => {}
            // What was known is of an older file under that name.
            Some(e) if e.file.is_some_and(|f| f != loaded.file) => {}
            Some(_) => return,
        }
        if file_id(path) != Some(loaded.file) {
            return;
        }
        files.insert(
            path.to_path_buf(),
            Entry {
                file: Some(loaded.file),
                map: Some(loaded.map),
                gaps: loaded.gaps,
            },
        );
    }

    /// Before a writer's commit of events from `lo` to `hi` (and gaps, if
    /// `gaps`) to the file at `path`.
    pub fn widen(&self, path: &Path, span: Option<(i64, i64)>, gaps: bool) {
        if let Some(e) = self.lock().get_mut(path) {
            if let (Some(map), Some((lo, hi))) = (&mut e.map, span) {
                map.add(lo, hi);
            }
            e.gaps |= gaps;
        }
    }

    /// Before gap rows are added to `path` other than by its writer's
    /// commit (retention's `unexported` gaps). A file not known yet is
    /// marked unknown, so that no query's earlier reading of it is kept.
    pub fn mark_gaps(&self, path: &Path) {
        self.lock()
            .entry(path.to_path_buf())
            .and_modify(|e| e.gaps = true)
            .or_insert(Entry::UNKNOWN);
    }

    /// A file a query could not read the map of (not migrated, say):
    /// unknown, so that it is read whole and not asked again.
    pub fn unreadable(&self, path: &Path) {
        self.lock()
            .entry(path.to_path_buf())
            .or_insert(Entry::UNKNOWN);
    }

    /// Whether anything (a map or a mark) is kept for the file `file` at
    /// `path` (what is kept of an older file under that name does not
    /// count).
    pub fn knows(&self, path: &Path, file: Option<FileId>) -> bool {
        self.lock()
            .get(path)
            .is_some_and(|e| e.file.is_none() || e.file == file)
    }

    /// For each of `files` (a path and the identity of the file there
    /// now): its plan, `next` worked out by `next` from its map.
    pub fn plan(
        &self,
        files: &[(&Path, Option<FileId>)],
        next: impl Fn(&TimeMap) -> Option<i64>,
    ) -> Vec<Plan> {
        let known = self.lock();
        files
            .iter()
            .map(|(path, id)| match known.get(*path) {
                Some(Entry {
                    file: Some(file),
                    map: Some(map),
                    gaps,
                }) if Some(*file) == *id => Plan::Known {
                    next: next(map),
                    gaps: *gaps,
                },
                _ => Plan::Unknown,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn spans_merge_where_they_meet_and_answer_both_ways() {
        let mut m = TimeMap::default();
        m.add(10, 20);
        m.add(40, 50);
        m.add(25, 30);
        assert_eq!(m.spans(), [(10, 20), (25, 30), (40, 50)]);
        m.add(19, 26);
        assert_eq!(m.spans(), [(10, 30), (40, 50)]);
        m.add(60, 55);
        assert_eq!(m.spans(), [(10, 30), (40, 50), (55, 60)]);
        m.add(0, 100);
        assert_eq!(m.spans(), [(0, 100)]);

        let mut m = TimeMap::default();
        assert_eq!(m.first_at_or_after(0), None);
        assert_eq!(m.last_at_or_before(0), None);
        m.add(10, 20);
        m.add(40, 50);
        assert_eq!(m.first_at_or_after(i64::MIN), Some(10));
        assert_eq!(m.first_at_or_after(15), Some(15));
        assert_eq!(m.first_at_or_after(21), Some(40));
        assert_eq!(m.first_at_or_after(51), None);
        assert_eq!(m.last_at_or_before(i64::MAX), Some(50));
        assert_eq!(m.last_at_or_before(45), Some(45));
        assert_eq!(m.last_at_or_before(39), Some(20));
        assert_eq!(m.last_at_or_before(9), None);
    }

    /// Thousands of commits' spans, in roughly rising order as a writer
    /// makes them: the map stays within its bound, stays sorted and
    /// disjoint, and still covers every time that was added.
    #[test]
    fn a_coarsened_map_still_covers_everything_added() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut m = TimeMap::default();
        let mut added = Vec::new();
        let mut t = 0i64;
        for _ in 0..20_000 {
            t += rng.random_range(0..1_000_000);
            let lo = t - rng.random_range(0..2_000);
            let hi = t + rng.random_range(0..50_000);
            m.add(lo, hi);
            added.push((lo, hi));
        }
        let s = m.spans();
        assert!(s.len() <= SPANS_MAX, "{}", s.len());
        assert!(s.windows(2).all(|w| w[0].1 < w[1].0), "sorted, disjoint");
        for (lo, hi) in added {
            for p in [lo, hi, lo + (hi - lo) / 2] {
                assert_eq!(m.first_at_or_after(p), Some(p), "{p} lost");
                assert_eq!(m.last_at_or_before(p), Some(p), "{p} lost");
            }
        }
    }

    #[test]
    fn a_query_reading_is_kept_only_for_a_file_nothing_is_known_of() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-000.db");
        let conn = crate::store::open_shard(&path).unwrap();
        let loaded = load(&conn, &path).unwrap();
        assert_eq!(loaded.map.spans(), []);
        let id = file_id(&path);
        let maps = ZoneMaps::default();
        let plan = |maps: &ZoneMaps| maps.plan(&[(&path, id)], |m| m.first_at_or_after(0))[0];
        assert_eq!(plan(&maps), Plan::Unknown);
        maps.learn(&path, loaded.clone());
        assert_eq!(
            plan(&maps),
            Plan::Known {
                next: None,
                gaps: false
            }
        );
        maps.widen(&path, Some((5, 9)), false);
        assert_eq!(
            plan(&maps),
            Plan::Known {
                next: Some(5),
                gaps: false
            }
        );
        // A later (older) reading does not undo what is known.
        maps.learn(&path, loaded.clone());
        assert_eq!(
            plan(&maps),
            Plan::Known {
                next: Some(5),
                gaps: false
            }
        );
        maps.mark_gaps(&path);
        assert_eq!(
            plan(&maps),
            Plan::Known {
                next: Some(5),
                gaps: true
            }
        );
        // Marked before anything was known: unknown, and a reading made
        // before the mark is not kept.
        let other = dir.path().join("shard-001.db");
        let conn = crate::store::open_shard(&other).unwrap();
        let reading = load(&conn, &other).unwrap();
        maps.mark_gaps(&other);
        maps.learn(&other, reading);
        assert_eq!(
            maps.plan(&[(&other, file_id(&other))], |m| m.first_at_or_after(0)),
            [Plan::Unknown]
        );
        // Another file under the same name is unknown.
        assert_eq!(
            maps.plan(&[(&path, Some((0, 0)))], |_| None),
            [Plan::Unknown]
        );
    }

    /// Events stored without a zone row (a tool writing the file, not a
    /// writer): the map still covers them, by their ids above the last
    /// row's, and a writer's load stores a row for them.
    #[test]
    fn events_no_zone_row_covers_are_found_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-000.db");
        let mut conn = crate::store::open_shard(&path).unwrap();
        let insert = |conn: &Connection, ts: i64| {
            conn.execute(
                crate::store::rows::INSERT_EVENT,
                rusqlite::params![ts, 0, ts, 1i64, 1, 1, 0, 6, "p", "n", "m", None::<&str>],
            )
            .unwrap();
            conn.last_insert_rowid()
        };
        for ts in [500, 100, 300] {
            insert(&conn, ts);
        }
        let loaded = load(&conn, &path).unwrap();
        assert_eq!(loaded.map.spans(), [(100, 500)]);
        assert_eq!(loaded.uncovered, Some((100, 500, 3)));
        compact(&mut conn, &loaded).unwrap();
        let again = load(&conn, &path).unwrap();
        assert_eq!(
            (again.uncovered, again.rows, again.id_max),
            (None, 1, Some(3))
        );
        // A commit's row, then two more events no row covers.
        let id = insert(&conn, 1000);
        record(&conn, 1000, 1000, id).unwrap();
        insert(&conn, 2000);
        insert(&conn, 1500);
        let loaded = load(&conn, &path).unwrap();
        assert_eq!(loaded.uncovered, Some((1500, 2000, 6)));
        assert_eq!(loaded.map.spans(), [(100, 500), (1000, 1000), (1500, 2000)]);
    }

    #[test]
    fn compaction_rewrites_the_rows_as_the_map() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-000.db");
        let mut conn = crate::store::open_shard(&path).unwrap();
        for k in 0..400i64 {
            // Four commits in a row overlap.
            let lo = 1000 + (k / 4) * 100 + (k % 4) * 3;
            record(&conn, lo, lo + 5, 0).unwrap();
        }
        let loaded = load(&conn, &path).unwrap();
        assert_eq!(loaded.rows, 400);
        assert_eq!(loaded.map.spans().len(), 100);
        compact(&mut conn, &loaded).unwrap();
        let again = load(&conn, &path).unwrap();
        assert_eq!(again.rows, 100);
        assert_eq!(again.map, loaded.map);
    }
}
