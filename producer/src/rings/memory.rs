//! The memory a ring lives in, seen as an array of atomic 64-bit words.
//!
//! Normally a shared mapping of the ring file (`MAP_SHARED`), so producers in
//! other processes and the reader see the same words, and the reader's futex
//! is a *shared* futex (no `FUTEX_PRIVATE_FLAG`). Under loom it is an array of
//! loom atomics with an emulated futex, so the same ring code is model-checked.
//!
//! Every index passed in is computed from a [`Geometry`] validated at attach
//! time and from offsets checked against page bounds, so an index out of range
//! is a bug in this crate, not bad input; `word` asserts it.

#[cfg(loom)]
use super::format::Geometry;
use super::format::H_FUTEX;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

pub struct RingMemory {
    words: usize,
    /// The SIGBUS guard of the mapping (see [`super::guard`]); dropped
    /// before `map`, so the mapping is unregistered before it is unmapped.
    #[cfg(not(loom))]
    guard: Option<super::guard::Registration>,
    #[cfg(not(loom))]
    map: Mapping,
    #[cfg(loom)]
    cells: Box<[AtomicU64]>,
    #[cfg(loom)]
    futex: crate::sync::Futex,
}

#[cfg(not(loom))]
struct Mapping {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is only accessed through atomics.
#[cfg(not(loom))]
unsafe impl Send for Mapping {}
// SAFETY: as above.
#[cfg(not(loom))]
unsafe impl Sync for Mapping {}

#[cfg(not(loom))]
impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl RingMemory {
    /// Maps `len` bytes of `file` shared and read-write.
    #[cfg(not(loom))]
    pub fn map(file: &std::fs::File, len: usize) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of an open file; the kernel picks the
        // address. The result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned a null mapping"))?;
        let guard = super::guard::register(ptr.as_ptr(), len);
        Ok(Self {
            words: len / 8,
            guard,
            map: Mapping { ptr, len },
        })
    }

    /// Whether the file shrank under this mapping: a fault was caught (or
    /// a check found the file too short) and the mapping now holds zeroed
    /// private memory. Always false when the mapping could not be guarded.
    #[cfg(not(loom))]
    #[inline(always)]
    pub fn faulted(&self) -> bool {
        self.guard
            .as_ref()
            .is_some_and(super::guard::Registration::faulted)
    }

    /// Whether the mapping is guarded against SIGBUS.
    #[cfg(not(loom))]
    pub fn guarded(&self) -> bool {
        self.guard.is_some()
    }

    /// Records that the file was found shorter than the mapping (before
    /// any access faulted): the ring is to be treated as gone.
    #[cfg(not(loom))]
    pub fn set_faulted(&self) {
        if let Some(g) = &self.guard {
            g.set_faulted();
        }
    }

    /// Zeroed memory for a ring of `geometry`, private to this process (loom
    /// models).
    #[cfg(loom)]
    pub fn anonymous(geometry: Geometry) -> Self {
        let words = geometry.file_words();
        Self {
            words,
            cells: (0..words).map(|_| AtomicU64::new(0)).collect(),
            futex: crate::sync::Futex::new(0),
        }
    }

    /// Under loom the memory is private: it never faults.
    #[cfg(loom)]
    pub fn faulted(&self) -> bool {
        false
    }

    #[inline(always)]
    pub fn word(&self, index: usize) -> &AtomicU64 {
        assert!(
            index < self.words,
            "ring word {index} out of {}",
            self.words
        );
        #[cfg(not(loom))]
        {
            // SAFETY: in bounds (asserted), 8-byte aligned (mmap is page
            // aligned and the index counts words), and the mapping lives as
            // long as `self`. Other processes write it too, which is why it is
            // only ever accessed as an atomic.
            unsafe { &*self.map.ptr.as_ptr().add(index * 8).cast::<AtomicU64>() }
        }
        #[cfg(loom)]
        {
            &self.cells[index]
        }
    }

    /// Words `start..start + len` (one bounds check for a whole record,
    /// rather than one per word).
    #[inline(always)]
    pub fn words(&self, start: usize, len: usize) -> &[AtomicU64] {
        let end = start.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= self.words),
            "ring words {start}+{len} out of {}",
            self.words
        );
        #[cfg(not(loom))]
        {
            // SAFETY: in bounds (asserted), 8-byte aligned (as in `word`),
            // and the mapping lives as long as `self`; atomics only, as in
            // `word`.
            unsafe {
                std::slice::from_raw_parts(
                    self.map.ptr.as_ptr().add(start * 8).cast::<AtomicU64>(),
                    len,
                )
            }
        }
        #[cfg(loom)]
        {
            &self.cells[start..start + len]
        }
    }

    /// The reader's futex word (the low half of header word `H_FUTEX`).
    #[inline(always)]
    pub fn futex(&self) -> &AtomicU32 {
        #[cfg(not(loom))]
        {
            // SAFETY: header word H_FUTEX is inside every valid ring and is
            // only ever used as this 32-bit futex word.
            unsafe { &*self.map.ptr.as_ptr().add(H_FUTEX * 8).cast::<AtomicU32>() }
        }
        #[cfg(loom)]
        {
            let _ = H_FUTEX;
            self.futex.word()
        }
    }

    /// Sleeps while the futex word holds `expected`, at most `timeout`.
    pub fn futex_wait(&self, expected: u32, timeout: Option<Duration>) {
        #[cfg(not(loom))]
        {
            let ts = timeout.map(|t| libc::timespec {
                tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: t.subsec_nanos() as libc::c_long,
            });
            let ts_ptr = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: FUTEX_WAIT on a live, aligned 32-bit word of the shared
            // mapping (no PRIVATE flag: producers in other processes wake it).
            // EAGAIN, EINTR and ETIMEDOUT are all "go and look again".
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.futex() as *const AtomicU32,
                    libc::FUTEX_WAIT,
                    expected,
                    ts_ptr,
                );
            }
        }
        #[cfg(loom)]
        {
            // Loom has no time: a bounded sleep is modelled as a yield.
            if timeout.is_some() {
                if self.futex.word().load(Ordering::Relaxed) == expected {
                    loom::thread::yield_now();
                }
            } else {
                self.futex.wait(expected);
            }
        }
    }

    /// Wakes every thread sleeping on the futex word.
    pub fn futex_wake(&self) {
        #[cfg(not(loom))]
        {
            // SAFETY: FUTEX_WAKE on a live, aligned word; see futex_wait.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.futex() as *const AtomicU32,
                    libc::FUTEX_WAKE,
                    i32::MAX,
                );
            }
        }
        #[cfg(loom)]
        {
            self.futex.wake_all();
        }
    }

    /// Copies `out.len()` words starting at `index` (relaxed atomic loads:
    /// producers may be writing them; the caller re-validates afterwards).
    pub fn copy_words(&self, index: usize, out: &mut [u64]) {
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = self.word(index + i).load(Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn maps_a_file_shared() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(4096).unwrap();
        let a = RingMemory::map(&file, 4096).unwrap();
        let b = RingMemory::map(&file, 4096).unwrap();
        a.word(7).store(42, Ordering::Relaxed);
        assert_eq!(b.word(7).load(Ordering::Relaxed), 42);
        drop(a);
        drop(b);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes[56], 42, "written through to the file");
    }
}
