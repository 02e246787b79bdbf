"""Several processes on one database file: they queue on the write lock instead of double-booking.

- Six CLI processes reserve at once, repeatedly, in a pool that cannot hold them all: every one
  exits 0 (placed or pending) or 7 (UNAVAILABLE), never anything else; every reservation printed is
  in the database; no atom is booked twice for overlapping time.
- The same with six service-layer processes that each reserve many times in a tight loop.
- A process killed with SIGKILL in the middle of a large write transaction leaves a database that
  opens, passes `PRAGMA integrity_check`, holds none of the half-written rows, and takes a reserve.
- A lock held longer than `db.busyTimeoutMs` makes a reserve exit 7 with `error: UNAVAILABLE:`
  quickly, and it writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from better_compute.inventory import parse_inventory
from better_compute.service import setup
from better_compute.service.context import Ctx
from better_compute.storage.db import open_database

T0 = 1_790_582_400_000  # 2026-09-28T08:00:00Z
NOW = str(T0)
WORKERS = 6
ROUNDS = 2
LIVE = ("placed", "binding", "active")

INVENTORY = parse_inventory(
    {
        "pools": [
            {
                "name": "small",
                "nodes": [
                    {
                        "name": f"n{i}",
                        "gpus": {
                            "count": 4,
                            "model": "h100",
                            "nvlinkGroups": 2,
                            "fabric": {"cluster": "c1", "clique": 1},
                        },
                    }
                    for i in range(1, 4)
                ],
            }
        ],
        "tenants": [{"id": "acme"}, {"id": "globex"}],
    }
)

pytestmark = pytest.mark.sqlite_only(
    reason="processes sharing one SQLite file (PostgreSQL: test_postgres_concurrency)"
)


def _cli() -> list[str]:
    exe = shutil.which("better-compute")
    if exe is not None:
        return [exe]
    return [sys.executable, "-c", "from better_compute.cli import main; main()"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env["COLUMNS"] = "100"
    return env


def run_cli(
    db: Path, *args: str, now: str = NOW, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_cli(), "--db", str(db), "--now", now, *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout,
    )


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "shared.db"
    db = setup.init(str(path), T0, force=True, manual=True, admin="admin", group=None)[0]
    setup.inventory_import(Ctx(db, T0), INVENTORY)
    db.close()
    return path


@contextmanager
def readonly(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        yield conn
    finally:
        conn.close()


def double_bookings(path: Path) -> list[tuple[Any, ...]]:
    marks = ",".join("?" * len(LIVE))
    with readonly(path) as conn:
        return conn.execute(
            "SELECT a.node_id, a.atom, a.reservation_id, b.reservation_id FROM bookings a"
            " JOIN reservations ra ON ra.id = a.reservation_id"
            " JOIN bookings b ON b.node_id = a.node_id AND b.atom = a.atom AND b.id > a.id"
            " JOIN reservations rb ON rb.id = b.reservation_id"
            f" WHERE a.start < b.end AND b.start < a.end AND ra.state IN ({marks})"
            f" AND rb.state IN ({marks})",
            (*LIVE, *LIVE),
        ).fetchall()


def states(path: Path) -> dict[str, str]:
    with readonly(path) as conn:
        return dict(conn.execute("SELECT id, state FROM reservations").fetchall())


def table_counts(path: Path) -> dict[str, int]:
    with readonly(path) as conn:
        return {
            t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("reservations", "allocations", "bookings", "events", "meta")
        }


# ---------------------------------------------------------------- many writers at once


def _reserve_args(worker: int, round_: int) -> list[str]:
    """A mix: single-node shares, gangs on fabric.domain, later windows, spot."""
    args = ["--json", "reserve", "--tenant", "acme" if worker % 2 else "globex", "--for", "2h"]
    args += ["--key", f"w{worker}-r{round_}"]
    if worker % 3 == 0:
        args += ["--gpus", "2", "--gang", "2", "--topology-key", "fabric.domain"]
    else:
        args += ["--gpus", str(1 + (worker + round_) % 4)]
    if round_ == 1:
        args += ["--start", "+30m"]
    if worker == 5:
        args += ["--spot"]
    return args


def test_concurrent_cli_reserves_never_double_book(db_path: Path) -> None:
    def worker(i: int) -> list[subprocess.CompletedProcess[str]]:
        return [run_cli(db_path, *_reserve_args(i, r)) for r in range(ROUNDS)]

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        results = [p for batch in pool.map(worker, range(WORKERS)) for p in batch]

    printed = []
    for proc in results:
        assert proc.returncode in (0, 7), f"exit {proc.returncode}: {proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr
        if proc.returncode == 7:
            assert proc.stdout == ""
            assert json.loads(proc.stderr)["error"]["code"] == "UNAVAILABLE"
            continue
        doc = json.loads(proc.stdout)  # exactly one document
        assert doc["state"] in ("placed", "pending"), doc
        printed.append(doc)
    in_db = states(db_path)
    for doc in printed:
        assert in_db.get(doc["id"]) == doc["state"], f"{doc['id']} printed but not stored as such"
    assert len(in_db) == len(printed), "a failed process left a reservation behind"
    assert len({d["id"] for d in printed}) == len(printed)
    assert any(d["state"] == "pending" for d in printed), "the pool was meant to overflow"
    assert any(d["state"] == "placed" for d in printed)
    assert double_bookings(db_path) == []


SERVICE_WORKER = textwrap.dedent(
    """
    import json, sys
    from better_compute.errors import BetterComputeError, Conflict
    from better_compute.service import booking, ticking
    from better_compute.service.booking import ReserveArgs
    from better_compute.service.context import open_ctx

    path, worker, now = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for k in range(int(sys.argv[4])):
        at = now + k * 60_000
        try:
            # One connection at a time, closed before the next open, as the CLI does.
            ctx = open_ctx(path, str(at), "admin", None)
        except BetterComputeError as exc:
            print(json.dumps({"error": exc.code, "exit": exc.exit_code}), flush=True)
            if exc.exit_code != 7:
                sys.exit(exc.exit_code)
            continue
        try:
            if k % 5 == 4:
                ticking.tick(ctx)
                print(json.dumps({"tick": at}), flush=True)
                continue
            gang = 2 if (worker + k) % 4 == 0 else None
            args = ReserveArgs(
                tenant="acme" if worker % 2 else "globex", pool=None, gpus=1 + (worker + k) % 3,
                duration_ms=3_600_000, gang=gang, start=at + (k % 3) * 600_000 if k % 3 else None,
                spot=(worker + k) % 5 == 0, key=f"s{worker}-{k}",
            )
            rsv = booking.reserve(ctx, args)
            print(json.dumps({"id": rsv.id, "state": rsv.state.value}), flush=True)
            if k % 4 == 3 and rsv.state.value in ("pending", "placed"):
                try:
                    booking.cancel(ctx, rsv.id)
                    print(json.dumps({"cancelled": rsv.id}), flush=True)
                except Conflict:  # another worker's tick moved it on meanwhile: it has started
                    print(json.dumps({"started": rsv.id}), flush=True)
        except BetterComputeError as exc:
            print(json.dumps({"error": exc.code, "exit": exc.exit_code}), flush=True)
            if exc.exit_code != 7:
                sys.exit(exc.exit_code)
        finally:
            ctx.db.close()
    """
)


def test_concurrent_service_writers_never_double_book(db_path: Path, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(SERVICE_WORKER)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(db_path), str(w), NOW, "15"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for w in range(WORKERS)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    created: dict[str, str] = {}
    cancelled: set[str] = set()
    started: set[str] = set()
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, f"exit {proc.returncode}: {err}{out}"
        for line in out.splitlines():
            doc = json.loads(line)
            if "id" in doc:
                created[doc["id"]] = doc["state"]
            elif "cancelled" in doc:
                cancelled.add(doc["cancelled"])
            elif "started" in doc:
                started.add(doc["started"])
            elif "error" in doc:
                assert doc["exit"] == 7, doc
    in_db = states(db_path)
    for rid in started:  # a cancel refused because it had started: it did start
        assert in_db[rid] in ("binding", "active", "released"), (rid, in_db[rid])
    assert set(created) == set(in_db), "printed reservations and stored ones differ"
    for rid in cancelled:
        assert in_db[rid] == "released"
    assert "pending" in created.values() and "placed" in created.values()
    assert double_bookings(db_path) == []


# ---------------------------------------------------------------- a writer killed mid-write

HALF_WRITER = textwrap.dedent(
    """
    import sys, time
    from better_compute.storage.db import open_database

    db = open_database(sys.argv[1])
    db.conn.execute("PRAGMA cache_size = 5")  # spill uncommitted pages into the WAL file
    with db.write():
        pool = db.conn.execute("SELECT id FROM pools").fetchone()[0]
        db.conn.execute(
            "INSERT INTO reservations(id, seq, tenant_id, pool_id, principal, state, gpus,"
            " duration_ms, quota_charge, params, created_at)"
            " VALUES ('rsv_halfwritten', 999, 'acme', ?, 'admin', 'placed', 4, 1, 4, '{}', 0)",
            (pool,),
        )
        for i in range(3000):
            db.conn.execute(
                "INSERT INTO events(type, at, tenant_id, reservation_id, data) VALUES"
                " ('reservation.halfwritten', ?, 'acme', 'rsv_halfwritten', ?)",
                (i, "x" * 500),
            )
        print("writing", flush=True)
        time.sleep(60)
    """
)


def _wait_for_line(proc: subprocess.Popen[str], want: str, timeout: float = 30) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline()
    while line.strip() != want:
        assert proc.poll() is None, (
            f"helper exited {proc.returncode}: {proc.stderr and proc.stderr.read()}"
        )
        assert time.monotonic() < deadline, "helper never got ready"
        line = proc.stdout.readline()


def test_a_writer_killed_mid_write_leaves_a_sound_database(db_path: Path, tmp_path: Path) -> None:
    script = tmp_path / "half.py"
    script.write_text(HALF_WRITER)
    before = table_counts(db_path)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        _wait_for_line(proc, "writing")
        wal = Path(str(db_path) + "-wal")
        assert wal.exists() and wal.stat().st_size > 100_000, "the write never reached the WAL"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    with readonly(db_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert (
            conn.execute("SELECT 1 FROM reservations WHERE id = 'rsv_halfwritten'").fetchone()
            is None
        )
        halves = conn.execute("SELECT COUNT(*) FROM events WHERE type = 'reservation.halfwritten'")
        assert halves.fetchone()[0] == 0
    assert table_counts(db_path) == before

    done = run_cli(db_path, "--json", "reserve", "--tenant", "acme", "--gpus", "4", "--for", "1h")
    assert done.returncode == 0, done.stderr
    rsv = json.loads(done.stdout)
    assert rsv["state"] == "placed"
    assert states(db_path) == {rsv["id"]: "placed"}
    with readonly(db_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# ---------------------------------------------------------------- a lock held too long

LOCK_HOLDER = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(60)
    """
)


def test_a_lock_past_the_busy_timeout_is_unavailable(db_path: Path, tmp_path: Path) -> None:
    db = open_database(str(db_path))
    setup.config_set(Ctx(db, T0), "db.busyTimeoutMs", "200")
    db.close()
    before = table_counts(db_path)

    script = tmp_path / "lock.py"
    script.write_text(LOCK_HOLDER)
    holder = subprocess.Popen(
        [sys.executable, str(script), str(db_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        _wait_for_line(holder, "locked")
        started = time.monotonic()
        human = run_cli(db_path, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
        as_json = run_cli(
            db_path, "--json", "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"
        )
        took = time.monotonic() - started
        assert holder.poll() is None, "the lock holder died early"
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.communicate(timeout=30)

    assert human.returncode == 7, human.stderr
    assert human.stdout == ""
    assert human.stderr.startswith("error: UNAVAILABLE: "), human.stderr
    assert "Traceback" not in human.stderr
    assert as_json.returncode == 7, as_json.stderr
    assert as_json.stdout == ""
    assert json.loads(as_json.stderr)["error"]["code"] == "UNAVAILABLE"
    assert took < 20, f"a 200 ms busy timeout took {took:.1f}s to give up"
    assert table_counts(db_path) == before, "a refused reserve wrote something"

    # Once the lock is gone, the same request goes through.
    done = run_cli(db_path, "--json", "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
    assert done.returncode == 0, done.stderr
