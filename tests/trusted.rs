//! What eventd vouches for about a sender, with real sending processes:
//! the kernel's credentials and what `/proc` says (command, executable,
//! systemd unit from the cgroup, boot), which a message cannot override,
//! and the boot marker stored at each start.
#![cfg(not(loom))]

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const NOBODY: u32 = 65534;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// (pid, uid, fields) of the events of `provider` in eventd's syslog ring.
fn stored(data: &Path, provider: &str) -> Vec<(i64, i64, serde_json::Value)> {
    let mut out = Vec::new();
    for (_, c) in shards(data) {
        let mut stmt = c
            .prepare("SELECT pid, uid, fields FROM events WHERE provider = ?1 AND cpu = 1048576")
            .unwrap();
        let rows = stmt
            .query_map([provider], |r| {
                let fields: String = r.get(2)?;
                Ok((r.get(0)?, r.get(1)?, serde_json::from_str(&fields).unwrap()))
            })
            .unwrap();
        out.extend(rows.map(|r| r.unwrap()));
    }
    out
}

/// A cgroup in systemd's own hierarchy named like a service, for the
/// duration of a test; `None` (said why) where that hierarchy cannot be
/// written.
struct ServiceCgroup {
    dir: PathBuf,
    made_slice: bool,
}

impl ServiceCgroup {
    fn make(unit: &str) -> Option<ServiceCgroup> {
        let root = Path::new("/sys/fs/cgroup/systemd");
        let unified = Path::new("/sys/fs/cgroup/unified");
        let base = if root.join("cgroup.procs").exists() {
            root
        } else if unified.join("cgroup.procs").exists() {
            unified
        } else {
            eprintln!("no writable systemd cgroup hierarchy: the unit part is skipped");
            return None;
        };
        let slice = base.join("system.slice");
        let made_slice = !slice.exists();
        let dir = slice.join(unit);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!(
                "cannot make {}: {e}; the unit part is skipped",
                dir.display()
            );
            return None;
        }
        Some(ServiceCgroup { dir, made_slice })
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for ServiceCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
        if self.made_slice {
            let _ = std::fs::remove_dir(self.dir.parent().unwrap());
        }
    }
}

/// A Python program that sends `message` to the syslog socket when told
/// to (a line on its stdin), then waits until its stdin closes.
const SENDER: &str = r#"
import socket, sys
sys.stdin.readline()
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(sys.argv[2].encode(), sys.argv[1])
print("sent", flush=True)
sys.stdin.read()
"#;

#[test]
fn a_syslog_message_carries_its_senders_trusted_fields_and_forged_ones_do_not_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let socket = data.join("run/syslog.sock");
    let unit = format!("eventd-test-{}.service", std::process::id());
    // Everything a message could claim: fields of the same names in its
    // structured data, a JSON object as text, a PROCID.
    let message = "<13>1 - - forger 1 - [meta comm=\"forged\" exe=\"/forged\" \
                   unit=\"forged.service\" boot_id=\"0\" gid=\"0\"] \
                   {\"comm\":\"forged\",\"exe\":\"/forged\",\"unit\":\"forged.service\"}";
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.args(["-c", SENDER])
        .arg(&socket)
        .arg(message)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let uid = if root() {
        as_nobody(&mut cmd);
        NOBODY
    } else {
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    };
    let mut sender = cmd.spawn().unwrap();
    let pid = sender.id();
    let cgroup = ServiceCgroup::make(&unit);
    if let Some(c) = &cgroup {
        c.enter(pid);
    }
    // What the kernel says of the sender, read by the test itself.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let mut stdin = sender.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    let mut sent = String::new();
    BufReader::new(sender.stdout.take().unwrap())
        .read_line(&mut sent)
        .unwrap();
    assert_eq!(sent, "sent\n");
    wait_until("the message stored", || !stored(&data, "forger").is_empty());
    drop(stdin);
    sender.wait().unwrap();
    let (spid, suid, f) = stored(&data, "forger").remove(0);
    assert_eq!((spid, suid), (i64::from(pid), i64::from(uid)));
    assert_eq!(f["comm"], comm.trim_end(), "{f}");
    assert_eq!(f["exe"], exe.to_str().unwrap(), "{f}");
    assert_eq!(f["gid"], uid, "{f}");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(f["boot_id"], boot.trim().replace('-', ""));
    match &cgroup {
        Some(_) => assert_eq!(f["unit"], unit.as_str(), "{f}"),
        None => assert!(f.get("unit").is_none(), "{f}"),
    }
    // The claims are there, as claims.
    assert_eq!(f["sd"]["meta"]["comm"], "forged");
    assert_eq!(f["procid"], "1");
    eventd.stop();
    drop(cgroup);
}

#[test]
fn each_start_stores_a_boot_marker_in_eventds_own_ring() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    eventd.stop();
    let eventd = Eventd::start(&data, None);
    let markers = || -> Vec<(i64, serde_json::Value)> {
        let mut out = Vec::new();
        for (_, c) in shards(&data) {
            let mut stmt = c
                .prepare(
                    "SELECT cpu, fields FROM events WHERE provider = 'eventd' AND name = 'boot'",
                )
                .unwrap();
            let rows = stmt
                .query_map([], |r| {
                    let fields: String = r.get(1)?;
                    Ok((r.get(0)?, serde_json::from_str(&fields).unwrap()))
                })
                .unwrap();
            out.extend(rows.map(|r| r.unwrap()));
        }
        out
    };
    wait_until("two boot markers", || markers().len() == 2);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let btime: i64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for (cpu, f) in markers() {
        assert_eq!(cpu, 1 << 20, "in eventd's syslog ring");
        assert_eq!(f["boot_id"], boot.trim().replace('-', ""));
        assert_eq!(f["boot_time_ns"], btime * 1_000_000_000);
    }
    eventd.stop();
}
