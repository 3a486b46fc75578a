//! What eventd itself knows about who sent an event, as opposed to what
//! the sender claims.
//!
//! For the sources where the kernel names the sender (the syslog sockets
//! through SCM_CREDENTIALS, stream connections through SO_PEERCRED, the
//! kernel log itself), eventd stores the pid and uid in their columns and
//! adds top-level keys to the event's `fields` that only it writes:
//! `gid`, `comm`, `exe`, `unit` (and `user_unit`), read from `/proc/PID`
//! ([`process`], [`unit`]) through a cache ([`cache`]), and `boot_id`
//! ([`boot`]). What a sender writes goes elsewhere (nested, or under a name
//! of its own such as `procid`), so it cannot take their place.
//!
//! Only events in eventd's own rings (cpu >= `SYSLOG_RING_CPU`) carry
//! these: no producer can open those rings. An event a producer wrote into
//! a CPU ring holds whatever the producer wrote, `fields` included.

pub mod boot;
pub mod cache;
pub mod process;
pub mod unit;

pub use cache::Senders;
pub use process::ProcessInfo;

use serde::Serialize;

/// The trusted keys of an event's `fields` that come from `/proc` and the
/// boot, flattened into a source's fields object. Keys that eventd does
/// not know (a process gone before it looked) are left out, never guessed.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Trusted<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exe: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_unit: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub boot_id: &'a str,
}

impl<'a> Trusted<'a> {
    /// The keys for a sender eventd read as `info` (or could not).
    pub fn of(info: Option<&'a ProcessInfo>) -> Trusted<'a> {
        Trusted {
            comm: info.and_then(|i| i.comm.as_deref()),
            exe: info.and_then(|i| i.exe.as_deref()),
            unit: info.and_then(|i| i.unit.as_deref()),
            user_unit: info.and_then(|i| i.user_unit.as_deref()),
            boot_id: boot::id(),
        }
    }
}
