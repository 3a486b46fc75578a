//! Every statement eventd and `eventctl` send to ClickHouse, each with the
//! settings it goes with and, for inserts, a body encoded as batches are:
//! what `eventctl export sql` prints, so that a test can run them on
//! another ClickHouse (`tests/export_sql.rs` runs them on a current one,
//! in-process, through chdb).
//!
//! The values are samples (a host, a file instance, id ranges, a cursor);
//! the text around them is the one the export stage and the fleet query
//! build, from the same functions.

use super::clickhouse::{Client, Endpoint};
use super::fleet::{FleetCursor, FleetQuery};
use super::format::{self, Format, Origin};
use super::init;
use super::state::Table;
use super::statements::{self as sql, Layout, Source};
use crate::query::{Filter, Order};
use crate::store::rows::{EventView, GapRow};

/// One statement as sent.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sent {
    /// What it is for (`settle: ids present`, ...).
    pub what: String,
    /// `single`, `cluster`, or `any` (sent in both layouts).
    pub layout: &'static str,
    pub sql: String,
    /// URL parameters besides the statement: settings, and the HTTP
    /// interface's own (`query_id`, `wait_end_of_query`).
    pub settings: Vec<(String, String)>,
    /// An insert's data, hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

const HOST: &str = "web-01";
const INSTANCE: &str = "0123456789abcdef";

fn sent(what: &str, layout: &'static str, sql: String, settings: &[(&str, &str)]) -> Sent {
    Sent {
        what: what.to_string(),
        layout,
        sql,
        settings: settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        body: None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Two events (one with fields and text to escape) and a gap, encoded.
fn body(table: Table, format: Format) -> Vec<u8> {
    let mut out = Vec::new();
    match table {
        Table::Events => {
            let events = [
                EventView {
                    ts: 1_764_620_000_123_456_789,
                    cpu: 1,
                    seq: 42,
                    ring_epoch: 1_764_000_000_000_000_000,
                    pid: 4242,
                    tid: 4243,
                    uid: 1000,
                    level: 3,
                    provider: "backup",
                    name: "nightly",
                    message: "it's \"done\" \\ über 100%\n",
                    fields: Some(r#"{"disk":"sda","free":12}"#),
                },
                EventView {
                    ts: 1_764_620_001_000_000_000,
                    cpu: 0,
                    seq: 7,
                    ring_epoch: 1_764_000_000_000_000_001,
                    pid: 1,
                    tid: 1,
                    uid: 0,
                    level: 6,
                    provider: "demo",
                    name: "",
                    message: "",
                    fields: None,
                },
            ];
            for (i, e) in events.iter().enumerate() {
                let o = Origin {
                    host: HOST,
                    source: INSTANCE,
                    id: 100 + i as i64,
                };
                match format {
                    Format::RowBinary => format::event_row_binary(&mut out, &o, e),
                    Format::JsonEachRow => format::event_json(&mut out, &o, e),
                }
            }
        }
        Table::Gaps => {
            let g = GapRow {
                ring_epoch: 1_764_000_000_000_000_000,
                cpu: 1,
                from_seq: 43,
                to_seq: 99,
                lost: 57,
                reason: "ring_lost".to_string(),
                ts_before: 1_764_620_000_123_456_789,
                detected_at: 1_764_620_002_000_000_000,
            };
            let o = Origin {
                host: HOST,
                source: INSTANCE,
                id: 5,
            };
            match format {
                Format::RowBinary => format::gap_row_binary(&mut out, &o, &g),
                Format::JsonEachRow => format::gap_json(&mut out, &o, &g),
            }
        }
    }
    out
}

/// What finds out where the tables are, and `eventctl export init`'s
/// schemas (the single one with and without its deduplication window).
fn discovery_and_schemas(database: &str, cluster: &str, out: &mut Vec<Sent>) {
    for (what, q) in [
        ("version", sql::VERSION.to_string()),
        ("layout: events engine", sql::events_engine(database)),
        ("layout: replicas", sql::cluster_replicas(cluster)),
        ("layout: host's shard", sql::host_hash(HOST)),
        (
            "layout: token setting",
            sql::has_setting("insert_deduplication_token"),
        ),
        (
            "init: dedup window setting",
            sql::has_merge_tree_setting("non_replicated_deduplication_window"),
        ),
        ("init: cluster", sql::has_cluster(cluster)),
    ] {
        out.push(sent(what, "any", q, &[("wait_end_of_query", "1")]));
    }
    let ddl = [
        ("wait_end_of_query", "1"),
        ("distributed_ddl_task_timeout", "180"),
    ];
    for q in init::statements(database, cluster) {
        out.push(sent("init: cluster schema", "cluster", q, &ddl));
    }
    // With the window first: what init makes on a server that has it (the
    // other is then a no-op, IF NOT EXISTS, still checked).
    for dedup in [true, false] {
        for q in init::single_statements(database, dedup) {
            let what = if dedup {
                "init: single schema, dedup window"
            } else {
                "init: single schema"
            };
            out.push(sent(what, "single", q, &ddl));
        }
    }
}

/// Every insert, in both formats, with each layout's settings.
fn inserts(database: &str, out: &mut Vec<Sent>) {
    for table in Table::ALL {
        for format in [Format::RowBinary, Format::JsonEachRow] {
            let text = sql::insert(database, table, format);
            let query_id = format!("eventd:{HOST}:{INSTANCE}:{}:1", table.name());
            let token = format!("{HOST}:{INSTANCE}:{}:100-101:2", table.name());
            let mut settings = vec![
                ("max_insert_block_size", "1048576"),
                ("query_id", query_id.as_str()),
                ("insert_deduplication_token", token.as_str()),
            ];
            let data = hex(&body(table, format));
            let mut single = sent("insert", "single", text.clone(), &settings);
            single.body = Some(data.clone());
            out.push(single);
            settings.extend([
                ("insert_distributed_sync", "1"),
                ("insert_distributed_timeout", "30"),
            ]);
            let mut cluster = sent("insert", "cluster", text.clone(), &settings);
            cluster.body = Some(data);
            out.push(cluster);
        }
    }
}

/// The settle, reconcile and running-insert checks, in each layout.
fn lookups(database: &str, out: &mut Vec<Sent>) {
    let checked = [
        ("wait_end_of_query", "1"),
        ("skip_unavailable_shards", "0"),
        ("max_execution_time", "30"),
    ];
    let replicas = ["10.0.0.1:9000".to_string(), "10.0.0.2:9000".to_string()];
    for (layout, name) in [(Layout::Single, "single"), (Layout::Cluster, "cluster")] {
        let from = Source {
            layout: &layout,
            database,
            replicas: &replicas,
            credentials: Some(("eventd", "pass'word")),
        };
        for table in Table::ALL {
            let times = (1_764_620_000_000_000_000, 1_764_620_009_000_000_000);
            let present = sql::lookup(
                &from,
                table,
                HOST,
                INSTANCE,
                (100, 101),
                times,
                sql::PRESENT,
            );
            out.push(sent("settle: ids present", name, present, &checked));
            let highest = sql::lookup(
                &from,
                table,
                HOST,
                INSTANCE,
                (101, i64::MAX),
                (times.0, i64::MAX),
                sql::HIGHEST,
            );
            out.push(sent("reconcile: highest id", name, highest, &checked));
            let ranges = [((1_764_000_000_000_000_000, 1), (42, 43)), ((7, 0), (7, 7))];
            let identity = sql::by_identity(&from, table, HOST, &ranges);
            out.push(sent("rollback: by identity", name, identity, &checked));
        }
        let prefix = format!("eventd:{HOST}:{INSTANCE}:events:");
        let here = sql::running(&[], None, &prefix);
        out.push(sent("settle: inserts running here", name, here, &checked));
        if layout == Layout::Cluster {
            let there = sql::running(&replicas, from.credentials, &prefix);
            out.push(sent(
                "settle: inserts running on the shard",
                name,
                there,
                &checked,
            ));
        }
    }
}

/// `eventctl query --cluster`: every filter, first pages and next pages,
/// both orders.
fn fleet(database: &str, out: &mut Vec<Sent>) {
    let client = Client::new(
        Endpoint {
            url: "http://127.0.0.1:1/".to_string(),
            user: None,
            password: None,
            tls: None,
        },
        std::time::Duration::from_secs(1),
    );
    let hosts = [HOST.to_string(), "db-02".to_string()];
    let key = (1_764_620_000_123_456_789, HOST.to_string(), 1, 42, 7);
    for order in [Order::OldestFirst, Order::NewestFirst] {
        let filter = Filter {
            since_ns: Some(1_764_620_000_000_000_000),
            until_ns: Some(1_764_620_009_000_000_000),
            cpu: Some(1),
            level: Some(3),
            provider: Some("backup".to_string()),
            name: Some("nightly".to_string()),
            pid: Some(4242),
            uid: Some(1000),
            text: Some("it's 100%".to_string()),
            fields: vec![
                ("disk".to_string(), "sda".to_string()),
                ("free".to_string(), "12".to_string()),
            ],
            order,
            limit: Some(10),
            ..Filter::default()
        };
        let query = FleetQuery {
            client: &client,
            database,
            filter: &filter,
            hosts: &hosts,
            cursor: FleetCursor::default(),
        };
        let settings = [("wait_end_of_query", "1"), ("max_result_rows", "0")];
        for last in [None, Some(&key)] {
            out.push(sent(
                "fleet: events",
                "any",
                query.events_sql(last, 10),
                &settings,
            ));
            out.push(sent(
                "fleet: gaps",
                "any",
                query.gaps_sql(last, 10),
                &settings,
            ));
        }
    }
}

/// Every statement, for tables in `database` and a cluster named
/// `cluster`.
pub fn catalogue(database: &str, cluster: &str) -> Vec<Sent> {
    let mut out = Vec::new();
    discovery_and_schemas(database, cluster, &mut out);
    inserts(database, &mut out);
    lookups(database, &mut out);
    fleet(database, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_statement_is_listed_and_inserts_carry_their_bodies() {
        let all = catalogue("db", "c");
        for what in [
            "version",
            "init: cluster schema",
            "init: single schema",
            "insert",
            "settle: ids present",
            "reconcile: highest id",
            "rollback: by identity",
            "settle: inserts running here",
            "settle: inserts running on the shard",
            "fleet: events",
            "fleet: gaps",
        ] {
            assert!(all.iter().any(|s| s.what == what), "{what} missing");
        }
        for s in all.iter().filter(|s| s.what == "insert") {
            assert!(s.body.as_ref().is_some_and(|b| !b.is_empty()), "{s:?}");
        }
    }
}
