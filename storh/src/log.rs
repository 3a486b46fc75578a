//! SegmentedLog: records appended to segment files in `<dir>/segments/`,
//! each at most `max_segment_bytes` (default 1 MiB) unless a single record
//! is larger. No file per record.
//!
//! A record's offset is its position in the whole log: segment files are
//! named after the offset of their first byte (`00000000000000001024.seg`),
//! so reading an offset opens one file at one position. Opening checks the
//! last segment frame by frame (every record carries a CRC32): a torn tail
//! is truncated, and how many bytes were lost is reported. Older segments
//! are checked by `verify`.

use crate::record::{self, Bad, HEADER_BYTES};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

pub const MAX_SEGMENT_BYTES_DEFAULT: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no record at offset {offset}")]
    NoRecord { offset: u64 },
    #[error("{path}: record at offset {offset} is damaged ({reason:?})")]
    Damaged {
        path: PathBuf,
        offset: u64,
        reason: Bad,
    },
}

type Result<T> = std::result::Result<T, LogError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub struct SegmentedLog {
    dir: PathBuf,
    max_segment_bytes: u64,
    /// Base offsets of the segments, ascending.
    segments: Vec<u64>,
    /// Appends go here (the last segment).
    tail: File,
    tail_len: u64,
    /// Bytes cut from a torn tail when opening.
    pub truncated_bytes: u64,
}

fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join("segments").join(format!("{base:020}.seg"))
}

impl SegmentedLog {
    pub fn open(dir: impl Into<PathBuf>, max_segment_bytes: u64) -> Result<SegmentedLog> {
        let dir = dir.into();
        let seg_dir = dir.join("segments");
        std::fs::create_dir_all(&seg_dir).map_err(io(&seg_dir))?;
        let mut segments: Vec<u64> = std::fs::read_dir(&seg_dir)
            .map_err(io(&seg_dir))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".seg")?.parse::<u64>().ok()
            })
            .collect();
        segments.sort_unstable();
        if segments.is_empty() {
            segments.push(0);
        }
        let base = *segments.last().unwrap_or(&0);
        let path = segment_path(&dir, base);
        let tail = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let len = tail.metadata().map_err(io(&path))?.len();
        let (valid, _) = record::scan(&path).map_err(io(&path))?;
        let truncated_bytes = len - valid;
        if truncated_bytes > 0 {
            tail.set_len(valid).map_err(io(&path))?;
            tail.sync_all().map_err(io(&path))?;
        }
        Ok(SegmentedLog {
            dir,
            max_segment_bytes: max_segment_bytes.max(HEADER_BYTES + 1),
            segments,
            tail,
            tail_len: valid,
            truncated_bytes,
        })
    }

    /// Appends `payload`; returns its offset. Durable when it returns.
    pub fn append(&mut self, payload: &[u8]) -> Result<u64> {
        let frame = record::frame(payload);
        if self.tail_len > 0 && self.tail_len + frame.len() as u64 > self.max_segment_bytes {
            let base = self.end();
            let path = segment_path(&self.dir, base);
            self.tail = OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(&path)
                .map_err(io(&path))?;
            self.segments.push(base);
            self.tail_len = 0;
            let seg_dir = self.dir.join("segments");
            File::open(&seg_dir)
                .and_then(|d| d.sync_all())
                .map_err(io(&seg_dir))?;
        }
        let offset = self.end();
        let path = segment_path(&self.dir, *self.segments.last().unwrap_or(&0));
        self.tail.write_all(&frame).map_err(io(&path))?;
        self.tail.sync_data().map_err(io(&path))?;
        self.tail_len += frame.len() as u64;
        Ok(offset)
    }

    /// The offset the next record will get.
    pub fn end(&self) -> u64 {
        self.segments.last().copied().unwrap_or(0) + self.tail_len
    }

    /// The record at `offset`, with the offset of the next one.
    pub fn read(&self, offset: u64) -> Result<(Vec<u8>, u64)> {
        if offset >= self.end() {
            return Err(LogError::NoRecord { offset });
        }
        let i = self.segments.partition_point(|&b| b <= offset);
        let base = self.segments[i.saturating_sub(1)];
        let path = segment_path(&self.dir, base);
        let mut file = File::open(&path).map_err(io(&path))?;
        let len = file.metadata().map_err(io(&path))?.len();
        match record::read_at(&mut file, offset - base, len).map_err(io(&path))? {
            Ok(payload) => {
                let mut next = offset + HEADER_BYTES + payload.len() as u64;
                // The last record of a segment: the next starts the next one.
                if next - base >= len {
                    next = self.segments.get(i).copied().unwrap_or(next);
                }
                Ok((payload, next))
            }
            Err(Bad::Short) if offset - base >= len => Err(LogError::NoRecord { offset }),
            Err(reason) => Err(LogError::Damaged {
                path,
                offset,
                reason,
            }),
        }
    }

    /// Every record from `offset` on, in order.
    pub fn iter_from(&self, offset: u64) -> impl Iterator<Item = Result<(u64, Vec<u8>)>> + '_ {
        let mut at = Some(offset);
        std::iter::from_fn(move || {
            let here = at?;
            if here >= self.end() {
                return None;
            }
            match self.read(here) {
                Ok((payload, next)) => {
                    at = Some(next);
                    Some(Ok((here, payload)))
                }
                Err(e) => {
                    at = None;
                    Some(Err(e))
                }
            }
        })
    }

    /// Checks every record of every segment; returns how many are good.
    pub fn verify(&self) -> Result<u64> {
        let mut n = 0;
        for r in self.iter_from(self.segments[0]) {
            r?;
            n += 1;
        }
        Ok(n)
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_roll_segments_and_read_back_by_offset() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = SegmentedLog::open(dir.path(), 100).unwrap();
        let mut offsets = Vec::new();
        for i in 0..50u32 {
            offsets.push(log.append(format!("record {i}").as_bytes()).unwrap());
        }
        assert!(log.segment_count() > 5);
        for seg in std::fs::read_dir(dir.path().join("segments")).unwrap() {
            assert!(seg.unwrap().metadata().unwrap().len() <= 100);
        }
        for (i, &o) in offsets.iter().enumerate() {
            assert_eq!(log.read(o).unwrap().0, format!("record {i}").as_bytes());
        }
        let from_20: Vec<Vec<u8>> = log.iter_from(offsets[20]).map(|r| r.unwrap().1).collect();
        assert_eq!(from_20.len(), 30);
        assert_eq!(from_20[0], b"record 20");
        assert_eq!(log.verify().unwrap(), 50);
        assert!(matches!(
            log.read(log.end()),
            Err(LogError::NoRecord { .. })
        ));
    }

    #[test]
    fn a_torn_tail_is_cut_on_open_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
        let a = log.append(b"kept").unwrap();
        let end = log.end();
        drop(log);
        // An append cut short by a crash.
        let path = segment_path(dir.path(), 0);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&record::frame(b"torn record")[..9]).unwrap();
        drop(f);
        let mut log = SegmentedLog::open(dir.path(), MAX_SEGMENT_BYTES_DEFAULT).unwrap();
        assert_eq!(log.truncated_bytes, 9);
        assert_eq!(log.end(), end);
        assert_eq!(log.read(a).unwrap().0, b"kept");
        let b = log.append(b"after").unwrap();
        assert_eq!(b, end);
        assert_eq!(log.verify().unwrap(), 2);
    }
}
