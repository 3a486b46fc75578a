//! The producer that client libraries build on (the `tracing` layer and
//! `log` backend of `eventd-tracing`, `libeventd` for C, the Python
//! handler): an [`Emitter`] that a program can hold from its first line,
//! whether or not eventd has made its rings yet, and that never blocks,
//! never panics and never fails the program.
//!
//! While the ring directory cannot be opened, events are dropped and
//! counted; the directory is tried again at most once a second, and the
//! first failure is said once on stderr (a client library has no other
//! voice). Once open, an emit is [`Emitter::emit`]'s: the calling CPU's
//! ring, lock-free. With eventd stopped the rings are still there and keep
//! what is emitted for its next start (until they lap, which eventd counts
//! as gaps); nothing here needs the daemon to run.

pub mod budget;
mod count;

pub use super::json::Fields;
pub use super::typed::truncate;

use super::{EmitError, Emitter, Event, Field, Level, RingError, TypedFields};
use crate::rings::attach::EmitRingError;
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// How often a directory that could not be opened is tried again.
const RETRY_MS: u64 = 1000;

/// The longest provider or name a ring takes, in bytes.
pub const NAME_BYTES_MAX: usize = 255;

/// Why one event was not written. Every one of them is also counted in
/// [`Producer::dropped`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// The ring directory (or this CPU's ring) is not there: eventd has not
    /// made it, or the path is wrong.
    NoRings,
    /// The ring directory or file may not be opened by this user (not in
    /// eventd's ProducerGroup).
    Permission,
    /// The event is larger than a ring record can hold.
    TooLarge,
    /// The ring was contended, replaced or cut under the event.
    Busy,
    /// Anything else the ring said (a damaged ring file, an I/O error).
    Failed,
    /// Past this provider's budget in this process ([`budget`]); counted
    /// and reported into the ring when the window ends.
    Limited,
}

impl Dropped {
    pub fn describe(self) -> &'static str {
        match self {
            Dropped::NoRings => "the ring directory or this CPU's ring does not exist",
            Dropped::Permission => "this user may not open eventd's rings (ProducerGroup)",
            Dropped::TooLarge => "the event is larger than a ring record holds",
            Dropped::Busy => "the ring was contended or replaced under the event",
            Dropped::Failed => "the ring could not be written",
            Dropped::Limited => "past this provider's rate limit in this process",
        }
    }
}

/// A never-failing producer for one program (see the module docs).
pub struct Producer {
    dir: PathBuf,
    provider: String,
    emitter: OnceLock<Emitter>,
    /// Serialises opening attempts (taken only until the rings are open).
    opening: Mutex<()>,
    /// `sync` clock ms before which no new attempt is made.
    retry_at_ms: AtomicU64,
    said: AtomicBool,
    /// Events written, counted per thread (see [`count`]).
    emitted: count::ThreadCount,
    /// Events not written, counted per thread too: a flood refused by the
    /// budget on many threads does not pass one line between their CPUs.
    dropped: count::ThreadCount,
    /// This provider's budget in this process (the daemon's limit unless
    /// fixed by `EVENTD_RATE_LIMIT` or [`Producer::with_budget`]).
    budget: budget::Budget,
}

impl Producer {
    /// A producer for the rings in `dir` (eventd's `DATA_DIR/kmes`), naming
    /// itself `provider` (cut to 255 bytes at a character boundary). Opens
    /// nothing yet.
    pub fn new(dir: impl Into<PathBuf>, provider: &str) -> Producer {
        Producer {
            dir: dir.into(),
            provider: truncate(provider, NAME_BYTES_MAX).to_string(),
            emitter: OnceLock::new(),
            opening: Mutex::new(()),
            retry_at_ms: AtomicU64::new(0),
            said: AtomicBool::new(false),
            emitted: count::ThreadCount::new(),
            dropped: count::ThreadCount::new(),
            budget: budget::Budget::from_env(),
        }
    }

    /// The ring directory clients use when told nothing: `$EVENTD_KMES_DIR`,
    /// else `$EVENTD_DATA_DIR/kmes`, else `./eventd-data/kmes` (eventd's
    /// own default `--data-dir`).
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("EVENTD_KMES_DIR").filter(|d| !d.is_empty()) {
            return PathBuf::from(d);
        }
        match std::env::var_os("EVENTD_DATA_DIR").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d).join("kmes"),
            None => PathBuf::from("eventd-data/kmes"),
        }
    }

    /// The program's name (`/proc/self/comm`'s source: the executable's
    /// file name), the default provider.
    pub fn program_name() -> String {
        std::env::args_os()
            .next()
            .and_then(|a| {
                Path::new(&a)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "unknown".to_string())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// Events written into a ring.
    pub fn emitted(&self) -> u64 {
        self.emitted.total()
    }

    /// Events not written, for any [`Dropped`] reason.
    pub fn dropped(&self) -> u64 {
        self.dropped.total()
    }

    /// Writes one event. `name` is cut to 255 bytes; `fields` is a JSON
    /// object's text or empty (eventd stores anything else as
    /// `{"invalid_fields": ...}`).
    pub fn emit(
        &self,
        level: Level,
        name: &str,
        message: &str,
        fields: &str,
    ) -> Result<(), Dropped> {
        self.emit_via(level, name, message, fields, |e, event| e.emit(event))
    }

    /// Writes one event with typed fields (see [`crate::rings::typed`]):
    /// the fast path, no formatting; eventd stores them as the JSON object
    /// [`Producer::emit`] would have written.
    pub fn emit_typed<F: TypedFields + ?Sized>(
        &self,
        level: Level,
        name: &str,
        message: &str,
        fields: &F,
    ) -> Result<(), Dropped> {
        self.emit_via(level, name, message, "", |e, event| {
            e.emit_typed(event, fields)
        })
    }

    /// [`Producer::emit_typed`] with the fields as a slice of [`Field`]s.
    pub fn emit_items(
        &self,
        level: Level,
        name: &str,
        message: &str,
        fields: &[Field<'_>],
    ) -> Result<(), Dropped> {
        self.emit_typed(level, name, message, fields)
    }

    #[inline]
    fn emit_via(
        &self,
        level: Level,
        name: &str,
        message: &str,
        fields: &str,
        write: impl FnOnce(&Emitter, &Event<'_>) -> Result<u32, EmitRingError>,
    ) -> Result<(), Dropped> {
        // The event's time first: it also paces the budget's look at the
        // daemon's limit, so an event under no limit reads one clock.
        let ts_ns = super::now_ns();
        if !self.within_budget(level, ts_ns) {
            return Err(Dropped::Limited);
        }
        let result = match self.open() {
            Some(emitter) => {
                let Ids { pid, tid, uid, .. } = ids_at(ts_ns);
                let event = Event {
                    ts_ns,
                    pid,
                    tid,
                    uid,
                    level,
                    provider: &self.provider,
                    name: truncate(name, NAME_BYTES_MAX),
                    message,
                    fields,
                };
                write(emitter, &event).map_err(classify)
            }
            None => Err(Dropped::NoRings),
        };
        match result {
            Ok(_) => self.emitted.add(),
            Err(_) => self.dropped.add(),
        }
        result.map(drop)
    }

    /// The emitter, opening the directory if it is time to try.
    #[inline]
    fn open(&self) -> Option<&Emitter> {
        match self.emitter.get() {
            Some(e) => Some(e),
            None => self.open_dir(),
        }
    }

    /// [`Producer::open`] before the rings are open: tries the directory
    /// if it is time to.
    #[cold]
    fn open_dir(&self) -> Option<&Emitter> {
        let now = crate::sync::monotonic_ms();
        // Relaxed: a hint of when to try; the lock below decides.
        if now < self.retry_at_ms.load(Ordering::Relaxed) {
            return None;
        }
        // Threads that emit first at the same moment wait here for the one
        // attempt (a directory listing, microseconds) rather than drop
        // their events; after that, this lock is never taken again. A
        // poisoned lock guards nothing but the attempt itself.
        let _guard = self.opening.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.emitter.get() {
            return Some(e);
        }
        // Relaxed: under the lock; another thread's failed attempt counts.
        if now < self.retry_at_ms.load(Ordering::Relaxed) {
            return None;
        }
        match Emitter::open(&self.dir) {
            Ok(e) => Some(self.emitter.get_or_init(|| e)),
            Err(why) => {
                self.retry_at_ms.store(now + RETRY_MS, Ordering::Relaxed);
                self.say_once(&why);
                None
            }
        }
    }

    fn say_once(&self, why: &RingError) {
        // Relaxed: at most one message is all that matters.
        if !self.said.swap(true, Ordering::Relaxed) {
            eprintln!(
                "eventd: cannot open the rings in {} ({why}); events of {} are dropped and \
                 counted until it can",
                self.dir.display(),
                self.provider
            );
        }
    }
}

fn classify(e: EmitRingError) -> Dropped {
    match e {
        EmitRingError::Ring(RingError::NoRing { .. }) => Dropped::NoRings,
        EmitRingError::Ring(RingError::NotAProducer { .. }) => Dropped::Permission,
        EmitRingError::Ring(RingError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            Dropped::Permission
        }
        EmitRingError::Ring(_) => Dropped::Failed,
        EmitRingError::Emit(EmitError::Encode(_)) => Dropped::TooLarge,
        EmitRingError::Emit(EmitError::Busy | EmitError::Overwritten | EmitError::Gone) => {
            Dropped::Busy
        }
    }
}

/// How long a thread's cached uid is used before it is asked again: a
/// daemon that drops privileges is reported as its new user within this
/// (`getuid` is a system call: asking per event would double the cost).
const UID_REFRESH_NS: i64 = 100_000_000;

/// The process id, asked again after a fork (0: not known).
static PID: AtomicU32 = AtomicU32::new(0);

/// A thread's ids as an event carries them.
#[derive(Clone, Copy)]
struct Ids {
    /// The pid they were taken under (a fork's child has another).
    pid: u32,
    tid: u32,
    uid: u32,
    /// When `uid` was asked, ns since the epoch.
    uid_asked_ns: i64,
}

thread_local! {
    /// This thread's ids, in one place so an event looks once.
    static IDS: Cell<Ids> = const {
        Cell::new(Ids { pid: 0, tid: 0, uid: 0, uid_asked_ns: i64::MIN })
    };
}

extern "C" fn forget_pid() {
    // Relaxed: the child runs one thread at this point.
    PID.store(0, Ordering::Relaxed);
}

/// The process id, cached until a fork.
fn pid() -> u32 {
    // Relaxed: the pid is only ever the process's own; a stale 0 asks again.
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: forget_pid is async-signal-safe (one atomic store) and
        // lives as long as the program.
        unsafe { libc::pthread_atfork(None, None, Some(forget_pid)) };
    });
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    PID.store(pid, Ordering::Relaxed);
    pid
}

fn ask_tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn ask_uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// This thread's pid, tid and uid (the uid as of at most
/// [`UID_REFRESH_NS`] before `now`) without a system call in the steady
/// state: all are cached, and a fork (which copies the caches into a child
/// with other ids) makes the child ask again.
fn ids_at(now: i64) -> Ids {
    let pid = pid();
    IDS.try_with(|cell| {
        let mut ids = cell.get();
        let fresh_uid =
            now.wrapping_sub(ids.uid_asked_ns) < UID_REFRESH_NS && now >= ids.uid_asked_ns;
        if ids.pid == pid && ids.tid != 0 && fresh_uid {
            return ids;
        }
        if ids.pid != pid || ids.tid == 0 {
            ids.pid = pid;
            ids.tid = ask_tid();
        }
        if !fresh_uid {
            ids.uid = ask_uid();
            ids.uid_asked_ns = now;
        }
        cell.set(ids);
        ids
    })
    // A thread being torn down: ask directly.
    .unwrap_or_else(|_| Ids {
        pid,
        tid: ask_tid(),
        uid: ask_uid(),
        uid_asked_ns: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_drops_and_counts_and_says_so_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = Producer::new(dir.path().join("absent"), "test");
        for _ in 0..3 {
            assert_eq!(p.emit(Level::Info, "n", "m", ""), Err(Dropped::NoRings));
        }
        assert_eq!((p.emitted(), p.dropped()), (0, 3));
        assert!(p.said.load(Ordering::Relaxed));
    }

    #[test]
    fn names_are_cut_at_a_character_boundary() {
        let s = "é".repeat(200);
        let t = truncate(&s, 255);
        assert_eq!(t.len(), 254);
        assert!(t.chars().all(|c| c == 'é'));
        assert_eq!(truncate("short", 255), "short");
    }

    #[test]
    fn ids_are_this_threads() {
        let now = crate::rings::now_ns();
        let Ids { pid, tid, uid, .. } = ids_at(now);
        // SAFETY: no preconditions.
        assert_eq!(uid, unsafe { libc::getuid() });
        // SAFETY: no preconditions.
        assert_eq!(pid, unsafe { libc::getpid() } as u32);
        // SAFETY: no preconditions.
        assert_eq!(tid, unsafe { libc::gettid() } as u32);
        let other = std::thread::spawn(move || ids_at(now)).join().unwrap();
        assert_eq!(other.pid, pid);
        assert_ne!(other.tid, tid);
    }
}
