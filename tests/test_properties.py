"""Properties of the real service layer on a temporary database, over random operation sequences.

Each example builds a fresh database (six 4-GPU nodes: three in fabric domain c1.1, two in c1.2,
one with no fabric; tenants acme without quota and beta with 16 GPUs) and applies a sequence of
reserve (now or later, spot or not, gangs of 2-3 with or without --topology-key fabric.domain,
node leases), cancel, release, extend, tick and plain waits at non-decreasing times.

(a) no atom is ever booked twice for overlapping time, and every live reservation's bookings are
    exactly its allocations over its window;
(b) the same operations on two fresh databases with the same seed give identical output;
(c) tick is idempotent at a fixed time;
(d) a gang is all or nothing, on distinct nodes sharing the topology value;
(e) `tick --until` is the same as ticking at every step.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from better_compute.errors import Conflict, QuotaExceeded
from better_compute.inventory import parse_inventory
from better_compute.model import LIVE_STATES, State
from better_compute.render.json import event as event_json
from better_compute.render.json import reservation as reservation_json
from better_compute.service import booking, setup, ticking
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage import repo
from better_compute.storage.db import Database, open_database

T0 = 1_790_582_400_000  # 2026-09-28T08:00:00Z
SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN


def _node(name: str, clique: int | None, rack: str) -> dict[str, Any]:
    gpus: dict[str, Any] = {"count": 4, "model": "h100", "nvlinkGroups": 2}
    if clique is not None:
        gpus["fabric"] = {"cluster": "c1", "clique": clique}
    return {"name": name, "labels": {"rack": rack}, "gpus": gpus}


INVENTORY = parse_inventory(
    {
        "pools": [
            {
                "name": "p",
                "nodes": [
                    _node("n1", 1, "r1"),
                    _node("n2", 1, "r1"),
                    _node("n3", 1, "r2"),
                    _node("n4", 2, "r2"),
                    _node("n5", 2, "r2"),
                    _node("n6", None, "r1"),
                ],
            }
        ],
        "tenants": [{"id": "acme"}, {"id": "beta", "quota": {"gpus": 16}}],
    }
)

EXPECTED_ERRORS = (Conflict, QuotaExceeded)
DUMPED_TABLES = ("reservations", "allocations", "bookings", "usage", "events", "meta")

# ---------------------------------------------------------------- operations


@dataclass(frozen=True)
class Reserve:
    tenant: str
    gpus: int | None
    duration_ms: int
    start_in: int | None  # ms after the current instant; None = now
    spot: bool = False
    gang: int | None = None
    topology_key: str | None = None
    topology: str | None = None
    node_lease: bool = False


@dataclass(frozen=True)
class Cancel:
    index: int


@dataclass(frozen=True)
class Release:
    index: int


@dataclass(frozen=True)
class Extend:
    index: int
    by_ms: int


@dataclass(frozen=True)
class Tick:
    advance_ms: int


@dataclass(frozen=True)
class Wait:
    """Time passes without a tick (cron did not run)."""

    advance_ms: int


Op = Reserve | Cancel | Release | Extend | Tick | Wait

DURATIONS = st.sampled_from([10 * MIN, 30 * MIN, HOUR, 2 * HOUR])
STARTS = st.sampled_from([None, None, 1 * MIN, 10 * MIN, 20 * MIN, HOUR, 3 * HOUR])
ADVANCES = st.sampled_from([0, 30 * SEC, 2 * MIN, 5 * MIN, 16 * MIN, HOUR, 3 * HOUR])


@st.composite
def reserves(draw: st.DrawFn) -> Reserve:
    tenant = draw(st.sampled_from(["acme", "acme", "beta"]))
    duration, start_in = draw(DURATIONS), draw(STARTS)
    kind = draw(st.sampled_from(["single", "single", "single", "gang", "gang", "lease"]))
    if kind == "lease":
        gpus = draw(st.sampled_from([None, 2, 4]))
        return Reserve(tenant, gpus, duration, start_in, node_lease=True)
    spot = draw(st.booleans())
    if kind == "gang":
        key = draw(st.sampled_from([None, "fabric.domain", "fabric.domain", "rack"]))
        return Reserve(
            tenant,
            draw(st.sampled_from([1, 2, 4, 4])),
            duration,
            start_in,
            spot=spot,
            gang=draw(st.integers(2, 3)),
            topology_key=key,
        )
    gpus = draw(st.sampled_from([1, 2, 3, 4, 4]))
    topology = draw(st.sampled_from([None, None, "nvlink-all"])) if gpus <= 2 else None
    return Reserve(tenant, gpus, duration, start_in, spot=spot, topology=topology)


INDEXES = st.integers(0, 30)
OPS: st.SearchStrategy[Op] = st.one_of(
    reserves(),
    reserves(),
    reserves(),
    reserves(),
    st.builds(Cancel, INDEXES),
    st.builds(Release, INDEXES),
    st.builds(Extend, INDEXES, st.sampled_from([5 * MIN, 30 * MIN, HOUR])),
    st.builds(Tick, ADVANCES),
    st.builds(Tick, ADVANCES),
    st.builds(Wait, st.sampled_from([30 * SEC, 10 * MIN])),
)
SEQUENCES = st.lists(OPS, min_size=6, max_size=30)

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---------------------------------------------------------------- the harness


@dataclass
class Harness:
    """A database at an instant, the reservations created so far, and the output of each op."""

    db: Database
    now: int = T0
    ids: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, path: str) -> Harness:
        db = setup.init(path, T0, force=True, manual=True, admin="admin", group=None)[0]
        setup.inventory_import(Ctx(db, T0), INVENTORY)
        return cls(db)

    def ctx(self) -> Ctx:
        return Ctx(self.db, self.now)

    def _pick(self, index: int) -> str | None:
        return self.ids[index % len(self.ids)] if self.ids else None

    def apply(self, op: Op) -> str:
        """Run one operation; its output (a JSON text, or the expected error) is recorded."""
        try:
            doc = self._run(op)
        except EXPECTED_ERRORS as exc:
            doc = {"error": {"code": exc.code, "message": exc.message}}
        text = json.dumps(doc, sort_keys=True)
        self.outputs.append(text)
        return text

    def _run(self, op: Op) -> Any:
        if isinstance(op, Reserve):
            args = ReserveArgs(
                tenant=op.tenant,
                pool=None,
                gpus=op.gpus,
                duration_ms=op.duration_ms,
                topology=op.topology,
                gang=op.gang,
                topology_key=op.topology_key,
                start=None if op.start_in is None else self.now + op.start_in,
                spot=op.spot,
                node_lease=op.node_lease,
            )
            rsv = booking.reserve(self.ctx(), args)
            self.ids.append(rsv.id)
            return reservation_json(rsv)
        if isinstance(op, (Tick, Wait)):
            self.now += op.advance_ms
            if isinstance(op, Wait):
                return {"now": self.now}
            return [event_json(e) for e in ticking.tick(self.ctx())]
        rsv_id = self._pick(op.index)
        if rsv_id is None:
            return None
        if isinstance(op, Cancel):
            return reservation_json(booking.cancel(self.ctx(), rsv_id))
        if isinstance(op, Release):
            return reservation_json(booking.release(self.ctx(), rsv_id))
        return reservation_json(booking.extend(self.ctx(), rsv_id, op.by_ms))

    def reservations(self) -> list[Any]:
        return booking.list_reservations(self.ctx(), None, None, [])


@contextmanager
def harness() -> Iterator[Harness]:
    with tempfile.TemporaryDirectory(prefix="bc-prop-") as tmp:
        h = Harness.create(str(Path(tmp) / "bc.db"))
        try:
            yield h
        finally:
            h.db.close()


def dump(conn: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the ledger tables, in storage order."""
    return {
        t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY rowid")]
        for t in DUMPED_TABLES
    }


# ---------------------------------------------------------------- invariants

LIVE = tuple(s.value for s in LIVE_STATES)
_OVERLAPS = """
SELECT a.node_id, a.atom, a.reservation_id, a.start, a.end, b.reservation_id, b.start, b.end
FROM bookings a
JOIN reservations ra ON ra.id = a.reservation_id
JOIN bookings b ON b.node_id = a.node_id AND b.atom = a.atom AND b.id > a.id
JOIN reservations rb ON rb.id = b.reservation_id
WHERE a.start < b.end AND b.start < a.end AND a.start < a.end AND b.start < b.end {live}
"""


def double_bookings(conn: sqlite3.Connection, live_only: bool = True) -> list[tuple[Any, ...]]:
    """Pairs of bookings of one atom whose intervals overlap (live reservations only, or all)."""
    marks = ",".join("?" * len(LIVE))
    live = f"AND ra.state IN ({marks}) AND rb.state IN ({marks})" if live_only else ""
    args = (*LIVE, *LIVE) if live_only else ()
    return [tuple(r) for r in conn.execute(_OVERLAPS.format(live=live), args)]


def check_no_double_booking(h: Harness) -> None:
    conn = h.db.conn
    clashes = double_bookings(conn)
    assert not clashes, f"atoms booked twice at once (live reservations): {clashes}"
    # Past bookings of released reservations are history; they must not overlap either.
    clashes = double_bookings(conn, live_only=False)
    assert not clashes, f"atoms booked twice at once (including history): {clashes}"


def check_bookings_match(h: Harness) -> None:
    """A live reservation holds exactly its allocations' atoms over its window; others hold none."""
    conn = h.db.conn
    for rsv in h.reservations():
        rows = sorted(
            tuple(r)
            for r in conn.execute(
                "SELECT node_id, atom, start, end FROM bookings WHERE reservation_id = ?",
                (rsv.id,),
            )
        )
        if rsv.state in LIVE_STATES:
            assert rsv.during is not None and rsv.allocations, rsv
            want = sorted(
                (a.node_id, atom, rsv.during.start, rsv.during.end)
                for a in rsv.allocations
                for atom in a.atoms
            )
            assert rows == want, f"{rsv.id} ({rsv.state}) books {rows}, expected {want}"
        elif rsv.state == State.PENDING:
            assert not rsv.allocations and rsv.during is None, rsv
            assert all(end <= h.now for _, _, _, end in rows), f"pending {rsv.id} holds {rows}"
        else:
            assert all(end <= h.now for _, _, _, end in rows), f"released {rsv.id} holds {rows}"


def check_gangs(h: Harness) -> None:
    nodes = {n.name: n for n in repo.load_nodes(h.db.conn)}
    for rsv in h.reservations():
        if rsv.gang_size is None:
            continue
        allocs = rsv.allocations
        if rsv.state == State.PENDING:
            assert allocs == (), f"pending gang {rsv.id} holds {allocs}"
            continue
        if rsv.state == State.RELEASED and not allocs:
            continue  # released while pending
        assert len(allocs) == rsv.gang_size, f"gang {rsv.id} of {rsv.gang_size} has {allocs}"
        names = [a.node_id for a in allocs]
        assert len(set(names)) == len(names), f"gang {rsv.id} repeats a node: {names}"
        assert all(len(a.atoms) == rsv.gpus for a in allocs), f"gang {rsv.id}: {allocs}"
        if rsv.topology_key is not None:
            values = {nodes[n].label(rsv.topology_key) for n in names}
            assert len(values) == 1 and None not in values, (
                f"gang {rsv.id} spans {rsv.topology_key} values {values} on {names}"
            )


# ---------------------------------------------------------------- properties


@SETTINGS
@given(SEQUENCES)
def test_no_atom_is_ever_booked_twice(ops: list[Op]) -> None:
    """(a) Whatever happens, bookings of live reservations never overlap on one atom."""
    with harness() as h:
        for op in ops:
            h.apply(op)
            check_no_double_booking(h)
            check_bookings_match(h)


@SETTINGS
@given(SEQUENCES)
def test_same_inputs_give_the_same_plan(ops: list[Op]) -> None:
    """(b) Two fresh databases made with the same instant and path replay identically."""
    with tempfile.TemporaryDirectory(prefix="bc-det-") as tmp:
        runs = []
        here = os.getcwd()
        try:
            for name in ("a", "b"):
                folder = Path(tmp) / name
                folder.mkdir()
                os.chdir(folder)  # same relative path, so the same database id
                runs.append(Harness.create("bc.db"))
        finally:
            os.chdir(here)
        first, second = runs
        try:
            for op in ops:
                assert first.apply(op) == second.apply(op), op
            docs = [[json.dumps(reservation_json(r)) for r in h.reservations()] for h in runs]
            assert docs[0] == docs[1]
            assert dump(first.db.conn) == dump(second.db.conn)
        finally:
            first.db.close()
            second.db.close()


@SETTINGS
@given(SEQUENCES, ADVANCES)
def test_tick_is_idempotent_at_a_fixed_time(ops: list[Op], advance: int) -> None:
    """(c) A second tick at the same T returns no events and changes nothing."""
    with harness() as h:
        for op in ops:
            h.apply(op)
        h.now += advance
        ticking.tick(h.ctx())
        before = dump(h.db.conn)
        again = ticking.tick(h.ctx())
        assert again == [], f"second tick at {h.now} changed: {again}"
        assert dump(h.db.conn) == before
        check_no_double_booking(h)


@SETTINGS
@given(SEQUENCES)
def test_a_gang_is_all_or_nothing(ops: list[Op]) -> None:
    """(d) Every gang holds 0 or exactly gang_size allocations on distinct nodes of one value."""
    with harness() as h:
        for op in ops:
            h.apply(op)
            check_gangs(h)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SEQUENCES, st.sampled_from([30 * SEC, 5 * MIN]), st.integers(1, 8))
def test_tick_until_is_ticking_at_every_step(ops: list[Op], step: int, steps: int) -> None:
    """(e) `tick --until` gives the same events and ledger as one tick per step."""
    with harness() as h:
        for op in ops:
            h.apply(op)
        h.db.close()
        with tempfile.TemporaryDirectory(prefix="bc-until-") as tmp:
            copy = Path(tmp) / "copy.db"
            shutil.copy(h.db.path, copy)
            h.db = open_database(str(h.db.path))
            other = open_database(str(copy))
            try:
                until = h.now + step * steps
                together = ticking.tick_until(h.ctx(), until, step)
                one_by_one = []
                for k in range(steps + 1):
                    one_by_one.extend(ticking.tick(Ctx(other, h.now + k * step)))
                assert together == one_by_one
                assert dump(h.db.conn) == dump(other.conn)
            finally:
                other.close()
