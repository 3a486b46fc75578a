"""Runs the statements eventd sends to ClickHouse (`eventctl export sql`,
one JSON object a line on stdin) on a current ClickHouse engine, in this
process, through chdb. Used by tests/export_sql.rs.

    eventctl export sql --database D | python3 export_sql.py --layout single DIR

Every statement is first parsed as it is sent (`EXPLAIN AST`), then run:

- settings: every one eventd sends as a URL parameter must be a setting the
  engine knows (the HTTP interface's own parameters, `query_id` and
  `wait_end_of_query`, are not settings and are left out); each is SET in
  the session for its statement, then set back to its default;
- inserts: the body, written to a file, goes in with `FROM INFILE` before
  `FORMAT` (chdb has no HTTP body); the statement is otherwise the same;
- the cluster layout has no cluster, ZooKeeper or other server here, so
  what needs them is swapped for its plain form before running (never
  before the parse): `ON CLUSTER name` is dropped, `ReplicatedMergeTree(...)`
  becomes `MergeTree`, `Distributed(c, db, table, key)` becomes
  `Merge(db, '^table$')` (it reads the local table, and takes no inserts,
  so inserts into `events`/`gaps` go to `events_local`/`gaps_local`), and
  `remote('addresses', 'db', 'table'[, user, password])` becomes
  `db.table`.

Then the answers are checked where the sample rows make them known: the
lookups find the inserted ids, and on a single server the same batch sent
twice (RowBinary, then JSONEachRow, with one deduplication token) is stored
once (in the cluster layout, whose swapped tables have no deduplication,
twice).

Prints one line per statement and a last line `N passed, M failed`; exits
1 if any failed.
"""

import json
import os
import re
import struct
import sys

import chdb
from chdb import session

HTTP_ONLY = {"wait_end_of_query", "query_id"}


def quote(value):
    if re.fullmatch(r"-?[0-9]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def swapped(sql, layout):
    """The statement in the plain form chdb can run (see the module doc)."""
    if layout != "cluster":
        return sql
    sql = re.sub(r" ON CLUSTER \w+", "", sql)
    sql = re.sub(r"ReplicatedMergeTree\('[^']*', '[^']*'\)", "MergeTree", sql)
    sql = re.sub(
        r"Distributed\((\w+), (\w+), (\w+), [^\n]*\)$",
        lambda m: f"Merge({m.group(2)}, '^{m.group(3)}$')",
        sql,
        flags=re.M,
    )
    sql = re.sub(
        r"remote\('[^']*', '(\w+)', '(\w+)'(, '(?:[^'\\]|\\.)*'){0,2}\)",
        lambda m: f"{m.group(1)}.{m.group(2)}",
        sql,
    )
    sql = re.sub(r"^(INSERT INTO `\w+`\.)(events|gaps) ", r"\1\2_local ", sql)
    return sql


def u64s(data):
    return [struct.unpack_from("<Q", data, i)[0] for i in range(0, len(data), 8)]


class Run:
    def __init__(self, directory, layout):
        self.s = session.Session(os.path.join(directory, "chdb"))
        self.dir = directory
        self.layout = layout
        self.passed = 0
        self.failed = 0
        self.known = None

    def query(self, sql):
        return bytes(self.s.query(sql, "TSVRaw").bytes())

    def settings(self, pairs):
        if self.known is None:
            names = self.query("SELECT name FROM system.settings").decode()
            self.known = set(names.split())
        unknown = [k for k, _ in pairs if k not in HTTP_ONLY and k not in self.known]
        if unknown:
            raise RuntimeError(f"settings this ClickHouse does not know: {unknown}")
        return [(k, v) for k, v in pairs if k not in HTTP_ONLY]

    def one(self, n, st):
        sql = st["sql"]
        self.query("EXPLAIN AST " + sql)
        pairs = self.settings(st["settings"])
        run = swapped(sql, self.layout)
        if st.get("body") is not None:
            path = os.path.join(self.dir, f"body-{n}")
            with open(path, "wb") as f:
                f.write(bytes.fromhex(st["body"]))
            run = re.sub(r" FORMAT (\w+)$", rf" FROM INFILE '{path}' FORMAT \1", run)
        for k, v in pairs:
            self.query(f"SET {k} = {quote(v)}")
        try:
            answer = self.query(run)
        finally:
            for k, _ in pairs:
                self.query(f"SET {k} = DEFAULT")
        self.check(st, sql, answer)

    def check(self, st, sql, answer):
        what = st["what"]
        # Each batch goes in twice (RowBinary, then JSONEachRow, one token):
        # stored once on the single server's table with its deduplication
        # window, twice in the swapped MergeTree of the cluster layout.
        copies = 1 if self.layout == "single" else 2
        events = " events WHERE" in sql or "events_local'" in sql
        if what == "settle: ids present" and events:
            if sorted(u64s(answer)) != [100, 101]:
                raise RuntimeError(f"ids present: {u64s(answer)}, not [100, 101]")
        if what == "reconcile: highest id" and events:
            if u64s(answer) != [101, copies]:
                raise RuntimeError(f"highest id, count: {u64s(answer)}, not [101, {copies}]")
        if what == "rollback: by identity" and events:
            if len(answer) != copies * (8 + 4 + 8 + 8):
                raise RuntimeError(f"by identity: {len(answer)} bytes, not {copies} rows")

    def after_inserts(self, database):
        if self.layout != "single":
            return
        count = self.query(f"SELECT count() FROM {database}.events").decode().strip()
        if count != "2":
            raise RuntimeError(
                f"{database}.events holds {count} rows: the batch sent twice with one "
                "deduplication token was not stored once"
            )


def main():
    layout, directory = sys.argv[2], sys.argv[3]
    assert sys.argv[1] == "--layout" and layout in ("single", "cluster")
    statements = [json.loads(line) for line in sys.stdin if line.strip()]
    run = Run(directory, layout)
    print(f"ClickHouse {run.query('SELECT version()').decode().strip()} (chdb {chdb.__version__})")
    database = None
    inserted = False
    for n, st in enumerate(statements):
        if st["layout"] not in ("any", layout):
            continue
        if st["what"] == "insert":
            inserted = True
            database = re.match(r"INSERT INTO `(\w+)`", st["sql"]).group(1)
        elif inserted and database:
            try:
                run.after_inserts(database)
                run.passed += 1
                print(f"ok    after the inserts: each batch stored once")
            except Exception as e:
                run.failed += 1
                print(f"FAIL  after the inserts: {str(e).splitlines()[0]}")
            inserted = False
        try:
            run.one(n, st)
            run.passed += 1
            print(f"ok    {st['what']}: {st['sql'][:90]!r}")
        except Exception as e:
            run.failed += 1
            print(f"FAIL  {st['what']}: {st['sql']!r}\n      {str(e).splitlines()[0]}")
    print(f"{run.passed} passed, {run.failed} failed")
    sys.exit(1 if run.failed else 0)


if __name__ == "__main__":
    main()
