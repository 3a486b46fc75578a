use super::*;
use crate::rings::format::Geometry;
use crate::rings::{Event, Level, Ring, RingItem, RingReader};
use std::sync::Arc;

fn every_kind() -> [Field<'static>; 9] {
    [
        Field::new("neg", Value::I64(i64::MIN)),
        Field::new("i", Value::I64(-42)),
        Field::new("big", Value::U64(u64::MAX)),
        Field::new("half", Value::F64(0.5)),
        Field::new("nan", Value::F64(f64::NAN)),
        Field::new("yes", Value::Bool(true)),
        Field::new("no", Value::Bool(false)),
        Field::new("text", Value::Str("quote \" tab \t ünï")),
        Field::new("", Value::Str("")),
    ]
}

fn encode(fields: &[Field<'_>]) -> Vec<u8> {
    let mut e = Encoder::default();
    for f in fields {
        e.field(f.key, f.value);
    }
    e.encoded().0.to_vec()
}

#[test]
fn every_kind_round_trips() {
    let fields = every_kind();
    let bytes = encode(&fields);
    assert_eq!(bytes.len(), fields.as_slice().encoded_len());
    let back: Vec<Field<'_>> = entries(&bytes).map(Result::unwrap).collect();
    assert_eq!(back.len(), fields.len());
    for (got, want) in back.iter().zip(&fields) {
        assert_eq!(got.key, want.key);
        match (got.value, want.value) {
            (Value::F64(a), Value::F64(b)) => assert_eq!(a.to_bits(), b.to_bits()),
            (a, b) => assert_eq!(a, b),
        }
    }
}

#[test]
fn json_is_what_the_formatted_path_writes() {
    let fields = every_kind();
    let mut typed = Fields::default();
    to_json(&encode(&fields), &mut typed).unwrap();
    let mut formatted = Fields::default();
    formatted.i64("neg", i64::MIN);
    formatted.i64("i", -42);
    formatted.u64("big", u64::MAX);
    formatted.f64("half", 0.5);
    formatted.f64("nan", f64::NAN);
    formatted.bool("yes", true);
    formatted.bool("no", false);
    formatted.str("text", "quote \" tab \t ünï");
    formatted.str("", "");
    assert_eq!(typed.text(), formatted.finish());
    // A key seen twice is kept the first time, as in the formatted path.
    let mut dup = Fields::default();
    to_json(
        &encode(&[
            Field::new("k", Value::U64(1)),
            Field::new("k", Value::Str("again")),
        ]),
        &mut dup,
    )
    .unwrap();
    assert_eq!(dup.text(), r#"{"k":1}"#);
    let mut none = Fields::default();
    to_json(&[], &mut none).unwrap();
    assert_eq!(none.text(), "");
}

#[test]
fn long_keys_are_cut_at_a_character_boundary() {
    let key = "é".repeat(200);
    for value in [
        Value::Bool(true),
        Value::I64(-1),
        Value::U64(7),
        Value::F64(0.5),
    ] {
        let bytes = encode(&[Field::new(&key, value)]);
        let back = entries(&bytes).next().unwrap().unwrap();
        assert_eq!(back.key.len(), 254);
        assert!(back.key.chars().all(|c| c == 'é'));
        assert_eq!(back.value, value);
    }
}

#[test]
fn the_encoder_writes_the_bytes_a_field_slice_does() {
    let key: String = "k".repeat(300);
    for len in [0, 1, 7, 8, 9, 254, 255, 256, 300] {
        for field in every_kind() {
            let field = Field::new(&key[..len], field.value);
            let mut direct = Vec::new();
            field.encode(&mut direct);
            assert_eq!(
                encode(&[field]),
                direct,
                "key of {len} bytes, {:?}",
                field.value
            );
        }
    }
}

#[test]
fn hostile_payloads_are_malformed_never_a_panic() {
    let good = encode(&every_kind());
    // Every truncation of a valid payload but at an entry's end fails.
    let ends: Vec<usize> = {
        let mut at = 0;
        every_kind()
            .iter()
            .map(|f| {
                at += std::slice::from_ref(f).encoded_len();
                at
            })
            .collect()
    };
    for cut in 1..good.len() {
        let result = validate(&good[..cut]);
        assert_eq!(result.is_ok(), ends.contains(&cut), "cut at {cut}");
    }
    let hostile: [&[u8]; 8] = [
        &[200],                                             // key longer than the payload
        &[1, b'k'],                                         // no kind
        &[1, b'k', 9, 0, 0, 0, 0, 0, 0, 0, 0],              // unknown kind
        &[1, b'k', 0],                                      // kind 0
        &[1, b'k', KIND_BOOL, 2],                           // a bool that is neither
        &[1, b'k', KIND_STR, 0xff, 0xff, 0xff, 0xff, b'a'], // string length past the end
        &[1, 0xff, KIND_BOOL, 1],                           // key not UTF-8
        &[1, b'k', KIND_STR, 1, 0, 0, 0, 0xc3],             // value not UTF-8
    ];
    for bytes in hostile {
        assert_eq!(validate(bytes), Err(Malformed), "{bytes:?}");
        assert!(to_json(bytes, &mut Fields::default()).is_err());
    }
    let mut flipped = 0;
    for i in 0..good.len() {
        for bit in 0..8 {
            let mut bad = good.clone();
            bad[i] ^= 1 << bit;
            // Must not panic; most flips are caught, some (a value's
            // bits) are just another value.
            flipped += usize::from(validate(&bad).is_err());
        }
    }
    assert!(flipped > 0);
}

fn ring(dir: &std::path::Path) -> Arc<Ring> {
    let g = Geometry::new(4096, 4).unwrap();
    Arc::new(Ring::create(&dir.join("cpu-000.ring"), g, 0).unwrap())
}

fn event(message: &str) -> Event<'_> {
    Event {
        ts_ns: 1_700_000_000_000_000_000,
        pid: 1,
        tid: 2,
        uid: 3,
        level: Level::Notice,
        provider: "typed",
        name: "test",
        message,
        // Not written by emit_typed.
        fields: "ignored",
    }
}

#[test]
fn a_ring_gives_typed_fields_back_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path());
    ring.emit_typed(&event("slice"), every_kind().as_slice())
        .unwrap();
    ring.emit_typed(&event("encoded"), &Encoder::default().encoded())
        .unwrap();
    let mut e = Encoder::default();
    e.u64("order", 7);
    e.f64("amount", 2.5);
    e.bool("paid", true);
    ring.emit_typed(&event("three"), &e.encoded()).unwrap();
    let mut reader = RingReader::new(ring);
    let mut expected_all = Fields::default();
    to_json(&encode(&every_kind()), &mut expected_all).unwrap();
    let want = [
        ("slice", expected_all.text().to_string()),
        ("encoded", String::new()),
        (
            "three",
            r#"{"order":7,"amount":2.5,"paid":true}"#.to_string(),
        ),
    ];
    for (seq, (message, fields)) in want.iter().enumerate() {
        match reader.poll() {
            Some(RingItem::Event { seq: s, event: got }) => {
                assert_eq!(s, seq as u64 + 1);
                assert_eq!(got.message, *message);
                assert_eq!(got.fields, fields);
                assert_eq!((got.provider, got.name), ("typed", "test"));
                assert_eq!((got.pid, got.tid, got.uid), (1, 2, 3));
                assert_eq!(got.level, Level::Notice);
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(reader.poll().is_none());
}

#[test]
fn a_large_typed_event_is_staged_on_the_heap() {
    let dir = tempfile::tempdir().unwrap();
    let g = Geometry::new(16 * 1024, 4).unwrap();
    let ring = Arc::new(Ring::create(&dir.path().join("cpu-000.ring"), g, 0).unwrap());
    let long = "x".repeat(STAGE_WORDS * 8 + 100);
    ring.emit_typed(&event("big"), &[Field::new("long", Value::Str(&long))])
        .unwrap();
    let mut reader = RingReader::new(ring);
    match reader.poll() {
        Some(RingItem::Event { event: got, .. }) => {
            assert_eq!(got.fields, format!(r#"{{"long":"{long}"}}"#));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_hostile_typed_record_is_counted_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring(dir.path());
    ring.emit_typed(&event("good"), &[Field::new("n", Value::I64(1))])
        .unwrap();
    // A producer may write any bytes as "typed": the checksum is right,
    // the entries are not.
    for bad in [
        &[1u8, b'k', 9][..],
        &[200u8][..],
        &[1, b'k', KIND_STR, 9, 0, 0, 0],
    ] {
        ring.emit_typed(&event("bad"), &Encoded(bad)).unwrap();
    }
    ring.emit_typed(&event("after"), &[Field::new("n", Value::I64(2))])
        .unwrap();
    let mut reader = RingReader::new(ring);
    let mut items = Vec::new();
    while let Some(item) = reader.poll() {
        items.push(match item {
            RingItem::Event { event, .. } => format!("{} {}", event.message, event.fields),
            RingItem::Gap(g) => format!("gap {}..={} {}", g.from_seq, g.to_seq, g.reason.name()),
        });
    }
    assert_eq!(
        items,
        [
            r#"good {"n":1}"#,
            "gap 2..=2 corrupt",
            "gap 3..=3 corrupt",
            "gap 4..=4 corrupt",
            r#"after {"n":2}"#
        ]
    );
    assert_eq!(reader.counts(), (2, 3));
}

#[test]
fn unknown_record_flags_are_corrupt() {
    use crate::rings::event::{validate as record, RecordFault};
    use crate::rings::format::*;
    let e = event("m");
    let header = e.header_words_with(0, 0x80);
    let mut words = vec![0u64; RECORD_HEADER_WORDS];
    let n = e
        .record_words_with(0, Geometry::new(4096, 2).unwrap())
        .unwrap();
    words[R_STATE] = RecordState {
        seq_low: 1,
        words: n,
        state: STATE_COMMITTED,
    }
    .pack();
    words[R_TS..].copy_from_slice(&header);
    let mut payload = Vec::new();
    payload.extend_from_slice(e.provider.as_bytes());
    payload.extend_from_slice(e.name.as_bytes());
    payload.extend_from_slice(e.message.as_bytes());
    payload.resize(payload.len().div_ceil(8) * 8, 0);
    for c in payload.chunks(8) {
        words.push(u64::from_le_bytes(c.try_into().unwrap()));
    }
    assert_eq!(words.len(), n as usize);
    words[R_CHECKSUM] = checksum(words[R_STATE], &words[R_TS..]);
    assert_eq!(record(&words), Err(RecordFault::Flags(0x80)));
}

#[test]
fn every_short_length_is_copied_whole() {
    let dir = tempfile::tempdir().unwrap();
    let g = Geometry::new(16 * 1024, 4).unwrap();
    let ring = Arc::new(Ring::create(&dir.path().join("cpu-000.ring"), g, 0).unwrap());
    let text: String = ('a'..='z').chain('A'..='Z').collect();
    for len in 0..=40 {
        let s = &text[..len];
        ring.emit_typed(&event(s), &[Field::new(s, Value::Str(s))])
            .unwrap();
    }
    let mut reader = RingReader::new(ring);
    for len in 0..=40 {
        let s = &text[..len];
        match reader.poll() {
            Some(RingItem::Event { event: got, .. }) => {
                assert_eq!(got.message, s);
                assert_eq!(got.fields, format!(r#"{{"{s}":"{s}"}}"#));
            }
            other => panic!("{len}: {other:?}"),
        }
    }
}

#[test]
fn many_keys_keep_the_first_of_each_as_few_do() {
    // Past KEYS_COMPARED_MAX entries repeats are found with a hash set;
    // the object is the one the formatted path writes.
    let keys: Vec<String> = (0..300).map(|i| format!("k{}", i % 150)).collect();
    let mut e = Encoder::default();
    let mut formatted = Fields::default();
    for (i, k) in keys.iter().enumerate() {
        e.u64(k, i as u64);
        formatted.u64(k, i as u64);
    }
    let mut typed = Fields::default();
    to_json(e.encoded().0, &mut typed).unwrap();
    assert_eq!(typed.text(), formatted.finish());
    assert!(typed.text().contains(r#""k0":0,"#) && !typed.text().contains(":150"));
    // Repeats before the set takes over, and of those keys after it.
    let mut e = Encoder::default();
    let mut formatted = Fields::default();
    for i in 0..300u64 {
        let k = format!("r{}", i % 40);
        e.u64(&k, i);
        formatted.u64(&k, i);
    }
    to_json(e.encoded().0, &mut typed).unwrap();
    assert_eq!(typed.text(), formatted.finish());
    assert!(typed.text().contains(r#""r39":39}"#) && !typed.text().contains(":40"));
    // The set is gone with the next object: a repeat is found again.
    to_json(
        &encode(&[
            Field::new("a", Value::U64(1)),
            Field::new("a", Value::U64(2)),
        ]),
        &mut typed,
    )
    .unwrap();
    assert_eq!(typed.text(), r#"{"a":1}"#);
}

#[test]
fn short_copies_of_every_length_copy_exactly_those_bytes() {
    let src: Vec<u8> = (0..100u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
    for n in 0..=src.len() {
        // Guard bytes around the destination show a write past either end.
        let mut dst = vec![0xEEu8; n + 16];
        // SAFETY: `dst` has room for `n` bytes from offset 8, and is not `src`.
        unsafe { super::copy_short(&src[..n], dst.as_mut_ptr().add(8)) };
        assert_eq!(&dst[8..8 + n], &src[..n], "{n} bytes");
        assert!(dst[..8].iter().all(|&b| b == 0xEE), "{n}: before");
        assert!(dst[8 + n..].iter().all(|&b| b == 0xEE), "{n}: after");
    }
}

#[test]
fn extend_new_adds_only_keys_not_there_yet() {
    let mut span = Encoder::default();
    span.u64("user", 1);
    span.str("where", "here");
    let mut recorded = Encoder::default();
    recorded.u64("user", 2);
    recorded.bool("late", true);
    recorded.str("where", "there");
    span.extend_new(&recorded);
    let got: Vec<Field<'_>> = entries(&span.buf).map(Result::unwrap).collect();
    assert_eq!(
        got,
        [
            Field::new("user", Value::U64(1)),
            Field::new("where", Value::Str("here")),
            Field::new("late", Value::Bool(true)),
        ]
    );
}
