//! The service manager's notification protocol (sd_notify: `Type=notify`
//! in eventd.service), through the `sd-notify` crate. Each call sends one
//! datagram to `$NOTIFY_SOCKET` and does nothing when it is not set (eventd
//! started by hand, or by a manager that does not listen). A message that
//! cannot be sent is logged, never fatal: eventd runs the same either way.

use sd_notify::NotifyState;

fn send(what: &str, states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, message = what, "cannot notify the service manager");
    }
}

/// READY=1, once the rings, writers, drains and every socket are up; with
/// a STATUS line saying what runs.
pub fn ready(status: &str) {
    send("READY", &[NotifyState::Ready, NotifyState::Status(status)]);
}

/// RELOADING=1 (with the monotonic time systemd 253 and later ask for)
/// before a configuration reload; [`ready`] after it.
pub fn reloading() {
    let mut states = vec![NotifyState::Reloading];
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    send("RELOADING", &states);
}

/// STOPPING=1, as soon as a stop is asked for.
pub fn stopping() {
    send(
        "STOPPING",
        &[
            NotifyState::Stopping,
            NotifyState::Status("stopping: writers commit what they hold"),
        ],
    );
}

/// WATCHDOG=1; false when it could not be sent.
pub fn watchdog_ping() -> bool {
    sd_notify::notify(&[NotifyState::Watchdog]).is_ok()
}

/// The watchdog timeout the service manager set for this process
/// (WATCHDOG_USEC, and WATCHDOG_PID if set, naming this process), if any.
pub fn watchdog_timeout() -> Option<std::time::Duration> {
    sd_notify::watchdog_enabled().filter(|t| !t.is_zero())
}
