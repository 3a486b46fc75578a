//! KMES rings: one memory-mapped event ring per logical CPU (DESIGN §1.1).
//!
//! Producers — any thread of any process on the host — write events into the
//! ring of the CPU they run on, lock-free and without ever waiting for the
//! daemon ([`producer`]). When a ring is full the oldest page is overwritten.
//! One drain thread per ring reads it ([`reader`]): events in sequence order,
//! or gaps with the exact number of events lost and why. The ring file is
//! writable by every producer, so the reader treats its contents as untrusted
//! input. `docs/rings.md` describes the format byte by byte.

#[cfg(not(loom))]
pub mod attach;
pub mod event;
pub mod format;
mod memory;
pub mod producer;
pub mod reader;

#[cfg(not(loom))]
pub use attach::{online_cpus, AttachedRing, Emitter, KmesDir};
pub use event::{Event, Level};
pub use producer::EmitError;
pub use reader::{Gap, LossReason, ReadPosition, RingItem, RingReader};

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
    #[error("{path}: ring says cpu {found}, its name says cpu {expected}")]
    WrongCpu {
        path: PathBuf,
        expected: u32,
        found: u32,
    },
    #[error("no ring for cpu {cpu} in {dir} (is eventd running with --data-dir pointing there?)")]
    NoRing { cpu: u32, dir: PathBuf },
}

/// One attached ring: its memory and its identity.
pub struct Ring {
    mem: RingMemory,
    geometry: Geometry,
    epoch: u64,
    cpu: u32,
    path: PathBuf,
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

    /// Events producers refused before they got a sequence number (so no
    /// gap accounts for them).
    pub fn producer_refusals(&self) -> u64 {
        // Relaxed: a statistic.
        self.mem.word(H_PRODUCER_REFUSED).load(Ordering::Relaxed)
    }

    /// The position the reader last published and the sequence it expects
    /// next there.
    pub fn published_read_position(&self) -> ReadPosition {
        // Relaxed: monitoring only.
        ReadPosition::from_words(
            self.mem.word(H_READ_POS).load(Ordering::Relaxed),
            self.mem.word(H_READ_SEQ).load(Ordering::Relaxed),
        )
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

    /// Creates the ring file at `path` (which must not exist) atomically: the
    /// file is built under a temporary name and linked into place.
    #[cfg(not(loom))]
    pub fn create(path: &Path, geometry: Geometry, cpu: u32) -> Result<Ring, RingError> {
        use std::fs::OpenOptions;
        let io = |source| RingError::Io {
            path: path.to_path_buf(),
            source,
        };
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io)?;
        let result = (|| {
            file.set_len(geometry.file_bytes() as u64)?;
            let mem = RingMemory::map(&file, geometry.file_bytes())?;
            Ring::initialize(&mem, geometry, cpu, random_u64(), now_ns() as u64);
            file.sync_all()?;
            // Fails if another process created the ring first: theirs wins.
            std::fs::hard_link(&tmp, path)?;
            Ok(())
        })();
        let _ = std::fs::remove_file(&tmp);
        result.map_err(io)?;
        Ring::open(path, Some(cpu))
    }

    /// Opens an existing ring file and validates its header. `cpu`, if given,
    /// must match the cpu the ring says it belongs to.
    #[cfg(not(loom))]
    pub fn open(path: &Path, cpu: Option<u32>) -> Result<Ring, RingError> {
        let p = || path.to_path_buf();
        let io = |source| RingError::Io { path: p(), source };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let header_bytes = (HEADER_WORDS * 8) as u64;
        if len < header_bytes {
            return Err(RingError::Truncated {
                path: p(),
                len,
                need: header_bytes,
            });
        }
        let header = RingMemory::map(&file, HEADER_WORDS * 8).map_err(io)?;
        // Relaxed: the header's identity words never change after creation.
        let read = |i: usize| header.word(i).load(Ordering::Relaxed);
        let magic = read(H_MAGIC);
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
        let epoch = read(H_EPOCH);
        drop(header);
        let mem = RingMemory::map(&file, geometry.file_bytes()).map_err(io)?;
        Ok(Ring {
            mem,
            geometry,
            epoch,
            cpu: found,
            path: p(),
        })
    }
}

/// Nanoseconds since the Unix epoch (realtime clock).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(i64::MAX as u128) as i64)
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
