//! Queue: events appended to one `queue.log` (the format of
//! [`crate::record`]; an event's offset is its position in the file);
//! named consumers read from their position and acknowledge, and a
//! consumer's position is a small file (`consumers/<name>`), written
//! atomically, so it survives a restart.
//!
//! One writer at a time, as for the log: [`Queue::open`] takes
//! `<dir>/lock` and keeps `<dir>/state` ([`crate::writer_lock`]), and
//! after a crash cuts a torn tail of `queue.log`. Damage in the middle is
//! left in place and stepped over: a consumer reading across it gets the
//! events after it, at their offsets, and is told the damaged range, so
//! positions already written stay valid. [`Queue::open_read_only`] opens
//! alongside a writer and never changes `queue.log`; it may still `ack`
//! (a position file is the consumer's own; one process per consumer name).

use crate::recfile::{self, AppendError, Appender, Range, Read, Repair};
use crate::record::{Format, PAYLOAD_BYTES_MAX};
use crate::verify::{findings_of_scan, Finding, Verified};
use crate::writer_lock::{self, LockError, State, WriterLock};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("queue {path} is open for writing by another process ({holder})")]
    Locked { path: PathBuf, holder: String },
    #[error("{path}: {reason}")]
    Foreign { path: PathBuf, reason: String },
    #[error("consumer name {0:?}: use letters, digits, '-' and '_' (1 to 64)")]
    BadName(String),
    #[error("an event of {bytes} bytes is over the limit of {PAYLOAD_BYTES_MAX}")]
    TooLarge { bytes: usize },
    #[error("the queue is open read-only")]
    ReadOnly,
    #[error("{path}: an earlier append failed and could not be taken back; reopen the queue")]
    Broken { path: PathBuf },
}

type Result<T> = std::result::Result<T, QueueError>;

/// Events with their offsets.
pub type Events = Vec<(u64, Vec<u8>)>;

/// What a `read` gives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Batch {
    pub events: Events,
    /// Where the consumer goes on (what to acknowledge).
    pub next: u64,
    /// Damaged ranges stepped over on the way (offsets).
    pub damaged: Vec<Range>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> QueueError + '_ {
    move |source| QueueError::Io {
        path: path.to_path_buf(),
        source,
    }
}

enum Log {
    Writer(Appender),
    Reader {
        file: File,
        format: Format,
        len: u64,
    },
}

pub struct Queue {
    dir: PathBuf,
    log: Log,
    _lock: Option<WriterLock>,
    repair: Repair,
    /// Bytes cut from a torn tail when opening.
    pub truncated_bytes: u64,
    closed: bool,
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Queue {
    /// Opens (creating) the queue in `dir` for writing.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Queue> {
        let dir = dir.into();
        std::fs::create_dir_all(dir.join("consumers")).map_err(io(&dir))?;
        let lock = writer_lock::take(&dir).map_err(|e| match e {
            LockError::Io(e) => io(&dir)(e),
            LockError::Held(holder) => QueueError::Locked {
                path: dir.clone(),
                holder,
            },
        })?;
        let trusted_len = match writer_lock::read_state(&dir) {
            State::Clean(end) => Some(end),
            State::Unknown => None,
        };
        writer_lock::mark_dirty(&dir).map_err(io(&dir))?;
        let path = dir.join("queue.log");
        let (appender, repair) = match Appender::open(&path, 0, trusted_len) {
            Ok(Ok(opened)) => opened,
            Ok(Err(f)) => return Err(QueueError::Foreign { path, reason: f.0 }),
            Err(e) => return Err(io(&path)(e)),
        };
        writer_lock::sync_dir(&dir).map_err(io(&dir))?;
        Ok(Queue {
            dir,
            log: Log::Writer(appender),
            _lock: Some(lock),
            truncated_bytes: repair.cut.map_or(0, |(a, b)| b - a),
            repair,
            closed: false,
        })
    }

    /// Opens the queue in `dir` to read, alongside a writer or not. It sees
    /// the events there were when it opened; `queue.log` is not changed.
    pub fn open_read_only(dir: impl Into<PathBuf>) -> Result<Queue> {
        let dir = dir.into();
        let path = dir.join("queue.log");
        let (file, scan) = match recfile::scan_file(&path, 0) {
            Ok(Ok(s)) => s,
            Ok(Err(f)) => return Err(QueueError::Foreign { path, reason: f.0 }),
            Err(e) => return Err(io(&path)(e)),
        };
        Ok(Queue {
            dir,
            log: Log::Reader {
                file,
                format: scan.format,
                len: scan.end,
            },
            _lock: None,
            repair: Repair {
                cut: None,
                damaged: scan.damaged,
            },
            truncated_bytes: 0,
            closed: false,
        })
    }

    /// What opening found: the tail it cut, damaged ranges it left.
    pub fn repair(&self) -> &Repair {
        &self.repair
    }

    /// Appends an event; returns its offset. Durable when it returns.
    pub fn append(&mut self, payload: &[u8]) -> Result<u64> {
        if payload.len() > PAYLOAD_BYTES_MAX as usize {
            return Err(QueueError::TooLarge {
                bytes: payload.len(),
            });
        }
        let Log::Writer(a) = &mut self.log else {
            return Err(QueueError::ReadOnly);
        };
        a.append(payload).map_err(|e| match e {
            AppendError::Io(e) => io(&a.path)(e),
            AppendError::Broken => QueueError::Broken {
                path: a.path.clone(),
            },
        })
    }

    fn position_path(&self, consumer: &str) -> Result<PathBuf> {
        if !valid_name(consumer) {
            return Err(QueueError::BadName(consumer.to_string()));
        }
        Ok(self.dir.join("consumers").join(consumer))
    }

    /// Where `consumer` will read next (0 for a new consumer: its first
    /// read starts at the first event).
    pub fn position(&self, consumer: &str) -> Result<u64> {
        let path = self.position_path(consumer)?;
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(text.trim().parse::<u64>().unwrap_or(0).min(self.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn read_at(&self, offset: u64) -> std::io::Result<Read> {
        match &self.log {
            Log::Writer(a) => a.read(offset),
            Log::Reader { file, format, len } => recfile::read_in(file, format, 0, *len, offset),
        }
    }

    /// Up to `max` events from `consumer`'s position, with their offsets,
    /// the offset after the last (what to acknowledge), and the damaged
    /// ranges stepped over. Reading does not move the position.
    pub fn read(&self, consumer: &str, max: usize) -> Result<Batch> {
        let path = self.dir.join("queue.log");
        let mut batch = Batch {
            next: self.position(consumer)?,
            ..Batch::default()
        };
        while batch.events.len() < max {
            match self.read_at(batch.next).map_err(io(&path))? {
                Read::Record {
                    offset,
                    payload,
                    next,
                } => {
                    batch.events.push((offset, payload));
                    batch.next = next;
                }
                Read::Damaged { next, .. } => {
                    batch.damaged.push((batch.next, next));
                    batch.next = next;
                }
                Read::End => break,
            }
        }
        Ok(batch)
    }

    /// Records that `consumer` has handled everything before `next`.
    pub fn ack(&self, consumer: &str, next: u64) -> Result<()> {
        let path = self.position_path(consumer)?;
        let temp = path.with_extension("tmp");
        let mut f = File::create(&temp).map_err(io(&temp))?;
        writeln!(f, "{}", next.min(self.len())).map_err(io(&temp))?;
        f.sync_all().map_err(io(&temp))?;
        std::fs::rename(&temp, &path).map_err(io(&path))?;
        let dir = self.dir.join("consumers");
        writer_lock::sync_dir(&dir).map_err(io(&dir))
    }

    /// Where the queue ends (bytes of `queue.log` that count).
    pub fn len(&self) -> u64 {
        match &self.log {
            Log::Writer(a) => a.end(),
            Log::Reader { len, .. } => *len,
        }
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        match &self.log {
            Log::Writer(a) => a.len <= a.format.first_record(),
            Log::Reader { len, format, .. } => *len <= format.first_record(),
        }
    }

    /// Consumers and their positions (as their files say; `None` for one
    /// that does not parse).
    pub fn consumers(&self) -> Result<Vec<(String, Option<u64>)>> {
        let dir = self.dir.join("consumers");
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io(&dir)(e)),
        };
        for e in entries {
            let e = e.map_err(io(&dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !valid_name(&name) {
                continue;
            }
            let position = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            out.push((name, position));
        }
        out.sort();
        Ok(out)
    }

    /// Checks `queue.log` whole and every consumer's position; nothing is
    /// changed. See [`crate::verify`].
    pub fn verify(&self) -> Result<Verified> {
        let path = self.dir.join("queue.log");
        let mut out = Verified::default();
        let scan = match recfile::scan_file(&path, 0).map_err(io(&path))? {
            Ok((_, scan)) => scan,
            Err(foreign) => {
                out.findings.push(Finding {
                    path,
                    range: None,
                    problem: foreign.0,
                });
                return Ok(out);
            }
        };
        let mut scan = scan;
        if let Log::Writer(a) = &self.log {
            scan.len = scan.len.min(a.len);
        }
        out.records = scan.records;
        out.bytes = scan.len;
        out.findings = findings_of_scan(&path, 0, &scan, true);
        for (name, position) in self.consumers()? {
            let consumer = self.dir.join("consumers").join(&name);
            let problem = match position {
                None => Some("not a position (a number of bytes)".to_string()),
                Some(p) if p > scan.end => Some(format!(
                    "position {p} is past the end of the queue ({})",
                    scan.end
                )),
                Some(p) if p == scan.end || p == 0 => None,
                Some(p) => match self.read_at(p).map_err(io(&path))? {
                    Read::Record { offset, .. } if offset == p => None,
                    _ => Some(format!(
                        "position {p} is not where an intact event starts (its next read steps over damage)"
                    )),
                },
            };
            if let Some(problem) = problem {
                out.findings.push(Finding {
                    path: consumer,
                    range: None,
                    problem,
                });
            }
        }
        Ok(out)
    }

    /// Marks the queue closed cleanly and releases the lock. Dropping it
    /// does the same, ignoring errors.
    pub fn close(mut self) -> Result<()> {
        self.closed = true;
        if let Log::Writer(a) = &self.log {
            writer_lock::mark_clean(&self.dir, a.end()).map_err(io(&self.dir))?;
        }
        Ok(())
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        if let (false, Log::Writer(a)) = (self.closed, &self.log) {
            let _ = writer_lock::mark_clean(&self.dir, a.end());
        }
    }
}

#[cfg(test)]
mod tests;
