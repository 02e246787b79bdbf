"""Benchmark: `reserve` and friends on a large pool that holds many future bookings.

Not part of the test suite. Run from the repository root:

    python benchmarks/bench_reserve.py [--nodes 500 --bookings 20000 --repeat 30]

It builds a database (a pool of N nodes x 8 h100 GPUs in several fabric domains, about half the
GPUs busy now, B future calendar bookings spread over the next 30 days, B/4 released bookings of
the past week), times the service calls a user or the lifecycle makes, then proves that placement
reads only the bookings that overlap its window: it counts the rows the overlap query returns and
prints SQLite's EXPLAIN QUERY PLAN of every bookings query the measured calls actually ran
(captured with a trace callback, so the plans are of the real SQL, not a copy of it).

The bookings are written straight into the tables in one transaction, shaped exactly as
repo.insert_reservation / repo.insert_allocation write them: going through `reserve` 20,000 times
would take far longer than a minute (see the printed per-call figures).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from better_compute.identity import os_user
from better_compute.inventory import parse_inventory
from better_compute.service import booking, setup, ticking, views
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage.db import Database

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a fixed instant so runs compare
GPUS_PER_NODE = 8
HORIZON = 30 * DAY
TENANTS = 10
GPU_CHOICES = (1, 2, 4, 8)
GPU_WEIGHTS = (30, 30, 25, 15)
HOURS_CHOICES = (1, 2, 4, 8, 12, 24)
HOURS_WEIGHTS = (15, 20, 25, 20, 12, 8)


# ---------------------------------------------------------------- building the database


def inventory_doc(nodes: int) -> dict[str, object]:
    """One pool; nodes spread over fabric domains of ~ nodes/10 (at least 5) nodes each."""
    per_domain = max(5, nodes // 10)
    return {
        "pools": [
            {
                "name": "h100",
                "labels": {"site": "bench"},
                "nodes": [
                    {
                        "name": f"n{i:04d}",
                        "labels": {"rack": f"r{i // 20:02d}"},
                        "gpus": {
                            "count": GPUS_PER_NODE,
                            "model": "h100",
                            "fabric": {"cluster": "c1", "clique": i // per_domain},
                        },
                    }
                    for i in range(nodes)
                ],
            }
        ],
        "tenants": [{"id": f"t{t}", "quota": {"gpus": 1_000_000}} for t in range(TENANTS)],
    }


@dataclass
class Counts:
    active: int = 0
    future: int = 0
    history: int = 0
    booking_rows: int = 0
    future_booking_rows: int = 0


class Writer:
    """Rows shaped as repo.insert_reservation / insert_allocation / metering write them."""

    def __init__(self, conn: sqlite3.Connection, pool_id: str) -> None:
        self.conn = conn
        self.pool_id = pool_id
        self.seq = 0
        self.rsv: list[tuple[object, ...]] = []
        self.alloc: list[tuple[object, ...]] = []
        self.book: list[tuple[object, ...]] = []
        self.usage: list[tuple[object, ...]] = []

    def add(
        self,
        rng: random.Random,
        node: str,
        atoms: list[int],
        start: int,
        end: int,
        state: str,
        requested_start: int | None,
    ) -> None:
        self.seq += 1
        rsv_id, alloc_id = f"rsv_b{self.seq:011d}", f"alc_b{self.seq:011d}"
        tenant = f"t{rng.randrange(TENANTS)}"
        spot = int(rng.random() < 0.1)
        gpus = len(atoms)
        params = json.dumps(
            {
                "binding": "device",
                "durationMs": end - start,
                "gang": None,
                "gpus": gpus,
                "models": [],
                "pool": self.pool_id,
                "spot": bool(spot),
                "start": requested_start,
                "topology": None,
                "topologyKey": None,
            },
            sort_keys=True,
        )
        released = state == "released"
        started = start <= NOW
        self.rsv.append(
            (
                rsv_id,
                self.seq,
                tenant,
                self.pool_id,
                "admin",
                state,
                gpus,
                spot,
                end - start,
                requested_start,
                start,
                end,
                gpus,
                params,
                "expired" if released else None,
                start - rng.randrange(1, 72) * HOUR,
                int(started),
                int(started),
            )
        )
        self.alloc.append(
            (alloc_id, rsv_id, node, json.dumps(sorted(atoms)), int(state != "placed"))
        )
        for a in sorted(atoms):
            self.book.append((self.pool_id, node, a, alloc_id, rsv_id, spot, start, end))
        if state == "active":
            meter = "gpu.h100.spot.hours" if spot else "gpu.h100.hours"
            self.usage.append((meter, tenant, rsv_id, alloc_id, gpus, start, None))
        elif released:
            meter = "gpu.h100.spot.hours" if spot else "gpu.h100.hours"
            self.usage.append((meter, tenant, rsv_id, alloc_id, gpus, start, end))

    def flush(self) -> None:
        c = self.conn
        c.executemany(
            "INSERT INTO reservations(id, seq, tenant_id, pool_id, principal, state, gpus, spot,"
            " duration_ms, start, during_start, during_end, quota_charge, params, release_reason,"
            " created_at, lead_checked, start_checked)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            self.rsv,
        )
        c.executemany(
            "INSERT INTO allocations(id, reservation_id, node_id, atoms, bound)"
            " VALUES (?, ?, ?, ?, ?)",
            self.alloc,
        )
        c.executemany(
            "INSERT INTO bookings(pool_id, node_id, atom, allocation_id, reservation_id, spot,"
            " start, end) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            self.book,
        )
        c.executemany(
            "INSERT INTO usage(meter, tenant_id, reservation_id, allocation_id, gpus, start, end)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            self.usage,
        )


def _free(intervals: list[tuple[int, int]], start: int, end: int) -> bool:
    return all(e <= start or s >= end for s, e in intervals)


def populate(db: Database, nodes: int, future: int, seed: int) -> Counts:
    """Active work now, `future` calendar bookings over 30 days, future/4 past released ones."""
    rng = random.Random(seed)
    counts = Counts()
    names = [f"n{i:04d}" for i in range(nodes)]
    booked: dict[tuple[str, int], list[tuple[int, int]]] = {
        (n, a): [] for n in names for a in range(GPUS_PER_NODE)
    }

    def place(start: int, end: int) -> tuple[str, list[int]] | None:
        gpus = rng.choices(GPU_CHOICES, GPU_WEIGHTS)[0]
        for _ in range(20):
            node = rng.choice(names)
            free = [a for a in range(GPUS_PER_NODE) if _free(booked[(node, a)], start, end)]
            if len(free) >= gpus:
                atoms = free[:gpus]
                for a in atoms:
                    booked[(node, a)].append((start, end))
                return node, atoms
        return None

    with db.write() as conn:
        pool_id = str(conn.execute("SELECT id FROM pools WHERE name = 'h100'").fetchone()[0])
        w = Writer(conn, pool_id)
        # About half of every node busy now: active reservations that started in the last 12 h.
        for node in names:
            target, used = rng.randrange(GPUS_PER_NODE + 1), 0
            while used < target:
                gpus = min(rng.choice((1, 2, 4)), target - used)
                start = NOW - rng.randrange(1, 12 * 4) * 15 * MINUTE
                end = NOW + rng.randrange(1, 24 * 4) * 15 * MINUTE
                atoms = list(range(used, used + gpus))
                for a in atoms:
                    booked[(node, a)].append((start, end))
                w.add(rng, node, atoms, start, end, "active", None)
                used += gpus
                counts.active += 1
        # Future calendar bookings, starts uniform over the next 30 days on 15-minute marks.
        while counts.future < future:
            start = NOW + rng.randrange(2, HORIZON // (15 * MINUTE)) * 15 * MINUTE
            end = start + rng.choices(HOURS_CHOICES, HOURS_WEIGHTS)[0] * HOUR
            spot = place(start, end)
            if spot is not None:
                w.add(rng, spot[0], spot[1], start, end, "placed", start)
                counts.future += 1
        # Released history: the past week, kept as truncated bookings (the timeline shows them).
        while counts.history < future // 4:
            end = NOW - rng.randrange(1, 7 * 24 * 4) * 15 * MINUTE
            start = end - rng.choices(HOURS_CHOICES, HOURS_WEIGHTS)[0] * HOUR
            spot = place(start, end)
            if spot is not None:
                w.add(rng, spot[0], spot[1], start, end, "released", start)
                counts.history += 1
        w.flush()
        counts.booking_rows = int(conn.execute("SELECT COUNT(*) FROM bookings").fetchone()[0])
        counts.future_booking_rows = int(
            conn.execute("SELECT COUNT(*) FROM bookings WHERE start > ?", (NOW,)).fetchone()[0]
        )
    return counts


def build(path: str, nodes: int, future: int, seed: int) -> tuple[Database, Counts, float]:
    t0 = time.perf_counter()
    db, _ = setup.init(
        path,
        NOW,
        force=True,
        manual=True,
        admin=os_user(),
        group=None,
        fill=parse_inventory(inventory_doc(nodes)),
    )
    assert isinstance(db, Database)  # a path, so the SQLite ledger
    counts = populate(db, nodes, future, seed)
    return db, counts, time.perf_counter() - t0


# ---------------------------------------------------------------- measuring


def median_p95(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[math.ceil(0.95 * len(ordered)) - 1]


def measure(
    run: Callable[[], object], repeat: int, undo: Callable[[object], None] | None = None
) -> list[float]:
    """Wall times in ms of `repeat` runs after one warm-up; `undo` restores state, untimed."""
    samples = []
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        out = run()
        elapsed = (time.perf_counter() - t0) * 1000
        if undo is not None:
            undo(out)
        if i:
            samples.append(elapsed)
    return samples


def reserve_args(**kw: object) -> ReserveArgs:
    base: dict[str, object] = {"tenant": "t0", "pool": None, "gpus": 4, "duration_ms": 8 * HOUR}
    base.update(kw)
    return ReserveArgs(**base)  # type: ignore[arg-type]


OPERATIONS: dict[str, str] = {
    "reserve": "`reserve --gpus 4 --for 8h` (now)",
    "calendar": "`reserve --gpus 4 --for 8h --start +7d`",
    "preview": "`preview --gpus 4 --for 8h` (now)",
    "gang": "`reserve --gpus 4 --gang 4 --topology-key fabric.domain --for 8h`",
    "tick": "`tick` at a fixed instant (steady state)",
    "timeline": "`timeline` 24 h, 60-min buckets",
    "pool": "`pool show` (rollup)",
    "cli_reserve": "CLI process: `better-compute reserve --gpus 4 --for 8h`",
    "cli_get": "CLI process: `better-compute get RSV` (startup baseline)",
}


@dataclass
class Result:
    samples: dict[str, list[float]]
    states: dict[str, str]
    traces: dict[str, list[str]]


def run_all(db: Database, repeat: int) -> Result:
    samples: dict[str, list[float]] = {}
    states: dict[str, str] = {}
    traces: dict[str, list[str]] = {}

    def cancel(rsv: object) -> None:
        booking.cancel(Ctx(db, NOW), rsv.id)  # type: ignore[attr-defined]

    def reserving(args: ReserveArgs) -> Callable[[], object]:
        return lambda: booking.reserve(Ctx(db, NOW), args)

    calls: dict[str, tuple[Callable[[], object], Callable[[object], None] | None]] = {
        "reserve": (reserving(reserve_args()), cancel),
        "calendar": (reserving(reserve_args(start=NOW + 7 * DAY)), cancel),
        "preview": (lambda: booking.preview(Ctx(db, NOW), reserve_args()), None),
        "gang": (reserving(reserve_args(gang=4, topology_key="fabric.domain")), cancel),
        "tick": (lambda: ticking.tick(Ctx(db, NOW)), None),
        "timeline": (lambda: views.timeline(Ctx(db, NOW), None, None, None, None, 60), None),
        "pool": (lambda: views.pool(Ctx(db, NOW), "h100"), None),
    }
    for name, (run, undo) in calls.items():
        samples[name] = measure(run, repeat, undo)
        # One more, traced: the SQL it ran, for the query plans; and what it produced.
        statements: list[str] = []
        db.conn.set_trace_callback(statements.append)
        try:
            out = run()
        finally:
            db.conn.set_trace_callback(None)
        traces[name] = statements
        if name in ("reserve", "calendar", "gang"):
            states[name] = f"{out.state.value} on {len(out.allocations)} node(s)"  # type: ignore[attr-defined]
            assert undo is not None
            undo(out)
        elif name == "preview":
            states[name] = "fits" if out.fits else "does not fit"  # type: ignore[attr-defined]
        elif name == "tick":
            states[name] = f"{len(out)} event(s)"  # type: ignore[arg-type]
    return Result(samples, states, traces)


def run_cli(db: Database, result: Result, repeat: int) -> None:
    """Whole `better-compute` processes, as a user runs them: startup, import, open, command."""
    exe = shutil.which("better-compute")
    if exe is None:
        return
    base = [exe, "--db", str(db.path), "--now", "2026-01-01T00:00:00Z", "--json"]

    def cli(*argv: str) -> object:
        out = subprocess.run([*base, *argv], capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def cancel(doc: object) -> None:
        booking.cancel(Ctx(db, NOW), doc["id"])  # type: ignore[index]

    reserve = ("reserve", "--tenant", "t0", "--gpus", "4", "--for", "8h")
    result.samples["cli_reserve"] = measure(lambda: cli(*reserve), repeat, cancel)
    result.samples["cli_get"] = measure(lambda: cli("get", "rsv_b00000000001"), repeat)
    result.states["cli_reserve"] = "placed"


# ---------------------------------------------------------------- proving "does not load them all"

SNAPSHOT_SQL = (
    "SELECT b.node_id, b.atom, b.reservation_id, b.spot, r.state FROM bookings b"
    " JOIN reservations r ON r.id = b.reservation_id"
    " WHERE b.pool_id = ? AND b.end > ? AND b.start < ? AND b.reservation_id IS NOT ?"
)


def window_rows(db: Database, start: int, end: int) -> tuple[int, int]:
    """(rows the snapshot overlap query returns, index entries its range visits)."""
    conn = db.conn
    pool_id = conn.execute("SELECT id FROM pools").fetchone()[0]
    returned = len(conn.execute(SNAPSHOT_SQL, (pool_id, start, end, None)).fetchall())
    visited = conn.execute(
        "SELECT COUNT(*) FROM bookings WHERE pool_id = ? AND end > ?", (pool_id, start)
    ).fetchone()[0]
    return returned, int(visited)


# First match wins: the rollup queries also join reservations, so they come first.
LABELS = (
    ("rollup reserved (views.rollup)", "NOT EXISTS"),
    ("rollup in use (views.rollup)", "b.start <= "),
    ("snapshot overlap (repo.snapshots)", "b.reservation_id IS NOT"),
    ("commit clash check (placing.commit)", "SELECT COUNT(*) FROM bookings WHERE node_id"),
    ("timeline spans (repo.booking_spans)", "SELECT node_id, atom, start, end FROM bookings"),
    ("tick: due releases", "during_end <="),
    ("tick: due repairs / bindings", "state = 'placed' AND during_start <="),
    ("quota held (admission.check_quota)", "SUM(quota_charge)"),
)
_NUMBER = re.compile(r"\b\d+\b|'[^']*'|\bNULL\b")


def label_of(sql: str) -> str | None:
    return next((label for label, marker in LABELS if marker in sql), None)


@dataclass
class PlanReport:
    label: str
    ops: list[str]
    sql: str
    plan: list[str]
    full_scan: bool


def query_plans(db: Database, traces: dict[str, list[str]]) -> list[PlanReport]:
    """EXPLAIN QUERY PLAN of each distinct SELECT the measured calls ran on bookings or on
    reservations by state/window; one line per query shape (literals ignored)."""
    seen: dict[str, PlanReport] = {}
    for op, statements in traces.items():
        for sql in statements:
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            label = label_of(sql)
            if label is None and "bookings" not in sql:
                continue
            shape = _NUMBER.sub("?", sql)
            if shape in seen:
                if op not in seen[shape].ops:
                    seen[shape].ops.append(op)
                continue
            rows = db.conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
            plan = [str(r[3]) for r in rows]
            full = any(re.match(r"SCAN (b|c|r|bookings|reservations)\b", p) for p in plan)
            seen[shape] = PlanReport(label or "other", [op], sql, plan, full)
    order = [label for label, _ in LABELS] + ["other"]
    return sorted(seen.values(), key=lambda p: (order.index(p.label), p.sql))


# ---------------------------------------------------------------- reporting


def fmt(ms: float) -> str:
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def table(runs: list[tuple[str, Result]]) -> str:
    """The first configuration's median, p95 and outcome; the others' medians, and the ratio of the
    first median to each of theirs."""
    (big_name, big), others = runs[0], runs[1:]
    head = f"| operation | {big_name} median ms | p95 ms | outcome |"
    head += "".join(f" {name} median ms |" for name, _ in others)
    head += "".join(f" ratio to {name} |" for name, _ in others)
    lines = [head, "|---|---:|---:|---|" + "---:|" * (2 * len(others))]
    for op, label in OPERATIONS.items():
        if op not in big.samples:
            continue
        med, p95 = median_p95(big.samples[op])
        line = f"| {label} | {fmt(med)} | {fmt(p95)} | {big.states.get(op, '')} |"
        theirs = [median_p95(r.samples[op])[0] if op in r.samples else None for _, r in others]
        line += "".join(f" {fmt(m)} |" if m is not None else " – |" for m in theirs)
        line += "".join(f" {med / m:.1f}x |" if m is not None else " – |" for m in theirs)
        lines.append(line)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--bookings", type=int, default=20_000, help="future calendar bookings")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--small-nodes", type=int, default=50, help="the scaling comparison's pool")
    ap.add_argument("--small-bookings", type=int, default=2_000)
    ap.add_argument("--no-compare", action="store_true", help="skip the small configuration")
    ap.add_argument("--cli-repeat", type=int, default=5, help="whole-process runs; 0 skips them")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", metavar="DIR", help="keep the databases in DIR")
    opts = ap.parse_args()

    started = time.perf_counter()
    workdir = opts.keep or tempfile.mkdtemp(prefix="bench-reserve-")
    os.makedirs(workdir, exist_ok=True)
    print(f"# bench_reserve: {os.cpu_count()} CPU(s), Python {platform.python_version()},")
    print(f"# SQLite {sqlite3.sqlite_version}, {platform.platform()}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"# load average before the run: {load} (other work on the machine skews timings)")
    print(f"# {' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}\n")

    # The scaling comparison: the same pool with 10x fewer bookings, then both 10x smaller.
    configs = [(opts.nodes, opts.bookings)]
    if not opts.no_compare:
        configs.append((opts.nodes, opts.small_bookings))
        configs.append((opts.small_nodes, opts.small_bookings))
    results: dict[tuple[int, int], Result] = {}
    big_db: Database | None = None
    for nodes, future in configs:
        path = os.path.join(workdir, f"bench-{nodes}x{future}.db")
        db, counts, build_s = build(path, nodes, future, opts.seed)
        print(
            f"built {nodes} nodes x {GPUS_PER_NODE} GPUs in {build_s:.1f} s (direct SQL):"
            f" {counts.future} future + {counts.active} active + {counts.history} released"
            f" reservations; {counts.booking_rows} booking rows"
            f" ({counts.future_booking_rows} start in the future)"
        )
        for label, (start, end) in {
            "now, 8 h": (NOW, NOW + 8 * HOUR),
            "+7 d, 8 h": (NOW + 7 * DAY, NOW + 7 * DAY + 8 * HOUR),
        }.items():
            returned, visited = window_rows(db, start, end)
            if (nodes, future) == configs[0]:  # the case: far fewer than all of them
                assert returned < 0.1 * counts.booking_rows, "the overlap query loads too much"
            print(
                f"  overlap query, window {label}: returns {returned} of {counts.booking_rows}"
                f" booking rows ({100 * returned / counts.booking_rows:.1f}%); its index range"
                f" (pool_id, end > from) visits {visited} index entries"
            )
        results[(nodes, future)] = run_all(db, opts.repeat)
        if (nodes, future) == configs[0]:
            if opts.cli_repeat > 0:
                run_cli(db, results[(nodes, future)], opts.cli_repeat)
            big_db = db
        else:
            db.close()

    big = results[configs[0]]
    big_name = f"{configs[0][0]}n/{configs[0][1]}b"
    runs = [(f"{n}n/{b}b", results[(n, b)]) for n, b in configs]
    print(
        f"\n## Results ({opts.repeat} timed runs each after one warm-up;"
        f" CLI processes {opts.cli_repeat})\n"
    )
    print(table(runs))
    print("\n(n = nodes of 8 GPUs, b = future bookings; ratios are of medians)")

    assert big_db is not None
    plans = query_plans(big_db, big.traces)
    print(f"\n## Query plans ({big_name}, captured from the calls above)\n")
    scans = []
    for p in plans:
        flag = "  <-- FULL SCAN" if p.full_scan else ""
        print(f"{p.label} [{', '.join(p.ops)}]{flag}")
        for line in p.plan:
            print(f"    {line}")
        if p.full_scan:
            scans.append(p)
    big_db.close()
    if not opts.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ntotal benchmark time {time.perf_counter() - started:.0f} s")
    must_search = [p for p in plans if "bookings" in p.sql and p.label != "other"]
    for p in must_search:
        assert any("USING" in line and "INDEX" in line for line in p.plan), p.label
    if scans:
        print("FAILED: full table scans:", ", ".join(p.label for p in scans))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
