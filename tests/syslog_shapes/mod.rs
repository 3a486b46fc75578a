//! Shapes of syslog messages real senders write, each with what eventd must
//! store for it. The corpus of `tests/syslog_corpus.rs` (through a daemon's
//! sockets) and `benches/syslog_parse.rs` (the parser alone).
//!
//! The lines are written for eventd after RFC 3164, RFC 5424 and the
//! formats rsyslog's `pmrfc3164` and syslog-ng's `syslog-format` document;
//! host names, programs and texts are made up. `class` names the shape as
//! docs/guide/syslog.md lists them.
#![allow(dead_code)] // each user takes what it needs

use eventd::syslog::parse::{facility_name, Parsed};

/// One message and the fields eventd stores for it.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub class: &'static str,
    pub line: &'static str,
    /// `fields.format`.
    pub format: &'static str,
    /// `fields.facility`.
    pub facility: &'static str,
    /// The `level` column (the severity).
    pub level: u8,
    /// `fields.timestamp`: the timestamp as written.
    pub timestamp: Option<&'static str>,
    /// `fields.timestamp_ns` as RFC 3339 in UTC: the instant the timestamp
    /// names, when it names its offset.
    pub instant: Option<&'static str>,
    pub hostname: Option<&'static str>,
    /// The `provider` column: APP-NAME or tag, else `syslog`.
    pub provider: &'static str,
    /// `fields.procid`: the pid the message claims.
    pub procid: Option<&'static str>,
    /// `fields.msgid`, also the `name` column (else the facility's name).
    pub msgid: Option<&'static str>,
    /// `fields.sd` as JSON, or "" for none.
    pub sd: &'static str,
    /// The `message` column.
    pub message: &'static str,
}

const BSD: Shape = Shape {
    class: "",
    line: "",
    format: "rfc3164",
    facility: "user",
    level: 5,
    timestamp: None,
    instant: None,
    hostname: None,
    provider: "syslog",
    procid: None,
    msgid: None,
    sd: "",
    message: "",
};

const UNSTRUCTURED: Shape = Shape {
    format: "unstructured",
    ..BSD
};

const RFC5424: Shape = Shape {
    format: "rfc5424",
    ..BSD
};

pub const SHAPES: &[Shape] = &[
    // An RFC 3339 timestamp in a BSD header (rsyslog's forwarding
    // templates, syslog-ng's ISO dates).
    Shape {
        class: "rfc3339 in a BSD header",
        line: "<7>2025-03-14T09:26:53.589+02:00 edge-1 openvpn[2210]: TLS handshake done",
        facility: "kern",
        level: 7,
        timestamp: Some("2025-03-14T09:26:53.589+02:00"),
        instant: Some("2025-03-14T07:26:53.589Z"),
        hostname: Some("edge-1"),
        provider: "openvpn",
        procid: Some("2210"),
        message: "TLS handshake done",
        ..BSD
    },
    Shape {
        class: "rfc3339 in a BSD header",
        line: "<30>2025-03-14T09:26:53Z web-03.example.net nginx: worker 4 started",
        facility: "daemon",
        level: 6,
        timestamp: Some("2025-03-14T09:26:53Z"),
        instant: Some("2025-03-14T09:26:53Z"),
        hostname: Some("web-03.example.net"),
        provider: "nginx",
        message: "worker 4 started",
        ..BSD
    },
    Shape {
        class: "rfc3339 in a BSD header",
        line: "<134>2025-12-31T23:59:59.123456-05:00 10.1.2.3 haproxy[77]: backend app/web1 is UP",
        facility: "local0",
        level: 6,
        timestamp: Some("2025-12-31T23:59:59.123456-05:00"),
        instant: Some("2026-01-01T04:59:59.123456Z"),
        hostname: Some("10.1.2.3"),
        provider: "haproxy",
        procid: Some("77"),
        message: "backend app/web1 is UP",
        ..BSD
    },
    Shape {
        class: "rfc3339 in a BSD header",
        line: "<14>2025-03-14 09:26:53+01:00 db1 postgres[901]: checkpoint complete",
        level: 6,
        timestamp: Some("2025-03-14 09:26:53+01:00"),
        instant: Some("2025-03-14T08:26:53Z"),
        hostname: Some("db1"),
        provider: "postgres",
        procid: Some("901"),
        message: "checkpoint complete",
        ..BSD
    },
    Shape {
        class: "rfc3339 in a BSD header",
        line: "<78>2025-03-14T09:26:53.250 db1 CRON[12]: (root) CMD (run-parts /etc/cron.hourly)",
        facility: "cron",
        level: 6,
        timestamp: Some("2025-03-14T09:26:53.250"),
        hostname: Some("db1"),
        provider: "CRON",
        procid: Some("12"),
        message: "(root) CMD (run-parts /etc/cron.hourly)",
        ..BSD
    },
    Shape {
        class: "rfc3339 in a BSD header",
        line: "<13>2025-03-14T09:26:53+00:00 backup: nightly run finished",
        timestamp: Some("2025-03-14T09:26:53+00:00"),
        instant: Some("2025-03-14T09:26:53Z"),
        provider: "backup",
        message: "nightly run finished",
        ..BSD
    },
    Shape {
        class: "rfc3339 in a BSD header",
        line: "<86>2025-03-14T09:26:53.000812+01:00 bastion sshd[4410]: Accepted publickey for \
               deploy from 192.0.2.7 port 52144 ssh2",
        facility: "authpriv",
        level: 6,
        timestamp: Some("2025-03-14T09:26:53.000812+01:00"),
        instant: Some("2025-03-14T08:26:53.000812Z"),
        hostname: Some("bastion"),
        provider: "sshd",
        procid: Some("4410"),
        message: "Accepted publickey for deploy from 192.0.2.7 port 52144 ssh2",
        ..BSD
    },
    Shape {
        class: "rfc3339 in a BSD header",
        line: "<165>2024-02-29t12:00:00.1234567891z relay sensor[3]: reading 17",
        facility: "local4",
        level: 5,
        timestamp: Some("2024-02-29t12:00:00.1234567891z"),
        instant: Some("2024-02-29T12:00:00.123456789Z"),
        hostname: Some("relay"),
        provider: "sensor",
        procid: Some("3"),
        message: "reading 17",
        ..BSD
    },
    // A hostname, whatever follows it.
    Shape {
        class: "hostname without a colon after the next word",
        line: "<14>Aug 30 23:00:05 X4711",
        level: 6,
        timestamp: Some("Aug 30 23:00:05"),
        hostname: Some("X4711"),
        ..BSD
    },
    Shape {
        class: "hostname without a colon after the next word",
        line: "<14>Aug 30 23:00:06 X4711 ",
        level: 6,
        timestamp: Some("Aug 30 23:00:06"),
        hostname: Some("X4711"),
        ..BSD
    },
    Shape {
        class: "hostname without a colon after the next word",
        line: "<13>Jun  2 08:15:00 fw01 Link down on port 3",
        timestamp: Some("Jun  2 08:15:00"),
        hostname: Some("fw01"),
        provider: "Link",
        message: "down on port 3",
        ..BSD
    },
    Shape {
        class: "hostname without a colon after the next word",
        line: "<13>Jun  2 08:15:01 gw-2 -- MARK --",
        timestamp: Some("Jun  2 08:15:01"),
        hostname: Some("gw-2"),
        provider: "--",
        message: "MARK --",
        ..BSD
    },
    Shape {
        class: "hostname without a colon after the next word",
        line: "<13>Jun  2 08:15:02 nas01 smartd",
        timestamp: Some("Jun  2 08:15:02"),
        hostname: Some("nas01"),
        provider: "smartd",
        ..BSD
    },
    Shape {
        class: "hostname without a colon after the next word",
        line: "<189>Jun  2 08:15:07 %SYS-5-CONFIG_I Configured from console by vty0",
        facility: "local7",
        timestamp: Some("Jun  2 08:15:07"),
        provider: "%SYS-5-CONFIG_I",
        message: "Configured from console by vty0",
        ..BSD
    },
    Shape {
        class: "hostname and tag",
        line: "<165>Jun  2 08:15:03 edge3.example.com app[12]: ok",
        facility: "local4",
        timestamp: Some("Jun  2 08:15:03"),
        hostname: Some("edge3.example.com"),
        provider: "app",
        procid: Some("12"),
        message: "ok",
        ..BSD
    },
    Shape {
        class: "hostname and tag",
        line: "<13>Jun  2 08:15:04 fw01  dnsmasq: cache size 150",
        timestamp: Some("Jun  2 08:15:04"),
        hostname: Some("fw01"),
        provider: "dnsmasq",
        message: "cache size 150",
        ..BSD
    },
    Shape {
        class: "hostname and tag",
        line: "<38>Jun  2 08:15:05 bastion sshd(pam_unix)[12750]: session opened for user ops",
        facility: "auth",
        level: 6,
        timestamp: Some("Jun  2 08:15:05"),
        hostname: Some("bastion"),
        provider: "sshd(pam_unix)",
        procid: Some("12750"),
        message: "session opened for user ops",
        ..BSD
    },
    Shape {
        class: "hostname and tag",
        line: "<13>Jun  2 08:15:06 relay ctld/snmpd[2499]: trap sent to 192.0.2.9:162",
        timestamp: Some("Jun  2 08:15:06"),
        hostname: Some("relay"),
        provider: "ctld/snmpd",
        procid: Some("2499"),
        message: "trap sent to 192.0.2.9:162",
        ..BSD
    },
    // What glibc's syslog(3), logger and journald write to /dev/log: no
    // hostname.
    Shape {
        class: "local, no hostname",
        line: "<13>Dec  4 10:00:00 myprog[123]: text",
        timestamp: Some("Dec  4 10:00:00"),
        provider: "myprog",
        procid: Some("123"),
        message: "text",
        ..BSD
    },
    Shape {
        class: "local, no hostname",
        line: "<11>Dec  4 10:00:01 backup: nightly backup failed",
        level: 3,
        timestamp: Some("Dec  4 10:00:01"),
        provider: "backup",
        message: "nightly backup failed",
        ..BSD
    },
    Shape {
        class: "local, no hostname",
        line: "<30>Dec  4 10:00:02 systemd[1]: Started Daily apt upgrade.",
        facility: "daemon",
        level: 6,
        timestamp: Some("Dec  4 10:00:02"),
        provider: "systemd",
        procid: Some("1"),
        message: "Started Daily apt upgrade.",
        ..BSD
    },
    Shape {
        class: "local, no hostname",
        line: "<13>Dec  4 10:00:03 cafe: beans ground",
        timestamp: Some("Dec  4 10:00:03"),
        provider: "cafe",
        message: "beans ground",
        ..BSD
    },
    Shape {
        class: "local, no hostname",
        line: "<13>Dec  4 10:00:04 ctld/snmpd[2499]: trap sent",
        timestamp: Some("Dec  4 10:00:04"),
        provider: "ctld/snmpd",
        procid: Some("2499"),
        message: "trap sent",
        ..BSD
    },
    Shape {
        class: "local, no hostname",
        line: "<14>cron[77]: job done",
        level: 6,
        provider: "cron",
        procid: Some("77"),
        message: "job done",
        ..BSD
    },
    Shape {
        class: "local, no hostname",
        line: "<13>error: disk full",
        provider: "error",
        message: "disk full",
        ..BSD
    },
    // IPv6 addresses as hostnames.
    Shape {
        class: "IPv6 hostname",
        line: "<13>Jun  2 08:16:00 2001:db8::17 prg0: listening",
        timestamp: Some("Jun  2 08:16:00"),
        hostname: Some("2001:db8::17"),
        provider: "prg0",
        message: "listening",
        ..BSD
    },
    Shape {
        class: "IPv6 hostname",
        line: "<29>Jun  2 08:16:01 fe80::1ff:fe23:4567:890a ntpd[42]: clock synchronized",
        facility: "daemon",
        level: 5,
        timestamp: Some("Jun  2 08:16:01"),
        hostname: Some("fe80::1ff:fe23:4567:890a"),
        provider: "ntpd",
        procid: Some("42"),
        message: "clock synchronized",
        ..BSD
    },
    Shape {
        class: "IPv6 hostname",
        line: "<13>Jun  2 08:16:02 ::1 app: local only",
        timestamp: Some("Jun  2 08:16:02"),
        hostname: Some("::1"),
        provider: "app",
        message: "local only",
        ..BSD
    },
    Shape {
        class: "IPv6 hostname",
        line: "<13>Jun  2 08:16:03 fd00:: vpn: tunnel up",
        timestamp: Some("Jun  2 08:16:03"),
        hostname: Some("fd00::"),
        provider: "vpn",
        message: "tunnel up",
        ..BSD
    },
    // Spaces between <PRI> and the header.
    Shape {
        class: "space after <PRI>",
        line: "<15> dhclient[880]: bound to 10.0.0.5 -- renewal in 1800 seconds",
        level: 7,
        provider: "dhclient",
        procid: Some("880"),
        message: "bound to 10.0.0.5 -- renewal in 1800 seconds",
        ..BSD
    },
    Shape {
        class: "space after <PRI>",
        line: "<165> Mar  7 19:06:53 switch-4 stpd: port 12 blocking",
        facility: "local4",
        timestamp: Some("Mar  7 19:06:53"),
        hostname: Some("switch-4"),
        provider: "stpd",
        message: "port 12 blocking",
        ..BSD
    },
    // Years, months in other cases, fractions.
    Shape {
        class: "year in the timestamp",
        line: "<190>Apr 15 2007 21:28:13: %ASA-6-302014: Teardown TCP connection 17 for \
               outside:198.51.100.4/443 to inside:10.0.0.8/51234",
        facility: "local7",
        level: 6,
        timestamp: Some("Apr 15 2007 21:28:13"),
        provider: "%ASA-6-302014",
        message: "Teardown TCP connection 17 for outside:198.51.100.4/443 to inside:10.0.0.8/51234",
        ..BSD
    },
    Shape {
        class: "year in the timestamp",
        line: "<189>Apr 15 2007 21:28:14 core-sw %LINK-3-UPDOWN: Interface Gi0/1, changed state \
               to down",
        facility: "local7",
        timestamp: Some("Apr 15 2007 21:28:14"),
        hostname: Some("core-sw"),
        provider: "%LINK-3-UPDOWN",
        message: "Interface Gi0/1, changed state to down",
        ..BSD
    },
    Shape {
        class: "year in the timestamp",
        line: "<6>AUG 10 22:18:24 2021  fw-edge [audit] user=admin action=login",
        facility: "kern",
        level: 6,
        timestamp: Some("AUG 10 22:18:24 2021"),
        hostname: Some("fw-edge"),
        message: "[audit] user=admin action=login",
        ..BSD
    },
    Shape {
        class: "year in the timestamp",
        line: "<13>2024 Mar  7 19:06:53 sw1 raslogd: port fault",
        timestamp: Some("2024 Mar  7 19:06:53"),
        hostname: Some("sw1"),
        provider: "raslogd",
        message: "port fault",
        ..BSD
    },
    Shape {
        class: "year in the timestamp",
        line: "<22>Mar 7 2008 19:06:53 mailhub postfix/smtpd[3310]: connect from \
               unknown[192.0.2.55]",
        facility: "mail",
        level: 6,
        timestamp: Some("Mar 7 2008 19:06:53"),
        hostname: Some("mailhub"),
        provider: "postfix/smtpd",
        procid: Some("3310"),
        message: "connect from unknown[192.0.2.55]",
        ..BSD
    },
    Shape {
        class: "clock-sync mark",
        line: "<189>*Mar  1 18:48:50.483: %SYS-5-CONFIG_I: Configured from console by vty0",
        facility: "local7",
        timestamp: Some("*Mar  1 18:48:50.483"),
        provider: "%SYS-5-CONFIG_I",
        message: "Configured from console by vty0",
        ..BSD
    },
    Shape {
        class: "month in other cases",
        line: "<134>NOV 22 00:00:33 192.168.33.8-1 SWLOG[4411]: port 7 link up",
        facility: "local0",
        level: 6,
        timestamp: Some("NOV 22 00:00:33"),
        hostname: Some("192.168.33.8-1"),
        provider: "SWLOG",
        procid: Some("4411"),
        message: "port 7 link up",
        ..BSD
    },
    Shape {
        class: "month in other cases",
        line: "<13>dec  4 10:00:00 host7 app: lower-case month",
        timestamp: Some("dec  4 10:00:00"),
        hostname: Some("host7"),
        provider: "app",
        message: "lower-case month",
        ..BSD
    },
    Shape {
        class: "fraction of a second",
        line: "<13>Aug 29 02:00:00.156 host8 app: fractional seconds",
        timestamp: Some("Aug 29 02:00:00.156"),
        hostname: Some("host8"),
        provider: "app",
        message: "fractional seconds",
        ..BSD
    },
    // Unpadded days, a colon after the timestamp, nothing after it.
    Shape {
        class: "unpadded day, colon, end",
        line: "<167>Mar 7 19:06:53: relay2 queue: flushed 12 messages",
        facility: "local4",
        level: 7,
        timestamp: Some("Mar 7 19:06:53"),
        hostname: Some("relay2"),
        provider: "queue",
        message: "flushed 12 messages",
        ..BSD
    },
    Shape {
        class: "unpadded day, colon, end",
        line: "<34>Oct 1 22:14:15 mymachine su: 'su root' failed for ops on /dev/pts/8",
        facility: "auth",
        level: 2,
        timestamp: Some("Oct 1 22:14:15"),
        hostname: Some("mymachine"),
        provider: "su",
        message: "'su root' failed for ops on /dev/pts/8",
        ..BSD
    },
    Shape {
        class: "unpadded day, colon, end",
        line: "<14>Aug 30 23:00:07",
        level: 6,
        timestamp: Some("Aug 30 23:00:07"),
        ..BSD
    },
    Shape {
        class: "unpadded day, colon, end",
        line: "<14>2010-08-30T23:00:05Z",
        level: 6,
        timestamp: Some("2010-08-30T23:00:05Z"),
        instant: Some("2010-08-30T23:00:05Z"),
        ..BSD
    },
    // Neither format: stored whole.
    Shape {
        class: "unstructured",
        line: "<13>hello world, no header here",
        message: "hello world, no header here",
        ..UNSTRUCTURED
    },
    Shape {
        class: "unstructured",
        line: "<13>{\"event\":\"login\",\"user\":\"ops\"}",
        message: "{\"event\":\"login\",\"user\":\"ops\"}",
        ..UNSTRUCTURED
    },
    Shape {
        class: "unstructured",
        line: "<12>[2025-03-14 09:26:53] worker crashed",
        level: 4,
        message: "[2025-03-14 09:26:53] worker crashed",
        ..UNSTRUCTURED
    },
    Shape {
        class: "unstructured",
        line: "<13>Aug 32 10:00:00 host app: no such day",
        message: "Aug 32 10:00:00 host app: no such day",
        ..UNSTRUCTURED
    },
    // RFC 5424.
    Shape {
        class: "rfc5424",
        line: "<34>1 2025-03-14T22:14:15.003Z relay.example.com su - ID47 - 'su root' failed \
               for ops on /dev/pts/8",
        facility: "auth",
        level: 2,
        timestamp: Some("2025-03-14T22:14:15.003Z"),
        instant: Some("2025-03-14T22:14:15.003Z"),
        hostname: Some("relay.example.com"),
        provider: "su",
        msgid: Some("ID47"),
        message: "'su root' failed for ops on /dev/pts/8",
        ..RFC5424
    },
    Shape {
        class: "rfc5424",
        line: "<165>1 2025-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - - %% It's time \
               to make the do-nuts.",
        facility: "local4",
        level: 5,
        timestamp: Some("2025-08-24T05:14:15.000003-07:00"),
        instant: Some("2025-08-24T12:14:15.000003Z"),
        hostname: Some("192.0.2.1"),
        provider: "myproc",
        procid: Some("8710"),
        message: "%% It's time to make the do-nuts.",
        ..RFC5424
    },
    Shape {
        class: "rfc5424",
        line: "<165>1 2025-10-11T22:14:15.003Z host9.example.com evntslog - ID47 \
               [exampleSDID@32473 iut=\"3\" eventSource=\"Application\" eventID=\"1011\"]\
               [examplePriority@32473 class=\"high\"] An application event",
        facility: "local4",
        level: 5,
        timestamp: Some("2025-10-11T22:14:15.003Z"),
        instant: Some("2025-10-11T22:14:15.003Z"),
        hostname: Some("host9.example.com"),
        provider: "evntslog",
        msgid: Some("ID47"),
        sd: r#"{"exampleSDID@32473": {"iut": "3", "eventSource": "Application",
                "eventID": "1011"}, "examplePriority@32473": {"class": "high"}}"#,
        message: "An application event",
        ..RFC5424
    },
    Shape {
        class: "rfc5424",
        line: "<14>1 2025-03-14T09:26:53+01:00 web01 app 12 REQ [req@1 path=\"/a\\\"b\"] \
               \u{FEFF}body after a BOM",
        level: 6,
        timestamp: Some("2025-03-14T09:26:53+01:00"),
        instant: Some("2025-03-14T08:26:53Z"),
        hostname: Some("web01"),
        provider: "app",
        procid: Some("12"),
        msgid: Some("REQ"),
        sd: r#"{"req@1": {"path": "/a\"b"}}"#,
        message: "body after a BOM",
        ..RFC5424
    },
    Shape {
        class: "rfc5424",
        line: "<14>1 - - - - - -",
        level: 6,
        ..RFC5424
    },
];

/// `text` (RFC 3339) as nanoseconds since the Unix epoch.
pub fn instant_ns(text: &str) -> i64 {
    let t = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(d.as_nanos()).unwrap()
}

/// `sd` as a JSON value (`Null` for "").
pub fn sd_json(sd: &str) -> serde_json::Value {
    if sd.is_empty() {
        return serde_json::Value::Null;
    }
    serde_json::from_str(sd).unwrap_or_else(|e| panic!("{sd}: {e}"))
}

/// Structured data as eventd stores it: `{"id": {"name": "value"}}`.
fn parsed_sd(parsed: &Parsed<'_>) -> serde_json::Value {
    if parsed.structured_data.is_empty() {
        return serde_json::Value::Null;
    }
    let mut map = serde_json::Map::new();
    for element in &parsed.structured_data {
        let params = element
            .params
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(v.as_str())))
            .collect();
        map.insert(element.id.to_string(), serde_json::Value::Object(params));
    }
    serde_json::Value::Object(map)
}

/// What the parser made of `shape.line` that differs from what the shape
/// says, one line per field (empty when all agree).
pub fn parse_mismatches(shape: &Shape, parsed: &Parsed<'_>) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut check = |field: &str, got: String, want: String| {
        if got != want {
            wrong.push(format!("{field}: got {got}, want {want}"));
        }
    };
    check("format", parsed.format.name().into(), shape.format.into());
    check(
        "facility",
        facility_name(parsed.facility).into(),
        shape.facility.into(),
    );
    check(
        "level",
        parsed.severity.to_string(),
        shape.level.to_string(),
    );
    check(
        "timestamp",
        format!("{:?}", parsed.timestamp.as_deref()),
        format!("{:?}", shape.timestamp),
    );
    check(
        "timestamp_ns",
        format!("{:?}", parsed.timestamp_ns),
        format!("{:?}", shape.instant.map(instant_ns)),
    );
    check(
        "hostname",
        format!("{:?}", parsed.hostname.as_deref()),
        format!("{:?}", shape.hostname),
    );
    check(
        "provider",
        parsed.app_name.as_deref().unwrap_or("syslog").into(),
        shape.provider.into(),
    );
    check(
        "procid",
        format!("{:?}", parsed.procid.as_deref()),
        format!("{:?}", shape.procid),
    );
    check(
        "msgid",
        format!("{:?}", parsed.msgid.as_deref()),
        format!("{:?}", shape.msgid),
    );
    let (got_sd, want_sd) = (parsed_sd(parsed), sd_json(shape.sd));
    if got_sd != want_sd {
        check("sd", got_sd.to_string(), want_sd.to_string());
    }
    check(
        "message",
        format!("{:?}", parsed.message),
        format!("{:?}", shape.message),
    );
    check("problems", format!("{:?}", parsed.problems), "[]".into());
    wrong
}
