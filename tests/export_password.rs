//! The ClickHouse password: a password file that is not a small regular
//! file is refused without holding up anything. These tests need no
//! ClickHouse server.

mod common;

use common::{config, emit_one, read, Eventd, EVENTCTL};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn eventctl(data: &Path, args: &[&str]) -> Output {
    Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A port nothing listens on (bound, learnt, closed).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `eventctl export status --output json` once it answers and `ok` holds
/// for it; fails the test (with the log) after two minutes.
fn wait_status(
    data: &Path,
    log: &Path,
    mut ok: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = String::new();
    loop {
        let out = eventctl(data, &["export", "status", "--output", "json"]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if ok(&v) {
                return v;
            }
            last = v.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "status never came: {last}\nlog:\n{}",
            read(log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A data directory and configuration exporting to `url` as `user`, with
/// the password in `password_file`.
fn host(root: &Path, url: &str, user: &str, password_file: &Path) -> (PathBuf, PathBuf) {
    let cfg = config(
        root,
        &format!(
            "HostName = \"pw-host\"\nExportUrl = \"{url}\"\nExportUser = \"{user}\"\n\
             ExportPasswordFile = \"{}\"\nStorageShards = 1\nRingBytes = 65536\n\
             SyslogSocket = \"\"\nSyslogStreamSocket = \"\"\n",
            password_file.display()
        ),
    );
    (root.join("data"), cfg)
}

/// eventd's state of its one shard file, once the exporter took it.
fn shard_state(data: &Path, log: &Path) -> String {
    let status = wait_status(data, log, |v| {
        v["shards"]
            .as_array()
            .and_then(|s| s.first())
            .and_then(|s| s["state"].as_str())
            .is_some_and(|s| s != "starting")
    });
    status["shards"][0]["state"].as_str().unwrap().to_string()
}

#[test]
fn a_fifo_as_password_file_is_refused_and_start_up_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("password.fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let url = format!("http://127.0.0.1:{}/", closed_port());
    let (data, cfg) = host(dir.path(), &url, "eventd", &fifo);
    // Start-up finishes (Eventd::start waits for the pid file, at most a
    // minute): nobody ever writes to the FIFO.
    let eventd = Eventd::start(&data, Some(&cfg));
    emit_one(&data, "one event");
    let state = shard_state(&data, &eventd.log);
    assert!(
        state.starts_with("not exported") && state.contains("not a regular file"),
        "{state}"
    );
    let log = read(&eventd.log);
    assert!(
        log.contains("password.fifo") && log.contains("not a regular file"),
        "{log}"
    );
    // eventctl, which reads the same file, does not wait on it either.
    let out = eventctl(
        &data,
        &[
            "export",
            "init",
            "--url",
            &url,
            "--user",
            "eventd",
            "--password-file",
            fifo.to_str().unwrap(),
        ],
    );
    assert!(
        !out.status.success() && text(&out).contains("not a regular file"),
        "{}",
        text(&out)
    );
    eventd.stop();
}

/// The most memory a process ever held (VmHWM), KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_huge_password_file_is_refused_without_being_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.password");
    // 256 MiB of zero bytes (sparse): no newline, so the "first line" is
    // all of it.
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(256 << 20).unwrap();
    drop(file);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let url = format!("http://127.0.0.1:{}/", closed_port());
    let (data, cfg) = host(dir.path(), &url, "eventd", &path);
    let eventd = Eventd::start(&data, Some(&cfg));
    emit_one(&data, "one event");
    let state = shard_state(&data, &eventd.log);
    let log = read(&eventd.log);
    let peak = peak_rss_kib(eventd.child.id());
    // Far below the file's 256 MiB (eventd alone holds a few tens of MiB).
    assert!(peak < 128 << 10, "eventd's peak RSS {peak} KiB");
    assert!(
        state.starts_with("not exported") && state.contains("4096"),
        "{state}"
    );
    assert!(log.contains("huge.password"), "{log}");
    eventd.stop();
}
