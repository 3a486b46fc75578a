//! Where the kernel log reader goes on from: the boot and the next kernel
//! sequence number it has not put into the kernel ring, kept in
//! `RUN_DIR/kernel.seq` (as journald keeps its under `/run`).
//!
//! The file is one line of fixed length, `BOOT_ID NEXT\n`, written over in
//! place with one `pwrite` after each batch of records is in the ring. No
//! fsync: it only has to outlive eventd (a write that returned is in the
//! page cache whatever becomes of the process), not the machine, and after
//! a reboot the boot id differs anyway.
//!
//! The ring is the other witness: a record is in the ring before the file
//! says so, so a crash between the two leaves the file behind. At start
//! the reader takes the larger of the file's number and one past the
//! newest record of this boot still in the kernel ring ([`resume_point`]),
//! so nothing is read twice and nothing is skipped.

use crate::access::files::{check_file, Found};
use crate::access::Mode;
use crate::rings::drops::KernelLoss;
use crate::rings::{ReadPosition, Ring, RingItem, RingReader};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file's name in the run directory.
pub const FILE_NAME: &str = "kernel.seq";
/// `BOOT_ID` (32 hex digits) ` ` `NEXT` (20 digits) `\n`.
const LINE_BYTES: usize = 32 + 1 + 20 + 1;

/// The open state file.
pub struct SeqFile {
    file: File,
    path: PathBuf,
}

/// What the file held at start: the boot it was written in and the next
/// sequence number then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub boot_id: String,
    pub next: u64,
}

impl SeqFile {
    /// Opens (or creates, mode 0600) the file in `run_dir` and reads what
    /// it holds. A file that is not eventd's (another owner, a link, loose
    /// permissions) is moved aside and made anew; one that does not hold a
    /// line of the expected form is read as holding nothing.
    pub fn open(run_dir: &Path) -> std::io::Result<(SeqFile, Option<Stored>)> {
        let path = run_dir.join(FILE_NAME);
        if let Found::Untrusted(why) = check_file(&path, Mode::PRIVATE)? {
            let aside = path.with_extension("seq.bad");
            std::fs::rename(&path, &aside)?;
            tracing::warn!(
                file = %path.display(),
                reason = %why,
                aside = %aside.display(),
                "kernel log position file not usable; moved aside"
            );
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        let mut line = [0u8; LINE_BYTES];
        let n = file.read_at(&mut line, 0)?;
        let stored = parse(&line[..n]);
        file.set_len(LINE_BYTES as u64)?;
        Ok((SeqFile { file, path }, stored))
    }

    /// Records that every record of `boot_id` before `next` is in the ring.
    pub fn store(&self, boot_id: &str, next: u64) -> std::io::Result<()> {
        self.file.write_all_at(line(boot_id, next).as_bytes(), 0)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn line(boot_id: &str, next: u64) -> String {
    format!("{boot_id:<32.32} {next:020}\n")
}

fn parse(bytes: &[u8]) -> Option<Stored> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (boot_id, next) = text.trim_end_matches('\n').split_once(' ')?;
    let boot_id = boot_id.trim();
    if boot_id.is_empty() {
        return None;
    }
    Some(Stored {
        boot_id: boot_id.to_string(),
        next: next.trim().parse().ok()?,
    })
}

/// Where the reader starts in boot `boot_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    /// The first kernel sequence number not in the ring yet (0: the first
    /// start of this boot, the whole backlog is read).
    pub next: u64,
    /// The time of the newest record of this boot in the ring, if any.
    pub last_ts_ns: Option<i64>,
}

/// The larger of what the file says for this boot and one past the newest
/// record of this boot the ring still holds (a record, or a report of
/// records lost), with that record's time.
pub fn resume_point(stored: Option<&Stored>, boot_id: &str, ring: &Arc<Ring>) -> Resume {
    let from_file = stored
        .filter(|s| !boot_id.is_empty() && s.boot_id == boot_id)
        .map_or(0, |s| s.next);
    let (from_ring, last_ts_ns) = newest_in_ring(ring, boot_id);
    Resume {
        next: from_file.max(from_ring),
        last_ts_ns,
    }
}

/// One past the highest kernel sequence number of boot `boot_id` that
/// `ring` accounts for, and the time of the newest such record.
fn newest_in_ring(ring: &Arc<Ring>, boot_id: &str) -> (u64, Option<i64>) {
    let mut reader = RingReader::looking(ring.clone(), ReadPosition::START);
    let (mut next, mut last_ts) = (0u64, None);
    let mut idle_at = None;
    loop {
        match reader.poll() {
            Some(RingItem::Event { event, .. }) => {
                idle_at = None;
                let covered = if event.provider == super::PROVIDER {
                    super::fields_seq(event.fields)
                } else {
                    KernelLoss::covered(&event)
                };
                if let Some((boot, seq)) = covered {
                    if boot == boot_id && seq >= next {
                        next = seq.saturating_add(1);
                        last_ts = Some(event.ts_ns);
                    }
                }
            }
            Some(RingItem::Gap(_)) => idle_at = None,
            None => {
                // `poll` also pauses after a bounded number of steps: the
                // end is where it pauses twice at the same place.
                let here = reader.position();
                if idle_at == Some(here) {
                    return (next, last_ts);
                }
                idle_at = Some(here);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_written_over_in_place_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (file, stored) = SeqFile::open(dir.path()).unwrap();
        assert_eq!(stored, None);
        let boot = "45f658aa63aa465595f77d4712175ca2";
        file.store(boot, 12).unwrap();
        file.store(boot, 3_000_000).unwrap();
        drop(file);
        let (_, stored) = SeqFile::open(dir.path()).unwrap();
        assert_eq!(
            stored,
            Some(Stored {
                boot_id: boot.to_string(),
                next: 3_000_000
            })
        );
        let meta = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(meta.len(), LINE_BYTES as u64);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_file_of_another_form_holds_nothing() {
        assert_eq!(parse(b"garbage"), None);
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"  12\n"), None);
        assert_eq!(
            parse(line("b", 5).as_bytes()),
            Some(Stored {
                boot_id: "b".to_string(),
                next: 5
            })
        );
    }
}
