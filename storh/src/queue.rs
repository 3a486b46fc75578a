//! Queue: events appended to one `queue.log` (the framing of
//! [`crate::record`]); named consumers read from their position and
//! acknowledge, and a consumer's position is a small file
//! (`consumers/<name>`), written atomically, so it survives a restart. A
//! torn tail of `queue.log` is cut on open and reported, as in the log.

use crate::record::{self, HEADER_BYTES};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("consumer name {0:?}: use letters, digits, '-' and '_' (1 to 64)")]
    BadName(String),
    #[error("{path}: damaged record at offset {offset}")]
    Damaged { path: PathBuf, offset: u64 },
}

type Result<T> = std::result::Result<T, QueueError>;

/// Events with their offsets.
pub type Events = Vec<(u64, Vec<u8>)>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> QueueError + '_ {
    move |source| QueueError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub struct Queue {
    dir: PathBuf,
    log: File,
    len: u64,
    /// Bytes cut from a torn tail when opening.
    pub truncated_bytes: u64,
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Queue {
    pub fn open(dir: impl Into<PathBuf>) -> Result<Queue> {
        let dir = dir.into();
        std::fs::create_dir_all(dir.join("consumers")).map_err(io(&dir))?;
        let path = dir.join("queue.log");
        let log = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let len = log.metadata().map_err(io(&path))?.len();
        let (valid, _) = record::scan(&path).map_err(io(&path))?;
        if valid < len {
            log.set_len(valid).map_err(io(&path))?;
            log.sync_all().map_err(io(&path))?;
        }
        Ok(Queue {
            dir,
            log,
            len: valid,
            truncated_bytes: len - valid,
        })
    }

    /// Appends an event; returns its offset. Durable when it returns.
    pub fn append(&mut self, payload: &[u8]) -> Result<u64> {
        let path = self.dir.join("queue.log");
        let offset = self.len;
        let frame = record::frame(payload);
        self.log.write_all(&frame).map_err(io(&path))?;
        self.log.sync_data().map_err(io(&path))?;
        self.len += frame.len() as u64;
        Ok(offset)
    }

    fn position_path(&self, consumer: &str) -> Result<PathBuf> {
        if !valid_name(consumer) {
            return Err(QueueError::BadName(consumer.to_string()));
        }
        Ok(self.dir.join("consumers").join(consumer))
    }

    /// Where `consumer` will read next (0 for a new consumer).
    pub fn position(&self, consumer: &str) -> Result<u64> {
        let path = self.position_path(consumer)?;
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(text.trim().parse::<u64>().unwrap_or(0).min(self.len)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Up to `max` events from `consumer`'s position, with their offsets
    /// and the offset after the last (what to acknowledge). Reading does
    /// not move the position.
    pub fn read(&self, consumer: &str, max: usize) -> Result<(Events, u64)> {
        let path = self.dir.join("queue.log");
        let mut file = File::open(&path).map_err(io(&path))?;
        let mut at = self.position(consumer)?;
        let mut out = Vec::new();
        while out.len() < max && at < self.len {
            match record::read_at(&mut file, at, self.len).map_err(io(&path))? {
                Ok(payload) => {
                    let next = at + HEADER_BYTES + payload.len() as u64;
                    out.push((at, payload));
                    at = next;
                }
                Err(_) => return Err(QueueError::Damaged { path, offset: at }),
            }
        }
        Ok((out, at))
    }

    /// Records that `consumer` has handled everything before `next`.
    pub fn ack(&self, consumer: &str, next: u64) -> Result<()> {
        let path = self.position_path(consumer)?;
        let temp = path.with_extension("tmp");
        let mut f = File::create(&temp).map_err(io(&temp))?;
        writeln!(f, "{}", next.min(self.len)).map_err(io(&temp))?;
        f.sync_all().map_err(io(&temp))?;
        std::fs::rename(&temp, &path).map_err(io(&path))?;
        let dir = self.dir.join("consumers");
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&dir))
    }

    /// Bytes in the queue file.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumers_read_ack_and_keep_their_position_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let mut q = Queue::open(dir.path()).unwrap();
        for i in 0..10 {
            q.append(format!("event {i}").as_bytes()).unwrap();
        }
        let (first, next) = q.read("mailer", 4).unwrap();
        assert_eq!(first.len(), 4);
        assert_eq!(first[0].1, b"event 0");
        // Not acknowledged: read again.
        assert_eq!(q.read("mailer", 4).unwrap().0, first);
        q.ack("mailer", next).unwrap();
        drop(q);
        let q = Queue::open(dir.path()).unwrap();
        let (rest, end) = q.read("mailer", 100).unwrap();
        assert_eq!(rest.len(), 6);
        assert_eq!(rest[0].1, b"event 4");
        assert_eq!(end, q.len());
        // Another consumer starts at the beginning.
        assert_eq!(q.read("audit", 1).unwrap().0[0].1, b"event 0");
        assert!(matches!(q.read("../x", 1), Err(QueueError::BadName(_))));
    }

    #[test]
    fn a_torn_tail_is_cut_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut q = Queue::open(dir.path()).unwrap();
        q.append(b"whole").unwrap();
        let len = q.len();
        drop(q);
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("queue.log"))
            .unwrap();
        f.write_all(&record::frame(b"half written")[..11]).unwrap();
        drop(f);
        let mut q = Queue::open(dir.path()).unwrap();
        assert_eq!((q.truncated_bytes, q.len()), (11, len));
        q.append(b"next").unwrap();
        let (events, _) = q.read("c", 10).unwrap();
        let payloads: Vec<&[u8]> = events.iter().map(|(_, p)| p.as_slice()).collect();
        assert_eq!(payloads, [&b"whole"[..], b"next"]);
    }
}
