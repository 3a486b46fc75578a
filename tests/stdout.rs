//! The service-output socket with the real daemon: `eventctl run` with
//! real commands (both streams, `<N>` prefixes, non-zero exits, signals),
//! the protocol spoken by a Python client as a service's wrapper would,
//! forged exit reports refused, and the per-uid bound on connections.
#![cfg(not(loom))]

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

const NOBODY: u32 = 65534;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A stored event of eventd's syslog ring.
#[derive(Debug, Clone)]
struct Row {
    ts: i64,
    level: i64,
    provider: String,
    name: String,
    pid: i64,
    uid: i64,
    message: String,
    fields: serde_json::Value,
}

/// The events of `provider`, in the order they were stored.
fn rows(data: &Path, provider: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for (_, c) in shards(data) {
        let mut stmt = c
            .prepare(
                "SELECT ts, level, provider, name, pid, uid, message, fields, seq FROM events \
                 WHERE provider = ?1 AND cpu = 1048576",
            )
            .unwrap();
        let found = stmt
            .query_map([provider], |r| {
                let fields: String = r.get(7)?;
                Ok((
                    r.get::<_, i64>(8)?,
                    Row {
                        ts: r.get(0)?,
                        level: r.get(1)?,
                        provider: r.get(2)?,
                        name: r.get(3)?,
                        pid: r.get(4)?,
                        uid: r.get(5)?,
                        message: r.get(6)?,
                        fields: serde_json::from_str(&fields).unwrap(),
                    },
                ))
            })
            .unwrap();
        out.extend(found.map(|r| r.unwrap()));
    }
    out.sort_by_key(|(seq, _)| *seq);
    out.into_iter().map(|(_, r)| r).collect()
}

fn wait_rows(data: &Path, provider: &str, n: usize) -> Vec<Row> {
    wait_until(&format!("{n} events of {provider}"), || {
        rows(data, provider).len() >= n
    });
    rows(data, provider)
}

fn run(data: &Path, args: &[&str]) -> std::process::Output {
    Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(data)
        .arg("run")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_command_writing_both_streams_with_prefixes_and_failing_is_stored_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    // The command of docs/guide/emitting.md.
    let script = "echo 'plain out'; echo '<3>prefixed err' >&2; echo 'plain err' >&2; \
                  echo '<6>prefixed info'; printf 'no newline at the end'; exit 3";
    let out = run(&data, &["--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    let got = wait_rows(&data, "sh", 6);
    assert_eq!(got.len(), 6, "{got:#?}");
    let find = |m: &str| {
        got.iter()
            .find(|r| r.message == m)
            .unwrap_or_else(|| panic!("{m:?}: {got:#?}"))
    };
    let pid = find("plain out").pid;
    for (message, stream, level) in [
        ("plain out", "stdout", 6),
        ("prefixed err", "stderr", 3),
        ("plain err", "stderr", 4),
        ("prefixed info", "stdout", 6),
        ("no newline at the end", "stdout", 6),
    ] {
        let r = find(message);
        assert_eq!((r.name.as_str(), r.level), (stream, level), "{r:?}");
        assert_eq!(r.fields["stream"], stream);
        assert_eq!(r.provider, "sh", "the command's name");
        assert_eq!(r.fields["transport"], "stdout");
        assert_eq!(r.pid, pid, "every line from the command's own process");
        assert_eq!(r.uid, 0);
        assert_eq!(r.fields["comm"], "sh", "{r:?}");
        assert_eq!(r.fields["boot_id"].as_str().unwrap().len(), 32);
    }
    assert_eq!(find("no newline at the end").fields["line_break"], "eof");
    // The exit record: the command's pid, its status, after every line.
    let exit = find("exited with status 3");
    assert_eq!((exit.name.as_str(), exit.level, exit.pid), ("exit", 3, pid));
    assert_eq!(exit.fields["exit_status"], 3);
    assert!(exit.fields.get("status_from_parent").is_none(), "{exit:?}");
    assert!(got.iter().all(|r| r.ts <= exit.ts), "{got:#?}");
    assert_ne!(exit.fields["reported_by"].as_i64().unwrap(), pid);
    // In text output the source is the stream.
    let text = eventctl_text(&data, &["query", "--provider", "sh", "--output", "text"]);
    assert!(
        text.contains(" stderr #") && text.contains(" exit #"),
        "{text}"
    );
    assert!(!text.contains("cpu1048576"), "{text}");
    eventd.stop();
}

#[test]
fn a_signal_and_another_user_and_a_missing_command_end_as_a_shell_says() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let out = run(
        &data,
        &[
            "-t",
            "killed",
            "--",
            "sh",
            "-c",
            "echo before; kill -TERM $$",
        ],
    );
    assert_eq!(out.status.code(), Some(128 + 15), "{out:?}");
    let got = wait_rows(&data, "killed", 2);
    let exit = got.iter().find(|r| r.name == "exit").unwrap();
    assert_eq!(exit.fields["exit_signal"], 15);
    assert_eq!(exit.message, "killed by signal 15");
    let out = run(&data, &["--", "/no/such/command"]);
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    if root() {
        let mut cmd = Command::new(EVENTCTL);
        cmd.arg("--data-dir")
            .arg(&data)
            .args(["run", "-t", "as-nobody", "--stderr-level", "err", "--"])
            .args(["sh", "-c", "echo hello >&2; exit 1"]);
        let out = as_nobody(&mut cmd).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let got = wait_rows(&data, "as-nobody", 2);
        for r in &got {
            assert_eq!(r.uid, i64::from(NOBODY), "{r:?}");
            assert_eq!(r.fields["gid"], NOBODY);
        }
        let line = got.iter().find(|r| r.message == "hello").unwrap();
        assert_eq!(line.level, 3);
    } else {
        eprintln!("not root: the part run as another user was skipped");
    }
    eventd.stop();
}

/// Speaks the socket's protocol from a Python program, as a service's
/// wrapper would: header, answer, lines.
#[test]
fn a_program_can_speak_the_protocol_itself() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let socket = data.join("run/stdout.sock");
    let client = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b"stdout\nwrapper\nnotice\n1\n")
answer = s.makefile("rb").readline()
assert answer == b"ok\n", answer
s.sendall(b"first\n<2>second\nthird")
s.close()
"#;
    let status = Command::new("python3")
        .arg("-c")
        .arg(client)
        .arg(&socket)
        .status()
        .unwrap();
    assert!(status.success());
    let got = wait_rows(&data, "wrapper", 3);
    let levels: Vec<(String, i64)> = got.iter().map(|r| (r.message.clone(), r.level)).collect();
    assert_eq!(
        levels,
        vec![
            ("first".to_string(), 5),
            ("second".to_string(), 2),
            ("third".to_string(), 5)
        ]
    );
    assert!(got[0].fields["comm"]
        .as_str()
        .is_some_and(|c| c.starts_with("python")));
    // A bad header is answered and nothing is stored.
    let mut s = UnixStream::connect(&socket).unwrap();
    s.write_all(b"stdin\nx\ninfo\n1\n").unwrap();
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer).unwrap();
    assert!(
        answer.starts_with("error: line 1: stream \"stdin\""),
        "{answer}"
    );
    eventd.stop();
}

#[test]
fn an_exit_report_for_a_process_that_is_not_the_senders_exited_child_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let socket = data.join("run/stdout.sock");
    let report = |pid: u32| {
        let mut s = UnixStream::connect(&socket).unwrap();
        write!(s, "exit\nforger\ninfo\n1\n{pid} exit:0\n").unwrap();
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).unwrap();
        answer
    };
    // Not our child.
    let answer = report(eventd.child.id());
    assert!(
        answer.contains("is not an exited child of the sender"),
        "{answer}"
    );
    // Our child, still running.
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let answer = report(child.id());
    assert!(
        answer.contains("is not an exited child of the sender"),
        "{answer}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // One that truly is: the status is the kernel's, not the one claimed.
    let mut child = Command::new("sh").args(["-c", "exit 4"]).spawn().unwrap();
    let pid = child.id();
    wait_until("the child to exit", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit(')').next().unwrap().trim_start().starts_with('Z'))
    });
    let answer = report(pid);
    child.wait().unwrap();
    assert_eq!(answer, "ok\n");
    let got = wait_rows(&data, "forger", 1);
    assert_eq!(got.len(), 1, "{got:#?}");
    if root() {
        assert_eq!(got[0].fields["exit_status"], 4, "{got:#?}");
    }
    assert_eq!(got[0].pid, i64::from(pid));
    eventd.stop();
}

#[test]
fn one_uid_gets_its_share_of_the_output_socket_and_is_told_why_not_more() {
    if !root() {
        eprintln!("skipped: not root (connections as another uid)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let socket = data.join("run/stdout.sock");
    // 40 connections as nobody, each sending its header.
    let answers: Vec<(UnixStream, String)> = std::thread::spawn({
        let socket = socket.clone();
        move || {
            // SAFETY: raw system calls with plain integer arguments; they
            // change this thread's credentials only.
            unsafe {
                assert_eq!(
                    libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY),
                    0
                );
                assert_eq!(
                    libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY),
                    0
                );
            }
            (0..40)
                .map(|_| {
                    let mut s = UnixStream::connect(&socket).unwrap();
                    let _ = s.write_all(b"stdout\nheld\ninfo\n1\n");
                    let mut answer = String::new();
                    let _ = BufReader::new(&s).read_line(&mut answer);
                    (s, answer)
                })
                .collect()
        }
    })
    .join()
    .unwrap();
    let ok = answers.iter().filter(|(_, a)| a == "ok\n").count();
    let refused: Vec<&String> = answers
        .iter()
        .map(|(_, a)| a)
        .filter(|a| *a != "ok\n")
        .collect();
    assert_eq!(ok, 32, "{refused:?}");
    assert_eq!(refused.len(), 8);
    assert!(
        refused[0].contains("uid 65534 holds its share"),
        "{}",
        refused[0]
    );
    // Another uid still gets in.
    let out = run(&data, &["-t", "other", "--", "echo", "still served"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    wait_rows(&data, "other", 2);
    let stats = eventctl_json(&data, "stats")["stats"]["stdout"].clone();
    assert_eq!(stats["rejected_connections_share"], 8, "{stats}");
    drop(answers);
    eventd.stop();
}
