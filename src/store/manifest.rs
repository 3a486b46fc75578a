//! A shard file's manifest: a few lines beside it (`shard-NNN.db.manifest`)
//! saying what the file held the last time it was written: its instance
//! id, the highest event id, the time span and, for each ring epoch, how
//! many of its events and the highest sequence number among them (the
//! counts the file keeps in the transactions that insert and delete
//! events, `ring_counts`). A file
//! damaged later (cut short, emptied, scribbled over) takes its own record
//! of what it held with it; the manifest does not, so the loss can be
//! counted and stored where queries see it (see [`super::loss`]).
//!
//! Written by a file's writer when it starts, after each of its checkpoints
//! and when it stops, and by start-up for the historical files (then by
//! retention, the only writer they have, after it trims one). It lags the
//! file by what was committed since the last of those: a loss counted from
//! it is a lower bound ("at least").
//!
//! Format (text, one `key value` per line, unknown keys ignored):
//!
//! ```text
//! eventd-manifest 1
//! instance 3f9a2c81d07e44b5
//! event_id_max 130001
//! ts 1796398742511199623 1796398800345362797
//! written_at 1796398801000000000
//! ring 9c1e5a0b7d3f2e11 0 60172 240688
//! ring 9c1e5a0b7d3f2e11 1 60173 240692
//! ```
//!
//! (`ring EPOCH CPU EVENTS MAX_SEQ`.)

use super::files::side_file;
use super::schema::RingCount;
use rusqlite::Connection;
use std::io::Write;
use std::path::{Path, PathBuf};

const HEADER: &str = "eventd-manifest 1";
const SUFFIX: &str = ".manifest";

/// What a shard file held when its manifest was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub instance: String,
    pub rings: Vec<RingCount>,
    pub event_id_max: i64,
    /// The least and greatest `ts` of its events (none: it held none).
    pub ts: Option<(i64, i64)>,
    pub written_at: i64,
}

/// The manifest's file for shard file `path`.
pub fn manifest_path(path: &Path) -> PathBuf {
    side_file(path, SUFFIX)
}

impl Manifest {
    /// What `conn`'s file holds now: a few index lookups, no counting.
    /// `None` if its schema predates the ring counts (not migrated yet).
    pub fn of(conn: &Connection) -> rusqlite::Result<Option<Manifest>> {
        let (Some(instance), Some(rings)) = (
            super::schema::instance(conn)?,
            super::schema::ring_counts(conn)?,
        ) else {
            return Ok(None);
        };
        let event_id_max: Option<i64> =
            conn.query_row("SELECT max(id) FROM events", [], |r| r.get(0))?;
        let ts: (Option<i64>, Option<i64>) =
            conn.query_row("SELECT min(ts), max(ts) FROM events", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        Ok(Some(Manifest {
            instance,
            rings,
            event_id_max: event_id_max.unwrap_or(0),
            ts: ts.0.zip(ts.1),
            written_at: crate::rings::now_ns(),
        }))
    }

    /// Events of every ring together.
    pub fn events(&self) -> u64 {
        self.rings.iter().map(|r| r.events).sum()
    }

    fn text(&self) -> String {
        let mut t = format!(
            "{HEADER}\ninstance {}\nevent_id_max {}\n",
            self.instance, self.event_id_max
        );
        if let Some((lo, hi)) = self.ts {
            t.push_str(&format!("ts {lo} {hi}\n"));
        }
        t.push_str(&format!("written_at {}\n", self.written_at));
        for r in &self.rings {
            t.push_str(&format!(
                "ring {:016x} {} {} {}\n",
                r.ring_epoch, r.cpu, r.events, r.max_seq
            ));
        }
        t
    }

    fn parse(text: &str) -> Option<Manifest> {
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let (mut instance, mut id_max, mut ts, mut at) = (None, None, None, None);
        let mut rings = Vec::new();
        for line in lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[..] {
                ["instance", v] => instance = Some(v.to_string()),
                ["event_id_max", v] => id_max = v.parse().ok(),
                ["ts", lo, hi] => ts = lo.parse().ok().zip(hi.parse().ok()),
                ["written_at", v] => at = v.parse().ok(),
                ["ring", epoch, cpu, events, max_seq] => rings.push(RingCount {
                    ring_epoch: u64::from_str_radix(epoch, 16).ok()?,
                    cpu: cpu.parse().ok()?,
                    events: events.parse().ok()?,
                    max_seq: max_seq.parse().ok()?,
                }),
                _ => {}
            }
        }
        Some(Manifest {
            instance: instance?,
            rings,
            event_id_max: id_max?,
            ts,
            written_at: at?,
        })
    }

    /// The manifest beside shard file `path`, if there is a readable one.
    pub fn read(path: &Path) -> Option<Manifest> {
        Self::parse(&std::fs::read_to_string(manifest_path(path)).ok()?)
    }

    /// Replaces the manifest beside `path` whole (a temporary file, synced,
    /// renamed over it), with `mode` (that of the shard files).
    pub fn write(&self, path: &Path, mode: crate::access::Mode) -> std::io::Result<()> {
        let target = manifest_path(path);
        let tmp = side_file(&target, ".tmp");
        let mut file = std::fs::File::create(&tmp)?;
        crate::access::files::set_mode_fd(&file, mode)?;
        file.write_all(self.text().as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &target)
    }
}

/// Writes the manifest of `conn`'s file `path` now; a failure is logged
/// (the manifest then lags; nothing else depends on it).
pub fn refresh(conn: &Connection, path: &Path, mode: crate::access::Mode) {
    let written = Manifest::of(conn)
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|m| match m {
            Some(m) => m.write(path, mode),
            None => Ok(()),
        });
    if let Err(e) = written {
        tracing::warn!(
            shard = %path.display(),
            error = %e,
            "shard manifest not written; what this file holds is known as of its last one"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_reads_back_as_written_and_garbage_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-000.db");
        let m = Manifest {
            instance: "00ff00ff00ff00ff".into(),
            rings: vec![RingCount {
                ring_epoch: u64::MAX - 3,
                cpu: 7,
                events: 12,
                max_seq: 99,
            }],
            event_id_max: 40,
            ts: Some((5, 9)),
            written_at: 77,
        };
        m.write(&path, crate::access::Mode::PRIVATE).unwrap();
        assert_eq!(Manifest::read(&path), Some(m.clone()));
        let empty = Manifest { ts: None, ..m };
        empty.write(&path, crate::access::Mode::PRIVATE).unwrap();
        assert_eq!(Manifest::read(&path), Some(empty));
        std::fs::write(manifest_path(&path), "eventd-manifest 1\nevent_id_max x\n").unwrap();
        assert_eq!(Manifest::read(&path), None);
    }

    #[test]
    fn the_ring_counts_follow_inserts_and_deletes() {
        use super::super::schema::count_ring_events;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard-000.db");
        let conn = crate::store::open_shard(&path).unwrap();
        let m = Manifest::of(&conn).unwrap().unwrap();
        assert_eq!((m.events(), m.event_id_max, m.ts), (0, 0, None));
        count_ring_events(&conn, 9, 1, 5, 50, 1).unwrap();
        count_ring_events(&conn, 9, 1, 2, 40, 2).unwrap();
        count_ring_events(&conn, 9, 1, -3, 0, 0).unwrap();
        count_ring_events(&conn, 8, 0, 1, 3, 1).unwrap();
        let mut rings = Manifest::of(&conn).unwrap().unwrap().rings;
        rings.sort_by_key(|r| r.ring_epoch);
        let got: Vec<(u64, u32, u64, u64)> = rings
            .iter()
            .map(|r| (r.ring_epoch, r.cpu, r.events, r.max_seq))
            .collect();
        assert_eq!(got, vec![(8, 0, 1, 3), (9, 1, 4, 50)]);
    }
}
