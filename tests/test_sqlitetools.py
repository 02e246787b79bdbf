"""sqlite-utils where the issue names it (issue 9): the SQLite migrations run through it inside
our own write transaction, and `inventory import` (JSON, openb-nodes, `init --demo`) adds new
nodes in bulk. What must not change: a failing import writes nothing, a failing migration leaves
the file as it was, and two processes upgrading one file run each migration once."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pgtest
import pytest
from conftest import ME, Cli

from better_compute.storage import db as dbmod
from better_compute.storage.db import Database, _migrate, migration_script, sqlite_tools
from better_compute.storage.schema import APPLICATION_ID, SCHEMA_VERSION

#: More new nodes than one import step (setup.IMPORT_STEP), so several bulk inserts happen
#: before the failing node is reached.
MANY = 700


def _moves_a_busy_node(run: Cli) -> str:
    """A demo node with a live booking: an import may not move it to another pool."""
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "2h", "--key", "busy")
    return str(rsv["allocations"][0]["nodeId"])


def _state(run: Cli) -> tuple[object, object, object]:
    return run.ok("inventory", "export"), run.ok("events"), run.ok("pool", "list")


def test_a_json_import_refused_after_its_bulk_inserts_writes_nothing(
    run: Cli, db_dir: Path
) -> None:
    busy = _moves_a_busy_node(run)
    before = _state(run)
    fresh = [{"name": f"aa-{i:04d}", "gpus": {"count": 4, "model": "l4"}} for i in range(MANY)]
    doc = {
        "pools": [
            {"name": "aaa-new", "nodes": fresh},
            {"name": "east", "nodes": [{"name": busy, "gpus": {"count": 8, "model": "h100"}}]},
        ],
        "tenants": [{"id": "newcorp"}],
    }
    (db_dir / "inv.json").write_text(json.dumps(doc))
    code, out, err = run("inventory", "import", db_dir / "inv.json", json=False)
    assert (code, out) == (2, "")
    assert err.startswith("error: INVALID_INPUT: pools[1].nodes[0].name"), err
    assert err.count("\n") == 1  # one line
    assert _state(run) == before
    assert run.fails(3, "node", "show", "aa-0000")["code"] == "NOT_FOUND"


def test_an_openb_import_refused_after_its_bulk_inserts_writes_nothing(
    run: Cli, db_dir: Path
) -> None:
    busy = _moves_a_busy_node(run)
    before = _state(run)
    rows = [f"aa-{i:04d},1,1,2,T4" for i in range(MANY)] + [f"{busy},1,1,8,H100"]
    (db_dir / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "\n".join(rows))
    err = run.fails(2, "inventory", "import", "--format", "openb-nodes", db_dir / "nodes.csv")
    assert err["code"] == "INVALID_INPUT"
    assert err["message"].startswith(f"line {MANY + 2} ({busy}): "), err["message"]  # its row
    assert _state(run) == before


def test_a_bulk_import_adds_every_node_and_gpu_as_one_at_a_time_did(run: Cli, db_dir: Path) -> None:
    """New nodes (bulk) and existing ones (updated) in one file: the export is the file."""
    nodes = [
        {
            "name": f"n-{i:04d}",
            "labels": {"rack": f"r{i % 3}"},
            "gpus": {
                "count": 8,
                "model": "a100",
                "nvlinkGroups": 2,
                "fabric": {"cluster": "c9", "clique": i % 4},
            },
        }
        for i in range(MANY)
    ]
    west = run.ok("inventory", "export")["pools"][0]
    doc = {"pools": [west, {"name": "big", "labels": {"tier": "b"}, "nodes": nodes}]}
    (db_dir / "big.json").write_text(json.dumps(doc))
    assert run.ok("inventory", "import", db_dir / "big.json")["nodes"] == 7 + MANY
    exported = run.ok("inventory", "export")
    big = next(p for p in exported["pools"] if p["name"] == "big")
    assert big == {"name": "big", "labels": {"tier": "b"}, "nodes": nodes}
    assert run.ok("pool", "show", "big")["allocatable"] == 8 * MANY
    # a GPU row as the one-at-a-time insert wrote it: healthy, its NVLink group from its index
    gpus = run.ok("node", "show", "n-0005")["gpus"]
    assert [(g["index"], g["nvlinkGroup"], g["health"]) for g in gpus[3:5]] == [
        (3, 0, "healthy"),
        (4, 1, "healthy"),
    ]


# ---------------------------------------------------------------- migrations (SQLite files)


def _version_1_ledger(path: Path) -> None:
    """A ledger file as better-compute 1 left it: migration 1 only."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN")
    sqlite_tools(conn).executescript(migration_script(0))
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO meta(key, value) VALUES ('db_id', 'abc')")
    conn.execute("COMMIT")
    conn.close()


def _schema_and_version(path: Path) -> tuple[list[tuple[object, ...]], int]:
    conn = sqlite3.connect(str(path))
    try:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
        return rows, int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.sqlite_only(reason="SQLite's migration runner on a file")
def test_a_migration_that_fails_midway_leaves_the_file_as_it_was(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script runs inside BEGIN IMMEDIATE, statement by statement: its first statement
    (a new table) is rolled back with the failing second, and the version stays."""
    path = db_dir / "old.db"
    _version_1_ledger(path)
    before = _schema_and_version(path)
    broken = (*dbmod.MIGRATIONS[:1], "CREATE TABLE extra (x INTEGER);\nCREATE TABLE meta (k);")
    monkeypatch.setattr(dbmod, "MIGRATIONS", broken)
    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", 2)
    db = Database(path, 5000)
    try:
        with pytest.raises(sqlite3.OperationalError, match="meta already exists"):
            _migrate(db)
        assert not db.conn.in_transaction
    finally:
        db.close()
    assert _schema_and_version(path) == before


@pytest.mark.sqlite_only(reason="SQLite's migration runner on a file")
def test_a_migration_another_process_ran_meanwhile_is_not_run_again(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes open an old file at once: both read its version before either holds the
    write lock. The one that waited reads it again under the lock and skips what the other ran."""
    path = db_dir / "old.db"
    _version_1_ledger(path)
    first, second = Database(path, 5000), Database(path, 5000)
    try:
        _migrate(first)
        # The second's first read: the version as it was before the first upgraded the file.
        reads = iter([1])
        real = dbmod._user_version
        monkeypatch.setattr(dbmod, "_user_version", lambda conn: next(reads, None) or real(conn))
        _migrate(second)  # without the read under the lock: "table ... already exists"
        assert next(reads, None) is None  # the stale read was used
    finally:
        first.close()
        second.close()
    assert _schema_and_version(path)[1] == SCHEMA_VERSION


# ---------------------------------------------------------------- querying the ledger yourself

README = Path(__file__).resolve().parent.parent / "README.md"


def _readme_queries() -> list[str]:
    """The SQL of the README's `sqlite-utils tour.db "…"` report queries."""
    found = re.findall(r"sqlite-utils tour\.db ([\"'])(.*?)\1", README.read_text(), flags=re.S)
    return [" ".join(sql.split()) for _, sql in found]


def _query(db: Path, sql: str) -> list[tuple[object, ...]]:
    """Run `sql` as a person would with sqlite-utils or psql: straight on the database."""
    if pgtest.active():
        import psycopg

        with psycopg.connect(pgtest.ledger(str(db))) as conn:
            return [tuple(r) for r in conn.execute(sql.encode())]
    conn = sqlite3.connect(str(db))
    try:
        return [tuple(r) for r in conn.execute(sql)]
    finally:
        conn.close()


def test_the_readme_report_queries_run_on_both_backends(run: Cli) -> None:
    """README and docs/postgres.md promise the same text on both: reservations per tenant and
    state, GPU-hours of closed usage windows, events by type and actor."""
    queries = _readme_queries()
    assert len(queries) == 3, queries
    done = run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--key", "a")
    run.ok("tick")  # placed -> binding -> active: its usage window opens
    run.ok("release", done["id"], now="2026-09-28T09:30:00Z")
    run.ok("reserve", "--tenant", "globex", "--gpus", "2", "--for", "1h", "--key", "b")
    held, hours, events = (_query(run.db, sql) for sql in queries)
    assert held == [("globex", "placed", 1, 2)], held
    assert [(t, m, float(h)) for t, m, h in hours] == [("acme", "gpu.h100.hours", 6.0)], hours
    by_type = {(e[0], e[1]): e[2] for e in events}
    assert by_type[("reservation.created", ME)] == 2, events
    assert by_type[("reservation.active", "system")] == 1, events
