//! `eventctl` writing into a pipe whose reader goes away, as in
//! `eventctl query | head -1`: every command that prints ends quietly, with
//! exit status 0 and nothing on standard error, as journalctl and Unix
//! filters do. Both with standard error apart and with it in the same pipe
//! (`2>&1 | head -1`). Real pipes, a real daemon, real `eventctl` processes.

mod common;

use common::{config, wait_for_events, Emitter, Eventd, EVENTCTL};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};

/// Enough events, with long enough messages, that a listing is many times
/// a pipe's buffer (64 KiB): eventctl is still writing when the reader
/// goes away.
const EVENTS: u64 = 1500;

/// A daemon (with export on, towards a port nobody listens on, so that
/// `export status` has something to print) holding `EVENTS` events.
struct Host {
    _dir: tempfile::TempDir,
    data: PathBuf,
    config: PathBuf,
    eventd: Eventd,
}

fn host() -> Host {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = config(dir.path(), "ExportUrl = \"http://127.0.0.1:1/\"\n");
    let eventd = Eventd::start(&data, Some(&config));
    let mut emitter = Emitter::spawn(&data, "pipes");
    for i in 0..EVENTS {
        emitter.send(&format!("event {i:05} {}", "x".repeat(300)));
    }
    emitter.finish();
    wait_for_events(&data, EVENTS);
    Host {
        _dir: dir,
        data,
        config,
        eventd,
    }
}

impl Host {
    fn eventctl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(EVENTCTL);
        cmd.arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null());
        cmd
    }
}

/// The commands that print a listing longer than a pipe's buffer.
const LISTINGS: &[&[&str]] = &[
    &["query"],
    &["query", "--output", "json"],
    &["query", "--output", "table", "--reverse"],
    &["query", "--offline"],
    // A follow lists the newest 10 unless told otherwise.
    &["query", "--follow", "--lines", "all"],
];

/// Every command that prints, each printing something here.
const ALL: &[&[&str]] = &[
    &["query"],
    &["query", "--limit", "1"],
    &["query", "--offline"],
    &["query", "--follow"],
    &["stats"],
    &["stats", "--prometheus"],
    &["shards"],
    &["config"],
    &["export", "status"],
    &["export", "status", "--output", "json"],
];

/// A pipe: its read end and its write end, both close-on-exec (a child
/// gets the write end only where it is given as its standard output or
/// error).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which has room
    // for both.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just made by pipe2; nothing else owns
    // them.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// Runs `cmd` with its standard output a pipe (and its standard error too
/// when `together`), reads one line and closes the pipe. Its exit status,
/// the line, and what it wrote on a standard error of its own.
fn one_line_then_close(mut cmd: Command, together: bool) -> (ExitStatus, String, String) {
    let (reader, writer) = pipe();
    if together {
        cmd.stderr(writer.try_clone().unwrap());
    } else {
        cmd.stderr(Stdio::piped());
    }
    cmd.stdout(writer);
    let mut child = cmd.spawn().unwrap();
    // The write ends the command still holds: only eventctl's remain.
    drop(cmd);
    let mut line = String::new();
    BufReader::new(reader).read_line(&mut line).unwrap();
    // BufReader and pipe closed here: eventctl's next write meets EPIPE.
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut stderr).unwrap();
    }
    (child.wait().unwrap(), line, stderr)
}

/// Runs `cmd` with its standard output (and its standard error when
/// `together`) a pipe whose reader is closed before it starts, as in
/// `eventctl stats | true` once `true` has exited: its first write meets
/// EPIPE. Its exit status and its own standard error.
fn closed_from_the_start(mut cmd: Command, together: bool) -> (ExitStatus, String) {
    let (reader, writer) = pipe();
    drop(reader);
    if together {
        cmd.stderr(writer.try_clone().unwrap());
    } else {
        cmd.stderr(Stdio::piped());
    }
    let out = cmd.stdout(writer).output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn show(args: &[&str], together: bool) -> String {
    format!(
        "eventctl {}{}",
        args.join(" "),
        if together { " 2>&1" } else { "" }
    )
}

#[test]
fn a_reader_gone_after_one_line_ends_eventctl_quietly() {
    let host = host();
    let mut failed = Vec::new();
    for args in LISTINGS {
        for together in [false, true] {
            let what = show(args, together);
            let (status, line, stderr) = one_line_then_close(host.eventctl(args), together);
            // An event (eventd's boot marker is the first), or the table's
            // header: not an error.
            let event = line.contains("event ") || line.contains("eventd started in boot");
            if !(event || line.starts_with("TIME ")) {
                failed.push(format!("{what} | head -1: first line {line:?}"));
            }
            if !status.success() || !stderr.is_empty() {
                failed.push(format!("{what} | head -1: {status}; stderr {stderr:?}"));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    host.eventd.stop();
}

#[test]
fn a_pipe_closed_before_eventctl_writes_ends_it_quietly() {
    let host = host();
    let mut failed = Vec::new();
    for args in ALL {
        for together in [false, true] {
            let what = show(args, together);
            let (status, stderr) = closed_from_the_start(host.eventctl(args), together);
            if !status.success() || !stderr.is_empty() {
                failed.push(format!("{what} | true: {status}; stderr {stderr:?}"));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    // What each command prints is there when the pipe stays open.
    for args in ALL.iter().filter(|a| !a.contains(&"--follow")) {
        let out = host.eventctl(args).output().unwrap();
        assert!(out.status.success(), "{}", show(args, false));
        assert!(
            !out.stdout.is_empty(),
            "{} printed nothing",
            show(args, false)
        );
    }
    host.eventd.stop();
}

/// Only a reader gone is quiet: any other failed write (here /dev/full, a
/// full disk under `> file`) is an error, named, with exit status 1.
#[test]
fn a_write_that_fails_otherwise_is_an_error() {
    let host = host();
    let mut failed = Vec::new();
    for args in ALL.iter().filter(|a| !a.contains(&"--follow")) {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = host.eventctl(args).stdout(full).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(1) || !stderr.contains("No space left on device") {
            failed.push(format!(
                "{} > /dev/full: {}; {stderr:?}",
                show(args, false),
                out.status
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    host.eventd.stop();
}
