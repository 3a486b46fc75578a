//! The kernel log reader's loop: from `/dev/kmsg` (or, in tests, a
//! recorded stream of what `read` returned) into eventd's kernel ring.
//!
//! Each `read` returns one record. Its sequence number decides:
//!
//! - below the next one expected: already in the ring (read again after a
//!   restart, from the oldest record the kernel holds): passed over;
//! - above it: the kernel overwrote the records in between before eventd
//!   read them (a descriptor whose position was overwritten gets EPIPE
//!   once, then the oldest record left): a report of exactly that many is
//!   written first, which the ring's drain stores as one
//!   `kernel_overwritten` gap row; at the first start of a boot the
//!   records the kernel no longer held count the same way;
//! - then the record itself goes into the ring.
//!
//! Before each write the reader waits until the ring has room (an eighth
//! of its pages, at least two) rather than overwrite what the drain has
//! not read: meanwhile the kernel keeps the records, or, if it must
//! overwrite them, the jump is counted. After each batch (at most
//! [`BATCH`] records, or fewer when it has caught up) the next sequence
//! number goes into the position file.

use super::record::{self, Record};
use super::state::{Resume, SeqFile};
use super::{KernelStats, PROVIDER};
use crate::rings::client::truncate;
use crate::rings::drops::KernelLoss;
use crate::rings::{CurrentRing, EmitError, Event, Level, Ring};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Records read between two writes of the position file (and two looks at
/// the stop flag).
pub const BATCH: usize = 256;
/// A record is at most 8 KiB (the kernel's CONSOLE_EXT_LOG_MAX); a read
/// into a smaller buffer fails with EINVAL.
const READ_BYTES: usize = 16 << 10;
/// How long the reader sleeps while its ring has no room.
const ROOM_WAIT: Duration = Duration::from_micros(500);

/// Where records come from.
pub trait Source {
    /// One record into `buf`: its length, or the error `read` gave
    /// (`WouldBlock` when there is none now, EPIPE after a jump).
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize>;
    /// Waits until a record may be there; false when the reader is to stop.
    fn wait(&mut self) -> bool;
    /// Whether the reader is to stop.
    fn stopping(&self) -> bool;
}

/// `/dev/kmsg`, opened non-blocking, with the stop flag and the eventfd
/// that wakes its `poll`.
pub struct Device {
    pub file: std::fs::File,
    pub wake: RawFd,
    pub stop: Arc<AtomicBool>,
}

impl Source for Device {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        std::io::Read::read(&mut self.file, buf)
    }

    fn wait(&mut self) -> bool {
        let mut fds = [
            libc::pollfd {
                fd: self.file.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd entries, and their count.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // Not expected; a pause keeps a failing poll from spinning.
            std::thread::sleep(Duration::from_millis(100));
        }
        !self.stopping()
    }

    fn stopping(&self) -> bool {
        // Relaxed: a request to end; nothing is published through it.
        self.stop.load(Ordering::Relaxed)
    }
}

/// What follows a batch.
enum After {
    /// Records may be waiting: read on.
    More,
    /// Caught up: wait for the next record.
    Wait,
    /// The reader is to stop.
    Stop,
}

/// The reader's loop and what it keeps between records.
pub struct Pump<S> {
    source: S,
    ring: Arc<CurrentRing>,
    cached: (u64, Arc<Ring>),
    stats: Arc<KernelStats>,
    state: Option<SeqFile>,
    boot_id: String,
    /// The next kernel sequence number expected.
    next: u64,
    /// The time of the last record put into the ring (a loss report's
    /// `since_ns`).
    last_ts_ns: Option<i64>,
    /// Wall clock minus the kernel's log clock, taken per batch.
    offset_ns: i64,
    caught_up: bool,
    buf: Vec<u8>,
    fields: Vec<u8>,
    state_failed: bool,
}

impl<S: Source> Pump<S> {
    pub fn new(
        source: S,
        ring: Arc<CurrentRing>,
        stats: Arc<KernelStats>,
        resume: Resume,
    ) -> Pump<S> {
        stats.next_seq.store(resume.next, Ordering::Relaxed);
        Pump {
            source,
            cached: ring.cached(),
            ring,
            stats,
            state: None,
            boot_id: crate::trusted::boot::id().to_string(),
            next: resume.next,
            last_ts_ns: resume.last_ts_ns,
            offset_ns: 0,
            caught_up: false,
            buf: vec![0; READ_BYTES],
            fields: Vec::with_capacity(512),
            state_failed: false,
        }
    }

    /// Writes the position into `file` after each batch.
    pub fn with_state(mut self, file: SeqFile) -> Self {
        self.state = Some(file);
        self
    }

    /// Records as being of boot `boot_id` (tests: another boot).
    pub fn with_boot_id(mut self, boot_id: &str) -> Self {
        self.boot_id = boot_id.to_string();
        self
    }

    /// The next kernel sequence number expected.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Reads until the source says stop.
    pub fn run(&mut self) {
        loop {
            self.offset_ns = wall_minus_log_clock();
            let after = self.batch();
            self.save();
            let go_on = match after {
                After::More => !self.source.stopping(),
                After::Wait => self.source.wait(),
                After::Stop => false,
            };
            if !go_on {
                return;
            }
        }
    }

    /// Reads up to [`BATCH`] records.
    fn batch(&mut self) -> After {
        let mut taken = 0;
        while taken < BATCH {
            match self.source.read(&mut self.buf) {
                Ok(n) => {
                    taken += 1;
                    if !self.take(n) {
                        return After::Stop;
                    }
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EPIPE) => {
                        // The next read gives the oldest record left; the
                        // jump to it is counted there.
                        self.stats.epipe.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(libc::EINTR) => {}
                    _ if e.kind() == std::io::ErrorKind::WouldBlock => {
                        self.caught_up = true;
                        return After::Wait;
                    }
                    _ => {
                        let before = self.stats.read_errors.fetch_add(1, Ordering::Relaxed);
                        if before == 0 {
                            tracing::error!(error = %e, "reading the kernel log failed");
                        }
                        // Not expected: a pause keeps it from spinning.
                        std::thread::sleep(Duration::from_secs(1));
                        return After::Wait;
                    }
                },
            }
        }
        After::More
    }

    /// Takes one record of `n` bytes in the buffer; false when the reader
    /// is to stop (it was waiting for room then).
    fn take(&mut self, n: usize) -> bool {
        self.stats.read.fetch_add(1, Ordering::Relaxed);
        if !self.caught_up {
            self.stats.backlog.fetch_add(1, Ordering::Relaxed);
        }
        let record = match record::parse(&self.buf[..n]) {
            Ok(r) => r,
            Err(e) => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "a kernel log record did not parse; not stored");
                return true;
            }
        };
        if record.seq < self.next {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        if record.seq > self.next && !self.report_loss(self.next, record.seq - 1) {
            return false;
        }
        let ts_ns = self.wall_ns(record.usec);
        if !self.room() {
            return false;
        }
        let max = self.cached.1.geometry().payload_bytes_max();
        let mut fields = std::mem::take(&mut self.fields);
        let boot_id = std::mem::take(&mut self.boot_id);
        let event = kernel_event(&record, ts_ns, &boot_id, max, &mut fields);
        if self.emit(&event) {
            self.stats.stored.fetch_add(1, Ordering::Relaxed);
        }
        (self.fields, self.boot_id) = (fields, boot_id);
        self.last_ts_ns = Some(ts_ns);
        self.advance(record.seq.saturating_add(1));
        true
    }

    /// Writes the report of records `from..=to` lost; false when the
    /// reader is to stop first.
    fn report_loss(&mut self, from: u64, to: u64) -> bool {
        if !self.room() {
            return false;
        }
        let since_ns = self
            .last_ts_ns
            .or_else(crate::trusted::boot::time_ns)
            .unwrap_or(0);
        let loss = KernelLoss {
            from,
            to,
            since_ns,
            boot_id: &self.boot_id,
        };
        let (mut message, mut fields) = (String::new(), String::new());
        let event = loss.event(&mut message, &mut fields);
        if self.emit(&event) {
            let lost = to - from + 1;
            self.stats.lost.fetch_add(lost, Ordering::Relaxed);
            self.stats.loss_reports.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                lost,
                first = from,
                last = to,
                "kernel log records were overwritten by the kernel before eventd read them; \
                 recorded as a gap"
            );
        }
        self.advance(to + 1);
        true
    }

    fn advance(&mut self, next: u64) {
        self.next = next;
        self.stats.next_seq.store(next, Ordering::Relaxed);
    }

    /// Waits until the ring has room for a record without overwriting
    /// what its drain has not read; false if the reader is to stop first.
    fn room(&mut self) -> bool {
        let ring = self.ring.refresh(&mut self.cached).clone();
        let pages = ring.geometry().page_count as u64;
        let headroom = (pages / 8).max(2);
        let full = || ring.backlog_pages() + headroom >= pages;
        if !full() {
            return true;
        }
        self.stats.ring_waits.fetch_add(1, Ordering::Relaxed);
        while full() {
            if self.source.stopping() {
                return false;
            }
            std::thread::sleep(ROOM_WAIT);
        }
        true
    }

    /// Writes `event` into the ring (taken again if it was replaced);
    /// false, counted and logged, if the ring refused it.
    fn emit(&mut self, event: &Event<'_>) -> bool {
        for _ in 0..3 {
            let ring = self.ring.refresh(&mut self.cached);
            match ring.emit(event) {
                Ok(()) => return true,
                Err(EmitError::Encode(_)) => break,
                Err(EmitError::Busy | EmitError::Overwritten | EmitError::Gone) => continue,
            }
        }
        self.stats.emit_failures.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            provider = event.provider,
            name = event.name,
            "the kernel ring refused a record; it is not stored"
        );
        false
    }

    /// Stores the position, if there is a file for it.
    fn save(&mut self) {
        let Some(file) = &self.state else {
            return;
        };
        if let Err(e) = file.store(&self.boot_id, self.next) {
            if !self.state_failed {
                tracing::error!(
                    file = %file.path().display(),
                    error = %e,
                    "cannot store the kernel log position: a restart in this boot goes on \
                     from the kernel ring's newest record"
                );
            }
            self.state_failed = true;
        }
    }

    /// The wall-clock time of a record logged `usec` after boot.
    fn wall_ns(&self, usec: u64) -> i64 {
        let log_ns = i64::try_from(usec.saturating_mul(1000)).unwrap_or(i64::MAX);
        self.offset_ns.saturating_add(log_ns)
    }
}

/// The wall clock minus the monotonic clock (which the kernel's log clock
/// follows, both without suspend), in ns.
fn wall_minus_log_clock() -> i64 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid clock id and a timespec to write into.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec.saturating_mul(1_000_000_000) + ts.tv_nsec
    };
    read(libc::CLOCK_REALTIME) - read(libc::CLOCK_MONOTONIC)
}

/// The `fields` object of a kernel record.
#[derive(Serialize)]
struct KernelFields<'a> {
    transport: &'static str,
    facility: &'static str,
    kernel_seq: u64,
    kernel_usec: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    caller: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    boot_id: &'a str,
    #[serde(flatten)]
    dict: Dict<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncated_from: Option<usize>,
}

/// The continuation lines, each under its key (one that would take the
/// place of a key above is written as `dict_KEY`).
struct Dict<'a>(&'a [(String, String)]);

const RESERVED: [&str; 7] = [
    "transport",
    "facility",
    "kernel_seq",
    "kernel_usec",
    "caller",
    "boot_id",
    "truncated_from",
];

impl Serialize for Dict<'_> {
    fn serialize<Z: Serializer>(&self, s: Z) -> Result<Z::Ok, Z::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (key, value) in self.0 {
            if RESERVED.contains(&key.as_str()) {
                map.serialize_entry(&format!("dict_{key}"), value)?;
            } else {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

/// The event of `record` at `ts_ns`, its fields text in `fields`, the
/// message cut so the record fits `max` payload bytes.
fn kernel_event<'r>(
    record: &'r Record,
    ts_ns: i64,
    boot_id: &'r str,
    max: usize,
    fields: &'r mut Vec<u8>,
) -> Event<'r> {
    let name = crate::syslog::parse::facility_name(record.facility());
    let mut f = KernelFields {
        transport: "kernel",
        facility: name,
        kernel_seq: record.seq,
        kernel_usec: record.usec,
        caller: record.caller.as_deref(),
        boot_id,
        dict: Dict(&record.dict),
        truncated_from: None,
    };
    let write = |f: &KernelFields<'_>, out: &mut Vec<u8>| {
        out.clear();
        // Plain strings and numbers into a Vec: cannot fail.
        let _ = serde_json::to_writer(&mut *out, f);
    };
    write(&f, fields);
    let fixed = PROVIDER.len() + name.len();
    let mut message = record.message.as_str();
    if fixed + fields.len() + message.len() > max {
        f.truncated_from = Some(message.len());
        write(&f, fields);
        message = truncate(message, max.saturating_sub(fixed + fields.len()));
    }
    let fields: &'r Vec<u8> = fields;
    Event {
        ts_ns,
        pid: 0,
        tid: 0,
        uid: 0,
        level: Level::from_u8(record.level()).unwrap_or(Level::Info),
        provider: PROVIDER,
        name,
        message,
        // serde_json writes UTF-8.
        fields: std::str::from_utf8(fields).unwrap_or("{}"),
    }
}

#[cfg(test)]
mod tests;
