//! Steps of the wall clock, as the retention coordinator sees them between
//! two passes: the wall clock moved more (or less) than the boot clock by
//! over [`STEP_BOUND`]. A pass that sees one is skipped and the step is
//! logged; age is judged by eventd's reckoning in any case
//! ([`reckoning`](crate::store::retention::reckoning)), so the step moves
//! nothing retention deletes.

pub use crate::store::retention::reckoning::STEP_BOUND;
use crate::store::retention::reckoning::{boot_ns, wall_ns};
use std::time::Duration;

/// One reading of both clocks, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub wall_ns: i64,
    pub boot_ns: i64,
}

impl Reading {
    pub fn now() -> Reading {
        Reading {
            wall_ns: wall_ns(),
            boot_ns: boot_ns(),
        }
    }
}

/// A step of the wall clock: which way, and how far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Forward(Duration),
    Back(Duration),
}

impl Step {
    /// The step between readings `last` and `now`, if the wall clock moved
    /// by more than [`STEP_BOUND`] besides what the boot clock counted.
    pub fn between(last: Reading, now: Reading) -> Option<Step> {
        let wall = i128::from(now.wall_ns) - i128::from(last.wall_ns);
        let boot = i128::from(now.boot_ns) - i128::from(last.boot_ns);
        let off = wall - boot;
        let by = Duration::from_nanos(off.unsigned_abs().min(u128::from(u64::MAX)) as u64);
        if by <= STEP_BOUND {
            None
        } else if off > 0 {
            Some(Step::Forward(by))
        } else {
            Some(Step::Back(by))
        }
    }

    /// "forward" or "back", for the log.
    pub fn direction(&self) -> &'static str {
        match self {
            Step::Forward(_) => "forward",
            Step::Back(_) => "back",
        }
    }

    pub fn by(&self) -> Duration {
        match self {
            Step::Forward(d) | Step::Back(d) => *d,
        }
    }
}

/// The readings of the last pass, to compare the next one with.
#[derive(Debug, Default)]
pub struct ClockWatch {
    last: Option<Reading>,
}

impl ClockWatch {
    /// Reads both clocks; the step since the last look, if there was one.
    pub fn look(&mut self) -> Option<Step> {
        self.look_at(Reading::now())
    }

    fn look_at(&mut self, now: Reading) -> Option<Step> {
        let last = self.last.replace(now)?;
        Step::between(last, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn at(wall: i64, boot: i64) -> Reading {
        Reading {
            wall_ns: wall * S,
            boot_ns: boot * S,
        }
    }

    #[test]
    fn steps_are_told_from_time_passing_and_slewing() {
        let mut w = ClockWatch::default();
        assert_eq!(w.look_at(at(1000, 10)), None, "nothing to compare yet");
        // Time passes (a suspend too: the boot clock counts it).
        assert_eq!(w.look_at(at(1030, 40)), None);
        assert_eq!(w.look_at(at(87_430, 86_440)), None);
        // Slewed by 59 s over 30 s: not a step.
        assert_eq!(w.look_at(at(87_519, 86_470)), None);
        let day = 86_400;
        assert_eq!(
            w.look_at(at(87_549 + 400 * day, 86_500)),
            Some(Step::Forward(Duration::from_secs(400 * 86_400)))
        );
        // Once seen, the new wall clock is where the next look starts.
        assert_eq!(w.look_at(at(87_579 + 400 * day, 86_530)), None);
        let back = w.look_at(at(87_609, 86_560)).unwrap();
        assert_eq!(back, Step::Back(Duration::from_secs(400 * 86_400)));
        assert_eq!(
            (back.direction(), back.by().as_secs()),
            ("back", 400 * 86_400)
        );
    }
}
