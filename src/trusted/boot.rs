//! The boot eventd runs in: its id (as journald prints it) and when it
//! started, and the marker event eventd stores at each start so that
//! queries can list boots and take a boot's time range.

use crate::rings::{EmitError, Event, Level, Ring};
use std::sync::OnceLock;

/// The provider and name of the boot marker.
pub const MARKER_PROVIDER: &str = "eventd";
pub const MARKER_NAME: &str = "boot";

/// This boot's id: `/proc/sys/kernel/random/boot_id` without its dashes,
/// 32 lowercase hex digits (journald's `_BOOT_ID`); empty if the kernel
/// does not say. Read once: it does not change while eventd runs.
pub fn id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .and_then(|text| compact_id(&text))
            .unwrap_or_default()
    })
}

/// `45f658aa-63aa-4655-95f7-7d4712175ca2\n` as
/// `45f658aa63aa465595f77d4712175ca2`; `None` unless it is a UUID.
pub fn compact_id(text: &str) -> Option<String> {
    let id: String = text.trim().chars().filter(|&c| c != '-').collect();
    let hex = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| id.to_ascii_lowercase())
}

/// When this boot started, in ns since the Unix epoch: `btime` of
/// `/proc/stat` (whole seconds, as the kernel gives it).
pub fn time_ns() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    btime_ns(&stat)
}

fn btime_ns(stat: &str) -> Option<i64> {
    let secs: i64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    secs.checked_mul(1_000_000_000)
}

/// Writes the boot marker into `ring` (one of eventd's own rings): provider
/// `eventd`, name `boot`, `fields.boot_id` and `fields.boot_time_ns`.
pub fn write_marker(ring: &Ring) -> Result<(), EmitError> {
    let boot_time_ns = time_ns();
    let fields = serde_json::json!({
        "transport": "eventd",
        "boot_id": id(),
        "boot_time_ns": boot_time_ns,
    })
    .to_string();
    let message = format!("eventd started in boot {}", id());
    let event = Event {
        ts_ns: crate::rings::now_ns(),
        pid: std::process::id(),
        tid: 0,
        uid: crate::access::own_uid(),
        level: Level::Info,
        provider: MARKER_PROVIDER,
        name: MARKER_NAME,
        message: &message,
        fields: &fields,
    };
    ring.emit(&event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_id_is_printed_as_journald_prints_it() {
        assert_eq!(
            compact_id("45F658AA-63aa-4655-95f7-7d4712175ca2\n").as_deref(),
            Some("45f658aa63aa465595f77d4712175ca2")
        );
        assert_eq!(compact_id("not-an-id"), None);
        let here = id();
        assert_eq!(here.len(), 32, "{here:?}");
        let raw = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        assert_eq!(here, raw.trim().replace('-', ""));
    }

    #[test]
    fn the_boot_time_is_read_from_proc_stat() {
        assert_eq!(
            btime_ns("cpu 1 2 3\nbtime 1764780000\nprocesses 9\n"),
            Some(1_764_780_000_000_000_000)
        );
        assert_eq!(btime_ns("cpu 1 2 3\n"), None);
        let t = time_ns().unwrap();
        assert!(t > 0 && t <= crate::rings::now_ns());
    }
}
