//! Surviving a ring file that shrinks under its mappings.
//!
//! A ring is a shared mapping of a file that every producer may open
//! read-write, so any of them can truncate it (or the disk under a sparse
//! file can fill up). Touching a mapped page that no longer has a file page
//! behind it raises SIGBUS, whose default action kills the process: the
//! daemon and every producer would die of one hostile `truncate`.
//!
//! So every ring mapping is registered here, and the first ring mapping of a
//! process installs a SIGBUS handler. When a fault lands inside a registered
//! mapping, the handler replaces that whole mapping with private, zeroed
//! anonymous memory at the same address (`mmap` with `MAP_FIXED`), marks the
//! registration as faulted and returns: the faulting instruction runs again
//! on the zeroed page and the thread goes on. The ring code then sees the
//! flag ([`Registration::faulted`]) and treats the ring as gone: a producer
//! gets an error, the daemon stops reading that ring, logs it and makes a
//! new one. Nothing read from zeroed memory is ever delivered: a zero state
//! word is not a committed record, and the drain checks the flag before it
//! hands an event on.
//!
//! A fault anywhere else is not ours: the handler passes it to the handler
//! that was installed before (or, if that was the default action, restores
//! the default and returns, so the fault happens again and kills the
//! process as it would have without us).
//!
//! The handler only does async-signal-safe things: loads and stores of
//! atomics in a static table, and the raw `mmap` and `rt_sigaction` system
//! calls.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Once;

/// Ring mappings one process can have registered at once. A mapping that
/// finds the table full is still made, only unguarded (and the caller is
/// told, so it can say so once).
pub const SLOTS_MAX: usize = 4096;

struct Slot {
    /// Start address of the mapping; 0 when the slot is free.
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
    /// Claimed by a registration (set before `start`, cleared after).
    taken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // a template for the table below
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
    taken: AtomicBool::new(false),
};

static SLOTS: [Slot; SLOTS_MAX] = [FREE; SLOTS_MAX];

/// The SIGBUS disposition found when ours was installed (leaked, read by
/// the handler).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Once = Once::new();

/// A guarded mapping; unregisters when dropped (before the mapping is
/// unmapped, which the owner does next).
#[derive(Debug)]
pub struct Registration {
    index: usize,
}

impl Registration {
    /// Whether a fault in this mapping was caught: the mapping now holds
    /// zeroed private memory, not the ring file.
    #[inline(always)]
    pub fn faulted(&self) -> bool {
        // Relaxed: the flag is set by the handler in whichever thread
        // faulted; a reader that sees it late has only read zeros meanwhile,
        // which no validation accepts. Acquire would order nothing useful.
        SLOTS[self.index].faulted.load(Ordering::Relaxed)
    }

    /// Marks the mapping faulted (a check that found the file shrunk
    /// before any access faulted).
    pub fn set_faulted(&self) {
        SLOTS[self.index].faulted.store(true, Ordering::Relaxed);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let slot = &SLOTS[self.index];
        // Release: the slot is free only after its address is cleared, so a
        // later registration's words are never paired with ours.
        slot.start.store(0, Ordering::Release);
        slot.faulted.store(false, Ordering::Relaxed);
        slot.taken.store(false, Ordering::Release);
    }
}

/// Registers the mapping `start..start + len` (installing the handler on
/// first use). `None` if the table is full or the handler could not be
/// installed: the mapping is then unguarded.
pub fn register(start: *mut u8, len: usize) -> Option<Registration> {
    if !install() {
        return None;
    }
    for (index, slot) in SLOTS.iter().enumerate() {
        // Acquire: pairs with the Release that freed the slot.
        if slot
            .taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        slot.faulted.store(false, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        // Release: a handler that sees this start sees the length with it.
        slot.start.store(start as usize, Ordering::Release);
        return Some(Registration { index });
    }
    None
}

/// Installs the handler once per process; false if that failed.
fn install() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: plain data; all-zero is a valid empty sigaction.
        let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            on_sigbus;
        ours.sa_sigaction = handler as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: sa_mask is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&mut ours.sa_mask) };
        let old = Box::into_raw(Box::new(
            // SAFETY: as above, a zeroed sigaction for the kernel to fill.
            unsafe { std::mem::zeroed::<libc::sigaction>() },
        ));
        // SAFETY: valid pointers to a sigaction to install and one to fill.
        if unsafe { libc::sigaction(libc::SIGBUS, &ours, old) } == 0 {
            // Release: the handler reads the previous disposition through
            // this pointer (it can only run after the sigaction above).
            PREVIOUS.store(old, Ordering::Release);
        } else {
            // SAFETY: `old` came from Box::into_raw above and was not shared.
            drop(unsafe { Box::from_raw(old) });
        }
    });
    !PREVIOUS.load(Ordering::Acquire).is_null()
}

/// The slot whose mapping holds `addr`, if any.
fn slot_of(addr: usize) -> Option<&'static Slot> {
    SLOTS.iter().find(|slot| {
        // Acquire: pairs with the registration's Release of `start`; the
        // second read of `start` makes sure `len` belongs to it (a slot
        // reused in between reads as another start, or as the same start
        // with its new length, which is then right too).
        let start = slot.start.load(Ordering::Acquire);
        let len = slot.len.load(Ordering::Relaxed);
        start != 0
            && start == slot.start.load(Ordering::Acquire)
            && addr >= start
            && addr - start < len
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler;
    // si_addr is the faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some(slot) = slot_of(addr) {
        let start = slot.start.load(Ordering::Acquire);
        let len = slot.len.load(Ordering::Relaxed);
        // SAFETY: replaces a mapping this process made and registered (the
        // registration is dropped before it is unmapped) with anonymous
        // memory of the same size at the same address; nothing else lives
        // in that range. A raw system call: async-signal-safe.
        let result = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                start,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if result as usize == start {
            slot.faulted.store(true, Ordering::Relaxed);
            return;
        }
    }
    pass_on(sig, info, context);
}

/// Hands a fault that is not ours to the disposition found at install.
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = PREVIOUS.load(Ordering::Acquire);
    // SAFETY: set once at install (before the handler could run) and never
    // freed; the kernel filled it.
    let previous = unsafe { &*previous };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_IGN || handler == libc::SIG_DFL {
        // Restore the default and return: the instruction faults again and
        // the process ends as it would have without eventd's handler. (An
        // ignored SIGBUS from a fault cannot be ignored either.)
        // SAFETY: plain data; all-zero with SIG_DFL is the default action.
        let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
        default.sa_sigaction = libc::SIG_DFL;
        // SAFETY: valid pointer; sigaction is async-signal-safe.
        unsafe { libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut()) };
        return;
    }
    if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed as a three-argument
        // handler; it gets exactly what the kernel gave us.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, context);
    } else {
        // SAFETY: a one-argument handler, as its flags say.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_mapping_faults_into_zeros_and_is_flagged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(3 * 4096).unwrap();
        let mem = super::super::memory::RingMemory::map(&file, 3 * 4096).unwrap();
        mem.word(1000).store(7, Ordering::Relaxed);
        assert!(!mem.faulted());
        file.set_len(0).unwrap();
        // Without the handler this load kills the test process.
        let v = mem.word(1000).load(Ordering::Relaxed);
        assert_eq!(v, 0);
        assert!(mem.faulted());
        // The memory stays usable (private now).
        mem.word(10).store(5, Ordering::Relaxed);
        assert_eq!(mem.word(10).load(Ordering::Relaxed), 5);
    }
}
