//! One file of records ([`crate::record`]) as the log's segments and the
//! queue use it: opening it to append (the recovery rule applied: a torn
//! tail cut, a format 2 header written where there is none), appending
//! durably, and reading a record at an offset, with the damaged range a
//! failed read falls in.

use crate::record::{self, Bad, Foreign, Format, Scan, FILE_HEADER_BYTES};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A range of offsets, end exclusive.
pub type Range = (u64, u64);

/// What opening a file to append found and did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Repair {
    /// The tail that was cut (offsets), if there was one.
    pub cut: Option<Range>,
    /// Damaged ranges found (offsets), left in place.
    pub damaged: Vec<Range>,
}

/// A file opened for appending.
#[derive(Debug)]
pub(crate) struct Appender {
    pub(crate) path: PathBuf,
    file: File,
    pub(crate) base: u64,
    pub(crate) format: Format,
    /// Bytes in the file; appends go here.
    pub(crate) len: u64,
    /// An append failed and its bytes could not be taken back: no more
    /// appends (their offsets would be wrong).
    broken: bool,
}

/// Why an append failed.
#[derive(Debug)]
pub(crate) enum AppendError {
    Io(std::io::Error),
    /// An earlier failed append left bytes it could not remove.
    Broken,
}

impl Appender {
    /// Opens (creating) `path`, the file whose first byte is offset `base`.
    /// `trusted_len`: the length a clean close recorded; if the file has
    /// it and a format 2 header at its start, no scan is made.
    pub(crate) fn open(
        path: &Path,
        base: u64,
        trusted_len: Option<u64>,
    ) -> std::io::Result<Result<(Appender, Repair), Foreign>> {
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)?;
        let len = file.metadata()?.len();
        let scan = match trusted(&file, len, trusted_len)? {
            Some(scan) => scan,
            None => match record::scan(&file, base)? {
                Ok(scan) => scan,
                Err(foreign) => return Ok(Err(foreign)),
            },
        };
        let mut repair = Repair {
            cut: None,
            damaged: scan
                .damaged
                .iter()
                .map(|&(a, b)| (base + a, base + b))
                .collect(),
        };
        let mut format = scan.format;
        if scan.end < len {
            file.set_len(scan.end)?;
            file.sync_all()?;
            repair.cut = Some((base + scan.end, base + len));
        }
        let mut len = scan.end;
        if format.header_at.is_none() {
            // A new file, or one of format 1: format 2 from here on.
            (&file).write_all(&record::file_header())?;
            file.sync_all()?;
            format.header_at = Some(len);
            len += FILE_HEADER_BYTES;
        }
        let appender = Appender {
            path: path.to_path_buf(),
            file,
            base,
            format,
            len,
            broken: false,
        };
        Ok(Ok((appender, repair)))
    }

    /// The offset the next record gets.
    pub(crate) fn end(&self) -> u64 {
        self.base + self.len
    }

    /// Appends `payload` durably; returns its offset. A failed append is
    /// taken back (the file cut to where it was), so offsets stay right.
    pub(crate) fn append(&mut self, payload: &[u8]) -> Result<u64, AppendError> {
        if self.broken {
            return Err(AppendError::Broken);
        }
        let offset = self.end();
        let bytes = record::frame(offset, payload);
        let written = (&self.file)
            .write_all(&bytes)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            if self.file.set_len(self.len).is_err() {
                self.broken = true;
            }
            return Err(AppendError::Io(e));
        }
        self.len += bytes.len() as u64;
        Ok(offset)
    }

    /// Reads the record at `offset` (see [`read`]).
    pub(crate) fn read(&self, offset: u64) -> std::io::Result<Read> {
        read_in(&self.file, &self.format, self.base, self.len, offset)
    }
}

/// The scan a clean close lets a writer skip: the file has the recorded
/// length and is format 2 from its start.
fn trusted(file: &File, len: u64, trusted_len: Option<u64>) -> std::io::Result<Option<Scan>> {
    if trusted_len != Some(len) || len < FILE_HEADER_BYTES {
        return Ok(None);
    }
    match record::probe(file, FILE_HEADER_BYTES)? {
        Ok((format, _, _)) if format.header_at == Some(0) => Ok(Some(Scan {
            format,
            records: 0,
            damaged: Vec::new(),
            end: len,
            len,
        })),
        _ => Ok(None),
    }
}

/// The answer of a read at an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// A record: its offset (past a header the offset pointed at), its
    /// payload, and the offset after it.
    Record {
        offset: u64,
        payload: Vec<u8>,
        next: u64,
    },
    /// No intact record starts at `offset`; the next one (or the end of
    /// what was read) is at `next`.
    Damaged { reason: Bad, next: u64 },
    /// `offset` is at or past the end.
    End,
}

/// Reads the record at `offset` of a file whose first byte is `base`,
/// laid out as `format`, of which `len` bytes count.
pub(crate) fn read_in(
    file: &File,
    format: &Format,
    base: u64,
    len: u64,
    offset: u64,
) -> std::io::Result<Read> {
    let Some(pos) = offset.checked_sub(base) else {
        return Ok(Read::End);
    };
    let pos = format.skip_header(pos);
    if pos >= len {
        return Ok(Read::End);
    }
    match record::read_record(file, format, pos, base, len)? {
        Ok((payload, next)) => Ok(Read::Record {
            offset: base + pos,
            payload,
            next: base + next,
        }),
        Err(reason) => {
            let next = if pos < format.legacy_end {
                // Format 1 has no magic to look for: what follows is
                // either the header or nothing readable.
                format.header_at.map_or(len, |h| h + FILE_HEADER_BYTES)
            } else {
                record::next_record(file, pos, base, len)?.unwrap_or(len)
            };
            Ok(Read::Damaged {
                reason,
                next: base + next,
            })
        }
    }
}

/// Opens `path` to read and scans it, without changing it.
pub(crate) fn scan_file(path: &Path, base: u64) -> std::io::Result<Result<(File, Scan), Foreign>> {
    let file = File::open(path)?;
    Ok(record::scan(&file, base)?.map(|s| (file, s)))
}
