//! The KMES directory: one ring file per logical CPU, named `cpu-NNN.ring`.
//!
//! The daemon creates missing rings and attaches every online CPU's ring
//! ([`KmesDir::attach_all`]); producers open the ring of the CPU they run on
//! ([`Emitter`]).

use super::format::{Geometry, PAGE_SIZE_DEFAULT, RING_BYTES_DEFAULT};
use super::orphan::OrphanReport;
use super::{EmitError, Event, FileState, Ring, RingError, TypedFields};
use crate::access::files::Found;
use crate::access::Mode;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A ring the daemon attached, with its dense ordinal (R4: ordinals follow
/// logical CPU ids, skipping rings that failed to attach).
pub struct AttachedRing {
    pub ordinal: usize,
    pub cpu: u32,
    pub ring: Arc<Ring>,
}

/// The outcome of attaching: the rings that work, for each one that does
/// not, why, and what was mended on the way (for the log).
pub struct Attached {
    pub rings: Vec<AttachedRing>,
    pub failures: Vec<(u32, RingError)>,
    pub repairs: Vec<(u32, String)>,
}

/// The logical cpu id stored with eventd's own syslog ring: above every
/// cpu id Linux can have (at most 8192), so it never names a real CPU.
pub const SYSLOG_RING_CPU: u32 = 1 << 20;
/// The cpu id of eventd's own kernel log ring (`KernelLog`), beside the
/// syslog ring's: a flood of either cannot overwrite the other's records.
pub const KERNEL_RING_CPU: u32 = SYSLOG_RING_CPU + 1;

/// Whether `cpu` names one of eventd's own rings (mode 0600, written only
/// by eventd), whose events eventd vouches for: every cpu id from
/// [`SYSLOG_RING_CPU`] on.
pub fn is_own_ring(cpu: u32) -> bool {
    cpu >= SYSLOG_RING_CPU
}

/// How a ring is named to people: `syslog` and `kernel` for eventd's own
/// rings, else `cpu` and the number.
pub fn ring_name(cpu: u32) -> std::borrow::Cow<'static, str> {
    match cpu {
        SYSLOG_RING_CPU => "syslog".into(),
        KERNEL_RING_CPU => "kernel".into(),
        _ => format!("cpu{cpu}").into(),
    }
}

pub struct KmesDir {
    dir: PathBuf,
}

impl KmesDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn ring_path(&self, cpu: u32) -> PathBuf {
        self.dir.join(format!("cpu-{cpu:03}.ring"))
    }

    /// The file of eventd's own syslog ring.
    pub fn syslog_ring_path(&self) -> PathBuf {
        self.dir.join("syslog.ring")
    }

    /// Creates every missing ring of `cpus` with about `ring_bytes` of pages
    /// each, mode `mode`, then attaches them. A ring file that cannot be used
    /// (a corrupt or truncated header, the wrong cpu, another user's file or
    /// a symlink) is moved aside as `NAME.bad` and made anew, so no CPU stays
    /// without a ring; a ring that still cannot be made (a full disk) is
    /// reported in `failures` and skipped. Sparse ring files get their blocks
    /// allocated.
    pub fn attach_all(
        &self,
        cpus: &[u32],
        ring_bytes: usize,
        mode: Mode,
    ) -> Result<Attached, RingError> {
        self.create_dir()?;
        let geometry = Self::geometry(ring_bytes);
        let mut sorted = cpus.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut attached = Attached {
            rings: Vec::new(),
            failures: Vec::new(),
            repairs: Vec::new(),
        };
        for cpu in sorted {
            let mut repairs = Vec::new();
            match self.open_or_create(&self.ring_path(cpu), cpu, geometry, mode, &mut repairs) {
                Ok(ring) => attached.rings.push(AttachedRing {
                    ordinal: attached.rings.len(),
                    cpu,
                    ring: Arc::new(ring),
                }),
                Err(e) => attached.failures.push((cpu, e)),
            }
            attached
                .repairs
                .extend(repairs.into_iter().map(|r| (cpu, r)));
        }
        Ok(attached)
    }

    /// Attaches (creating or mending it as [`attach_all`](Self::attach_all)
    /// does) eventd's own syslog ring, which no producer may open.
    pub fn attach_syslog(
        &self,
        ring_bytes: usize,
        repairs: &mut Vec<String>,
    ) -> Result<Ring, RingError> {
        self.create_dir()?;
        let path = self.syslog_ring_path();
        let geometry = Self::geometry(ring_bytes);
        self.open_or_create(&path, SYSLOG_RING_CPU, geometry, Mode::PRIVATE, repairs)
    }

    /// Attaches eventd's own kernel log ring (`kernel.ring`), as
    /// [`attach_syslog`](Self::attach_syslog) does the syslog ring.
    pub fn attach_kernel(
        &self,
        ring_bytes: usize,
        repairs: &mut Vec<String>,
    ) -> Result<Ring, RingError> {
        self.create_dir()?;
        let path = self.dir.join("kernel.ring");
        let geometry = Self::geometry(ring_bytes);
        self.open_or_create(&path, KERNEL_RING_CPU, geometry, Mode::PRIVATE, repairs)
    }

    /// Creates the directory if it is missing (the daemon gives it its mode
    /// before attaching; this is for tools and tests).
    fn create_dir(&self) -> Result<(), RingError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| RingError::Io {
            path: self.dir.clone(),
            source,
        })
    }

    /// The geometry for rings of about `ring_bytes`.
    pub fn geometry(ring_bytes: usize) -> Geometry {
        Geometry::for_ring_bytes(ring_bytes, PAGE_SIZE_DEFAULT)
            .or_else(|| Geometry::for_ring_bytes(RING_BYTES_DEFAULT, PAGE_SIZE_DEFAULT))
            .expect("the default geometry is valid")
    }

    fn open_or_create(
        &self,
        path: &Path,
        cpu: u32,
        geometry: Geometry,
        mode: Mode,
        repairs: &mut Vec<String>,
    ) -> Result<Ring, RingError> {
        let io = |source| RingError::Io {
            path: path.to_path_buf(),
            source,
        };
        let found = crate::access::files::check_file(path, mode).map_err(io)?;
        let unusable = match found {
            Found::Missing => return Self::create_or_open(path, cpu, geometry, mode),
            Found::Untrusted(why) => why,
            Found::Trusted => match Ring::open_allocated(path, Some(cpu)) {
                Ok((ring, allocated)) => {
                    if allocated {
                        repairs.push("its blocks were not all allocated; now they are".into());
                    }
                    return Ok(ring);
                }
                // Nothing to move aside for: the file is fine, the disk
                // is full (the ring is not attached; it would fault).
                Err(e @ RingError::Allocate { .. }) => return Err(e),
                Err(e) => e.to_string(),
            },
        };
        let aside = path.with_extension("ring.bad");
        std::fs::rename(path, &aside).map_err(io)?;
        repairs.push(format!(
            "not usable ({unusable}); moved aside to {} and made anew (a new epoch: what it \
             held is not read)",
            aside.display()
        ));
        Self::create_or_open(path, cpu, geometry, mode)
    }

    /// Creates the ring; if another process did at the same moment, opens
    /// theirs.
    fn create_or_open(
        path: &Path,
        cpu: u32,
        geometry: Geometry,
        mode: Mode,
    ) -> Result<Ring, RingError> {
        match Ring::create_with(path, geometry, cpu, mode) {
            Err(RingError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                Ring::open(path, Some(cpu))
            }
            other => other,
        }
    }
}

/// The ring the daemon now uses for one CPU (or its syslog ring), which it
/// may replace with a new one while others hold the old: they look at the
/// generation (one load) and take the new ring when it changed.
pub struct CurrentRing {
    generation: AtomicU64,
    ring: Mutex<Arc<Ring>>,
}

impl CurrentRing {
    pub fn new(ring: Arc<Ring>) -> Self {
        CurrentRing {
            generation: AtomicU64::new(1),
            ring: Mutex::new(ring),
        }
    }

    /// The ring now in use.
    pub fn get(&self) -> Arc<Ring> {
        self.lock().clone()
    }

    /// Puts `ring` in place of the current one.
    pub fn replace(&self, ring: Arc<Ring>) {
        *self.lock() = ring;
        // Release: a holder that sees the new generation and then takes the
        // lock gets the new ring (the lock orders it anyway; this keeps the
        // fast check honest on its own).
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// `cached` brought up to date: the ring is taken again only when the
    /// generation moved.
    pub fn refresh<'c>(&self, cached: &'c mut (u64, Arc<Ring>)) -> &'c Arc<Ring> {
        // Acquire: pairs with `replace`.
        let now = self.generation.load(Ordering::Acquire);
        if now != cached.0 {
            *cached = (now, self.get());
        }
        &cached.1
    }

    /// A holder's first cached value.
    pub fn cached(&self) -> (u64, Arc<Ring>) {
        // Acquire: as in `refresh`.
        (self.generation.load(Ordering::Acquire), self.get())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Arc<Ring>> {
        // The guarded value is one Arc, replaced whole: never half-written.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The logical CPUs that are online, from `/sys/devices/system/cpu/online`
/// (falling back to `0..available_parallelism`).
pub fn online_cpus() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(s.trim()))
        .unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n as u32).collect()
        })
}

/// Parses a kernel CPU list such as `0-3,5,7-8`.
pub fn parse_cpu_list(list: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Most CPU ids an emitter keeps rings for.
const CPU_IDS_MAX: usize = 4096;
/// A ring found gone (truncated, replaced) is opened again at most this
/// often per CPU; emits in between fail with [`EmitError::Gone`].
const REOPEN_INTERVAL_MS: u64 = 100;
/// Rings one thread keeps at hand (see `CACHE`): a thread that moves
/// between more CPUs than this takes a lock now and then.
const CACHE_ENTRIES_MAX: usize = 8;
/// A thread looks at the name of a ring it emits into (is that file still
/// the one it writes into?) when its events' timestamps have moved this far
/// since it last looked, or after this many events, whichever comes first:
/// one `stat` per thread and ring a tenth of a second at most, no system
/// call on the path of an event otherwise. See [`super::orphan`].
const IDENTITY_CHECK_NS: i64 = 100_000_000;
const IDENTITY_CHECK_EVENTS: u32 = 1 << 16;

/// The producer side for programs: emits into the ring of the CPU the calling
/// thread runs on, opening rings on first use, and again when the daemon
/// replaced one (or its file was truncated).
pub struct Emitter {
    /// Tells this emitter's entries in the threads' caches from another's.
    id: u64,
    kmes: KmesDir,
    slots: Vec<Slot>,
}

/// One CPU's ring, as this emitter has it.
struct Slot {
    /// Bumped each time `ring` is set; 0: never opened.
    generation: AtomicU64,
    ring: Mutex<Option<Arc<Ring>>>,
    /// When the ring was last opened (ms, `sync` clock).
    opened_ms: AtomicU64,
    /// A report of a ring this process claimed (see [`super::orphan`]), to
    /// be written into the ring that replaced it as soon as there is one.
    report: Mutex<Option<OrphanReport>>,
}

/// A ring a thread emitted into last on one CPU: emits take it from here
/// with no lock and no reference count, as long as the slot's generation
/// has not moved.
struct Cached {
    emitter: u64,
    cpu: u32,
    generation: u64,
    ring: Arc<Ring>,
    /// Event time of this thread's last look at the ring's name, and events
    /// emitted since (see [`IDENTITY_CHECK_NS`]).
    checked_ns: Cell<i64>,
    since_check: Cell<u32>,
}

impl Cached {
    /// Counts an event at `ts_ns`; whether it is time to look at the
    /// ring's name again (and if so, starts the count over).
    fn identity_check_due(&self, ts_ns: i64) -> bool {
        let since = self.since_check.get().saturating_add(1);
        let due = since >= IDENTITY_CHECK_EVENTS
            || ts_ns.abs_diff(self.checked_ns.get()) >= IDENTITY_CHECK_NS as u64;
        if due {
            self.checked_ns.set(ts_ns);
            self.since_check.set(0);
        } else {
            self.since_check.set(since);
        }
        due
    }
}

thread_local! {
    static CACHE: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
}

impl Drop for Emitter {
    /// Takes this emitter's rings out of the dropping thread's cache, so
    /// their mappings go with the emitter (other threads' entries go when
    /// they are pushed out, or with the thread).
    fn drop(&mut self) {
        let _ = CACHE.try_with(|cache| {
            if let Ok(mut cache) = cache.try_borrow_mut() {
                cache.retain(|e| e.emitter != self.id);
            }
        });
    }
}

impl Emitter {
    /// An emitter for the rings in `dir` (the daemon's `DATA_DIR/kmes`). Fails
    /// if the directory does not exist.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Emitter, RingError> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let kmes = KmesDir::new(dir);
        std::fs::read_dir(kmes.path()).map_err(|source| {
            if source.kind() == std::io::ErrorKind::PermissionDenied {
                RingError::NotAProducer {
                    path: kmes.path().to_path_buf(),
                }
            } else {
                RingError::Io {
                    path: kmes.path().to_path_buf(),
                    source,
                }
            }
        })?;
        Ok(Emitter {
            // Relaxed: only uniqueness matters.
            id: IDS.fetch_add(1, Ordering::Relaxed),
            kmes,
            slots: (0..CPU_IDS_MAX)
                .map(|_| Slot {
                    generation: AtomicU64::new(0),
                    ring: Mutex::new(None),
                    opened_ms: AtomicU64::new(0),
                    report: Mutex::new(None),
                })
                .collect(),
        })
    }

    /// Emits `event` into the current CPU's ring; returns that CPU's id.
    /// A ring found gone is opened again once and the event retried.
    pub fn emit(&self, event: &Event<'_>) -> Result<u32, EmitRingError> {
        self.emit_with(event.ts_ns, |ring| ring.emit(event))
    }

    /// [`Emitter::emit`] with typed fields ([`Ring::emit_typed`]).
    pub fn emit_typed<F: TypedFields + ?Sized>(
        &self,
        event: &Event<'_>,
        fields: &F,
    ) -> Result<u32, EmitRingError> {
        self.emit_with(event.ts_ns, |ring| ring.emit_typed(event, fields))
    }

    /// Runs `write` on the current CPU's ring (again once on a ring found
    /// gone and opened anew).
    #[inline]
    fn emit_with(
        &self,
        ts_ns: i64,
        write: impl Fn(&Ring) -> Result<(), EmitError>,
    ) -> Result<u32, EmitRingError> {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        let cpu = u32::try_from(cpu).unwrap_or(0);
        let (generation, result) = self.on_ring(cpu, ts_ns, &write)?;
        match result {
            Err(EmitError::Gone) => {
                self.reopen(cpu, generation)?;
                self.on_ring(cpu, ts_ns, &write)?.1?;
            }
            other => other?,
        }
        Ok(cpu)
    }

    /// The ring of `cpu` now, opened on first use.
    pub fn ring(&self, cpu: u32) -> Result<Arc<Ring>, EmitRingError> {
        let slot = self.slot(cpu)?;
        Ok(self.current(cpu, slot)?.1)
    }

    /// Whether `ring` (this emitter's ring of `cpu` at `generation`) is
    /// still the file at its name. If another file is there, or none, the
    /// ring was taken from under this process: claim it (see
    /// [`super::orphan`]), keep the report of it for its successor, and
    /// open the successor if there is one. Also writes a report still
    /// waiting into the current ring.
    fn still_at_its_name(&self, cpu: u32, generation: u64, ring: &Arc<Ring>) -> bool {
        let Ok(slot) = self.slot(cpu) else {
            return true;
        };
        match ring.file_state() {
            FileState::Removed | FileState::Replaced => {}
            // A shrunk file faults the mapping; the emit then says `Gone`.
            FileState::Intact | FileState::Shrunk => {
                self.write_report(slot, ring);
                return true;
            }
        }
        if ring.retire() {
            // Our claim: the front is frozen now; read it with the sequence
            // the daemon's reader last published as the reference for its
            // upper bits.
            let reference = ring.published_read_position().next_seq.max(1);
            let last_seq = ring.front_last_seq(reference).unwrap_or(reference - 1);
            *lock(&slot.report) = Some(OrphanReport {
                epoch: ring.epoch(),
                cpu,
                last_seq,
            });
        }
        // Opens the ring now at the name (and writes the report into it),
        // unless another thread did, or it was tried a moment ago: then the
        // next emit finds the old ring retired and tries again.
        let _ = self.reopen(cpu, generation);
        false
    }

    /// Writes the report `slot` keeps (if any) into `ring`, the ring now at
    /// the name; kept for the next try if the ring refuses it.
    fn write_report(&self, slot: &Slot, ring: &Ring) {
        let mut pending = lock(&slot.report);
        let Some(report) = *pending else {
            return;
        };
        if report.epoch == ring.epoch() {
            return;
        }
        // SAFETY: getpid, gettid and getuid have no preconditions.
        let ids = unsafe { (libc::getpid() as u32, libc::gettid() as u32, libc::getuid()) };
        let (message, fields) = (report.message(), report.fields());
        if ring
            .emit(&report.event(super::now_ns(), ids, &message, &fields))
            .is_ok()
        {
            *pending = None;
        }
    }

    fn slot(&self, cpu: u32) -> Result<&Slot, EmitRingError> {
        self.slots
            .get(cpu as usize)
            .ok_or_else(|| self.no_ring(cpu))
    }

    fn no_ring(&self, cpu: u32) -> EmitRingError {
        EmitRingError::Ring(RingError::NoRing {
            cpu,
            dir: self.kmes.path().to_path_buf(),
        })
    }

    /// Runs `f` on the ring of `cpu`: from this thread's cache when it is
    /// current, else from the slot (opening the ring if needed), which then
    /// goes into the cache. Returns the generation `f` ran on.
    /// `ts_ns` is the event's time, which paces the look at the ring's name
    /// (see [`IDENTITY_CHECK_NS`]).
    fn on_ring<R>(
        &self,
        cpu: u32,
        ts_ns: i64,
        f: impl FnOnce(&Ring) -> R,
    ) -> Result<(u64, R), EmitRingError> {
        let slot = self.slot(cpu)?;
        // Acquire: pairs with the Release bump in `store`, so the cached
        // ring of this generation is the one stored with it.
        let generation = slot.generation.load(Ordering::Acquire);
        let mut f = Some(f);
        let hit = CACHE
            .try_with(|cache| {
                let cache = cache.try_borrow().ok()?;
                // Newest first: entries of emitters dropped on other
                // threads stay until pushed out, in front.
                let entry = cache
                    .iter()
                    .rev()
                    .find(|e| e.emitter == self.id && e.cpu == cpu && e.generation == generation)?;
                if entry.identity_check_due(ts_ns)
                    && !self.still_at_its_name(cpu, generation, &entry.ring)
                {
                    // The slot has moved on (or will at the next try): take
                    // its ring below, as on a miss.
                    return None;
                }
                // `f` is still there: this is the only place before the
                // miss path that takes it.
                let f = f.take()?;
                Some(f(&entry.ring))
            })
            .ok()
            .flatten();
        if let Some(r) = hit {
            return Ok((generation, r));
        }
        let (generation, ring) = self.current(cpu, slot)?;
        // Not taken: the cache path above returned if it took it.
        let f = f.take().ok_or_else(|| self.no_ring(cpu))?;
        let result = f(&ring);
        let _ = CACHE.try_with(|cache| {
            // A re-entrant call (from inside `f`) finds the cache borrowed
            // and simply does not cache.
            if let Ok(mut cache) = cache.try_borrow_mut() {
                cache.retain(|e| !(e.emitter == self.id && e.cpu == cpu));
                if cache.len() >= CACHE_ENTRIES_MAX {
                    cache.remove(0);
                }
                cache.push(Cached {
                    emitter: self.id,
                    cpu,
                    generation,
                    ring,
                    checked_ns: Cell::new(ts_ns),
                    since_check: Cell::new(0),
                });
            }
        });
        Ok((generation, result))
    }

    /// The slot's ring and generation, opening the ring on first use.
    fn current(&self, cpu: u32, slot: &Slot) -> Result<(u64, Arc<Ring>), EmitRingError> {
        let mut ring = lock(&slot.ring);
        if let Some(r) = ring.as_ref() {
            // Acquire: as in `on_ring` (the lock orders it too).
            return Ok((slot.generation.load(Ordering::Acquire), r.clone()));
        }
        let opened = self.open_ring(cpu)?;
        *ring = Some(opened.clone());
        Ok((store(slot), opened))
    }

    /// Opens `cpu`'s ring file again after the ring the caller used at
    /// `generation` was found gone, unless another thread did already, or
    /// the last attempt was less than [`REOPEN_INTERVAL_MS`] ago.
    fn reopen(&self, cpu: u32, generation: u64) -> Result<(), EmitRingError> {
        let slot = self.slot(cpu)?;
        let mut ring = lock(&slot.ring);
        // Acquire: as in `on_ring`.
        if slot.generation.load(Ordering::Acquire) != generation {
            return Ok(());
        }
        let now = crate::sync::monotonic_ms();
        // Relaxed: read and written under the slot's lock.
        if now.saturating_sub(slot.opened_ms.load(Ordering::Relaxed)) < REOPEN_INTERVAL_MS {
            return Err(EmitRingError::Emit(EmitError::Gone));
        }
        // Counted as an attempt whether or not the open succeeds: a ring
        // file that stays broken is tried again at most this often.
        slot.opened_ms.store(now, Ordering::Relaxed);
        let opened = self.open_ring(cpu)?;
        self.write_report(slot, &opened);
        *ring = Some(opened);
        store(slot);
        Ok(())
    }

    fn open_ring(&self, cpu: u32) -> Result<Arc<Ring>, EmitRingError> {
        match Ring::open(&self.kmes.ring_path(cpu), Some(cpu)) {
            Ok(ring) => Ok(Arc::new(ring)),
            Err(RingError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Err(self.no_ring(cpu))
            }
            Err(e) => Err(EmitRingError::Ring(e)),
        }
    }
}

/// Bumps a slot's generation after its ring was set (under its lock).
fn store(slot: &Slot) -> u64 {
    // Release: a thread that sees the new generation sees the new ring.
    slot.generation.fetch_add(1, Ordering::Release) + 1
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every write under these locks is one whole assignment.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Emitting through an [`Emitter`] failed.
#[derive(Debug, thiserror::Error)]
pub enum EmitRingError {
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(transparent)]
    Emit(#[from] EmitError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,5,7-8"), Some(vec![0, 1, 2, 3, 5, 7, 8]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
        assert!(!online_cpus().is_empty());
    }
}
