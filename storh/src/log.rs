//! SegmentedLog: records appended to segment files in `<dir>/segments/`,
//! each at most `max_segment_bytes` (default 1 MiB). No file per record.
//!
//! A record's offset is its position in the whole log: segment files are
//! named after the offset of their first byte (`00000000000000001024.seg`),
//! so reading an offset opens one file at one position. The next segment's
//! name is where the previous one ends, so a segment missing from the
//! middle shows as a gap between names. The record format and the recovery
//! rule (torn tail cut, damage in the middle reported and stepped over,
//! offsets never renumbered) are in [`crate::record`].
//!
//! One writer at a time: [`SegmentedLog::open`] takes `<dir>/lock` (an OS
//! lock) and keeps `<dir>/state` (see [`crate::writer_lock`]); a second
//! writer is refused with the holder's pid. After a crash the writer scans
//! the last segment and cuts its torn tail; older segments are only read,
//! and checked by [`SegmentedLog::verify`].
//! [`SegmentedLog::open_read_only`] opens alongside a writer, never changes
//! a file, and sees the log as it was when it opened.

use crate::recfile::{self, AppendError, Appender, Range, Read, Repair};
use crate::record::{self, Bad, Format, FILE_HEADER_BYTES, PAYLOAD_BYTES_MAX};
use crate::writer_lock::{self, LockError, State, WriterLock};
use std::fs::File;
use std::path::{Path, PathBuf};

pub const MAX_SEGMENT_BYTES_DEFAULT: u64 = 1 << 20;
/// The smallest segment accepted: a header and a record of one byte.
pub const MIN_SEGMENT_BYTES: u64 = FILE_HEADER_BYTES + record::FRAME_HEADER_BYTES + 1;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("log {path} is open for writing by another process ({holder})")]
    Locked { path: PathBuf, holder: String },
    #[error("{path}: {reason}")]
    Foreign { path: PathBuf, reason: String },
    #[error("no record at offset {offset}")]
    NoRecord { offset: u64 },
    #[error("{path}: no intact record at offset {offset} ({reason}); the next one is at {next}")]
    Damaged {
        path: PathBuf,
        offset: u64,
        /// Where reading can go on.
        next: u64,
        reason: Bad,
    },
    #[error("a record of {bytes} bytes does not fit a segment of {max_segment_bytes} bytes (at most {max_payload_bytes} bytes of payload)")]
    TooLarge {
        bytes: usize,
        max_segment_bytes: u64,
        max_payload_bytes: u64,
    },
    #[error("max_segment_bytes {0} is smaller than a header and a record ({MIN_SEGMENT_BYTES})")]
    SegmentTooSmall(u64),
    #[error("the log is open read-only")]
    ReadOnly,
    #[error("{path}: an earlier append failed and could not be taken back; reopen the log")]
    Broken { path: PathBuf },
}

type Result<T> = std::result::Result<T, LogError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A segment other than the one appended to (never changed again).
#[derive(Debug, Clone)]
struct Segment {
    base: u64,
    format: Format,
    len: u64,
}

/// The last segment: appended to, or read as it was at open.
#[derive(Debug)]
enum Tail {
    Writer(Appender),
    Reader { file: File, segment: Segment },
}

impl Tail {
    fn base(&self) -> u64 {
        match self {
            Tail::Writer(a) => a.base,
            Tail::Reader { segment, .. } => segment.base,
        }
    }

    fn end(&self) -> u64 {
        match self {
            Tail::Writer(a) => a.end(),
            Tail::Reader { segment, .. } => segment.base + segment.len,
        }
    }

    /// Whether `offset`, in this segment, is where its records end: at or
    /// past its length once a header there is stepped over. A segment that
    /// holds only its header (a writer killed between starting it and
    /// appending) ends right after it.
    fn ends_at(&self, offset: u64) -> bool {
        let (base, format, len) = match self {
            Tail::Writer(a) => (a.base, &a.format, a.len),
            Tail::Reader { segment, .. } => (segment.base, &segment.format, segment.len),
        };
        offset >= base + len || offset >= base && format.skip_header(offset - base) >= len
    }
}

pub struct SegmentedLog {
    dir: PathBuf,
    max_segment_bytes: u64,
    /// Every segment but the last, ascending.
    older: Vec<Segment>,
    tail: Tail,
    _lock: Option<WriterLock>,
    repair: Repair,
    /// Bytes cut from a torn tail when opening.
    pub truncated_bytes: u64,
    closed: bool,
}

fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join("segments").join(format!("{base:020}.seg"))
}

/// The segment files' bases, ascending, and names that are not segments.
fn list_segments(dir: &Path) -> Result<(Vec<u64>, Vec<PathBuf>)> {
    let seg_dir = dir.join("segments");
    let (mut bases, mut strays) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(&seg_dir).map_err(io(&seg_dir))? {
        let entry = entry.map_err(io(&seg_dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        match name
            .strip_suffix(".seg")
            .and_then(|n| n.parse::<u64>().ok())
        {
            Some(base) if name.len() == 24 => bases.push(base),
            _ => strays.push(entry.path()),
        }
    }
    bases.sort_unstable();
    Ok((bases, strays))
}

/// The layout of an older segment (a format 1 one is read whole).
fn probe_segment(dir: &Path, base: u64) -> Result<Segment> {
    let path = segment_path(dir, base);
    let file = File::open(&path).map_err(io(&path))?;
    let len = file.metadata().map_err(io(&path))?.len();
    match record::probe(&file, len).map_err(io(&path))? {
        Ok((format, _, _)) => Ok(Segment { base, format, len }),
        Err(f) => Err(LogError::Foreign { path, reason: f.0 }),
    }
}

impl SegmentedLog {
    /// Opens (creating) the log in `dir` for writing; see the module doc.
    pub fn open(dir: impl Into<PathBuf>, max_segment_bytes: u64) -> Result<SegmentedLog> {
        let dir = dir.into();
        if max_segment_bytes < MIN_SEGMENT_BYTES {
            return Err(LogError::SegmentTooSmall(max_segment_bytes));
        }
        let seg_dir = dir.join("segments");
        std::fs::create_dir_all(&seg_dir).map_err(io(&seg_dir))?;
        let lock = writer_lock::take(&dir).map_err(|e| match e {
            LockError::Io(e) => io(&dir)(e),
            LockError::Held(holder) => LogError::Locked {
                path: dir.clone(),
                holder,
            },
        })?;
        let state = writer_lock::read_state(&dir);
        writer_lock::mark_dirty(&dir).map_err(io(&dir))?;
        let (mut bases, _) = list_segments(&dir)?;
        let tail_base = bases.pop().unwrap_or(0);
        let older = bases
            .iter()
            .map(|&b| probe_segment(&dir, b))
            .collect::<Result<Vec<_>>>()?;
        let trusted_len = match state {
            State::Clean(end) => end.checked_sub(tail_base),
            State::Unknown => None,
        };
        let path = segment_path(&dir, tail_base);
        let (appender, repair) = match Appender::open(&path, tail_base, trusted_len) {
            Ok(Ok(opened)) => opened,
            Ok(Err(f)) => return Err(LogError::Foreign { path, reason: f.0 }),
            Err(e) => return Err(io(&path)(e)),
        };
        // The tail's file may be new.
        writer_lock::sync_dir(&seg_dir).map_err(io(&seg_dir))?;
        let truncated_bytes = repair.cut.map_or(0, |(a, b)| b - a);
        Ok(SegmentedLog {
            dir,
            max_segment_bytes,
            older,
            tail: Tail::Writer(appender),
            _lock: Some(lock),
            repair,
            truncated_bytes,
            closed: false,
        })
    }

    /// Opens the log in `dir` to read, alongside a writer or not. Nothing
    /// is created, cut or written; the last segment's tail (an append in
    /// progress, or one cut short) is left out.
    pub fn open_read_only(dir: impl Into<PathBuf>) -> Result<SegmentedLog> {
        let dir = dir.into();
        let (mut bases, _) = list_segments(&dir)?;
        let tail_base = bases.pop().unwrap_or(0);
        let older = bases
            .iter()
            .map(|&b| probe_segment(&dir, b))
            .collect::<Result<Vec<_>>>()?;
        let path = segment_path(&dir, tail_base);
        let (file, scan) = match recfile::scan_file(&path, tail_base) {
            Ok(Ok(s)) => s,
            Ok(Err(f)) => return Err(LogError::Foreign { path, reason: f.0 }),
            Err(e) => return Err(io(&path)(e)),
        };
        let repair = Repair {
            cut: None,
            damaged: scan
                .damaged
                .iter()
                .map(|&(a, b)| (tail_base + a, tail_base + b))
                .collect(),
        };
        let segment = Segment {
            base: tail_base,
            format: scan.format,
            len: scan.end,
        };
        Ok(SegmentedLog {
            dir,
            max_segment_bytes: MAX_SEGMENT_BYTES_DEFAULT,
            older,
            tail: Tail::Reader { file, segment },
            _lock: None,
            repair,
            truncated_bytes: 0,
            closed: false,
        })
    }

    /// What opening found in the last segment: the tail it cut, and damaged
    /// ranges it left in place (offsets).
    pub fn repair(&self) -> &Repair {
        &self.repair
    }

    /// Appends `payload`; returns its offset. Durable when it returns. A
    /// record that would not fit in one segment is refused.
    pub fn append(&mut self, payload: &[u8]) -> Result<u64> {
        let frame_bytes = record::frame_bytes(payload.len());
        let max_payload_bytes =
            (self.max_segment_bytes - FILE_HEADER_BYTES - record::FRAME_HEADER_BYTES)
                .min(u64::from(PAYLOAD_BYTES_MAX));
        if payload.len() as u64 > max_payload_bytes {
            return Err(LogError::TooLarge {
                bytes: payload.len(),
                max_segment_bytes: self.max_segment_bytes,
                max_payload_bytes,
            });
        }
        let Tail::Writer(tail) = &mut self.tail else {
            return Err(LogError::ReadOnly);
        };
        let holds_records = tail.len > tail.format.first_record();
        if holds_records && tail.len + frame_bytes > self.max_segment_bytes {
            self.roll()?;
        }
        let Tail::Writer(tail) = &mut self.tail else {
            return Err(LogError::ReadOnly);
        };
        tail.append(payload).map_err(|e| match e {
            AppendError::Io(e) => io(&tail.path)(e),
            AppendError::Broken => LogError::Broken {
                path: tail.path.clone(),
            },
        })
    }

    /// Starts a new segment where the last one ends.
    fn roll(&mut self) -> Result<()> {
        let base = self.tail.end();
        let path = segment_path(&self.dir, base);
        let (next, _) = match Appender::open(&path, base, None) {
            Ok(Ok(opened)) => opened,
            Ok(Err(f)) => return Err(LogError::Foreign { path, reason: f.0 }),
            Err(e) => return Err(io(&path)(e)),
        };
        let seg_dir = self.dir.join("segments");
        writer_lock::sync_dir(&seg_dir).map_err(io(&seg_dir))?;
        let Tail::Writer(old) = std::mem::replace(&mut self.tail, Tail::Writer(next)) else {
            return Err(LogError::ReadOnly);
        };
        self.older.push(Segment {
            base: old.base,
            format: old.format,
            len: old.len,
        });
        Ok(())
    }

    /// Where the log ends: every record's offset is below it, and the next
    /// one's is at or past it (past a new segment's header).
    pub fn end(&self) -> u64 {
        self.tail.end()
    }

    /// The offset of the first record (0 until there is one).
    pub fn start(&self) -> u64 {
        match self.older.first() {
            Some(s) => s.base + s.format.first_record(),
            None => match &self.tail {
                Tail::Writer(a) => a.base + a.format.first_record(),
                Tail::Reader { segment, .. } => segment.base + segment.format.first_record(),
            },
        }
    }

    /// The record at `offset`, with the offset of the next one.
    /// [`LogError::Damaged`] says where reading can go on.
    pub fn read(&self, offset: u64) -> Result<(Vec<u8>, u64)> {
        self.read_from(offset).map(|(_, p, next)| (p, next))
    }

    /// The record at `offset` (or just past a segment header there): its
    /// offset, payload and the next offset.
    fn read_from(&self, offset: u64) -> Result<(u64, Vec<u8>, u64)> {
        if self.tail.ends_at(offset) {
            return Err(LogError::NoRecord { offset });
        }
        let i = self.older.partition_point(|s| s.base <= offset);
        // Where the segment `offset` is in ends: the next segment's base
        // (the tail has none after it).
        let next_base = match self.older.get(i) {
            Some(s) => s.base,
            None if offset >= self.tail.base() => u64::MAX,
            None => self.tail.base(),
        };
        let (answer, path) = if offset >= self.tail.base() {
            let path = segment_path(&self.dir, self.tail.base());
            let answer = match &self.tail {
                Tail::Writer(a) => a.read(offset),
                Tail::Reader { file, segment } => {
                    recfile::read_in(file, &segment.format, segment.base, segment.len, offset)
                }
            };
            (answer.map_err(io(&path))?, path)
        } else {
            let Some(s) = i.checked_sub(1).and_then(|at| self.older.get(at)) else {
                // Before the first segment: those offsets are missing.
                return Err(LogError::Damaged {
                    path: self.dir.join("segments"),
                    offset,
                    next: self.start(),
                    reason: Bad::Short,
                });
            };
            let path = segment_path(&self.dir, s.base);
            let file = File::open(&path).map_err(io(&path))?;
            let answer = recfile::read_in(&file, &s.format, s.base, s.len, offset);
            (answer.map_err(io(&path))?, path)
        };
        let segment_end = |next: u64| if next >= next_base { next_base } else { next };
        match answer {
            Read::Record {
                offset,
                payload,
                next,
            } => Ok((offset, payload, segment_end(next))),
            Read::Damaged { reason, next } => Err(LogError::Damaged {
                path,
                offset,
                next: segment_end(next),
                reason,
            }),
            // Past the end of an older segment but before the next one:
            // bytes that are missing.
            Read::End => Err(LogError::Damaged {
                path,
                offset,
                next: next_base,
                reason: Bad::Short,
            }),
        }
    }

    /// Every record from `offset` on, in order. A damaged range gives one
    /// [`LogError::Damaged`] and the records after it follow; any other
    /// error ends the iteration.
    pub fn iter_from(&self, offset: u64) -> impl Iterator<Item = Result<(u64, Vec<u8>)>> + '_ {
        let mut at = Some(offset);
        std::iter::from_fn(move || {
            let here = at?;
            if self.tail.ends_at(here) {
                return None;
            }
            match self.read_from(here) {
                Ok((offset, payload, next)) => {
                    at = Some(next);
                    Some(Ok((offset, payload)))
                }
                Err(LogError::Damaged {
                    path,
                    offset,
                    next,
                    reason,
                }) => {
                    at = (next > here).then_some(next);
                    Some(Err(LogError::Damaged {
                        path,
                        offset,
                        next,
                        reason,
                    }))
                }
                Err(e) => {
                    at = None;
                    Some(Err(e))
                }
            }
        })
    }

    pub fn segment_count(&self) -> usize {
        self.older.len() + 1
    }

    /// Marks the log closed cleanly (so the next writer skips the scan)
    /// and releases the lock. Dropping the log does the same, ignoring
    /// errors.
    pub fn close(mut self) -> Result<()> {
        self.closed = true;
        if let Tail::Writer(a) = &self.tail {
            writer_lock::mark_clean(&self.dir, a.end()).map_err(io(&self.dir))?;
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn segments_for_verify(&self) -> Result<(Vec<u64>, Vec<PathBuf>)> {
        list_segments(&self.dir)
    }

    pub(crate) fn writer_tail(&self) -> Option<(u64, u64)> {
        match &self.tail {
            Tail::Writer(a) => Some((a.base, a.len)),
            Tail::Reader { .. } => None,
        }
    }
}

impl Drop for SegmentedLog {
    fn drop(&mut self) {
        if let (false, Tail::Writer(a)) = (self.closed, &self.tail) {
            let _ = writer_lock::mark_clean(&self.dir, a.end());
        }
    }
}

pub use crate::verify::{Finding, Verified};

/// Offsets of a damaged range, for reports.
pub type DamagedRange = Range;

#[cfg(test)]
mod tests;
