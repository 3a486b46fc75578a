//! The KMES directory: one ring file per logical CPU, named `cpu-NNN.ring`.
//!
//! The daemon creates missing rings and attaches every online CPU's ring
//! ([`KmesDir::attach_all`]); producers open the ring of the CPU they run on
//! ([`Emitter`]).

use super::format::{Geometry, PAGE_SIZE_DEFAULT, RING_BYTES_DEFAULT};
use super::{EmitError, Event, Ring, RingError};
use crate::sync::Arc;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A ring the daemon attached, with its dense ordinal (R4: ordinals follow
/// logical CPU ids, skipping rings that failed to attach).
pub struct AttachedRing {
    pub ordinal: usize,
    pub cpu: u32,
    pub ring: Arc<Ring>,
}

/// The outcome of attaching: the rings that work and, for each one that does
/// not, why.
pub struct Attached {
    pub rings: Vec<AttachedRing>,
    pub failures: Vec<(u32, RingError)>,
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

    /// Creates the directory and every missing ring of `cpus` with about
    /// `ring_bytes` of pages each, then attaches them. A ring that cannot be
    /// created or opened (a corrupt header, say) is reported in `failures`
    /// and skipped; the others still attach.
    pub fn attach_all(&self, cpus: &[u32], ring_bytes: usize) -> Result<Attached, RingError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| RingError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let geometry = Geometry::for_ring_bytes(ring_bytes, PAGE_SIZE_DEFAULT)
            .or_else(|| Geometry::for_ring_bytes(RING_BYTES_DEFAULT, PAGE_SIZE_DEFAULT))
            .expect("the default geometry is valid");
        let mut sorted = cpus.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut attached = Attached {
            rings: Vec::new(),
            failures: Vec::new(),
        };
        for cpu in sorted {
            match self.open_or_create(cpu, geometry) {
                Ok(ring) => attached.rings.push(AttachedRing {
                    ordinal: attached.rings.len(),
                    cpu,
                    ring: Arc::new(ring),
                }),
                Err(e) => attached.failures.push((cpu, e)),
            }
        }
        Ok(attached)
    }

    fn open_or_create(&self, cpu: u32, geometry: Geometry) -> Result<Ring, RingError> {
        let path = self.ring_path(cpu);
        match Ring::open(&path, Some(cpu)) {
            Err(RingError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                match Ring::create(&path, geometry, cpu) {
                    // Another process created it between our open and create.
                    Err(RingError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::AlreadyExists =>
                    {
                        Ring::open(&path, Some(cpu))
                    }
                    other => other,
                }
            }
            other => other,
        }
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

/// The producer side for programs: emits into the ring of the CPU the calling
/// thread runs on, opening rings on first use.
pub struct Emitter {
    kmes: KmesDir,
    rings: Vec<OnceLock<Option<Arc<Ring>>>>,
}

impl Emitter {
    /// An emitter for the rings in `dir` (the daemon's `DATA_DIR/kmes`). Fails
    /// if the directory does not exist.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Emitter, RingError> {
        let kmes = KmesDir::new(dir);
        std::fs::read_dir(kmes.path()).map_err(|source| RingError::Io {
            path: kmes.path().to_path_buf(),
            source,
        })?;
        Ok(Emitter {
            kmes,
            rings: (0..CPU_IDS_MAX).map(|_| OnceLock::new()).collect(),
        })
    }

    /// Emits `event` into the current CPU's ring; returns that CPU's id.
    pub fn emit(&self, event: &Event<'_>) -> Result<u32, EmitRingError> {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        let cpu = u32::try_from(cpu).unwrap_or(0);
        self.ring(cpu)?.emit(event)?;
        Ok(cpu)
    }

    /// The ring of `cpu`, opened on first use.
    pub fn ring(&self, cpu: u32) -> Result<&Arc<Ring>, EmitRingError> {
        let no_ring = || {
            EmitRingError::Ring(RingError::NoRing {
                cpu,
                dir: self.kmes.path().to_path_buf(),
            })
        };
        let cell = self.rings.get(cpu as usize).ok_or_else(no_ring)?;
        if let Some(ring) = cell.get() {
            return ring.as_ref().ok_or_else(no_ring);
        }
        match Ring::open(&self.kmes.ring_path(cpu), Some(cpu)) {
            Ok(ring) => cell
                .get_or_init(|| Some(Arc::new(ring)))
                .as_ref()
                .ok_or_else(no_ring),
            Err(RingError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Err(no_ring())
            }
            Err(e) => Err(EmitRingError::Ring(e)),
        }
    }
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
