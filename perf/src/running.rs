//! What a running syslog peer offers the syslog scenario, whatever it is
//! (eventd, the floor, rsyslog, journald, syslog-ng): its own module, so the
//! scenario and the floor both use it without importing each other.

use std::path::PathBuf;

/// A running peer: how to count what it stored, how to stop it.
pub(crate) trait Running {
    fn socket(&self) -> PathBuf;
    /// Messages stored so far (polled the same way for every peer).
    fn stored(&mut self) -> anyhow::Result<u64>;
    fn stop(&mut self) -> anyhow::Result<()>;
    /// The peer's process, whose CPU time (with its descendants') is
    /// counted; `None` when it runs inside the harness (the floor).
    fn pid(&self) -> Option<u32>;
}
