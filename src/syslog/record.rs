//! From a received syslog message to an event in the ring of the CPU that
//! received it.
//!
//! Columns: `pid` and `uid` are the sender's credentials as the kernel gave
//! them (SCM_CREDENTIALS, SO_PEERCRED), never what the message says; `level`
//! is the severity, `provider` the app name (or "syslog"), `name` the MSGID
//! (or the facility), `message` the text. Everything else goes into
//! `fields`: what the message claims (hostname, procid, timestamp,
//! structured data), the facility, the kernel's gid, the transport and, when
//! something did not parse, the problems and the raw bytes (base64).

// The longest prefix of at most so many bytes that ends on a char boundary.
use super::parse::{self, Parsed};
use super::SyslogStats;
use crate::rings::client::truncate as prefix;
use crate::rings::drops::Drops;
use crate::rings::{CurrentRing, EmitError, Event, Level, Ring};
use crate::trusted::{Senders, Trusted};
use base64::Engine;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The sender as the kernel saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// The sender's `SCM_CREDENTIALS` from a control-message buffer, read
/// field by field (the kernel wrote it, but the lengths are checked as if
/// it were untrusted). Descriptors a sender passed along (`SCM_RIGHTS`: the
/// socket is open to every local user) are closed here, so nobody can fill
/// eventd's descriptor table through it.
pub fn control_messages(control: &[u8]) -> Option<Credentials> {
    // struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; }
    let word = std::mem::size_of::<usize>();
    let header = std::mem::size_of::<libc::cmsghdr>();
    let mut creds = None;
    let mut at = 0usize;
    while at
        .checked_add(header)
        .is_some_and(|end| end <= control.len())
    {
        let bytes = |i: usize, n: usize| control.get(at + i..at + i + n);
        let len = usize::from_ne_bytes(bytes(0, word)?.try_into().ok()?);
        let level = i32::from_ne_bytes(bytes(word, 4)?.try_into().ok()?);
        let kind = i32::from_ne_bytes(bytes(word + 4, 4)?.try_into().ok()?);
        let end = at.checked_add(len)?;
        if len < header || end > control.len() {
            return creds;
        }
        let data = &control[at + header..end];
        if level == libc::SOL_SOCKET && kind == libc::SCM_CREDENTIALS && data.len() >= 12 {
            creds = Some(Credentials {
                pid: i32::from_ne_bytes(data[0..4].try_into().ok()?),
                uid: u32::from_ne_bytes(data[4..8].try_into().ok()?),
                gid: u32::from_ne_bytes(data[8..12].try_into().ok()?),
            });
        }
        if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
            for fd in data.chunks_exact(4) {
                let fd = i32::from_ne_bytes(fd.try_into().ok()?);
                // SAFETY: the kernel installed this descriptor for this
                // process in this very message; nothing else owns it.
                unsafe { libc::close(fd) };
            }
        }
        at = end.checked_next_multiple_of(word)?;
    }
    creds
}

/// How a message arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Datagram,
    Stream,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Datagram => "dgram",
            Transport::Stream => "stream",
        }
    }
}

/// The `fields` object of a syslog event.
#[derive(Serialize)]
struct Fields<'a> {
    transport: &'static str,
    format: &'static str,
    facility: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    gid: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    no_credentials: bool,
    /// `comm`, `exe`, `unit`, `boot_id`: eventd's, from `/proc` and the
    /// kernel (`crate::trusted`).
    #[serde(flatten)]
    trusted: Trusted<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hostname: Option<&'a str>,
    /// The PROCID the message claims (the `pid` column is the kernel's).
    #[serde(skip_serializing_if = "Option::is_none")]
    procid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    msgid: Option<&'a str>,
    /// The timestamp the message claims, as written (`ts` is when eventd
    /// received it).
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<&'a str>,
    /// The instant that timestamp names, in ns since the Unix epoch, when
    /// it names its offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp_ns: Option<i64>,
    #[serde(skip_serializing_if = "Sd::is_empty")]
    sd: Sd<'a, 'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    problems: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    raw_base64: Option<String>,
    /// The message's length before it was cut to fit a ring record.
    #[serde(skip_serializing_if = "Option::is_none")]
    truncated_from: Option<usize>,
}

/// Structured data as `{"id": {"name": "value", ...}, ...}`.
struct Sd<'p, 'a>(&'p [parse::SdElement<'a>]);

impl Sd<'_, '_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Sd<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for element in self.0 {
            let params: std::collections::BTreeMap<&str, &str> = element
                .params
                .iter()
                .map(|(k, v)| (k.as_ref(), v.as_str()))
                .collect();
            map.serialize_entry(element.id.as_ref(), &params)?;
        }
        map.end()
    }
}

/// Turns received messages into events and emits them. One per receiving
/// thread (it keeps a scratch buffer and the ring it last used).
pub struct Ingest {
    /// eventd's own syslog ring, which no producer can open.
    ring: Arc<CurrentRing>,
    /// The ring as this thread last took it, with its generation.
    cached: (u64, Arc<Ring>),
    stats: Arc<SyslogStats>,
    stop: Arc<AtomicBool>,
    /// Shard writers failing their commits now (a full store disk): while
    /// any is, a receiver does not wait for room in the ring.
    store_failing: Arc<AtomicU64>,
    drops: Arc<Drops>,
    /// What eventd read of senders in `/proc`.
    senders: Arc<Senders>,
    /// On a stream connection, its sender as pinned when it was taken.
    pinned: Option<crate::trusted::cache::Pinned>,
    fields: Vec<u8>,
}

impl Clone for Ingest {
    fn clone(&self) -> Self {
        Ingest {
            ring: self.ring.clone(),
            cached: self.ring.cached(),
            stats: self.stats.clone(),
            stop: self.stop.clone(),
            store_failing: self.store_failing.clone(),
            drops: self.drops.clone(),
            senders: self.senders.clone(),
            pinned: self.pinned,
            fields: Vec::new(),
        }
    }
}

/// How long a receiver waits for the drain to make room before it looks
/// at the ring again.
const ROOM_WAIT: Duration = Duration::from_micros(200);
/// The longest a receiver waits for room for one message while the store
/// commits: the drain normally makes room at once, so this is only reached
/// when it cannot (then the message is dropped and counted, and blocking
/// senders are not held for as long as the trouble lasts).
const ROOM_WAIT_MAX: Duration = Duration::from_secs(2);

/// What the listeners share besides their statistics.
pub struct IngestParts {
    pub ring: Arc<CurrentRing>,
    pub store_failing: Arc<AtomicU64>,
    pub drops: Arc<Drops>,
    pub senders: Arc<Senders>,
}

impl Ingest {
    pub fn new(parts: IngestParts, stats: Arc<SyslogStats>, stop: Arc<AtomicBool>) -> Self {
        Ingest {
            cached: parts.ring.cached(),
            ring: parts.ring,
            stats,
            stop,
            store_failing: parts.store_failing,
            drops: parts.drops,
            senders: parts.senders,
            pinned: None,
            fields: Vec::with_capacity(4096),
        }
    }

    /// Stores one received message. `received_len` is its length as sent
    /// (more than `bytes.len()` when the receive buffer cut it).
    pub fn deliver(
        &mut self,
        bytes: &[u8],
        received_len: usize,
        credentials: Option<Credentials>,
        transport: Transport,
    ) {
        let s = &self.stats;
        s.received.fetch_add(1, Ordering::Relaxed);
        if self.stop.load(Ordering::Relaxed) {
            // The drains are about to stop: a ring written now could
            // overwrite what they have not read. Counted, not stored.
            s.rejected_stopping.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if bytes.iter().all(|b| b.is_ascii_whitespace() || *b == 0) {
            s.rejected_empty.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let parsed = parse::parse(bytes);
        let ring = self.ring.refresh(&mut self.cached).clone();
        let max = ring.geometry().payload_bytes_max();
        let cut = received_len > bytes.len();
        let sender = credentials.and_then(|c| match self.pinned {
            Some(pin) => self.senders.lookup_pinned(pin, c.pid, c.uid, c.gid),
            None => self.senders.lookup(c.pid, c.uid, c.gid),
        });
        let event = build(
            &parsed,
            bytes,
            received_len,
            Sender {
                credentials,
                trusted: Trusted::of(sender.as_deref()),
            },
            transport,
            max,
            &mut self.fields,
        );
        let Some(event) = event else {
            s.rejected_too_large.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if !parsed.problems.is_empty() {
            s.malformed.fetch_add(1, Ordering::Relaxed);
        }
        if parsed.format == parse::Format::Unstructured {
            s.unstructured.fetch_add(1, Ordering::Relaxed);
        }
        if cut || event.message.len() < parsed.message.len() {
            s.truncated.fetch_add(1, Ordering::Relaxed);
        }
        let event = event.as_event(&self.fields);
        self.store_in(&ring, &event);
    }

    /// Stores an event built elsewhere (a line of service output) the way
    /// a syslog message is stored: into eventd's own ring once it has
    /// room, else dropped and counted (see [`room`](Self::room)). Counted
    /// as received.
    pub fn store(&mut self, event: &Event<'_>) {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        if self.stop.load(Ordering::Relaxed) {
            self.stats.rejected_stopping.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let ring = self.ring.refresh(&mut self.cached).clone();
        self.store_in(&ring, event);
    }

    /// The largest payload a record of the ring holds now.
    pub fn payload_bytes_max(&mut self) -> usize {
        self.ring
            .refresh(&mut self.cached)
            .geometry()
            .payload_bytes_max()
    }

    /// The senders' cache this ingest looks processes up in.
    pub fn senders(&self) -> &Arc<Senders> {
        &self.senders
    }

    /// For a stream connection: from now on, process facts only of the
    /// process that made it (see [`crate::trusted::cache::Pinned`]).
    pub fn pin_sender(&mut self, credentials: Option<Credentials>) {
        self.pinned = credentials.map(|c| self.senders.pin(c.pid));
    }

    /// The counters this ingest adds to.
    pub fn stats(&self) -> &SyslogStats {
        &self.stats
    }

    fn store_in(&self, ring: &Ring, event: &Event<'_>) {
        if self.room(ring) {
            self.emit(ring, event);
        } else {
            self.drop(event);
        }
    }

    /// Whether the ring has room for a message without overwriting what the
    /// drain has not read. While it has not, the receiver waits (the kernel
    /// holds later messages, and blocking senders wait, as they do for
    /// journald or rsyslog) — but only while the store commits, and at most
    /// [`ROOM_WAIT_MAX`]: a store that cannot commit (a full disk) must not
    /// hold every sender on the host.
    fn room(&self, ring: &Ring) -> bool {
        let pages = ring.geometry().page_count as u64;
        let headroom = (pages / 8).max(2);
        let full = || ring.backlog_pages() + headroom >= pages;
        if !full() {
            return true;
        }
        self.stats.ring_waits.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        // Relaxed: a hint; a writer's failure is seen within a wait step.
        while self.store_failing.load(Ordering::Relaxed) == 0
            && started.elapsed() < ROOM_WAIT_MAX
            && !self.stop.load(Ordering::Relaxed)
        {
            std::thread::sleep(ROOM_WAIT);
            if !full() {
                return true;
            }
        }
        false
    }

    fn emit(&self, ring: &Ring, event: &Event<'_>) {
        let s = &self.stats;
        for _ in 0..3 {
            match ring.emit(event) {
                Ok(()) => {
                    s.stored.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(EmitError::Busy) => continue,
                Err(EmitError::Overwritten | EmitError::Encode(_) | EmitError::Gone) => break,
            }
        }
        s.emit_failures.fetch_add(1, Ordering::Relaxed);
        self.drop(event);
    }

    /// A message that could not be kept: counted, and reported into the
    /// ring (as one `dropped` gap) once it has room again.
    fn drop(&self, event: &Event<'_>) {
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        self.drops.add(event.ts_ns);
    }
}

/// The event eventd stores for one parsed message (its fields text in
/// `fields`), cut to fit `max` payload bytes; `None` if not even the
/// fields fit. What `Ingest::deliver` emits, for callers that store
/// messages some other way (the load harness's floor).
pub fn stored_event<'e>(
    parsed: &'e Parsed<'_>,
    raw: &[u8],
    received_len: usize,
    sender: Sender<'_>,
    transport: Transport,
    max: usize,
    fields: &'e mut Vec<u8>,
) -> Option<Event<'e>> {
    let built = build(parsed, raw, received_len, sender, transport, max, fields)?;
    let fields: &'e Vec<u8> = fields;
    Some(built.as_event(fields))
}

/// Who sent a message: the kernel's credentials, and what eventd read of
/// the process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sender<'a> {
    pub credentials: Option<Credentials>,
    pub trusted: Trusted<'a>,
}

/// What goes into the ring, before the borrow of the fields buffer.
struct Built<'p> {
    level: Level,
    pid: u32,
    uid: u32,
    provider: &'p str,
    name: &'p str,
    message: &'p str,
}

impl<'p> Built<'p> {
    fn as_event<'e>(&self, fields: &'e [u8]) -> Event<'e>
    where
        'p: 'e,
    {
        Event {
            ts_ns: crate::rings::now_ns(),
            pid: self.pid,
            tid: 0,
            uid: self.uid,
            level: self.level,
            provider: self.provider,
            name: self.name,
            message: self.message,
            // The buffer holds serde_json's output: UTF-8.
            fields: std::str::from_utf8(fields).unwrap_or(""),
        }
    }
}

/// Fills `fields` and returns the event's columns, the message cut so that
/// the record fits `max` payload bytes; `None` if not even the fields fit.
fn build<'p>(
    parsed: &'p Parsed<'_>,
    raw: &[u8],
    received_len: usize,
    sender: Sender<'_>,
    transport: Transport,
    max: usize,
    fields: &mut Vec<u8>,
) -> Option<Built<'p>> {
    let provider = prefix(parsed.app_name.as_deref().unwrap_or("syslog"), 255);
    let name = prefix(
        parsed
            .msgid
            .as_deref()
            .unwrap_or_else(|| parse::facility_name(parsed.facility)),
        255,
    );
    let mut problems = parsed.problems.clone();
    let keep_raw = !problems.is_empty() && raw.len() <= max / 2;
    if !problems.is_empty() && !keep_raw {
        problems.push("raw bytes not kept (too long)");
    }
    let credentials = sender.credentials;
    let mut f = Fields {
        transport: transport.name(),
        format: parsed.format.name(),
        facility: parse::facility_name(parsed.facility),
        gid: credentials.map(|c| c.gid),
        no_credentials: credentials.is_none(),
        trusted: sender.trusted,
        hostname: parsed.hostname.as_deref(),
        procid: parsed.procid.as_deref(),
        msgid: parsed.msgid.as_deref(),
        timestamp: parsed.timestamp.as_deref(),
        timestamp_ns: parsed.timestamp_ns,
        sd: Sd(&parsed.structured_data),
        problems,
        // What did not parse is kept as it came (if it fits a record).
        raw_base64: keep_raw.then(|| base64::engine::general_purpose::STANDARD.encode(raw)),
        truncated_from: (received_len > raw.len()).then_some(received_len),
    };
    let fixed = provider.len() + name.len();
    let mut message = parsed.message.as_ref();
    loop {
        fields.clear();
        // Serializing plain strings and numbers into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *fields, &f);
        let room = max.saturating_sub(fixed + fields.len());
        if message.len() <= room {
            break;
        }
        if f.raw_base64.is_some() {
            // The raw bytes go first: the message says most of it.
            f.raw_base64 = None;
            f.problems.push("raw bytes not kept (too long)");
            continue;
        }
        if f.truncated_from.is_none() {
            f.truncated_from = Some(received_len);
            continue;
        }
        if room == 0 {
            return None;
        }
        message = prefix(message, room);
    }
    let (pid, uid) = match credentials {
        Some(c) => (u32::try_from(c.pid).unwrap_or(0), c.uid),
        // Unknown sender: uid -1, as the kernel writes "no uid".
        None => (0, u32::MAX),
    };
    Some(Built {
        level: Level::from_u8(parsed.severity).unwrap_or(Level::Notice),
        pid,
        uid,
        provider,
        name,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields_of(
        input: &[u8],
        creds: Option<Credentials>,
        max: usize,
    ) -> (serde_json::Value, String) {
        let parsed = parse::parse(input);
        let mut buf = Vec::new();
        let built = build(
            &parsed,
            input,
            input.len(),
            Sender {
                credentials: creds,
                trusted: Trusted::default(),
            },
            Transport::Datagram,
            max,
            &mut buf,
        )
        .unwrap();
        let message = built.message.to_string();
        (serde_json::from_slice(&buf).unwrap(), message)
    }

    #[test]
    fn claims_and_kernel_credentials_are_kept_apart() {
        let creds = Credentials {
            pid: 4242,
            uid: 1000,
            gid: 100,
        };
        let input = b"<86>1 2026-11-30T10:00:00Z web01 nginx 17 ACCESS [req@1 id=\"7\"] GET /";
        let parsed = parse::parse(input);
        let mut buf = Vec::new();
        let built = build(
            &parsed,
            input,
            input.len(),
            Sender {
                credentials: Some(creds),
                trusted: Trusted {
                    comm: Some("nginx"),
                    unit: Some("nginx.service"),
                    ..Trusted::default()
                },
            },
            Transport::Datagram,
            16000,
            &mut buf,
        )
        .unwrap();
        assert_eq!((built.pid, built.uid), (4242, 1000));
        assert_eq!(
            (built.provider, built.name, built.message),
            ("nginx", "ACCESS", "GET /")
        );
        assert_eq!(built.level, Level::Info);
        let f: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(f["procid"], "17", "the claimed pid is kept as a claim");
        assert_eq!(f["gid"], 100);
        assert_eq!(f["facility"], "authpriv");
        assert_eq!(f["hostname"], "web01");
        assert_eq!(f["timestamp"], "2026-11-30T10:00:00Z");
        assert_eq!(f["timestamp_ns"], 1_796_032_800_000_000_000_i64);
        assert_eq!(f["sd"]["req@1"]["id"], "7");
        assert_eq!(
            (&f["comm"], &f["unit"]),
            (&"nginx".into(), &"nginx.service".into())
        );
        assert!(
            f.get("exe").is_none(),
            "what eventd does not know is left out"
        );
        assert!(f.get("problems").is_none() && f.get("raw_base64").is_none());
    }

    #[test]
    fn malformed_input_keeps_its_raw_bytes_and_oversized_is_cut() {
        let (f, message) = fields_of(b"<999>caf\xE9", None, 16000);
        assert_eq!(
            f["problems"],
            serde_json::json!(["priority out of range", "not UTF-8"])
        );
        assert_eq!(f["raw_base64"], "PDk5OT5jYWbp");
        assert_eq!(f["no_credentials"], true);
        assert_eq!(message, "<999>caf\u{FFFD}");
        let big = format!("<13>app: {}", "é".repeat(10_000));
        let (f, message) = fields_of(big.as_bytes(), None, 4000);
        assert_eq!(f["truncated_from"], big.len());
        assert!(message.len() < 4000 && message.starts_with("éé"));
        assert!(message.chars().all(|c| c == 'é'));
    }

    #[test]
    fn credentials_are_read_from_a_control_buffer() {
        let mut control = vec![0u8; 32];
        control[0..8].copy_from_slice(&28usize.to_ne_bytes());
        control[8..12].copy_from_slice(&libc::SOL_SOCKET.to_ne_bytes());
        control[12..16].copy_from_slice(&libc::SCM_CREDENTIALS.to_ne_bytes());
        control[16..20].copy_from_slice(&77i32.to_ne_bytes());
        control[20..24].copy_from_slice(&5u32.to_ne_bytes());
        control[24..28].copy_from_slice(&6u32.to_ne_bytes());
        assert_eq!(
            control_messages(&control),
            Some(Credentials {
                pid: 77,
                uid: 5,
                gid: 6
            })
        );
        // A hostile length is refused, not followed.
        control[0..8].copy_from_slice(&4096usize.to_ne_bytes());
        assert_eq!(control_messages(&control), None);
        assert_eq!(control_messages(&[]), None);
    }
}
