//! Text that comes from ClickHouse is escaped wherever eventd and
//! `eventctl` show it, as text from local producers is: rows of
//! `eventctl query --cluster` (a gap's reason too), the server's errors
//! there and in `eventctl export status`, and eventd's log. Control
//! characters (C0, DEL, C1) and bidi controls are shown as `\u{..}` in
//! text; JSON output writes C1 and bidi controls as `\uXXXX`.
//!
//! Against a real clickhouse-server 18.16 (cluster/src/lib.rs, one
//! server): rows are inserted into it directly, and a view whose rows it
//! cannot convert makes it answer with an error that quotes one of them.
//! Skipped (with the `apt-get install` line) where ClickHouse is missing,
//! unless `EVENTD_REQUIRE_CLICKHOUSE=1`.

use eventd_cluster as cluster;
mod common;

use cluster::{Cluster, Options, RowBinary};
use common::{config, emit_one, read, Eventd, EVENTCTL};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One cluster at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// An OSC title change ended by BEL, a C1 CSI, a right-to-left override,
/// a left-to-right isolate and a newline that would start a forged line.
const HOSTILE: &str = "x\u{1b}]0;owned\u{7} \u{9b}2J \u{202e}txt.exe\u{2066} \nforged line";

/// The characters of [`HOSTILE`] a terminal acts on.
const RAW: [char; 5] = ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}', '\u{2066}'];

fn cluster() -> Option<Cluster> {
    if let Err(why) = Cluster::available() {
        if std::env::var("EVENTD_REQUIRE_CLICKHOUSE").is_ok_and(|v| v == "1") {
            panic!("EVENTD_REQUIRE_CLICKHOUSE=1 but {why}");
        }
        eprintln!("skipped: {why}");
        return None;
    }
    Some(Cluster::start(1, 1, Options::default()))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn init(c: &Cluster, db: &str) {
    let out = Command::new(EVENTCTL)
        .args(["export", "init", "--url", &c.url(1, 1), "--database", db])
        .args(["--cluster", c.name()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

fn fleet_query(c: &Cluster, db: &str, output: &str) -> Output {
    Command::new(EVENTCTL)
        .args(["query", "--cluster", &c.url(1, 1), "--database", db])
        .args(["--output", output])
        .output()
        .unwrap()
}

fn assert_no_raw(what: &str, text: &str) {
    assert!(!text.contains(RAW), "{what} holds raw controls: {text:?}");
}

#[test]
fn rows_from_the_fleet_are_escaped_in_every_output() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = cluster() else {
        return;
    };
    init(&c, "eventd");
    let url = c.url(1, 1);
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let mut event = RowBinary::new();
    event
        .string("fleet-h")
        .string("src")
        .u64(1)
        .i64(ts)
        .u32(0)
        .u64(1)
        .i64(1);
    event.u32(1).u32(1).u32(0).u8(3);
    event
        .string(HOSTILE)
        .string(HOSTILE)
        .string(HOSTILE)
        .string("");
    c.insert(
        &url,
        "INSERT INTO eventd.events_local (host, source, source_id, ts, cpu, seq, ring_epoch, \
         pid, tid, uid, level, provider, name, message, fields) FORMAT RowBinary",
        &event.into_bytes(),
    )
    .unwrap();
    let mut gap = RowBinary::new();
    gap.string("fleet-h").string("src").u64(1).i64(1).u32(0);
    gap.u64(2).u64(3).u64(2).string(HOSTILE).i64(0).i64(ts);
    c.insert(
        &url,
        "INSERT INTO eventd.gaps_local (host, source, source_id, ring_epoch, cpu, from_seq, \
         to_seq, lost, reason, ts_before, detected_at) FORMAT RowBinary",
        &gap.into_bytes(),
    )
    .unwrap();

    // Text and table: one line per row, whatever newlines the row holds.
    for (output, lines) in [("text", 2), ("table", 3)] {
        let out = fleet_query(&c, "eventd", output);
        assert!(out.status.success(), "{}", text(&out));
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_no_raw(output, &stdout);
        assert_eq!(stdout.lines().count(), lines, "{output}: {stdout}");
        // The event's provider, name and message, and the gap's reason.
        let shown = stdout
            .matches(r"x\u{1b}]0;owned\u{7} \u{9b}2J \u{202e}txt.exe\u{2066} \u{a}forged line");
        assert_eq!(shown.count(), 4, "{output}: {stdout}");
    }
    // JSON: the same strings read back, no raw control in the text.
    let out = fleet_query(&c, "eventd", "json");
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_no_raw("json", &stdout);
    assert!(
        stdout.contains(r"\u009b") && stdout.contains(r"\u202e"),
        "{stdout}"
    );
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert_eq!(rows[0]["message"], HOSTILE);
    assert_eq!(rows[0]["provider"], HOSTILE);
    assert_eq!(rows[1]["gap"]["reason"], HOSTILE);
}

/// Makes `db.events_local` a view whose reads fail: the server cannot
/// convert a value to a number, and its error quotes the value.
fn break_events_local(c: &Cluster, db: &str) {
    let url = c.url(1, 1);
    c.query(
        &url,
        &format!("CREATE TABLE {db}.bad (s String) ENGINE = Memory"),
    );
    c.query(
        &url,
        &format!("CREATE TABLE {db}.kept AS {db}.events_local ENGINE = Memory"),
    );
    c.query(&url, &format!("DROP TABLE {db}.events_local"));
    c.query(
        &url,
        &format!(
            "CREATE VIEW {db}.events_local AS SELECT * FROM {db}.kept \
             WHERE toUInt64(concat('1', (SELECT any(s) FROM {db}.bad))) > 0"
        ),
    );
    let mut bad = RowBinary::new();
    bad.string(HOSTILE);
    c.insert(
        &url,
        &format!("INSERT INTO {db}.bad FORMAT RowBinary"),
        &bad.into_bytes(),
    )
    .unwrap();
}

#[test]
fn errors_from_the_fleet_are_escaped_in_eventctl_the_status_and_the_log() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = cluster() else {
        return;
    };
    init(&c, "evil");
    break_events_local(&c, "evil");

    // eventctl query --cluster: the server's error, escaped, on one line.
    for output in ["text", "json"] {
        let out = fleet_query(&c, "evil", output);
        let said = text(&out);
        assert!(!out.status.success(), "{said}");
        assert!(said.contains("Cannot parse string"), "{said}");
        assert!(said.contains(r"x\u{1b}]0;owned"), "{said}");
        assert_no_raw("eventctl query --cluster", &said);
        assert_eq!(said.trim_end().lines().count(), 1, "{said}");
    }

    // eventd exporting there: the same error in its status and its log.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &format!(
            "HostName = \"text-host\"\nExportUrl = \"{}/\"\nExportDatabase = \"evil\"\n\
             StorageShards = 1\nRingBytes = 65536\nSyslogSocket = \"\"\n\
             SyslogStreamSocket = \"\"\n",
            c.url(1, 1)
        ),
    );
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, Some(&cfg));
    emit_one(&data, "one event");
    let status = |args: &[&str]| {
        let out = Command::new(EVENTCTL)
            .arg("--data-dir")
            .arg(&data)
            .args(["export", "status"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let json = loop {
        let json = status(&["--output", "json"]);
        if json.contains("Cannot parse string") {
            break json;
        }
        assert!(
            Instant::now() < deadline,
            "no error from the view: {json}\n{}",
            read(&eventd.log)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_no_raw("export status --output json", &json);
    serde_json::from_str::<serde_json::Value>(&json).unwrap();
    let table = status(&[]);
    assert_no_raw("export status", &table);
    let error_lines: Vec<&str> = table.lines().filter(|l| l.contains("last error")).collect();
    assert_eq!(error_lines.len(), 1, "{table}");
    assert!(error_lines[0].contains(r"x\u{1b}]0;owned"), "{table}");
    let log_path = eventd.log.clone();
    eventd.stop();
    let log = read(&log_path);
    assert!(log.contains("Cannot parse string"), "{log}");
    assert_no_raw("eventd's log", &log);
}
