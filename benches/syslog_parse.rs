//! The syslog parser's cost (`eventd::syslog::parse::parse`, nothing else):
//! over every message shape of `tests/syslog_shapes` (the corpus), and
//! over the 92-byte line the syslog load test sends (`eventd-perf syslog`:
//! the local form glibc's `syslog(3)` writes). Before anything is
//! measured, every shape is parsed and checked field by field.
//!
//! `cargo bench --bench syslog_parse`

#[path = "../tests/syslog_shapes/mod.rs"]
mod syslog_shapes;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use eventd::syslog::parse::{parse, Format};
use std::hint::black_box;
use std::time::Duration;
use syslog_shapes::{parse_mismatches, SHAPES};

/// The load test's message 42, padded as it pads them.
fn load_test_line() -> Vec<u8> {
    let mut line = b"<13>Nov 30 10:01:02 bench[4242]: message 0000042 ".to_vec();
    while line.len() < 92 {
        line.push(b'a' + (line.len() % 26) as u8);
    }
    line
}

/// Panics unless the parser reads every shape as the corpus says, and the
/// load test's line as glibc meant it.
fn self_check() {
    for shape in SHAPES {
        let wrong = parse_mismatches(shape, &parse(shape.line.as_bytes()));
        assert!(wrong.is_empty(), "{}: {wrong:?}", shape.line);
    }
    let line = load_test_line();
    let m = parse(&line);
    assert_eq!(m.format, Format::Rfc3164);
    assert_eq!((m.hostname, m.app_name.as_deref()), (None, Some("bench")));
    assert_eq!(m.procid.as_deref(), Some("4242"));
    assert!(m.message.starts_with("message 0000042 "));
}

fn parse_messages(c: &mut Criterion) {
    self_check();
    let mut group = c.benchmark_group("syslog_parse");
    group.measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(SHAPES.len() as u64));
    group.bench_function("corpus", |b| {
        b.iter(|| {
            for shape in SHAPES {
                black_box(parse(black_box(shape.line.as_bytes())));
            }
        })
    });
    let line = load_test_line();
    group.throughput(Throughput::Elements(1));
    group.bench_function("load_test_line", |b| {
        b.iter(|| black_box(parse(black_box(&line))))
    });
    group.finish();
}

criterion_group!(benches, parse_messages);
criterion_main!(benches);
