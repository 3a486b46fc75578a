-- eventd's tables on a single ClickHouse server (see docs/design/export.md): no
-- ZooKeeper, no cluster, no macros. `eventctl export init` runs these
-- statements with ${DATABASE} replaced (default "eventd") and ${SETTINGS}
-- replaced by `SETTINGS non_replicated_deduplication_window = 1000` on
-- servers that have that setting (it came after 18.16), by nothing
-- otherwise; each is idempotent.
--
-- The same columns as schema.sql's tables, ordered for time-range queries
-- per host. `source` is the shard file's instance id on that host and
-- `source_id` the row's id in it: together with the host they name a row
-- exactly once, which is how the export stage checks what landed.

CREATE DATABASE IF NOT EXISTS ${DATABASE};

CREATE TABLE IF NOT EXISTS ${DATABASE}.events (
    host String,
    source String,
    source_id UInt64,
    ts Int64,
    cpu UInt32,
    seq UInt64,
    ring_epoch Int64,
    pid UInt32,
    tid UInt32,
    uid UInt32,
    level UInt8,
    provider String,
    name String,
    message String,
    fields String,
    time DateTime ALIAS toDateTime(intDiv(ts, 1000000000))
) ENGINE = MergeTree
PARTITION BY toYYYYMM(toDateTime(intDiv(ts, 1000000000)))
ORDER BY (host, ts, cpu, seq, ring_epoch)
${SETTINGS};

CREATE TABLE IF NOT EXISTS ${DATABASE}.gaps (
    host String,
    source String,
    source_id UInt64,
    ring_epoch Int64,
    cpu UInt32,
    from_seq UInt64,
    to_seq UInt64,
    lost UInt64,
    reason String,
    ts_before Int64,
    detected_at Int64,
    time DateTime ALIAS toDateTime(intDiv(detected_at, 1000000000))
) ENGINE = MergeTree
PARTITION BY toYYYYMM(toDateTime(intDiv(detected_at, 1000000000)))
ORDER BY (host, detected_at, cpu, from_seq, ring_epoch)
${SETTINGS};
