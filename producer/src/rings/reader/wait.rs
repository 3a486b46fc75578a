//! The reader's sleep: announcing it in the reserve word (WAIT) and waiting
//! on the ring's shared futex until a producer wakes it, or napping while a
//! reserved record may still be committed.

use super::{RingReader, SLEEP_CAP, STALL_NAP};
use crate::rings::format::*;
use crate::sync::Ordering;
use std::time::Duration;

impl RingReader {
    /// Sleeps until producers may have written something, or `timeout`.
    /// Returns at once if there is something to read. Bounded naps only while
    /// a reserved record is outstanding (its producer may have died).
    pub fn wait(&mut self, timeout: Option<Duration>) {
        let mem = &self.ring.mem;
        if self.stall.is_some() {
            let nap = timeout.map_or(STALL_NAP, |t| t.min(STALL_NAP));
            let epoch = mem.futex().load(Ordering::Acquire);
            mem.futex_wait(epoch, Some(nap));
            return;
        }
        let reserve = mem.word(H_RESERVE);
        // The futex word is read before the reserve word we decide on: a
        // producer that reserves after our CAS sees WAIT and bumps the futex
        // after this read, so the wait returns. Acquire pairs with its bump.
        let epoch = mem.futex().load(Ordering::Acquire);
        let current = reserve.load(Ordering::Acquire);
        let w = Reserve::unpack(current);
        let at_front = (w.ticket == self.ticket && !w.closed() && w.count == self.index)
            || (w.closed() && ((w.ticket + 1) & TICKET_MASK) == self.ticket && self.index == 0);
        if !at_front {
            // Something is there (or the reader is mid-resync): go and look.
            crate::sync::spin_loop();
            return;
        }
        if !w.wait {
            // AcqRel: Release orders our futex read before any producer's
            // bump that follows its reservation (which reads this CAS).
            let flagged = Reserve { wait: true, ..w }.pack();
            if reserve
                .compare_exchange(current, flagged, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                crate::sync::spin_loop();
                return;
            }
        }
        // Producers wake us, so no timeout is needed; the cap only keeps a
        // scribbler that clears WAIT from putting the reader to sleep for good.
        // (Loom has no time; there the sleep stays unbounded so the models
        // check that producers really wake the reader.)
        let timeout = if cfg!(loom) {
            timeout
        } else {
            Some(timeout.map_or(SLEEP_CAP, |t| t.min(SLEEP_CAP)))
        };
        mem.futex_wait(epoch, timeout);
        self.clear_wait_flag();
    }

    /// Clears WAIT so producers stop issuing wakes.
    fn clear_wait_flag(&self) {
        let reserve = self.ring.mem.word(H_RESERVE);
        let mut current = reserve.load(Ordering::Relaxed);
        for _ in 0..16 {
            let w = Reserve::unpack(current);
            if !w.wait {
                return;
            }
            let cleared = Reserve { wait: false, ..w }.pack();
            // Relaxed: the flag only decides whether producers wake us.
            match reserve.compare_exchange_weak(
                current,
                cleared,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }
}
