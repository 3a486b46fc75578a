//! The on-disk format shared by the segmented log and the queue, and the
//! recovery rule that reads it back.
//!
//! # Format 2 (written by this version)
//!
//! ```text
//! file:   [file header: 16 B][record][record]...
//! header: "STORHREC" | version: u32 LE (2) | crc32 of the 12 bytes before: u32 LE
//! record: magic: 4 B (a7 5c 0d e1) | length: u32 LE | check: u32 LE | payload
//! check:  crc32 of (magic, the record's offset as u64 LE, length, payload)
//! ```
//!
//! A record's *offset* is its position in the whole log (a segment's base
//! plus its position in the segment file; in the queue, its position in
//! `queue.log`). The check covers the magic, the offset and the length as
//! well as the payload, so
//! - zeros never read as a record (the magic is not zero, nor is the crc32
//!   of it);
//! - a length damaged into another plausible value fails the check;
//! - a record copied to another place (or a storh file stored inside a
//!   payload) does not read as a record there.
//!
//! # Format 1 (older files, still read)
//!
//! No file header; records are `length: u32 LE | crc32 of payload | payload`.
//! A file that does not start with the format 2 header is read as format 1
//! up to the first frame that does not check out; a writer that opens it
//! cuts what follows (as format 1 always did), writes a format 2 header
//! there, and appends format 2 records after it, so offsets already handed
//! out keep their meaning. Format 1 cannot tell an empty record from eight
//! zero bytes, so an all-zero format 1 frame is taken for zeros the disk
//! left, not for a record. Neither magic can begin a valid format 1 frame:
//! read as a length, each is larger than [`PAYLOAD_BYTES_MAX`].
//!
//! # Recovery
//!
//! [`scan`] reads a file from the start. Where a record does not check out,
//! it looks for the next position, byte by byte, where one does. If there
//! is one, the bytes in between are a *damaged range*: reported, left in
//! place, and the records after it are kept at their offsets. If there is
//! none, the rest of the file is its *tail*: an append cut short by a crash,
//! or zeros a filesystem left past the last write. Only a writer cuts a
//! tail, and only in the file it appends to.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Bytes of the file header.
pub const FILE_HEADER_BYTES: u64 = 16;
/// Bytes of a record's header (magic, length, check).
pub const FRAME_HEADER_BYTES: u64 = 12;
/// Bytes of a format 1 frame header (length, crc32).
pub const LEGACY_HEADER_BYTES: u64 = 8;
/// Largest payload accepted (a hostile length field is refused, not
/// allocated).
pub const PAYLOAD_BYTES_MAX: u32 = 64 << 20;
/// The format this version writes.
pub const VERSION: u32 = 2;

const FILE_MAGIC: [u8; 8] = *b"STORHREC";
const RECORD_MAGIC: [u8; 4] = [0xa7, 0x5c, 0x0d, 0xe1];

// Neither magic, read as a format 1 length, is a length format 1 accepts,
// so a format 1 reader can never mistake either for one of its frames.
const _: () = assert!(u32::from_le_bytes(RECORD_MAGIC) > PAYLOAD_BYTES_MAX);
const _: () = assert!(
    u32::from_le_bytes([FILE_MAGIC[0], FILE_MAGIC[1], FILE_MAGIC[2], FILE_MAGIC[3]])
        > PAYLOAD_BYTES_MAX
);

/// The file header of format [`VERSION`].
pub fn file_header() -> [u8; FILE_HEADER_BYTES as usize] {
    let mut out = [0u8; FILE_HEADER_BYTES as usize];
    out[..8].copy_from_slice(&FILE_MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    let crc = crc32fast::hash(&out[..12]);
    out[12..].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Bytes a record of `payload_bytes` takes.
pub fn frame_bytes(payload_bytes: usize) -> u64 {
    FRAME_HEADER_BYTES + payload_bytes as u64
}

fn check(offset: u64, len: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&RECORD_MAGIC);
    h.update(&offset.to_le_bytes());
    h.update(&len.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The record of `payload` at `offset`. The caller has checked the length
/// against [`PAYLOAD_BYTES_MAX`].
pub fn frame(offset: u64, payload: &[u8]) -> Vec<u8> {
    debug_assert!(payload.len() <= PAYLOAD_BYTES_MAX as usize);
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(payload.len() + FRAME_HEADER_BYTES as usize);
    out.extend_from_slice(&RECORD_MAGIC);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&check(offset, len, payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A format 1 frame (kept for tests of old files).
pub fn legacy_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + LEGACY_HEADER_BYTES as usize);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Why no record could be read at a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// Fewer bytes than a header, or than the header's length.
    Short,
    /// A length larger than [`PAYLOAD_BYTES_MAX`].
    TooLong(u32),
    /// No record magic there.
    Magic,
    /// The check does not match.
    Checksum,
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::Short => write!(f, "cut short"),
            Bad::TooLong(n) => write!(f, "a length of {n} bytes, over the limit"),
            Bad::Magic => write!(f, "no record starts there"),
            Bad::Checksum => write!(f, "checksum mismatch"),
        }
    }
}

/// How a file is laid out: format 1 frames in `[0, legacy_end)`, and
/// format 2 records after a header at `header_at`, if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub legacy_end: u64,
    pub header_at: Option<u64>,
}

impl Format {
    /// Where the first record is (or will be).
    pub fn first_record(&self) -> u64 {
        match self.header_at {
            Some(0) => FILE_HEADER_BYTES,
            _ if self.legacy_end > 0 => 0,
            Some(h) => h + FILE_HEADER_BYTES,
            None => 0,
        }
    }

    /// `pos` itself, or past the header if the header is there.
    pub fn skip_header(&self, pos: u64) -> u64 {
        if self.header_at == Some(pos) {
            pos + FILE_HEADER_BYTES
        } else {
            pos
        }
    }
}

/// What a file holds, read without changing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    pub format: Format,
    /// Records that check out.
    pub records: u64,
    /// Damaged ranges (file positions, end exclusive), with intact records
    /// after each.
    pub damaged: Vec<(u64, u64)>,
    /// Where the last intact record ends (or the header, or 0): the tail
    /// `[end, len)` holds no intact record.
    pub end: u64,
    /// The file's length when it was read.
    pub len: u64,
}

/// A file that storh did not write, or a format it does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Foreign(pub String);

fn read_exact_at(file: &File, pos: u64, buf: &mut [u8]) -> std::io::Result<()> {
    file.read_exact_at(buf, pos)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Whether a valid file header is at `pos`.
fn header_at(file: &File, pos: u64, len: u64) -> std::io::Result<bool> {
    if pos + FILE_HEADER_BYTES > len {
        return Ok(false);
    }
    let mut h = [0u8; FILE_HEADER_BYTES as usize];
    read_exact_at(file, pos, &mut h)?;
    Ok(h == file_header())
}

/// Reads the format 2 record at file position `pos` (offset `base + pos`)
/// of a file of `len` bytes: its payload, or why not.
pub fn read_at(
    file: &File,
    pos: u64,
    base: u64,
    len: u64,
) -> std::io::Result<Result<Vec<u8>, Bad>> {
    if pos + FRAME_HEADER_BYTES > len {
        return Ok(Err(Bad::Short));
    }
    let mut head = [0u8; FRAME_HEADER_BYTES as usize];
    read_exact_at(file, pos, &mut head)?;
    if head[..4] != RECORD_MAGIC {
        return Ok(Err(Bad::Magic));
    }
    let n = u32_at(&head, 4);
    if n > PAYLOAD_BYTES_MAX {
        return Ok(Err(Bad::TooLong(n)));
    }
    if pos + FRAME_HEADER_BYTES + u64::from(n) > len {
        return Ok(Err(Bad::Short));
    }
    let mut payload = vec![0u8; n as usize];
    read_exact_at(file, pos + FRAME_HEADER_BYTES, &mut payload)?;
    if check(base + pos, n, &payload) != u32_at(&head, 8) {
        return Ok(Err(Bad::Checksum));
    }
    Ok(Ok(payload))
}

/// Reads the format 1 frame at `pos`: its payload, or why not.
pub fn read_legacy_at(file: &File, pos: u64, len: u64) -> std::io::Result<Result<Vec<u8>, Bad>> {
    if pos + LEGACY_HEADER_BYTES > len {
        return Ok(Err(Bad::Short));
    }
    let mut head = [0u8; LEGACY_HEADER_BYTES as usize];
    read_exact_at(file, pos, &mut head)?;
    if head == [0u8; 8] {
        // Zeros, not an empty record (see the module doc).
        return Ok(Err(Bad::Magic));
    }
    let n = u32_at(&head, 0);
    if n > PAYLOAD_BYTES_MAX {
        return Ok(Err(Bad::TooLong(n)));
    }
    if pos + LEGACY_HEADER_BYTES + u64::from(n) > len {
        return Ok(Err(Bad::Short));
    }
    let mut payload = vec![0u8; n as usize];
    read_exact_at(file, pos + LEGACY_HEADER_BYTES, &mut payload)?;
    if crc32fast::hash(&payload) != u32_at(&head, 4) {
        return Ok(Err(Bad::Checksum));
    }
    Ok(Ok(payload))
}

/// The record at `pos` in a file of layout `format`, in whichever format
/// that position holds: its payload and the position after it.
pub fn read_record(
    file: &File,
    format: &Format,
    pos: u64,
    base: u64,
    len: u64,
) -> std::io::Result<Result<(Vec<u8>, u64), Bad>> {
    if pos < format.legacy_end {
        return Ok(read_legacy_at(file, pos, format.legacy_end)?.map(|p| {
            (
                p.clone(),
                format.skip_header(pos + LEGACY_HEADER_BYTES + p.len() as u64),
            )
        }));
    }
    match format.header_at {
        Some(h) if pos >= h + FILE_HEADER_BYTES => {
            Ok(read_at(file, pos, base, len)?.map(|p| (p.clone(), pos + frame_bytes(p.len()))))
        }
        _ => Ok(Err(Bad::Magic)),
    }
}

/// Window of a search for the next record (bytes read per call).
const SEARCH_WINDOW_BYTES: usize = 64 << 10;

/// The first position in `(from, len)` where an intact format 2 record
/// starts, if any. Reads the rest of the file in windows of
/// [`SEARCH_WINDOW_BYTES`]; each place the magic appears is checked whole.
pub fn next_record(file: &File, from: u64, base: u64, len: u64) -> std::io::Result<Option<u64>> {
    let mut window = vec![0u8; SEARCH_WINDOW_BYTES];
    let mut start = from + 1;
    while start + FRAME_HEADER_BYTES <= len {
        let n = (len - start).min(SEARCH_WINDOW_BYTES as u64) as usize;
        read_exact_at(file, start, &mut window[..n])?;
        for i in 0..n.saturating_sub(3) {
            if window[i..i + 4] == RECORD_MAGIC {
                let pos = start + i as u64;
                if read_at(file, pos, base, len)?.is_ok() {
                    return Ok(Some(pos));
                }
            }
        }
        // The next window overlaps this one by three bytes, so a magic
        // across the boundary is seen.
        start += n.saturating_sub(3).max(1) as u64;
    }
    Ok(None)
}

/// The first file header in `[from, len)`, if any.
fn next_header(file: &File, from: u64, len: u64) -> std::io::Result<Option<u64>> {
    let mut window = vec![0u8; SEARCH_WINDOW_BYTES];
    let mut start = from;
    while start + FILE_HEADER_BYTES <= len {
        let n = (len - start).min(SEARCH_WINDOW_BYTES as u64) as usize;
        read_exact_at(file, start, &mut window[..n])?;
        for i in 0..n.saturating_sub(7) {
            if window[i..i + 8] == FILE_MAGIC && header_at(file, start + i as u64, len)? {
                return Ok(Some(start + i as u64));
            }
        }
        start += n.saturating_sub(7).max(1) as u64;
    }
    Ok(None)
}

/// Whether every byte of the file is zero (a file created and never
/// written, as a crash can leave it).
fn all_zeros(file: &File, len: u64) -> std::io::Result<bool> {
    let mut window = vec![0u8; SEARCH_WINDOW_BYTES];
    let mut start = 0;
    while start < len {
        let n = (len - start).min(SEARCH_WINDOW_BYTES as u64) as usize;
        read_exact_at(file, start, &mut window[..n])?;
        if window[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        start += n as u64;
    }
    Ok(true)
}

/// A file's layout, its format 1 records, and a damaged range between its
/// format 1 part and its header.
pub type Probed = (Format, u64, Option<(u64, u64)>);

/// Works out the layout of `file` (`len` bytes), reading a format 1 part
/// whole. Also returns the format 1 records and a damaged range between
/// the format 1 part and the header, if there is one. An empty file, or one
/// shorter than a header that holds a torn header (a prefix of it, or
/// zeros), has neither format yet.
pub fn probe(file: &File, len: u64) -> std::io::Result<Result<Probed, Foreign>> {
    let none = Format {
        legacy_end: 0,
        header_at: None,
    };
    if header_at(file, 0, len)? {
        let format = Format {
            legacy_end: 0,
            header_at: Some(0),
        };
        return Ok(Ok((format, 0, None)));
    }
    let mut head = vec![0u8; len.min(FILE_HEADER_BYTES) as usize];
    read_exact_at(file, 0, &mut head)?;
    let torn_header = len < FILE_HEADER_BYTES && file_header().starts_with(&head);
    if torn_header || all_zeros(file, len)? {
        return Ok(Ok((none, 0, None)));
    }
    // Format 1 frames from the start, as far as they check out.
    let (mut pos, mut records) = (0, 0);
    while let Ok(p) = read_legacy_at(file, pos, len)? {
        pos += LEGACY_HEADER_BYTES + p.len() as u64;
        records += 1;
    }
    if records == 0 {
        let version = if head.len() >= 12 && head[..8] == FILE_MAGIC {
            format!(" (it says format {})", u32_at(&head, 8))
        } else {
            String::new()
        };
        return Ok(Err(Foreign(format!(
            "not a storh log or queue file of a format this version reads{version}"
        ))));
    }
    match next_header(file, pos, len)? {
        Some(h) => {
            let gap = (h > pos).then_some((pos, h));
            let format = Format {
                legacy_end: pos,
                header_at: Some(h),
            };
            Ok(Ok((format, records, gap)))
        }
        None => Ok(Ok((
            Format {
                legacy_end: pos,
                header_at: None,
            },
            records,
            None,
        ))),
    }
}

/// Reads the whole of `file` (its records at offsets `base + position`)
/// by the recovery rule in the module doc.
pub fn scan(file: &File, base: u64) -> std::io::Result<Result<Scan, Foreign>> {
    let len = file.metadata()?.len();
    let (format, legacy_records, gap) = match probe(file, len)? {
        Ok(p) => p,
        Err(f) => return Ok(Err(f)),
    };
    let mut out = Scan {
        format,
        records: legacy_records,
        damaged: gap.into_iter().collect(),
        end: format.legacy_end,
        len,
    };
    let Some(h) = format.header_at else {
        return Ok(Ok(out));
    };
    let mut pos = h + FILE_HEADER_BYTES;
    out.end = pos;
    while pos < len {
        match read_at(file, pos, base, len)? {
            Ok(p) => {
                pos += frame_bytes(p.len());
                out.records += 1;
                out.end = pos;
            }
            Err(_) => match next_record(file, pos, base, len)? {
                Some(next) => {
                    out.damaged.push((pos, next));
                    pos = next;
                }
                None => break,
            },
        }
    }
    Ok(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(path: &std::path::Path, bytes: &[u8]) -> File {
        std::fs::write(path, bytes).unwrap();
        File::open(path).unwrap()
    }

    fn records(payloads: &[&[u8]]) -> (Vec<u8>, Vec<u64>) {
        let mut out = file_header().to_vec();
        let mut at = Vec::new();
        for p in payloads {
            at.push(out.len() as u64);
            out.extend_from_slice(&frame(out.len() as u64, p));
        }
        (out, at)
    }

    #[test]
    fn records_read_back_and_a_torn_tail_is_not_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let (mut bytes, at) = records(&[b"one", b"", b"three"]);
        let whole = bytes.len() as u64;
        let f = write(&path, &bytes);
        let s = scan(&f, 0).unwrap().unwrap();
        assert_eq!((s.records, s.end, s.damaged.clone()), (3, whole, vec![]));
        assert_eq!(read_at(&f, at[2], 0, whole).unwrap().unwrap(), b"three");
        // The same record read at another offset (a copy elsewhere) fails.
        assert_eq!(read_at(&f, at[2], 1, whole).unwrap(), Err(Bad::Checksum));
        bytes.extend_from_slice(&frame(whole, b"four")[..9]);
        let f = write(&path, &bytes);
        let s = scan(&f, 0).unwrap().unwrap();
        assert_eq!((s.records, s.end, s.len), (3, whole, whole + 9));
        assert!(s.damaged.is_empty());
    }

    #[test]
    fn damage_in_the_middle_keeps_what_follows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let (bytes, at) = records(&[b"one", b"two", b"three", b"four"]);
        // Zeros over "two", garbage over the length of "three".
        let mut zeroed = bytes.clone();
        zeroed[at[1] as usize..at[2] as usize].fill(0);
        let s = scan(&write(&path, &zeroed), 0).unwrap().unwrap();
        assert_eq!((s.records, s.damaged.clone()), (3, vec![(at[1], at[2])]));
        let mut garbled = bytes.clone();
        garbled[at[2] as usize + 4] ^= 0x10;
        let s = scan(&write(&path, &garbled), 0).unwrap().unwrap();
        assert_eq!((s.records, s.damaged.clone()), (3, vec![(at[2], at[3])]));
        assert_eq!(s.end, bytes.len() as u64);
        // A zero-filled tail (a preallocated file) is a tail.
        let mut padded = bytes.clone();
        padded.extend_from_slice(&[0u8; 4096]);
        let s = scan(&write(&path, &padded), 0).unwrap().unwrap();
        assert_eq!((s.records, s.end), (4, bytes.len() as u64));
        assert!(s.damaged.is_empty());
        // Zeros are never a record.
        let f = write(&path, &[0u8; 64]);
        assert_eq!(read_at(&f, 16, 0, 64).unwrap(), Err(Bad::Magic));
        // A hostile length is refused, not allocated.
        let mut hostile = file_header().to_vec();
        hostile.extend_from_slice(&RECORD_MAGIC);
        hostile.extend_from_slice(&u32::MAX.to_le_bytes());
        hostile.extend_from_slice(&[0; 4]);
        let f = write(&path, &hostile);
        assert_eq!(
            read_at(&f, 16, 0, hostile.len() as u64).unwrap(),
            Err(Bad::TooLong(u32::MAX))
        );
    }

    #[test]
    fn old_files_read_and_foreign_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut bytes = Vec::new();
        for p in [&b"old one"[..], b"old two"] {
            bytes.extend_from_slice(&legacy_frame(p));
        }
        let legacy_end = bytes.len() as u64;
        let s = scan(&write(&path, &bytes), 0).unwrap().unwrap();
        assert_eq!(
            (s.records, s.end, s.format.header_at),
            (2, legacy_end, None)
        );
        // Upgraded in place: a header where the old part ends, then new
        // records.
        bytes.extend_from_slice(&file_header());
        let at = bytes.len() as u64;
        bytes.extend_from_slice(&frame(at, b"new"));
        let f = write(&path, &bytes);
        let s = scan(&f, 0).unwrap().unwrap();
        assert_eq!(s.records, 3);
        assert_eq!(s.format.header_at, Some(legacy_end));
        let (first, next) = read_record(&f, &s.format, 0, 0, s.len).unwrap().unwrap();
        assert_eq!(first, b"old one");
        let (_, next) = read_record(&f, &s.format, next, 0, s.len).unwrap().unwrap();
        assert_eq!(next, at, "the header is stepped over");
        // Not ours: refused, never read as records or cut.
        let f = write(&path, b"this is a text file, not a storh log");
        assert!(scan(&f, 0).unwrap().is_err());
        // A torn header of a new file is no format yet.
        let f = write(&path, &file_header()[..5]);
        assert_eq!(scan(&f, 0).unwrap().unwrap().format.header_at, None);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"x").unwrap();
    }
}
