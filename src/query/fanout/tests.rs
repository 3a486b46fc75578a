//! Tests of the fan-out reader: plans, pooling, paging and merging.

use super::*;
use crate::query::filter::Order;
use crate::store::zones::ZoneMaps;

fn shard_with(dir: &Path, name: &str, message: &str) -> PathBuf {
    let path = dir.join(name);
    let conn = crate::store::open_shard(&path).unwrap();
    conn.execute(
        crate::store::rows::INSERT_EVENT,
        rusqlite::params![
            1i64,
            0,
            1i64,
            7i64,
            1,
            1,
            0,
            6,
            "p",
            "n",
            message,
            None::<&str>
        ],
    )
    .unwrap();
    path
}

/// SQLite's plan for shard 0's next page of `fan`, one line.
fn plan(fan: &FanOut) -> String {
    let (sql, params) = fan.events_page_sql(0, 2);
    let conn = &fan.shards[0].conn;
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let lines: Vec<String> = stmt
        .query_map(rusqlite::params_from_iter(params.iter()), |r| r.get(3))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    lines.join("; ")
}

#[test]
fn every_first_page_walks_an_index_in_time_order_and_never_sorts_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = shard_with(dir.path(), "shard-000.db", "m");
    let conn = crate::store::open_shard(&path).unwrap();
    crate::store::indexes::sync(
        &conn,
        &[
            crate::store::indexes::QueryIndex::Column("provider"),
            crate::store::indexes::QueryIndex::Field("unit".into()),
        ],
        &path,
    )
    .unwrap();
    // One an operator made: `--level` must not read it (a range of
    // levels comes out of it unordered, and is sorted whole).
    conn.execute_batch("CREATE INDEX by_hand_level ON events (level, ts)")
        .unwrap();
    // Rows, so that SQLite's estimates are not those of an empty table.
    for i in 0..2000i64 {
        conn.execute(
            crate::store::rows::INSERT_EVENT,
            rusqlite::params![
                i,
                i % 4,
                i,
                7i64,
                1,
                1,
                0,
                i % 8,
                "p",
                "n",
                "m",
                None::<&str>
            ],
        )
        .unwrap();
    }
    let cases: Vec<(Filter, &str)> = vec![
        (Filter::default(), "events_ts"),
        (
            Filter {
                name: Some("n".into()),
                ..Filter::default()
            },
            "events_ts",
        ),
        (
            Filter {
                level: Some(3),
                ..Filter::default()
            },
            "events_ts",
        ),
        (
            Filter {
                text: Some("disk".into()),
                ..Filter::default()
            },
            "events_ts",
        ),
        (
            Filter {
                provider: Some("p".into()),
                ..Filter::default()
            },
            "events_by_provider",
        ),
        (
            Filter {
                fields: vec![("unit".into(), "sda".into())],
                ..Filter::default()
            },
            "events_by_field_756e6974",
        ),
        (
            Filter {
                provider: Some("p".into()),
                since_ns: Some(5),
                until_ns: Some(9),
                ..Filter::default()
            },
            "events_by_provider",
        ),
    ];
    for (filter, index) in cases {
        for order in [Order::OldestFirst, Order::NewestFirst] {
            let f = Filter {
                order,
                ..filter.clone()
            };
            let fan = FanOut::open(dir.path(), f.clone(), None).unwrap();
            let plan = plan(&fan);
            assert!(
                plan.contains(&format!("USING INDEX {index} ")),
                "{f:?}: {plan}"
            );
            assert!(!plan.contains("SCAN events"), "{f:?}: {plan}");
            assert!(!plan.contains("FOR ORDER BY"), "{f:?}: {plan}");
        }
    }
}

fn messages(dir: &Path, pool: &Arc<ConnectionPool>) -> Vec<String> {
    let mut fan =
        FanOut::open_pooled(dir, Filter::default(), None, Some(pool.clone()), None).unwrap();
    std::iter::from_fn(|| fan.next_event().map(|e| e.message)).collect()
}

#[test]
fn pooled_connections_are_reused_but_never_for_a_replaced_file() {
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let path = shard_with(dir.path(), "shard-000.db", "old");
    let pool = Arc::new(ConnectionPool::new(2));
    assert_eq!(messages(dir.path(), &pool), ["old"]);
    assert_eq!(pool.idle(), 1);
    // Replace the file under the same name (a restore, say).
    let fresh = shard_with(other.path(), "shard-000.db", "new");
    std::fs::rename(&fresh, &path).unwrap();
    assert_eq!(messages(dir.path(), &pool), ["new"]);
    assert_eq!(pool.idle(), 1);
}

/// Shards written the way stripes write them (runs of each "cpu"'s
/// events, one commit and zone row per run, equal timestamps across
/// shards, gaps in a few), read with and without their time maps: every
/// query, in both orders, with windows, cursors, limits and a filter,
/// lists the same events and gaps; and the newest page opens only the
/// files that hold it.
#[test]
fn time_maps_leave_files_unopened_but_change_no_answer() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let shards = 12usize;
    let mut conns: Vec<Connection> = (0..shards)
        .map(|j| crate::store::open_shard(&crate::store::shard_path(dir.path(), j)).unwrap())
        .collect();
    let mut all_ts = Vec::new();
    let mut seq = [0i64; 2];
    let mut t = 1_000i64;
    for run in 0..150usize {
        let j = (run * 7 + run / 12) % (shards - 1); // the last shard stays empty
        let cpu = run % 2;
        let tx = conns[j].transaction().unwrap();
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        for _ in 0..rng.random_range(1..40) {
            // Often the same time as the event before (another shard's).
            t += rng.random_range(0..3);
            seq[cpu] += 1;
            let provider = if rng.random_range(0..10) == 0 {
                "rare"
            } else {
                "p"
            };
            tx.execute(
                crate::store::rows::INSERT_EVENT,
                rusqlite::params![
                    t,
                    cpu as i64,
                    seq[cpu],
                    7i64,
                    1,
                    1,
                    0,
                    6,
                    provider,
                    "n",
                    "m",
                    None::<&str>
                ],
            )
            .unwrap();
            (lo, hi) = (lo.min(t), hi.max(t));
            all_ts.push(t);
        }
        crate::store::zones::record(&tx, lo, hi, tx.last_insert_rowid()).unwrap();
        if run % 37 == 0 {
            let gap = crate::store::rows::NewGap {
                ring_epoch: 7,
                cpu: cpu as u32,
                from_seq: seq[cpu] as u64 + 1,
                to_seq: seq[cpu] as u64 + 1,
                lost: 1,
                reason: "overwritten",
                ts_before: t,
                detected_at: t,
            };
            gap.insert(&mut tx.prepare(crate::store::rows::INSERT_GAP).unwrap())
                .unwrap();
            seq[cpu] += 1;
        }
        tx.commit().unwrap();
        // Often the next run (in another file) starts at the same time.
        if rng.random_range(0..3) > 0 {
            t += rng.random_range(1..200);
        }
    }
    // Every file's map as its writer would load it, but one: a query
    // reads that one's.
    let zones = ZoneMaps::default();
    for (j, conn) in conns.iter().enumerate().skip(1) {
        let path = crate::store::shard_path(dir.path(), j);
        zones.register(&path, Some(crate::store::zones::load(conn, &path).unwrap()));
    }
    let (t_min, t_max) = (all_ts[0], *all_ts.last().unwrap());
    let collect = |f: &Filter, zones: Option<&ZoneMaps>| {
        let mut fan = FanOut::open_pooled(dir.path(), f.clone(), None, None, zones).unwrap();
        let events: Vec<Cursor> =
            std::iter::from_fn(|| fan.next_event().map(|e| e.cursor())).collect();
        let opened = fan.opened();
        let gaps: Vec<GapCursor> =
            std::iter::from_fn(|| fan.next_gap().map(|g| g.cursor())).collect();
        (events, gaps, opened)
    };
    for k in 0..250 {
        let window = |rng: &mut rand::rngs::StdRng| {
            (rng.random_range(0..3) > 0).then(|| rng.random_range(t_min - 5..t_max + 5))
        };
        let mut f = Filter {
            order: if k % 2 == 0 {
                Order::OldestFirst
            } else {
                Order::NewestFirst
            },
            since_ns: window(&mut rng),
            until_ns: window(&mut rng),
            limit: (rng.random_range(0..4) > 0).then(|| rng.random_range(1..60)),
            provider: (rng.random_range(0..5) == 0).then(|| "rare".to_string()),
            ..Filter::default()
        };
        let (plain, plain_gaps, _) = collect(&f, None);
        let (mapped, mapped_gaps, _) = collect(&f, Some(&zones));
        assert!(
            mapped == plain,
            "{f:?}: {mapped:?}\nbut read whole: {plain:?}"
        );
        assert!(mapped_gaps == plain_gaps, "{f:?}: gaps differ");
        // The next page, after the last event.
        if let Some(last) = plain.last() {
            f.after = Some(*last);
            let (plain, _, _) = collect(&f, None);
            let (mapped, _, _) = collect(&f, Some(&zones));
            assert!(
                mapped == plain,
                "{f:?}: {mapped:?}\nbut read whole: {plain:?}"
            );
        }
    }
    // The 20 newest events are in the newest runs' files; the file with
    // no map is opened too (and its map learnt for the next query).
    // (Counted before the gaps: those are read from every file that
    // has any.)
    let newest = Filter {
        order: Order::NewestFirst,
        limit: Some(20),
        ..Filter::default()
    };
    let (_, _, first) = collect(&newest, Some(&zones));
    let (_, _, again) = collect(&newest, Some(&zones));
    assert!(first <= 4, "{first} of {shards} files opened");
    assert!(again < first || again <= 3, "{again} then");
    let (_, _, all) = collect(&newest, None);
    assert_eq!(all, shards);
}

/// Pages of `limit` gaps, each continuing after the last one's cursor,
/// over shards whose gaps interleave: every gap once, in order.
#[test]
fn gaps_page_through_every_shard_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut want = Vec::new();
    for shard in 0..3i64 {
        let conn =
            crate::store::open_shard(&dir.path().join(format!("shard-00{shard}.db"))).unwrap();
        for k in 0..40i64 {
            // Equal detection times across shards and cpus: the rest of
            // the key decides.
            let (detected_at, cpu, from_seq) = (k / 4, (k + shard) % 3, 10 * k + shard);
            let gap = crate::store::rows::NewGap {
                ring_epoch: 1,
                cpu: cpu as u32,
                from_seq: from_seq as u64,
                to_seq: from_seq as u64,
                lost: 1,
                reason: "overwritten",
                ts_before: 0,
                detected_at,
            };
            let mut insert = conn.prepare(crate::store::rows::INSERT_GAP).unwrap();
            gap.insert(&mut insert).unwrap();
            want.push((detected_at, cpu as u32, from_seq as u64));
        }
    }
    want.sort();
    for order in [Order::OldestFirst, Order::NewestFirst] {
        let mut expected = want.clone();
        if order == Order::NewestFirst {
            expected.reverse();
        }
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let filter = Filter {
                order,
                limit: Some(7),
                gaps_after: after,
                ..Filter::default()
            };
            let mut fan = FanOut::open(dir.path(), filter, None).unwrap();
            let page: Vec<GapRow> = std::iter::from_fn(|| fan.next_gap()).collect();
            assert!(page.len() <= 7);
            seen.extend(page.iter().map(|g| (g.detected_at, g.cpu, g.from_seq)));
            match page.last() {
                Some(g) if page.len() == 7 => after = Some(g.cursor()),
                _ => break,
            }
        }
        assert_eq!(seen, expected, "{order:?}");
    }
}
