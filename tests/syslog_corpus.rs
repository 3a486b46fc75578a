//! The shapes of syslog messages real senders write
//! (`tests/syslog_shapes`), checked field by field: by the parser alone, and
//! stored by a real daemon from its datagram socket and from its stream
//! socket in both framings (octet-counted and one per line).
#![cfg(not(loom))]

mod common;
mod syslog_shapes;

use common::*;
use std::io::Write;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use syslog_shapes::{instant_ns, parse_mismatches, sd_json, Shape, SHAPES};

/// The lines with what went wrong in each, for an assertion message.
fn report(wrong: &[(String, Vec<String>)]) -> String {
    let mut text = format!("{} of {} shapes wrong\n", wrong.len(), SHAPES.len());
    for (line, fields) in wrong {
        text += &format!("{line}\n    {}\n", fields.join("\n    "));
    }
    text
}

#[test]
fn the_parser_reads_every_shape_field_by_field() {
    let wrong: Vec<(String, Vec<String>)> = SHAPES
        .iter()
        .map(|s| {
            let parsed = eventd::syslog::parse::parse(s.line.as_bytes());
            (
                format!("{} | {}", s.class, s.line),
                parse_mismatches(s, &parsed),
            )
        })
        .filter(|(_, w)| !w.is_empty())
        .collect();
    assert!(wrong.is_empty(), "{}", report(&wrong));
}

/// One stored event: the columns and the fields object.
struct Stored {
    ts: i64,
    level: i64,
    provider: String,
    name: String,
    message: String,
    fields: serde_json::Value,
}

/// Every stored event, in the order eventd's syslog ring took them.
fn stored(data: &Path) -> Vec<Stored> {
    let mut all: Vec<(i64, Stored)> = Vec::new();
    for (_, c) in shards(data) {
        let mut stmt = c
            .prepare(&format!(
                "SELECT seq, ts, level, provider, name, message, fields FROM events \
                 WHERE {NOT_BOOT_MARKER}"
            ))
            .unwrap();
        let rows = stmt
            .query_map([], |r| {
                let fields: String = r.get(6)?;
                Ok((
                    r.get(0)?,
                    Stored {
                        ts: r.get(1)?,
                        level: r.get(2)?,
                        provider: r.get(3)?,
                        name: r.get(4)?,
                        message: r.get(5)?,
                        fields: serde_json::from_str(&fields).unwrap(),
                    },
                ))
            })
            .unwrap();
        all.extend(rows.map(|r| r.unwrap()));
    }
    all.sort_by_key(|(seq, _)| *seq);
    all.into_iter().map(|(_, s)| s).collect()
}

/// How `got` differs from what `shape` says eventd stores.
fn stored_mismatches(shape: &Shape, got: &Stored, transport: &str) -> Vec<String> {
    let f = &got.fields;
    let text = |v: Option<&str>| v.map_or(serde_json::Value::Null, serde_json::Value::from);
    let name = shape.msgid.unwrap_or(shape.facility);
    let instant = shape.instant.map(instant_ns);
    let checks: [(&str, serde_json::Value, serde_json::Value); 14] = [
        ("format", f["format"].clone(), shape.format.into()),
        ("facility", f["facility"].clone(), shape.facility.into()),
        ("level", got.level.into(), shape.level.into()),
        ("timestamp", f["timestamp"].clone(), text(shape.timestamp)),
        ("timestamp_ns", f["timestamp_ns"].clone(), instant.into()),
        ("hostname", f["hostname"].clone(), text(shape.hostname)),
        (
            "provider",
            got.provider.as_str().into(),
            shape.provider.into(),
        ),
        ("procid", f["procid"].clone(), text(shape.procid)),
        ("msgid", f["msgid"].clone(), text(shape.msgid)),
        ("name", got.name.as_str().into(), name.into()),
        ("sd", f["sd"].clone(), sd_json(shape.sd)),
        ("message", got.message.as_str().into(), shape.message.into()),
        ("problems", f["problems"].clone(), serde_json::Value::Null),
        ("transport", f["transport"].clone(), transport.into()),
    ];
    checks
        .into_iter()
        .filter(|(_, got, want)| got != want)
        .map(|(field, got, want)| format!("{field}: got {got}, want {want}"))
        .collect()
}

/// Sends every shape one way, waits until all are stored (`before` were
/// already), and checks what was stored for each.
fn send_and_check(
    data: &Path,
    how: &str,
    before: usize,
    send: impl FnOnce(&[Shape]),
) -> Vec<(String, Vec<String>)> {
    let sending = wall_clock_ns();
    send(SHAPES);
    wait_for_events(data, (before + SHAPES.len()) as u64);
    let checking = wall_clock_ns();
    let all = stored(data);
    assert_eq!(all.len(), before + SHAPES.len(), "{how}: stored once each");
    let transport = if how == "datagram" { "dgram" } else { "stream" };
    SHAPES
        .iter()
        .zip(&all[before..])
        .map(|(shape, got)| {
            let mut wrong = stored_mismatches(shape, got, transport);
            // `ts` is when eventd received the message, whatever it claims.
            if !(sending..=checking).contains(&got.ts) {
                wrong.push(format!(
                    "ts: {} is not between sending ({sending}) and the check ({checking})",
                    got.ts
                ));
            }
            (format!("{how} | {} | {}", shape.class, shape.line), wrong)
        })
        .filter(|(_, w)| !w.is_empty())
        .collect()
}

/// The wall clock, as eventd stamps events (ns since the Unix epoch).
fn wall_clock_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(d.as_nanos()).unwrap()
}

#[test]
fn every_shape_is_stored_field_by_field_from_both_sockets_and_framings() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let eventd = Eventd::start(&data, None);
    let datagrams = data.join("run/syslog.sock");
    let streams = data.join("run/syslog-stream.sock");
    let n = SHAPES.len();
    let mut wrong = send_and_check(&data, "datagram", 0, |shapes| {
        let s = UnixDatagram::unbound().unwrap();
        for shape in shapes {
            s.send_to(shape.line.as_bytes(), &datagrams).unwrap();
        }
    });
    wrong.extend(send_and_check(&data, "octet-counted", n, |shapes| {
        let mut s = UnixStream::connect(&streams).unwrap();
        for shape in shapes {
            write!(s, "{} {}", shape.line.len(), shape.line).unwrap();
        }
    }));
    wrong.extend(send_and_check(&data, "newline", 2 * n, |shapes| {
        let mut s = UnixStream::connect(&streams).unwrap();
        for shape in shapes {
            writeln!(s, "{}", shape.line).unwrap();
        }
    }));
    assert!(wrong.is_empty(), "{}", report(&wrong));

    // Messages stored as plain text are counted.
    let stats = &eventctl_json(&data, "stats")["stats"]["syslog"];
    let unstructured = SHAPES.iter().filter(|s| s.format == "unstructured").count();
    assert_eq!(stats["unstructured"], 3 * unstructured as u64, "{stats}");
    assert_eq!(stats["malformed"], 0, "{stats}");

    // The queries operators run find them by program and by host.
    let found = eventctl_text(
        &data,
        &[
            "query",
            "--provider",
            "openvpn",
            "--field",
            "hostname=edge-1",
            "--output",
            "json",
        ],
    );
    assert_eq!(found.lines().count(), 3, "{found}");
    let found = eventctl_text(
        &data,
        &[
            "query",
            "--field",
            "hostname=2001:db8::17",
            "--output",
            "json",
        ],
    );
    assert_eq!(found.lines().count(), 3, "{found}");
    eventd.stop();
}
