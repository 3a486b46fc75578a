-- eventd's tables in ClickHouse (see docs/design/export.md). `eventctl export init`
-- runs these statements with ${DATABASE} and ${CLUSTER} replaced (defaults
-- "eventd" and "eventd"); each is idempotent. {shard} and {replica} are the
-- servers' own macros (see cluster.xml).
--
-- Per shard: events_local and gaps_local, ReplicatedMergeTree, ordered for
-- time-range queries per host (ring_epoch in the key: one event's identity
-- is host, ring_epoch, cpu, seq). Over the cluster: events and gaps,
-- Distributed, sharded by a hash of the host, so one host's batch lands
-- whole on one shard and is one block there (deduplicated as one).
-- `source` is the shard file's instance id on that host and `source_id` the
-- row's id in it: together with the host they name a row exactly once,
-- which is how the export stage checks what landed.

CREATE DATABASE IF NOT EXISTS ${DATABASE} ON CLUSTER ${CLUSTER};

CREATE TABLE IF NOT EXISTS ${DATABASE}.events_local ON CLUSTER ${CLUSTER} (
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
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/${DATABASE}/events', '{replica}')
PARTITION BY toYYYYMM(toDateTime(intDiv(ts, 1000000000)))
ORDER BY (host, ts, cpu, seq, ring_epoch);

CREATE TABLE IF NOT EXISTS ${DATABASE}.gaps_local ON CLUSTER ${CLUSTER} (
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
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/${DATABASE}/gaps', '{replica}')
PARTITION BY toYYYYMM(toDateTime(intDiv(detected_at, 1000000000)))
ORDER BY (host, detected_at, cpu, from_seq, ring_epoch);

CREATE TABLE IF NOT EXISTS ${DATABASE}.events ON CLUSTER ${CLUSTER}
AS ${DATABASE}.events_local
ENGINE = Distributed(${CLUSTER}, ${DATABASE}, events_local, cityHash64(host));

CREATE TABLE IF NOT EXISTS ${DATABASE}.gaps ON CLUSTER ${CLUSTER}
AS ${DATABASE}.gaps_local
ENGINE = Distributed(${CLUSTER}, ${DATABASE}, gaps_local, cityHash64(host));
