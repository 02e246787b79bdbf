"""Issue 8, replay: every statement `simulate` runs per request or per tick searches an index.

A replay runs them tens of thousands of times, so a full scan of a growing table (bookings,
reservations, events, usage) would make a long replay quadratic. The report's queries run once
per replay, after it, and are left out.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

from conftest import ME
from test_fleet_memory import T0, _node

from better_compute.inventory import parse_inventory
from better_compute.model import Principal
from better_compute.service import setup, simulate
from better_compute.service.context import Ctx
from better_compute.storage import simulation as store
from better_compute.storage.db import Database

FULL_SCAN = re.compile(r"\bSCAN (?!CONSTANT)")
#: The report, read once after the replay, and the set-up before it.
ONCE = ("seq BETWEEN", "FROM events WHERE seq > ? AND reservation_id IS NOT NULL AND type IN")
WHOLE_TABLE_OK = ("FROM config", "FROM meta", "FROM pools", "FROM tenants", "FROM admins")


def _replayed(db_dir: Path) -> tuple[Database, list[str]]:
    """A contended replay of twelve requests (some wait, some preempt spot work, some start
    later), with every statement it ran."""
    path = db_dir / "q.db"
    db = setup.init(str(path), T0, force=True, manual=True, admin=ME, group=None)[0]
    doc = {"pools": [{"name": "p", "nodes": [_node(f"n{i}") for i in range(3)]}]}
    setup.inventory_import(Ctx(db, T0), parse_inventory(doc))
    lines = []
    for k in range(12):  # contended: some wait, some preempt spot work, some start later
        line = {"at": T0 + k * 60_000, "tenant": "acme", "gpus": 2 + 2 * (k % 4), "duration": "2h"}
        if k % 3 == 0:
            line["spot"] = True
        if k % 5 == 4:
            line["start"] = T0 + (k + 30) * 60_000
        lines.append(json.dumps(line) + "\n")
    (db_dir / "w.jsonl").write_text("".join(lines))
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)
    ctx = Ctx(db, T0, who=Principal(ME, admin=True))
    report = simulate.simulate(ctx, str(db_dir / "w.jsonl"), "jsonl", Fraction(1))
    db.conn.set_trace_callback(None)
    assert report.placed_after_waiting and report.cut_back + report.requeued  # every path ran
    return db, statements


def test_every_statement_of_a_replay_searches_an_index(db_dir: Path) -> None:
    db, statements = _replayed(db_dir)
    plans = {}
    for sql in sorted({s for s in statements if s.lstrip().upper().startswith(("SELECT", "WITH"))}):
        if any(marker in sql for marker in ONCE + WHOLE_TABLE_OK):
            continue
        plans[sql] = [str(r[3]) for r in db.conn.execute("EXPLAIN QUERY PLAN " + sql)]
    assert len(plans) > 30
    scans = {sql: p for sql, p in plans.items() if any(FULL_SCAN.search(x) for x in p)}
    assert scans == {}, json.dumps(scans, indent=1)
    db.close()


def test_a_replay_reads_the_ledgers_id_and_settings_once(db_dir: Path) -> None:
    """Every request seeds its pick with the ledger's id (Ctx.seed), which never changes, and
    reads settings the replay never writes (storage/settled.py): with no other process writing,
    each is read once, not once per request."""
    db, statements = _replayed(db_dir)
    for start in (
        "SELECT value FROM meta WHERE key = 'db_id'",
        "SELECT principal FROM admins",
        "SELECT * FROM pools ORDER BY name",
        "SELECT 1 FROM tenants WHERE id = ",
        "SELECT pool_id, gpus FROM quotas WHERE tenant_id",
        "SELECT pool_id, gpu_ms, period_ms FROM budgets",
        "SELECT pool_id, min_duration_ms",
        "SELECT model FROM atoms WHERE node_id",
        "SELECT auto_bind FROM pools",
    ):
        reads = [s for s in statements if s.startswith(start)]
        # At most once more in the set-up before the replay (its pools and tenants checked and
        # created); a node's model once per node (the pool has three).
        limit = 3 if "atoms" in start else 2
        assert 1 <= len(reads) <= limit, (start, len(reads))
    db.close()


def test_what_is_due_next_is_a_seek_per_state(db_dir: Path) -> None:
    db = setup.init(str(db_dir / "d.db"), T0, force=True, manual=True, admin=ME, group=None)[0]
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)
    store.next_due(db.conn, T0, 15 * 60_000, 3_600_000, 2_400_000)
    db.conn.set_trace_callback(None)
    plan = " | ".join(str(r[3]) for r in db.conn.execute("EXPLAIN QUERY PLAN " + statements[-1]))
    for index in ("reservations_ends", "reservations_deadlines", "reservations_retries"):
        assert index in plan, plan
    # The lead time is a seek on the starts, not a walk over every placed reservation.
    assert "reservations_starts (state=? AND during_start>?)" in plan, plan
    plan = " | ".join(
        str(r[3])
        for r in db.conn.execute(
            "EXPLAIN QUERY PLAN UPDATE usage SET end = 1 WHERE reservation_id = 'r' AND end IS NULL"
        )
    )
    assert "usage_open" in plan, plan
    db.close()
