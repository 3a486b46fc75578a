//! eventd's own reckoning of time, which no step of the wall clock moves:
//! the wall clock as it read at an anchor, plus what the boot clock
//! (`CLOCK_BOOTTIME`: monotonic, and it counts a suspend) has counted since.
//!
//! Retention judges an event's age by it (the commit marks, [`super::marks`]),
//! never by the wall clock of the moment: a wall clock set 400 days ahead
//! for five seconds makes nothing look old, and events stored while it was
//! behind do not look old once it is corrected.
//!
//! Across restarts: the boot clock runs on from boot to shutdown, so the
//! first eventd of a boot stores its anchor (boot id, boot clock, reckoning)
//! in `RunDir/clock`, and every later start in that boot goes on from it: a
//! step made while eventd ran, or while it was stopped, moves nothing. A
//! new boot starts the boot clock again, and nothing links it to the last
//! one: the reckoning starts again from the wall clock as eventd finds it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where the reckoning stood at one reading of the boot clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    /// `/proc/sys/kernel/random/boot_id`: the boot the boot clock counts in.
    pub boot_id: String,
    pub boot_ns: i64,
    pub reckoned_ns: i64,
}

static ANCHOR: OnceLock<Anchor> = OnceLock::new();

/// A wall clock that moved this much more (or less) than the boot clock
/// between two readings was stepped (NTP slews at most 0.05 %: 15 ms in
/// a 30 s retention interval).
pub const STEP_BOUND: std::time::Duration = std::time::Duration::from_secs(60);

/// The file in RunDir that carries the anchor across restarts in one boot.
pub const FILE_NAME: &str = "clock";
/// Its first word, naming its format.
const FORMAT: &str = "eventd-reckoning-1";

/// The time by eventd's reckoning, ns since the Unix epoch. Before
/// [`start`] (a process that is not the daemon: a tool, a unit test), the
/// first call anchors it at the wall clock.
pub fn now_ns() -> i64 {
    let anchor = ANCHOR.get_or_init(|| Anchor::here(boot_id()));
    anchor.at(boot_ns())
}

/// The boot clock, ns since boot.
pub fn boot_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives
    // across the call; CLOCK_BOOTTIME exists on every Linux since 2.6.39.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        // Cannot happen with a valid clock id and pointer; the monotonic
        // clock (which misses suspends) is the next best.
        return monotonic_ns();
    }
    ts.tv_sec.saturating_mul(1_000_000_000) + ts.tv_nsec
}

fn monotonic_ns() -> i64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos()
        .min(i64::MAX as u128) as i64
}

/// The wall clock, ns since the Unix epoch (0 before it).
pub fn wall_ns() -> i64 {
    crate::rings::now_ns()
}

/// A span of time for the log, to the nearest second, in days, hours,
/// minutes and seconds ("400d 0h 0m 5s"; humantime's months and years are
/// not whole days). A step measured between two readings is off by the
/// microseconds between them.
pub fn span(d: std::time::Duration) -> String {
    let s = d.as_secs() + u64::from(d.subsec_millis() >= 500);
    format!(
        "{}d {}h {}m {}s",
        s / 86_400,
        s / 3600 % 24,
        s / 60 % 60,
        s % 60
    )
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl Anchor {
    /// An anchor at the wall clock now.
    fn here(boot_id: String) -> Anchor {
        Anchor {
            boot_id,
            boot_ns: boot_ns(),
            reckoned_ns: wall_ns(),
        }
    }

    /// The reckoning when the boot clock reads `boot_ns`.
    pub fn at(&self, boot_ns: i64) -> i64 {
        self.reckoned_ns
            .saturating_add(boot_ns.saturating_sub(self.boot_ns))
    }

    fn text(&self) -> String {
        format!(
            "{FORMAT} {} {} {}\n",
            self.boot_id, self.boot_ns, self.reckoned_ns
        )
    }

    /// The anchor a file holds; `None` when it is not one.
    fn parse(text: &str) -> Option<Anchor> {
        let mut words = text.split_whitespace();
        if words.next()? != FORMAT {
            return None;
        }
        let anchor = Anchor {
            boot_id: words.next()?.to_string(),
            boot_ns: words.next()?.parse().ok()?,
            reckoned_ns: words.next()?.parse().ok()?,
        };
        words.next().is_none().then_some(anchor)
    }
}

/// How [`start`] anchored the reckoning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// From the anchor an earlier eventd of this boot stored.
    Continued,
    /// At the wall clock now: no anchor of this boot was stored (why, for
    /// the log: another boot's, none, or an unreadable file).
    Anchored(String),
}

/// Anchors the reckoning of this process for good, from `run_dir`'s clock
/// file when it holds an anchor of this boot, else at the wall clock (and
/// stores that anchor). Call it once, before anything reads [`now_ns`]
/// (the daemon does, before its writers start); the log says how it went,
/// and how far the wall clock is from the reckoning when that is over a
/// minute. A file that cannot be written is logged: the reckoning still
/// holds for this run, and the next start in this boot anchors anew.
pub fn start(run_dir: &Path) -> Started {
    let path = run_dir.join(FILE_NAME);
    let (anchor, started) = choose(&path, boot_id(), Anchor::here);
    if started != Started::Continued {
        if let Err(e) = store(&path, &anchor) {
            tracing::warn!(
                path = %path.display(),
                error = %e,
                "cannot store the anchor of eventd's reckoning of time; \
                 a restart in this boot will start it again from the wall clock"
            );
        }
    }
    let anchor = ANCHOR.get_or_init(|| anchor);
    let ahead = wall_ns().saturating_sub(anchor.at(boot_ns()));
    match &started {
        Started::Continued => {
            tracing::info!("eventd's reckoning of time goes on from an earlier start in this boot")
        }
        Started::Anchored(why) => {
            tracing::info!(reason = %why, "eventd's reckoning of time starts at the wall clock")
        }
    }
    if ahead.unsigned_abs() > STEP_BOUND.as_nanos() as u64 {
        tracing::warn!(
            wall_clock = if ahead > 0 { "ahead" } else { "behind" },
            by = %span(std::time::Duration::from_nanos(ahead.unsigned_abs())),
            "the wall clock differs from eventd's reckoning of time (a step since this boot's \
             first eventd started); retention judges age by the reckoning"
        );
    }
    started
}

/// The anchor for a start in boot `boot`, given the clock file at `path`:
/// the stored one if it is of this boot, else `fresh(boot)`.
fn choose(path: &Path, boot: String, fresh: impl FnOnce(String) -> Anchor) -> (Anchor, Started) {
    let why = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "no anchor stored".to_string(),
        Err(e) => format!("{} cannot be read: {e}", path.display()),
        Ok(text) => match Anchor::parse(&text) {
            None => format!("{} does not hold an anchor: {text:?}", path.display()),
            Some(stored) if !boot.is_empty() && stored.boot_id == boot => {
                return (stored, Started::Continued)
            }
            Some(_) => "the stored anchor is of another boot".to_string(),
        },
    };
    (fresh(boot), Started::Anchored(why))
}

/// Stores `anchor` at `path`, whole or not at all (a new file renamed over
/// the old one), readable by eventd's user only.
fn store(path: &Path, anchor: &Anchor) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp: PathBuf = path.with_extension("new");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(anchor.text().as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchor(boot: &str, boot_ns: i64, reckoned_ns: i64) -> Anchor {
        Anchor {
            boot_id: boot.to_string(),
            boot_ns,
            reckoned_ns,
        }
    }

    #[test]
    fn the_reckoning_moves_with_the_boot_clock_only() {
        let a = anchor("b", 1_000, 5_000_000);
        assert_eq!(a.at(1_000), 5_000_000);
        assert_eq!(a.at(61_000), 5_060_000);
        assert_eq!(Anchor::parse(&a.text()), Some(a));
    }

    #[test]
    fn a_start_in_the_same_boot_goes_on_from_the_stored_anchor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let fresh = |boot: String| anchor(&boot, 7, 9);
        let (first, how) = choose(&path, "boot-1".into(), fresh);
        assert_eq!(how, Started::Anchored("no anchor stored".into()));
        store(&path, &first).unwrap();
        // A wall clock stepped meanwhile would give another fresh anchor:
        // the stored one wins in the same boot.
        let stepped = |boot: String| anchor(&boot, 8, 400 * 86_400_000_000_000);
        assert_eq!(
            choose(&path, "boot-1".into(), stepped),
            (first, Started::Continued)
        );
        let (next, how) = choose(&path, "boot-2".into(), stepped);
        assert_eq!(next, anchor("boot-2", 8, 400 * 86_400_000_000_000));
        assert!(matches!(how, Started::Anchored(w) if w.contains("another boot")));
        // Without a boot id, nothing can be matched.
        assert!(matches!(
            choose(&path, String::new(), fresh).1,
            Started::Anchored(_)
        ));
    }

    #[test]
    fn a_file_that_holds_no_anchor_is_named_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        for text in [
            "",
            "junk",
            "eventd-reckoning-1 b 1",
            "eventd-reckoning-1 b 1 2 3",
        ] {
            std::fs::write(&path, text).unwrap();
            let (a, how) = choose(&path, "b".into(), |boot| anchor(&boot, 1, 2));
            assert_eq!(a, anchor("b", 1, 2));
            assert!(
                matches!(&how, Started::Anchored(w) if w.contains("does not hold an anchor")),
                "{how:?}"
            );
        }
    }

    #[test]
    fn spans_are_told_in_days() {
        let d = std::time::Duration::from_millis(400 * 86_400_000 + 3_723_004);
        assert_eq!(span(d), "400d 1h 2m 3s");
        let d = std::time::Duration::from_micros(400 * 86_400_000_000 - 5);
        assert_eq!(span(d), "400d 0h 0m 0s");
    }

    #[test]
    fn the_boot_clock_runs() {
        let a = boot_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(boot_ns() > a);
        assert!(now_ns() > 0);
    }
}
