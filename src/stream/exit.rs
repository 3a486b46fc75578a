//! The record of how a command ended (`eventctl run` sends it after the
//! command exits, on a connection of its own).
//!
//! The report names the command's pid. eventd stores it only if the kernel
//! says that pid is a child of the process that sent the report and has
//! exited without being waited for (a zombie: its parent holds it until
//! eventd answers), so nobody can write an exit record for a process that
//! is not theirs. It waits (at most [`OUTPUT_WAIT`]) for the command's
//! output connections to end, so that the exit record comes after the
//! last line, then stores: provider the identifier, name `exit`, the
//! command's pid and uid, and `fields.exit_status` or `fields.exit_signal`
//! (with `core_dumped`). The status is the kernel's (`/proc/PID/stat` of
//! the zombie) when eventd may read it (it runs as root); otherwise the
//! one the parent reported, and `status_from_parent` says so.

use super::header::{Ending, Header};
use crate::rings::Event;
use crate::syslog::record::Credentials;
use crate::trusted::{process, Senders, Trusted};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest the exit record waits for the command's output to end (a
/// command that left a process behind holding its stdout: the record is
/// stored all the same).
pub const OUTPUT_WAIT: Duration = Duration::from_secs(2);

/// The output connections open now, by the pid that made them, with that
/// process's credentials.
#[derive(Default)]
pub struct Outputs {
    open: Mutex<HashMap<i32, (u32, Credentials)>>,
}

impl Outputs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, (u32, Credentials)>> {
        // Counts are whole after every update.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection of `creds.pid` opened; [`Output::drop`] closes it.
    pub fn opened(&self, creds: Credentials) -> Output<'_> {
        self.lock().entry(creds.pid).or_insert((0, creds)).0 += 1;
        Output {
            outputs: self,
            pid: creds.pid,
        }
    }

    /// The credentials of `pid`'s open connections, if it has any.
    fn open_for(&self, pid: i32) -> Option<Credentials> {
        self.lock().get(&pid).map(|(_, c)| *c)
    }
}

/// An open output connection; counted until dropped.
pub struct Output<'a> {
    outputs: &'a Outputs,
    pid: i32,
}

impl Drop for Output<'_> {
    fn drop(&mut self) {
        let mut open = self.outputs.lock();
        if let Some(entry) = open.get_mut(&self.pid) {
            entry.0 -= 1;
            if entry.0 == 0 {
                open.remove(&self.pid);
            }
        }
    }
}

#[derive(Serialize)]
struct ExitFields<'a> {
    transport: &'static str,
    gid: u32,
    #[serde(flatten)]
    trusted: Trusted<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_status: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_signal: Option<i32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    core_dumped: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    status_from_parent: bool,
    /// The pid of the parent that reported it (`eventctl run`).
    reported_by: i32,
}

/// What the exit record needs besides the header.
pub struct Context<'a> {
    pub outputs: &'a Outputs,
    pub senders: &'a Senders,
    /// Whether eventd may read any process's exit status (it is root).
    pub sees_every_status: bool,
}

/// Checks the report of `header` from `sender` and makes its event (into
/// `message` and `fields`); an error says why it is refused.
pub fn exit_event<'e>(
    header: &'e Header,
    sender: Option<Credentials>,
    cx: &Context<'_>,
    bufs: (&'e mut String, &'e mut String),
) -> Result<Event<'e>, String> {
    let (pid, claimed) = header.exit.ok_or("not an exit report")?;
    let sender = sender.ok_or("the connection has no credentials")?;
    let stat = process::stat(pid).map_err(|_| format!("no process {pid}"))?;
    if stat.ppid != sender.pid || stat.state != b'Z' {
        return Err(format!(
            "process {pid} is not an exited child of the sender (pid {}) that it has not \
             waited for",
            sender.pid
        ));
    }
    let deadline = Instant::now() + OUTPUT_WAIT;
    let mut command = sender;
    while let Some(c) = cx.outputs.open_for(pid) {
        command = c;
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let kernel = stat.exit_code.and_then(Ending::from_wait_status);
    let (ending, from_parent) = match kernel {
        Some(e) if cx.sees_every_status => (e, false),
        _ => (claimed, true),
    };
    let info = cx.senders.lookup(pid, command.uid, command.gid);
    let (message, fields) = bufs;
    let (status, signal, core) = match ending {
        Ending::Exited(code) => {
            *message = format!("exited with status {code}");
            (Some(code), None, false)
        }
        Ending::Signaled { signal, core } => {
            *message = format!(
                "killed by signal {signal}{}",
                if core { " (core dumped)" } else { "" }
            );
            (None, Some(signal), core)
        }
    };
    *fields = serde_json::to_string(&ExitFields {
        transport: "stdout",
        gid: command.gid,
        trusted: Trusted::of(info.as_deref()),
        exit_status: status,
        exit_signal: signal,
        core_dumped: core,
        status_from_parent: from_parent,
        reported_by: sender.pid,
    })
    .unwrap_or_default();
    Ok(Event {
        ts_ns: crate::rings::now_ns(),
        // Positive: the header's parser refuses anything else.
        pid: u32::try_from(pid).unwrap_or(0),
        tid: 0,
        uid: command.uid,
        level: header.level,
        provider: crate::rings::client::truncate(&header.identifier, 255),
        name: "exit",
        message,
        fields,
    })
}
