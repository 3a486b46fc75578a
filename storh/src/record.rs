//! The framing shared by the segmented log and the queue: each record is
//! `[length: u32 LE][crc32 of the payload: u32 LE][payload]`.
//!
//! A file is read from the start; the first frame whose header is short,
//! whose length runs past the end, or whose checksum does not match ends
//! the valid part. What follows is a torn tail (an append cut short by a
//! crash), which opening truncates and reports.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

pub const HEADER_BYTES: u64 = 8;
/// Largest payload accepted (a hostile length field is refused, not
/// allocated).
pub const PAYLOAD_BYTES_MAX: u32 = 64 << 20;

/// The frame of `payload`.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + HEADER_BYTES as usize);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Why a frame could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// Fewer bytes than a header, or than the header's length.
    Short,
    TooLong(u32),
    Checksum,
}

/// Reads the frame at `offset` of `file`: its payload, or why not.
pub fn read_at(
    file: &mut std::fs::File,
    offset: u64,
    file_len: u64,
) -> std::io::Result<Result<Vec<u8>, Bad>> {
    if offset + HEADER_BYTES > file_len {
        return Ok(Err(Bad::Short));
    }
    file.seek(SeekFrom::Start(offset))?;
    let mut header = [0u8; 8];
    file.read_exact(&mut header)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len > PAYLOAD_BYTES_MAX {
        return Ok(Err(Bad::TooLong(len)));
    }
    if offset + HEADER_BYTES + u64::from(len) > file_len {
        return Ok(Err(Bad::Short));
    }
    let mut payload = vec![0u8; len as usize];
    file.read_exact(&mut payload)?;
    if crc32fast::hash(&payload) != crc {
        return Ok(Err(Bad::Checksum));
    }
    Ok(Ok(payload))
}

/// Where the valid frames of `path` end, and how many frames there are.
pub fn scan(path: &Path) -> std::io::Result<(u64, u64)> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let (mut at, mut count) = (0u64, 0u64);
    while let Ok(payload) = read_at(&mut file, at, len)? {
        at += HEADER_BYTES + payload.len() as u64;
        count += 1;
    }
    Ok((at, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn frames_read_back_and_damage_ends_the_valid_part() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = std::fs::File::create(&path).unwrap();
        for p in [&b"one"[..], b"", b"three"] {
            f.write_all(&frame(p)).unwrap();
        }
        let whole = std::fs::metadata(&path).unwrap().len();
        assert_eq!(scan(&path).unwrap(), (whole, 3));
        // A torn tail: half a header.
        f.write_all(&frame(b"four")[..5]).unwrap();
        assert_eq!(scan(&path).unwrap(), (whole, 3));
        // A flipped byte in the middle record's payload... of "three".
        let mut bytes = std::fs::read(&path).unwrap();
        let at = (HEADER_BYTES * 3 + 3) as usize;
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(scan(&path).unwrap(), (HEADER_BYTES * 2 + 3, 2));
        // A hostile length is refused.
        std::fs::write(&path, [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).unwrap();
        let mut f = std::fs::File::open(&path).unwrap();
        assert_eq!(read_at(&mut f, 0, 8).unwrap(), Err(Bad::TooLong(u32::MAX)));
    }
}
