//! journalctl's habits in `eventctl query`, one test per flag, on a store
//! of known events read through a real daemon: rows written into a shard
//! file the way the writers write them (eventd's own rings have `cpu` from
//! 1048576 on, as the syslog, stream and kernel sources will), boot
//! markers as eventd stores them at each start, then eventd started on it.
#![cfg(not(loom))]

use jiff::tz::TimeZone;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};

mod common;
use common::{Eventd, EVENTCTL};

/// eventd's syslog ring; the kernel's comes next.
const OWN: i64 = 1 << 20;
const MINUTE: i64 = 60_000_000_000;
const HOST: &str = "journal-test";
const B1: &str = "11111111111111111111111111111111";
const B2: &str = "cafe00000000000000000000000000b2";

/// One known event: minutes before the store's "now", ring, level,
/// provider, name, message, fields.
type Known = (i64, i64, u8, &'static str, &'static str, String, String);

fn known() -> Vec<Known> {
    let boot = |id: &str, at: i64| format!(r#"{{"boot_id":"{id}","boot_time_ns":{at}}}"#);
    let kernel = r#"{"transport":"kernel"}"#.to_string();
    let none = "{}".to_string();
    let mut k: Vec<Known> = vec![
        // Boot B1 started 120 minutes ago; its marker, then its events.
        (
            -119,
            0,
            6,
            "eventd",
            "boot",
            "boot one".into(),
            boot(B1, -120),
        ),
        (
            -100,
            OWN + 1,
            6,
            "kernel",
            "message",
            "Linux version old".into(),
            kernel.clone(),
        ),
        (
            -90,
            0,
            6,
            "app",
            "message",
            "old boot app".into(),
            none.clone(),
        ),
        // Boot B2 (the current one) started 55 minutes ago.
        (
            -54,
            0,
            6,
            "eventd",
            "boot",
            "boot two".into(),
            boot(B2, -55),
        ),
        (
            -53,
            OWN + 1,
            6,
            "kernel",
            "message",
            "Linux version new".into(),
            kernel.clone(),
        ),
        (
            -50,
            OWN,
            6,
            "nginx",
            "message",
            "GET /index".into(),
            r#"{"unit":"nginx.service","transport":"stdout","stream":"stdout"}"#.into(),
        ),
        (
            -48,
            OWN,
            5,
            "sshd",
            "message",
            "session opened".into(),
            r#"{"unit":"ssh.service","transport":"syslog"}"#.into(),
        ),
        // A producer claiming a unit and the kernel's transport: not
        // vouched for.
        (
            -45,
            0,
            3,
            "nginx",
            "message",
            "forged unit".into(),
            r#"{"unit":"nginx.service"}"#.into(),
        ),
        (
            -40,
            OWN + 1,
            4,
            "kernel",
            "message",
            "usb 1-1: new device".into(),
            kernel.clone(),
        ),
        (
            -35,
            1,
            4,
            "kernel",
            "message",
            "forged kernel".into(),
            kernel,
        ),
    ];
    for level in 0..8u8 {
        let at = -30 + i64::from(level);
        k.push((
            at,
            0,
            level,
            "app",
            "message",
            format!("level {level}"),
            none.clone(),
        ));
    }
    k.push((
        -5,
        0,
        4,
        "app",
        "message",
        "Disk almost full".into(),
        none.clone(),
    ));
    k.push((
        -4,
        1,
        6,
        "app",
        "message",
        "disk check ok".into(),
        none.clone(),
    ));
    k.push((-3, 1, 6, "cron", "message", "job done".into(), none));
    k
}

/// A running eventd over the known store.
struct Store {
    _dir: tempfile::TempDir,
    data: PathBuf,
    config: PathBuf,
    /// The store's "now" (ns): known events are minutes before it.
    now: i64,
    events: Vec<(i64, Known)>,
    eventd: Option<Eventd>,
}

/// The time of an event `minutes` before `now` (plus `k` ns, so that no
/// two events share a time).
fn at(now: i64, minutes: i64, k: usize) -> i64 {
    now + minutes * MINUTE + k as i64
}

impl Store {
    fn new() -> Store {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let store = data.join("store");
        std::fs::create_dir_all(&store).unwrap();
        // No socket and no kernel log: eventd then has no ring of its own
        // and stores no boot marker for the real boot, so the known
        // markers are the store's boots.
        let config = common::config(
            dir.path(),
            &format!(
                "HostName = \"{HOST}\"\nSyslogSocket = \"\"\nSyslogStreamSocket = \"\"\n\
                 StdoutSocket = \"\"\n"
            ),
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        let conn = eventd::store::open_shard(&store.join("shard-000.db")).unwrap();
        let mut events = Vec::new();
        for (k, e) in known().into_iter().enumerate() {
            let ts = at(now, e.0, k);
            // Boot markers give their start in minutes here.
            let fields = match e.3 {
                "eventd" => e.6.replace(
                    &format!("\"boot_time_ns\":{}", e.0 - 1),
                    &format!("\"boot_time_ns\":{}", at(now, e.0 - 1, 0)),
                ),
                _ => e.6.clone(),
            };
            conn.execute(
                eventd::store::rows::INSERT_EVENT,
                rusqlite::params![
                    ts,
                    e.1,
                    k as i64 + 1,
                    7i64,
                    1000 + k as i64,
                    1000 + k as i64,
                    0,
                    e.2,
                    e.3,
                    e.4,
                    e.5,
                    fields
                ],
            )
            .unwrap();
            events.push((ts, (e.0, e.1, e.2, e.3, e.4, e.5, fields)));
        }
        drop(conn);
        let eventd = Eventd::start(&data, Some(&config));
        Store {
            _dir: dir,
            data,
            config,
            now,
            events,
            eventd: Some(eventd),
        }
    }

    /// `eventctl query ARGS` with TZ set to `tz`.
    fn command(&self, tz: &str, args: &[&str]) -> Command {
        let mut c = Command::new(EVENTCTL);
        c.arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.config)
            .arg("query")
            .args(args)
            .env("TZ", tz)
            .env_remove("PAGER")
            .env_remove("SYSTEMD_PAGER")
            .env_remove("EVENTD_PAGER")
            .stdin(Stdio::null());
        c
    }

    /// What `eventctl query ARGS` printed (it must succeed), in UTC.
    fn text(&self, args: &[&str]) -> String {
        self.text_in("UTC", args)
    }

    fn text_in(&self, tz: &str, args: &[&str]) -> String {
        let out = self.command(tz, args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The messages `eventctl query -o cat ARGS` printed.
    fn messages(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec!["-o", "cat"];
        all.extend(args);
        self.text(&all).lines().map(str::to_string).collect()
    }

    /// The messages of the known events `keep` selects, in time order.
    fn expect(&self, keep: impl Fn(i64, &Known) -> bool) -> Vec<String> {
        self.events
            .iter()
            .filter(|(ts, e)| keep(*ts, e))
            .map(|(_, e)| e.5.clone())
            .collect()
    }

    /// The error `eventctl query ARGS` fails with.
    fn refusal(&self, args: &[&str]) -> String {
        let out = self.command("UTC", args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn emit(&self, provider: &str, message: &str) {
        let status = Command::new(EVENTCTL)
            .arg("--data-dir")
            .arg(&self.data)
            .args(["emit", "--provider", provider, message])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(e) = self.eventd.take() {
            if !std::thread::panicking() {
                e.stop();
            }
        }
    }
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn lines_n_prints_the_newest_n_in_time_order() {
    let s = Store::new();
    let all = s.expect(|_, _| true);
    let last3 = all[all.len() - 3..].to_vec();
    assert_eq!(s.messages(&["-n", "3"]), last3);
    assert_eq!(s.messages(&["--lines", "3"]), last3);
    assert_eq!(s.messages(&["--lines=3"]), last3);
    // The same from the files, without the daemon.
    assert_eq!(s.messages(&["--offline", "-n", "3"]), last3);
    let mut newest_first = last3.clone();
    newest_first.reverse();
    assert_eq!(s.messages(&["-n", "3", "-r"]), newest_first);
    // Without N: 10, as journalctl.
    assert_eq!(s.messages(&["-n"]), all[all.len() - 10..].to_vec());
    assert_eq!(s.messages(&["-n", "all"]), all);
    assert_eq!(s.messages(&["-n", "+2"]), all[..2].to_vec());
    // Within a window: the newest of the window.
    assert_eq!(
        s.messages(&["-n", "2", "-t", "kernel"]),
        strings(&["usb 1-1: new device", "forged kernel"])
    );
    assert!(s.refusal(&["--lines=-3"]).contains("-n \"-3\""));
}

/// Lines of a running `eventctl query -o cat ARGS`, read one by one.
fn follow(s: &Store, args: &[&str]) -> (std::process::Child, impl Iterator<Item = String>) {
    let mut all = vec!["-o", "cat"];
    all.extend(args);
    let mut child = s
        .command("UTC", &all)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(Result::unwrap);
    (child, lines)
}

#[test]
fn follow_prints_the_newest_n_then_what_commits_next() {
    let s = Store::new();
    let mut all = s.expect(|_, _| true);
    let cases: [(&[&str], usize); 3] = [
        (&["-n", "3", "-f"], 3),
        // -f alone: the newest 10, never the whole store.
        (&["-f"], 10),
        (&["--follow", "--limit", "2"], 2),
    ];
    for (k, (args, n)) in cases.into_iter().enumerate() {
        let (mut child, mut lines) = follow(&s, args);
        let first: Vec<String> = lines.by_ref().take(n).collect();
        assert_eq!(first, all[all.len() - n..].to_vec(), "{args:?}");
        // The next line printed is the event emitted now.
        let late = format!("late event {k}");
        s.emit("late", &late);
        assert_eq!(lines.next().as_deref(), Some(late.as_str()), "{args:?}");
        all.push(late);
        child.kill().unwrap();
        child.wait().unwrap();
    }
    // With --since and no -n: everything since, then the follow.
    let since = s.expect(|ts, e| ts >= s.now - 10 * MINUTE && e.3 == "app");
    assert_eq!(since.len(), 2);
    let (mut child, mut lines) = follow(&s, &["-f", "--since", "10 min ago", "-t", "app"]);
    let first: Vec<String> = lines.by_ref().take(2).collect();
    assert_eq!(first, since[..2].to_vec());
    s.emit("app", "after since");
    assert_eq!(lines.next().as_deref(), Some("after since"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(s.refusal(&["-f", "-r"]).contains("--reverse"));
}

#[test]
fn priority_selects_a_level_and_those_above_or_a_range() {
    let s = Store::new();
    let range = s.expect(|_, e| (3..=4).contains(&e.2));
    assert!(range.len() >= 4, "{range:?}");
    assert_eq!(s.messages(&["-p", "warning..err"]), range);
    assert_eq!(s.messages(&["-p", "err..warning"]), range);
    assert_eq!(s.messages(&["--priority", "3..4"]), range);
    assert_eq!(s.messages(&["-p", "err"]), s.expect(|_, e| e.2 <= 3));
    // The old name, the same meaning.
    assert_eq!(
        s.messages(&["--level", "warning"]),
        s.expect(|_, e| e.2 <= 4)
    );
    let e = s.refusal(&["-p", "warning..loud"]);
    assert!(e.contains("loud"), "{e}");
}

#[test]
fn unit_matches_only_what_eventd_received_from_that_unit() {
    let s = Store::new();
    // The producer's "forged unit" claims nginx.service too.
    assert_eq!(s.messages(&["-u", "nginx"]), strings(&["GET /index"]));
    assert_eq!(
        s.messages(&["-u", "nginx.service"]),
        strings(&["GET /index"])
    );
    assert_eq!(s.messages(&["--unit", "ss*"]), strings(&["session opened"]));
    assert_eq!(
        s.messages(&["-u", "nginx", "-u", "ssh"]),
        strings(&["GET /index", "session opened"])
    );
    assert!(s.messages(&["-u", "nginx.socket"]).is_empty());
    // --field asks the fields whoever wrote them.
    assert_eq!(
        s.messages(&["--field", "unit=nginx.service"]),
        strings(&["GET /index", "forged unit"])
    );
}

#[test]
fn identifier_is_the_provider_and_repeats_as_or() {
    let s = Store::new();
    assert_eq!(
        s.messages(&["-t", "nginx"]),
        s.expect(|_, e| e.3 == "nginx")
    );
    assert_eq!(
        s.messages(&["-t", "cron", "--identifier", "sshd"]),
        s.expect(|_, e| e.3 == "cron" || e.3 == "sshd")
    );
    assert_eq!(
        s.messages(&["--provider", "cron"]),
        s.expect(|_, e| e.3 == "cron")
    );
}

#[test]
fn reverse_prints_newest_first() {
    let s = Store::new();
    let mut all = s.expect(|_, _| true);
    all.reverse();
    assert_eq!(s.messages(&["-r"]), all);
    assert_eq!(s.messages(&["--reverse"]), all);
}

#[test]
fn grep_is_a_regular_expression_with_smart_case() {
    let s = Store::new();
    let disk = strings(&["Disk almost full", "disk check ok"]);
    assert_eq!(s.messages(&["-g", "disk"]), disk);
    assert_eq!(s.messages(&["-g", "Disk"]), disk[..1].to_vec());
    assert_eq!(
        s.messages(&["--case-sensitive", "-g", "disk"]),
        disk[1..].to_vec()
    );
    assert_eq!(s.messages(&["--case-sensitive=false", "-g", "Disk"]), disk);
    assert_eq!(
        s.messages(&["--grep", "^level [0-2]$"]),
        strings(&["level 0", "level 1", "level 2"])
    );
    let e = s.refusal(&["-g", "(unclosed"]);
    assert!(e.contains("(unclosed"), "{e}");
}

#[test]
fn dmesg_is_the_kernel_log_of_the_current_boot() {
    let s = Store::new();
    // Not the older boot's, not a producer's claim of the kernel's
    // transport.
    let current = strings(&["Linux version new", "usb 1-1: new device"]);
    assert_eq!(s.messages(&["-k"]), current);
    assert_eq!(s.messages(&["--dmesg"]), current);
    assert_eq!(
        s.messages(&["-k", "-b", "-1"]),
        strings(&["Linux version old"])
    );
    assert_eq!(s.messages(&["-k", "-p", "warning"]), current[1..].to_vec());
}

#[test]
fn boot_selects_a_boot_by_offset_or_id_and_list_boots_lists_them() {
    let s = Store::new();
    let start = |minutes| at(s.now, minutes, 0);
    let current = s.expect(|ts, _| ts >= start(-55));
    let before = s.expect(|ts, _| (start(-120)..start(-55)).contains(&ts));
    assert_eq!(
        before,
        strings(&["boot one", "Linux version old", "old boot app"])
    );
    assert_eq!(s.messages(&["-b"]), current);
    assert_eq!(s.messages(&["-b", "0"]), current);
    assert_eq!(s.messages(&["--boot=-1"]), before);
    assert_eq!(s.messages(&["-b", "-1"]), before);
    assert_eq!(s.messages(&["--offline", "-b", "-1"]), before);
    assert_eq!(s.messages(&["-b", "1"]), before);
    assert_eq!(s.messages(&["-b", B1]), before);
    assert_eq!(s.messages(&["-b", "cafe"]), current);
    // A number is an offset, never the start of an id.
    assert!(s.refusal(&["-b", "1111"]).contains("2 boot(s)"));
    assert_eq!(s.messages(&["-b", &format!("{B1}+1")]), current);
    // -b then another flag: the flag is not taken for the boot.
    assert_eq!(s.messages(&["-b", "-r"]).first(), current.last());
    assert!(s.refusal(&["-b", "-2"]).contains("2 boot(s)"));
    assert!(s
        .refusal(&["-b", "ffff"])
        .contains("no boot id starts with"));

    let list = s.text(&["--list-boots"]);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "{list}");
    assert!(lines[0].starts_with("IDX BOOT ID"), "{list}");
    let day = |ts: i64| {
        jiff::Timestamp::from_nanosecond(ts.into())
            .unwrap()
            .to_zoned(TimeZone::UTC)
            .strftime("%a %Y-%m-%d %H:%M:%S UTC")
            .to_string()
    };
    let first_of = |id: &str| s.events.iter().find(|(_, e)| e.6.contains(id)).unwrap().0;
    let last_before_b2 = s.events[2].0;
    let newest = s.events.last().unwrap().0;
    assert_eq!(
        lines[1],
        format!(" -1 {B1} {} {}", day(first_of(B1)), day(last_before_b2))
    );
    assert_eq!(
        lines[2],
        format!("  0 {B2} {} {}", day(first_of(B2)), day(newest))
    );
    let json: serde_json::Value =
        serde_json::from_str(&s.text(&["--list-boots", "-o", "json"])).unwrap();
    assert_eq!(json[1]["boot_id"], B2);
    assert_eq!(json[1]["index"], 0);
    assert_eq!(json[0]["last_entry"], last_before_b2);
}

/// `ts` as `FORMAT` in `tz`.
fn local(ts: i64, tz: &TimeZone, format: &str) -> String {
    jiff::Timestamp::from_nanosecond(ts.into())
        .unwrap()
        .to_zoned(tz.clone())
        .strftime(format)
        .to_string()
}

#[test]
fn since_and_until_read_relative_and_local_times() {
    let s = Store::new();
    let recent = s.expect(|ts, _| ts >= s.now - 10 * MINUTE);
    assert_eq!(
        recent,
        strings(&["Disk almost full", "disk check ok", "job done"])
    );
    assert_eq!(s.messages(&["--since", "10 min ago"]), recent);
    assert_eq!(s.messages(&["-S", "-10min"]), recent);
    assert_eq!(s.messages(&["--since", "10m"]), recent);
    assert_eq!(
        s.messages(&["--until", "10 min ago"]),
        s.expect(|ts, _| ts < s.now - 10 * MINUTE)
    );
    // Every event is less than a day old.
    assert_eq!(s.messages(&["--since", "yesterday"]), s.expect(|_, _| true));
    // Local time: a wall-clock time in a zone three hours east of UTC
    // means that instant only when eventctl reads it in that zone.
    let east = "XYZ-3";
    let tz = TimeZone::posix(east).unwrap();
    let (ts46, ts47) = (at(s.now, -46, 0), at(s.now, -47, 0));
    let minute = local(ts46, &tz, "%Y-%m-%d %H:%M");
    let second = local(ts47, &tz, "%Y-%m-%d %H:%M:%S");
    let from_45 = s.expect(|ts, _| ts >= s.now - 46 * MINUTE);
    let in_zone = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["-o", "cat"];
        all.extend(args);
        s.text_in(east, &all).lines().map(str::to_string).collect()
    };
    assert_eq!(in_zone(&["--since", &minute]), from_45);
    assert_eq!(in_zone(&["--since", &second]), from_45);
    assert_eq!(
        in_zone(&["--until", &minute]),
        s.expect(|ts, _| ts < s.now - 46 * MINUTE)
    );
    // Read as UTC, the same text is three hours later: nothing yet.
    assert!(s.messages(&["--since", &minute]).is_empty());
    assert!(in_zone(&["--utc", "--since", &minute]).is_empty());
    // today: from local midnight.
    let midnight = jiff::Timestamp::from_nanosecond(s.now.into())
        .unwrap()
        .to_zoned(tz.clone())
        .start_of_day()
        .unwrap()
        .timestamp()
        .as_nanosecond() as i64;
    assert_eq!(
        in_zone(&["--until", "today"]),
        s.expect(|ts, _| ts < midnight)
    );
    let e = s.refusal(&["--since", "soonish"]);
    assert!(e.contains("--since") && e.contains("soonish"), "{e}");
}

#[test]
fn output_json_is_one_object_per_line_with_fields_an_object() {
    let s = Store::new();
    let text = s.text(&["-o", "json"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), s.events.len());
    for (line, (ts, e)) in lines.iter().zip(&s.events) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["fields"].is_object(), "{line}");
        let stored: serde_json::Value = serde_json::from_str(&e.6).unwrap();
        assert_eq!(v["fields"], stored, "{line}");
        assert_eq!(v["hostname"], HOST, "{line}");
        assert_eq!(v["ts"], *ts);
        assert_eq!(v["message"], e.5.as_str());
        assert_eq!(v["provider"], e.3);
        assert_eq!(v["level"], e.2);
        assert_eq!(v["cpu"], e.1);
        for key in ["seq", "ring_epoch", "pid", "tid", "uid", "name"] {
            assert!(v.get(key).is_some(), "{key} missing: {line}");
        }
    }
    let nginx = s.text(&["-o", "json", "-u", "nginx"]);
    let v: serde_json::Value = serde_json::from_str(&nginx).unwrap();
    assert_eq!(v["fields"]["unit"], "nginx.service");
    // json-pretty: the same objects, indented.
    let pretty = s.text(&["-o", "json-pretty"]);
    let objects: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&pretty)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(objects.len(), s.events.len());
    assert!(pretty.lines().count() > 10 * s.events.len());
    for (o, line) in objects.iter().zip(&lines) {
        assert_eq!(o, &serde_json::from_str::<serde_json::Value>(line).unwrap());
    }
}

#[test]
fn short_formats_print_local_time_and_the_others_keep_theirs() {
    let s = Store::new();
    let east = "XYZ-3";
    let tz = TimeZone::posix(east).unwrap();
    let (ts, e) = s.events.iter().find(|(_, e)| e.5 == "GET /index").unwrap();
    let pid = 1000 + s.events.iter().position(|(t, _)| t == ts).unwrap();
    let line = |time: String| format!("{time} {HOST} nginx[{pid}]: GET /index\n");
    let cases = [
        ("short", "%b %d %H:%M:%S"),
        ("short-iso", "%Y-%m-%dT%H:%M:%S%:z"),
        ("short-precise", "%b %d %H:%M:%S.%6f"),
        ("short-iso-precise", "%Y-%m-%dT%H:%M:%S.%6f%:z"),
    ];
    for (output, format) in cases {
        let shown = s.text_in(east, &["-u", "nginx", "-o", output]);
        assert_eq!(shown, line(local(*ts, &tz, format)), "{output}");
        let utc = s.text_in(east, &["-u", "nginx", "-o", output, "--utc"]);
        assert_eq!(
            utc,
            line(local(*ts, &TimeZone::UTC, format)),
            "{output} --utc"
        );
    }
    // The default is short.
    assert_eq!(
        s.text_in(east, &["-u", "nginx"]),
        line(local(*ts, &tz, "%b %d %H:%M:%S"))
    );
    assert_eq!(s.text(&["-u", "nginx", "-o", "cat"]), "GET /index\n");
    let verbose = s.text_in(east, &["-u", "nginx", "-o", "verbose"]);
    assert!(
        verbose.starts_with(&local(*ts, &tz, "%a %Y-%m-%d %H:%M:%S.%6f")),
        "{verbose}"
    );
    for want in [
        format!("    hostname={HOST}"),
        "    provider=nginx".to_string(),
        "    fields.unit=nginx.service".to_string(),
        "    fields.transport=stdout".to_string(),
        format!("    level={} (info)", e.2),
    ] {
        assert!(
            verbose.lines().any(|l| l == want),
            "{want} not in {verbose}"
        );
    }
    // eventd's own text names the source of a row from its own rings (a
    // service's stdout line here) where a CPU ring's row shows `cpuN`;
    // table stays as it was.
    let text = s.text(&["-u", "nginx", "--output", "text"]);
    assert!(
        text.contains(" stdout #") && text.contains("nginx/message["),
        "{text}"
    );
    let table = s.text(&["-u", "nginx", "--output", "table"]);
    assert!(
        table.starts_with("TIME ") && table.contains("GET /index"),
        "{table}"
    );
}

/// A pseudo-terminal: (master, slave).
fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors; the name, termios and
    // window size pointers may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just made by openpty and are owned
    // here only.
    unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    }
}

/// Runs `eventctl query ARGS` with its standard output on a terminal and
/// `env` set; what reached the terminal.
fn on_terminal(s: &Store, args: &[&str], env: &[(&str, &str)]) -> String {
    let (master, slave) = pty();
    let mut cmd = s.command("UTC", args);
    cmd.stdout(slave.try_clone().unwrap())
        .stderr(Stdio::piped());
    // The tests run as root, where only less would be run (secure mode):
    // off unless a test sets it.
    cmd.env("SYSTEMD_PAGERSECURE", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(slave);
    drop(cmd);
    // Read what is there (EIO once every slave end is closed).
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let mut master = master;
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// `text` without its colour sequences (`ESC [ ... m`).
fn plain(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('\u{1b}') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        rest = rest.find('m').map_or("", |m| &rest[m + 1..]);
    }
    out + rest
}

#[test]
fn a_pager_reads_the_output_on_a_terminal_only() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let paged = |name: &str| dir.path().join(name);
    let pager = |name: &str| format!("cat > {}", paged(name).display());
    let want = s.text(&["-o", "cat"]);
    // On a terminal the output is coloured by level, through the pager
    // too (less -R shows the colours).
    let paged_text = |name: &str| plain(&std::fs::read_to_string(paged(name)).unwrap());
    // PAGER, then SYSTEMD_PAGER over it, then EVENTD_PAGER over both.
    let screen = on_terminal(&s, &["-o", "cat"], &[("PAGER", &pager("p"))]);
    assert_eq!(paged_text("p"), want);
    assert!(!screen.contains("job done"), "{screen}");
    on_terminal(
        &s,
        &["-o", "cat"],
        &[("PAGER", &pager("p2")), ("SYSTEMD_PAGER", &pager("s"))],
    );
    assert!(!paged("p2").exists());
    assert_eq!(paged_text("s"), want);
    on_terminal(
        &s,
        &["-o", "cat"],
        &[
            ("SYSTEMD_PAGER", &pager("s2")),
            ("EVENTD_PAGER", &pager("e")),
        ],
    );
    assert!(!paged("s2").exists());
    assert_eq!(paged_text("e"), want);
    // less gets LESS=FRX unless LESS is set.
    let env_pager = format!("env > {}", paged("env").display());
    on_terminal(&s, &[], &[("PAGER", &env_pager)]);
    let env = std::fs::read_to_string(paged("env")).unwrap();
    assert!(env.lines().any(|l| l == "LESS=FRX"), "{env}");
    // --no-pager, and an empty pager: straight to the terminal.
    let screen = on_terminal(&s, &["-o", "cat", "--no-pager"], &[("PAGER", &pager("n"))]);
    assert!(!paged("n").exists());
    assert!(screen.contains("job done"), "{screen}");
    let screen = on_terminal(&s, &["-o", "cat"], &[("PAGER", "")]);
    assert!(screen.contains("job done"), "{screen}");
    // Not a terminal: no pager.
    let out = s
        .command("UTC", &["-o", "cat"])
        .env("PAGER", pager("pipe"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);
    assert!(!paged("pipe").exists());
    // A pager that quits at once (as `q` in less) ends eventctl quietly.
    let screen = on_terminal(&s, &["-o", "cat"], &[("PAGER", "true")]);
    assert!(!screen.contains("job done"), "{screen}");
    // Secure mode (journalctl's, on for root unless SYSTEMD_PAGERSECURE=0):
    // a pager other than less is not run; less is, with LESSSECURE=1.
    let secure = [("SYSTEMD_PAGERSECURE", "1")];
    let screen = on_terminal(&s, &["-o", "cat"], &[secure[0], ("PAGER", &pager("sec"))]);
    assert!(!paged("sec").exists());
    assert!(screen.contains("job done"), "{screen}");
    let less = dir.path().join("less");
    std::fs::write(
        &less,
        format!(
            "#!/bin/sh\nenv > {}\ncat > /dev/null\n",
            paged("lessenv").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&less, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    on_terminal(
        &s,
        &["-o", "cat"],
        &[secure[0], ("PAGER", less.to_str().unwrap())],
    );
    let env = std::fs::read_to_string(paged("lessenv")).unwrap();
    assert!(env.lines().any(|l| l == "LESSSECURE=1"), "{env}");
}
