//! KMES rings: one memory-mapped event ring per logical CPU (DESIGN §1.1).
//!
//! Producers — any thread of any process on the host — write events into the
//! ring of the CPU they run on, lock-free and without ever waiting for the
//! daemon ([`producer`]). When a ring is full the oldest page is overwritten.
//! One drain thread per ring reads it ([`reader`]): events in sequence order,
//! or gaps with the exact number of events lost and why. The ring file is
//! writable by every producer, so the reader treats its contents as untrusted
//! input. `docs/design/rings.md` describes the format byte by byte.

#[cfg(not(loom))]
pub mod attach;
pub mod budget;
#[cfg(not(loom))]
pub mod client;
#[cfg(not(loom))]
pub mod drops;
pub mod event;
pub mod format;
#[cfg(not(loom))]
pub mod guard;
pub mod json;
mod memory;
#[cfg(not(loom))]
pub mod orphan;
pub mod per_cpu;
pub mod producer;
mod published;
pub mod reader;
pub mod typed;
mod unread;

#[cfg(not(loom))]
pub use attach::{
    is_own_ring, online_cpus, ring_name, AttachedRing, CurrentRing, Emitter, KmesDir,
    KERNEL_RING_CPU, SYSLOG_RING_CPU,
};
pub use event::{Event, Level};
pub use format::RateLimitWord;
pub use producer::EmitError;
pub use reader::{Gap, LossReason, ReadPosition, RingItem, RingReader, Scribble};
pub use typed::{Encoder, Field, TypedFields, Value};
pub use unread::Unread;

use crate::sync::Ordering;
use format::*;
use memory::RingMemory;
use std::path::{Path, PathBuf};

/// A ring could not be created, opened or attached.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a KMES ring (bad magic {magic:#018x})")]
    BadMagic { path: PathBuf, magic: u64 },
    #[error("{path}: ring format version {version}, this eventd reads version {VERSION}")]
    BadVersion { path: PathBuf, version: u32 },
    #[error(
        "{path}: ring geometry page_size={page_size} page_count={page_count} is invalid \
         (page size a power of two in {PAGE_SIZE_MIN}..={PAGE_SIZE_MAX}, \
         page count a power of two in {PAGE_COUNT_MIN}..={PAGE_COUNT_MAX})"
    )]
    BadGeometry {
        path: PathBuf,
        page_size: u64,
        page_count: u64,
    },
    #[error("{path}: file is {len} bytes, its header promises {need}")]
    Truncated { path: PathBuf, len: u64, need: u64 },
    #[error("{path}: file is {len} bytes, shorter than a ring's {need}-byte header")]
    NoHeader { path: PathBuf, len: u64, need: u64 },
    #[error("{path}: ring says cpu {found}, its name says cpu {expected}")]
    WrongCpu {
        path: PathBuf,
        expected: u32,
        found: u32,
    },
    #[error("no ring for cpu {cpu} in {dir} (is eventd running with --data-dir pointing there?)")]
    NoRing { cpu: u32, dir: PathBuf },
    #[error(
        "{path}: cannot allocate the ring's {bytes} bytes on disk: {source} (a ring's blocks are \
         allocated when it is made, so that a full disk can never fault a producer later)"
    )]
    Allocate {
        path: PathBuf,
        bytes: u64,
        source: std::io::Error,
    },
    #[error(
        "{path}: permission denied: emitting through the rings needs membership of the \
         ProducerGroup eventd runs with (see docs/design/security.md); any user can log through the \
         syslog socket instead"
    )]
    NotAProducer { path: PathBuf },
}

/// One attached ring: its memory and its identity.
pub struct Ring {
    mem: RingMemory,
    geometry: Geometry,
    epoch: u64,
    cpu: u32,
    path: PathBuf,
    /// The file's `(device, inode)` when it was opened: a file replaced or
    /// removed under that name is noticed by [`Ring::file_state`].
    #[cfg(not(loom))]
    identity: (u64, u64),
    /// Creation time from the header as opened (a scribbled header is
    /// written back with it).
    #[cfg(not(loom))]
    created_ns: u64,
}

/// What became of a ring's file since it was opened.
#[cfg(not(loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileState {
    /// Still the same file, at least as long as the ring.
    Intact,
    /// No file at the ring's name any more.
    Removed,
    /// Another file at the ring's name.
    Replaced,
    /// The file is shorter than the ring (truncated), or a fault was caught
    /// in the mapping: the ring's memory is gone.
    Shrunk,
}

impl Ring {
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Random id made when the ring file was created; sequence numbers of
    /// different epochs never mix.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the ring's file shrank under this process's mapping (see
    /// [`guard`]): nothing more can be read from or written to it.
    #[inline(always)]
    pub fn faulted(&self) -> bool {
        self.mem.faulted()
    }

    /// Looks at the ring's file by name: still the one mapped, and whole?
    /// A file found shorter than the ring marks the mapping faulted at once
    /// (before an access faults).
    #[cfg(not(loom))]
    pub fn file_state(&self) -> FileState {
        use std::os::unix::fs::MetadataExt;
        if self.mem.faulted() {
            return FileState::Shrunk;
        }
        match std::fs::symlink_metadata(&self.path) {
            Err(_) => FileState::Removed,
            Ok(m) if (m.dev(), m.ino()) != self.identity => FileState::Replaced,
            Ok(m) if m.len() < self.geometry.file_bytes() as u64 => {
                self.mem.set_faulted();
                FileState::Shrunk
            }
            Ok(_) => FileState::Intact,
        }
    }

    /// Whether the ring's mapping is protected against SIGBUS (see
    /// [`guard`]); false only if the guard table was full.
    #[cfg(not(loom))]
    pub fn guarded(&self) -> bool {
        self.mem.guarded()
    }

    /// Tells producers this ring is given up: their next reservation fails
    /// with [`EmitError::Gone`] and an [`Emitter`] opens the ring's file
    /// again. The mark keeps the front page's ticket and count, so what the
    /// ring holds is frozen from then on ([`Ring::unread`] counts it).
    ///
    /// Returns whether this call set the mark. Whoever sets it accounts for
    /// the ring's unread events, exactly once: the daemon when it replaces a
    /// ring, or a producer that finds the ring's file gone from under it
    /// (see [`Emitter`]). `false` if the ring was retired already, its
    /// mapping faulted, or the word would not settle (bounded).
    pub fn retire(&self) -> bool {
        if self.mem.faulted() {
            return false;
        }
        let reserve = self.mem.word(H_RESERVE);
        // Acquire: the count the mark freezes is read with the words the
        // reservations published (the reader of `unread` loads them after).
        let mut current = reserve.load(Ordering::Acquire);
        for _ in 0..1000 {
            let w = Reserve::unpack(current);
            if w.offset == Reserve::RETIRED {
                return false;
            }
            let retired = Reserve {
                offset: Reserve::RETIRED,
                ..w
            }
            .pack();
            // AcqRel: Acquire as above; Release so that a producer that sees
            // the mark and counts the ring's contents sees the words as the
            // claimant left them. A reservation made before the mark is
            // inside the frozen count.
            match reserve.compare_exchange_weak(
                current,
                retired,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
        false
    }

    /// The header's identity words as written at creation, if the header
    /// disagrees with them (a scribble): they are written back, and the
    /// number of words mended is returned. A producer that opens the ring
    /// validates these words, so a scribbled header would keep every new
    /// producer out.
    #[cfg(not(loom))]
    pub fn mend_header(&self) -> usize {
        let created_ns = self.created_ns;
        let mut mended = 0;
        for (i, want) in [
            (H_MAGIC, MAGIC),
            (
                H_VERSION,
                u64::from(VERSION) | (u64::from(HEADER_WORDS_USED) << 32),
            ),
            (H_EPOCH, self.epoch),
            (
                H_GEOMETRY,
                self.geometry.page_size as u64 | ((self.geometry.page_count as u64) << 32),
            ),
            (H_CPU, u64::from(self.cpu)),
            (H_CREATED_NS, created_ns),
        ] {
            // Relaxed: identity words are read once by producers at open;
            // nothing is ordered with them.
            let word = self.mem.word(i);
            let have = word.load(Ordering::Relaxed);
            // The version word's high half is how many header words the
            // ring's creator knew of: an older eventd's ring is no scribble.
            let same = have == want || (i == H_VERSION && have as u32 == VERSION);
            if !same {
                word.store(want, Ordering::Relaxed);
                mended += 1;
            }
        }
        mended
    }

    /// The reserve word as it is now (the daemon's health checks).
    pub fn reserve_word(&self) -> u64 {
        // Relaxed: compared between two checks; guards nothing.
        self.mem.word(H_RESERVE).load(Ordering::Relaxed)
    }

    /// The last sequence number reserved, as the producers' front page
    /// says, if its words are consistent; `None` otherwise. The front page
    /// starts at or after `page_first` (the reader's page's first sequence),
    /// which gives the 40 stored bits their full value.
    pub fn front_last_seq(&self, page_first: u64) -> Option<u64> {
        let w = Reserve::unpack(self.reserve_word());
        // Relaxed: an estimate for loss accounting.
        let meta = Meta::unpack(
            self.mem
                .word(self.geometry.meta_index(w.ticket))
                .load(Ordering::Relaxed),
        );
        if !meta.holds(w.ticket) || w.count > RECORDS_PER_PAGE_MAX {
            return None;
        }
        seq_from_low(meta.first_seq_low, page_first)?
            .checked_add(u64::from(w.count))?
            .checked_sub(1)
    }

    /// The page producers cannot open, if a meta word is what stops them
    /// (for the daemon's log of a wedged ring): the front page's own meta
    /// word naming another page, or, with the front page closed, its
    /// successor's naming neither that page's previous lap nor the next.
    pub fn unopenable_page(&self) -> Option<Scribble> {
        let g = self.geometry;
        let w = Reserve::unpack(self.reserve_word());
        // Relaxed: read for the log; nothing is read through them.
        let meta_word = |t: u64| self.mem.word(g.meta_index(t)).load(Ordering::Relaxed);
        let scribble = |ticket: u64, what| Scribble {
            ticket,
            slot: ticket & (g.page_count as u64 - 1),
            meta_word: meta_word(ticket),
            what,
        };
        if !Meta::unpack(meta_word(w.ticket)).holds(w.ticket) {
            return Some(scribble(
                w.ticket,
                "it names another page than the one producers reserve in",
            ));
        }
        let next = (w.ticket + 1) & TICKET_MASK;
        let previous = next.wrapping_sub(g.page_count as u64) & TICKET_MASK;
        let found = Meta::unpack(meta_word(next));
        (w.closed() && !found.holds(previous) && !found.holds(next)).then(|| {
            scribble(
                next,
                "it names neither the page's previous lap nor the next one",
            )
        })
    }

    /// How far the reader is behind the producers, in pages, from the
    /// position it last published (at each page boundary and when idle):
    /// 0 when caught up, near the page count when about to be lapped.
    /// Monitoring and load generation only.
    pub fn backlog_pages(&self) -> u64 {
        // Relaxed: an estimate; neither word guards other data here.
        let front = Reserve::unpack(self.mem.word(H_RESERVE).load(Ordering::Relaxed)).ticket;
        let read = Reserve::unpack(self.mem.word(H_READ_POS).load(Ordering::Relaxed)).ticket;
        ticket_distance(front, read).clamp(0, self.geometry.page_count as i64) as u64
    }

    /// Writes a fresh ring's header and page metas into zeroed memory.
    fn initialize(mem: &RingMemory, geometry: Geometry, cpu: u32, epoch: u64, created_ns: u64) {
        // Relaxed: the memory is not shared yet; publication is the rename
        // of the file (or, under loom, the spawn of the model's threads).
        let set = |i: usize, v: u64| mem.word(i).store(v, Ordering::Relaxed);
        set(H_MAGIC, MAGIC);
        set(
            H_VERSION,
            u64::from(VERSION) | (u64::from(HEADER_WORDS_USED) << 32),
        );
        set(H_EPOCH, epoch);
        set(
            H_GEOMETRY,
            geometry.page_size as u64 | ((geometry.page_count as u64) << 32),
        );
        set(H_CPU, u64::from(cpu));
        set(H_CREATED_NS, created_ns);
        set(
            H_RESERVE,
            Reserve {
                ticket: 0,
                offset: 0,
                count: 0,
                wait: false,
            }
            .pack(),
        );
        set(H_READ_POS, ReadPosition::START.position_word());
        set(H_READ_SEQ, ReadPosition::START.next_seq);
        for slot in 0..geometry.page_count as u64 {
            // Page 0 starts the ring at sequence 1; every other slot holds a
            // "previous lap" ticket so that opening it is an ordinary reuse.
            let (ticket, first_seq) = if slot == 0 {
                (0, 1)
            } else {
                (
                    slot.wrapping_sub(geometry.page_count as u64) & TICKET_MASK,
                    0,
                )
            };
            set(
                geometry.meta_index(slot),
                Meta::new(ticket, first_seq).pack(),
            );
        }
    }

    /// A ring in private memory, for loom models.
    #[cfg(loom)]
    pub fn anonymous(geometry: Geometry, cpu: u32) -> Ring {
        let mem = RingMemory::anonymous(geometry);
        Self::initialize(&mem, geometry, cpu, 1, 0);
        Ring {
            mem,
            geometry,
            epoch: 1,
            cpu,
            path: PathBuf::from("<memory>"),
        }
    }

    /// [`Ring::create_with`] a mode private to this user (0600): for tests,
    /// benches and tools.
    #[cfg(not(loom))]
    pub fn create(path: &Path, geometry: Geometry, cpu: u32) -> Result<Ring, RingError> {
        Self::create_with(path, geometry, cpu, crate::access::Mode::PRIVATE)
    }

    /// Creates the ring file at `path` (which must not exist) atomically:
    /// the file is built under a temporary name, with its blocks allocated
    /// and its mode and group set, and linked into place. If another process
    /// created the ring first, its ring wins (`AlreadyExists`).
    #[cfg(not(loom))]
    pub fn create_with(
        path: &Path,
        geometry: Geometry,
        cpu: u32,
        mode: crate::access::Mode,
    ) -> Result<Ring, RingError> {
        Self::build(path, geometry, cpu, mode, None)
    }

    /// Makes a new ring (a new epoch) at `path`, replacing the file there in
    /// one rename: producers that open the name from now on get the new one.
    /// `before_rename` runs once the new ring is ready, right before the
    /// rename (the daemon retires the old ring there).
    #[cfg(not(loom))]
    pub fn create_replacing(
        path: &Path,
        geometry: Geometry,
        cpu: u32,
        mode: crate::access::Mode,
        before_rename: impl FnOnce(),
    ) -> Result<Ring, RingError> {
        Self::build(path, geometry, cpu, mode, Some(Box::new(before_rename)))
    }

    #[cfg(not(loom))]
    fn build(
        path: &Path,
        geometry: Geometry,
        cpu: u32,
        mode: crate::access::Mode,
        replace: Option<Box<dyn FnOnce() + '_>>,
    ) -> Result<Ring, RingError> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::sync::atomic::AtomicU64;
        static MADE: AtomicU64 = AtomicU64::new(0);
        let io = |source| RingError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Unique per process and call: two drains may replace rings at once.
        let tmp = path.with_extension(format!(
            "tmp.{}.{}",
            std::process::id(),
            MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        let bytes = geometry.file_bytes();
        let result = (|| {
            allocate(&file, bytes as u64).map_err(|source| RingError::Allocate {
                path: path.to_path_buf(),
                bytes: bytes as u64,
                source,
            })?;
            crate::access::files::set_mode_fd(&file, mode).map_err(io)?;
            let mem = RingMemory::map(&file, bytes).map_err(io)?;
            Ring::initialize(&mem, geometry, cpu, random_u64(), now_ns() as u64);
            file.sync_all().map_err(io)?;
            if let Some(before_rename) = replace {
                before_rename();
                std::fs::rename(&tmp, path).map_err(io)?;
            } else {
                // Fails if another process created the ring first.
                std::fs::hard_link(&tmp, path).map_err(io)?;
            }
            Ok(mem)
        })();
        let _ = std::fs::remove_file(&tmp);
        let mem = result?;
        if mem.faulted() {
            // Only a file truncated between its making and now gets here.
            return Err(RingError::Truncated {
                path: path.to_path_buf(),
                len: 0,
                need: bytes as u64,
            });
        }
        Self::from_memory(path, &file, mem, Some(cpu))
    }

    /// Opens an existing ring file and validates its header. `cpu`, if given,
    /// must match the cpu the ring says it belongs to.
    #[cfg(not(loom))]
    pub fn open(path: &Path, cpu: Option<u32>) -> Result<Ring, RingError> {
        Self::open_file(path, cpu).map(|(ring, _)| ring)
    }

    /// Opens a ring as the daemon does: like [`Ring::open`], and a ring file
    /// whose blocks are not all allocated (sparse: made by an older eventd
    /// or copied) gets them allocated now, so that a full disk cannot fault
    /// the producers writing into it. Returns whether blocks were allocated.
    #[cfg(not(loom))]
    pub fn open_allocated(path: &Path, cpu: Option<u32>) -> Result<(Ring, bool), RingError> {
        use std::os::unix::fs::MetadataExt;
        let (ring, file) = Self::open_file(path, cpu)?;
        let bytes = ring.geometry.file_bytes() as u64;
        let meta = file.metadata().map_err(|source| RingError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if meta.blocks().saturating_mul(512) >= bytes {
            return Ok((ring, false));
        }
        allocate(&file, bytes).map_err(|source| RingError::Allocate {
            path: path.to_path_buf(),
            bytes,
            source,
        })?;
        Ok((ring, true))
    }

    #[cfg(not(loom))]
    fn open_file(path: &Path, cpu: Option<u32>) -> Result<(Ring, std::fs::File), RingError> {
        let p = || path.to_path_buf();
        let io = |source: std::io::Error| {
            if source.kind() == std::io::ErrorKind::PermissionDenied {
                RingError::NotAProducer { path: p() }
            } else {
                RingError::Io { path: p(), source }
            }
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let header_bytes = (HEADER_WORDS * 8) as u64;
        if len < header_bytes {
            return Err(RingError::NoHeader {
                path: p(),
                len,
                need: header_bytes,
            });
        }
        let header = RingMemory::map(&file, HEADER_WORDS * 8).map_err(io)?;
        let geometry = Self::validate_header(path, &header, len)?;
        drop(header);
        let mem = RingMemory::map(&file, geometry.file_bytes()).map_err(io)?;
        let ring = Self::from_memory(path, &file, mem, cpu)?;
        Ok((ring, file))
    }

    /// The geometry a mapped header promises, if the header is a ring's and
    /// the file (`len` bytes) holds all of it.
    #[cfg(not(loom))]
    fn validate_header(path: &Path, header: &RingMemory, len: u64) -> Result<Geometry, RingError> {
        let p = || path.to_path_buf();
        // Relaxed: the header's identity words never change after creation.
        let read = |i: usize| header.word(i).load(Ordering::Relaxed);
        let magic = read(H_MAGIC);
        if header.faulted() {
            // Truncated between the length check and the read.
            return Err(RingError::NoHeader {
                path: p(),
                len: 0,
                need: (HEADER_WORDS * 8) as u64,
            });
        }
        if magic != MAGIC {
            return Err(RingError::BadMagic { path: p(), magic });
        }
        let version = read(H_VERSION) as u32;
        if version != VERSION {
            return Err(RingError::BadVersion { path: p(), version });
        }
        let (page_size, page_count) = (read(H_GEOMETRY) & 0xFFFF_FFFF, read(H_GEOMETRY) >> 32);
        let geometry = Geometry::new(page_size as usize, page_count as usize).ok_or(
            RingError::BadGeometry {
                path: p(),
                page_size,
                page_count,
            },
        )?;
        let need = geometry.file_bytes() as u64;
        if len < need {
            return Err(RingError::Truncated {
                path: p(),
                len,
                need,
            });
        }
        Ok(geometry)
    }

    /// The ring in `mem`, a mapping of `file` whose header was validated
    /// (or just written); `cpu`, if given, must be the ring's.
    #[cfg(not(loom))]
    fn from_memory(
        path: &Path,
        file: &std::fs::File,
        mem: RingMemory,
        cpu: Option<u32>,
    ) -> Result<Ring, RingError> {
        use std::os::unix::fs::MetadataExt;
        let p = || path.to_path_buf();
        // Relaxed: identity words, written once at creation.
        let read = |i: usize| mem.word(i).load(Ordering::Relaxed);
        let found = read(H_CPU) as u32;
        if let Some(expected) = cpu {
            if found != expected {
                return Err(RingError::WrongCpu {
                    path: p(),
                    expected,
                    found,
                });
            }
        }
        let geometry = Geometry::new(
            (read(H_GEOMETRY) & 0xFFFF_FFFF) as usize,
            (read(H_GEOMETRY) >> 32) as usize,
        )
        .ok_or(RingError::BadGeometry {
            path: p(),
            page_size: read(H_GEOMETRY) & 0xFFFF_FFFF,
            page_count: read(H_GEOMETRY) >> 32,
        })?;
        let meta = file
            .metadata()
            .map_err(|source| RingError::Io { path: p(), source })?;
        let (epoch, created_ns) = (read(H_EPOCH), read(H_CREATED_NS));
        Ok(Ring {
            epoch,
            mem,
            geometry,
            cpu: found,
            path: p(),
            identity: (meta.dev(), meta.ino()),
            created_ns,
        })
    }
}

/// Allocates the blocks of `file`'s first `bytes` bytes (extending it to
/// that length), so that writes through a mapping never meet a full disk.
#[cfg(not(loom))]
fn allocate(file: &std::fs::File, bytes: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(bytes).map_err(std::io::Error::other)?;
    // SAFETY: an open descriptor we own; posix_fallocate touches no memory
    // of ours. It returns the error number instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// Nanoseconds since the Unix epoch (realtime clock): one
/// `clock_gettime(CLOCK_REALTIME)`, which the vDSO answers without a system
/// call (cheaper than `SystemTime::now()` and its conversions, on the
/// producer's emit path). Before the epoch: 0.
#[inline]
pub fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; CLOCK_REALTIME always
    // exists, so the call cannot fail with a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec)
        .max(0)
}

#[cfg(not(loom))]
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `len` bytes into the buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n == 8 {
        u64::from_le_bytes(bytes)
    } else {
        // No entropy source: time and pid still differ between ring lifetimes.
        (now_ns() as u64) ^ (u64::from(std::process::id()) << 32)
    }
}
