"""Spot reservations and preemption with a notice (PRODUCT.md §5.5), through the service layer and
(for tenant privacy) the CLI.

The world: pool `p` with n1 and n2, each 8 h100 GPUs in two NVLink groups of 4, fabric c1.1;
tenants acme and globex; placement.topN = 1; the notice is the default 2 minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import NOW_MS, Cli, at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from better_compute.errors import Conflict
from better_compute.inventory import parse_inventory
from better_compute.model import LIVE_STATES, Event, ReleaseReason, Reservation, State, Window
from better_compute.render import json as js
from better_compute.service import booking, placing, setup, ticking, views
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage import repo

T0 = 1_790_582_400_000  # 2026-09-28T08:00:00Z
SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
NOTICE = 2 * MIN
OTHER = "preempted by a non-spot reservation"


def _node(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "gpus": {
            "count": 8,
            "model": "h100",
            "nvlinkGroups": 2,
            "fabric": {"cluster": "c1", "clique": 1},
        },
    }


class World:
    def __init__(self, path: Path, nodes: tuple[str, ...] = ("n1", "n2")) -> None:
        self.db = setup.init(str(path), T0, force=True, manual=True, admin="admin", group=None)[0]
        self.now = T0
        doc = {
            "pools": [{"name": "p", "nodes": [_node(n) for n in nodes]}],
            "tenants": [
                {"id": "acme", "quota": {"gpus": 1000}},
                {"id": "globex", "quota": {"gpus": 1000}},
            ],
        }
        setup.inventory_import(self.ctx(), parse_inventory(doc))
        setup.config_set(self.ctx(), "placement.topN", "1")

    def ctx(self) -> Ctx:
        return Ctx(self.db, self.now)

    def reserve(
        self, gpus: int | None = 8, tenant: str = "acme", spot: bool = False, **kw: Any
    ) -> Reservation:
        args = {"tenant": tenant, "pool": None, "gpus": gpus, "duration_ms": HOUR, "spot": spot}
        return booking.reserve(self.ctx(), ReserveArgs(**{**args, **kw}))

    def tick(self, instant: int) -> list[Event]:
        self.now = instant
        return ticking.tick(self.ctx())

    def get(self, rsv_id: str) -> Reservation:
        return booking.get(self.ctx(), rsv_id)

    def all(self) -> list[Reservation]:
        return repo.reservations_where(self.db.conn)

    def snapshot(self) -> dict[str, Any]:
        return {r.id: js.reservation(r) for r in self.all()}

    def events(self, type_: str, rsv_id: str | None = None) -> list[Event]:
        rows = repo.events(self.db.conn, tenant=None, reservation=rsv_id, since=None)
        return [e for e in rows if e.type == type_]

    def bookings(self, rsv_id: str | None = None) -> list[tuple[Any, ...]]:
        sql = "SELECT node_id, atom, reservation_id, start, end FROM bookings"
        args: tuple[Any, ...] = ()
        if rsv_id is not None:
            sql += " WHERE reservation_id = ?"
            args = (rsv_id,)
        return [tuple(r) for r in self.db.conn.execute(sql + " ORDER BY id", args)]

    def held(self, tenant: str) -> int:
        return setup.quota_show(self.ctx(), tenant)[0].held


@pytest.fixture
def world(db_dir: Path) -> Iterator[World]:
    w = World(db_dir / "spot.db")
    yield w
    w.db.close()


@pytest.fixture
def one_node(db_dir: Path) -> Iterator[World]:
    w = World(db_dir / "spot1.db", nodes=("n1",))
    yield w
    w.db.close()


def nodes_atoms(rsv: Reservation) -> list[tuple[str, tuple[int, ...]]]:
    return [(a.node_id, a.atoms) for a in rsv.allocations]


# ---------------------------------------------------------------- victim selection


@dataclass(frozen=True)
class Setup:
    tenant: str
    gpus: int
    spot: bool
    where: list[tuple[str, tuple[int, ...]]]  # asserted, so the scenario is what it claims


SCENARIOS = {
    # n1 would be a better fit (it fills the node) but costs two spot jobs; n2 costs one
    "fewest victims beats a better score": (
        [
            Setup("acme", 4, False, [("n1", (0, 1, 2, 3))]),
            Setup("globex", 2, True, [("n1", (4, 5))]),
            Setup("globex", 2, True, [("n1", (6, 7))]),
            Setup("globex", 8, True, [("n2", tuple(range(8)))]),
        ],
        4,
        [3],
        "n2",
    ),
    # one victim either way: the better score (n2, already half used by regular work) wins
    "equal victims: best score, not node name": (
        [
            Setup("globex", 8, True, [("n1", tuple(range(8)))]),
            Setup("acme", 2, False, [("n2", (0, 1))]),
            Setup("globex", 6, True, [("n2", (2, 3, 4, 5, 6, 7))]),
        ],
        4,
        [2],
        "n2",
    ),
    # on one node: the 4-GPU holder alone frees enough, the two 2-GPU holders are spared
    "fewest victims on one node": (
        [
            Setup("acme", 8, False, [("n1", tuple(range(8)))]),
            Setup("globex", 4, True, [("n2", (0, 1, 2, 3))]),
            Setup("globex", 2, True, [("n2", (4, 5))]),
            Setup("globex", 2, True, [("n2", (6, 7))]),
        ],
        4,
        [1],
        "n2",
    ),
    "two victims when nothing less will do": (
        [
            Setup("acme", 8, False, [("n1", tuple(range(8)))]),
            Setup("globex", 4, True, [("n2", (0, 1, 2, 3))]),
            Setup("globex", 4, True, [("n2", (4, 5, 6, 7))]),
        ],
        8,
        [1, 2],
        "n2",
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_victim_selection(world: World, name: str) -> None:
    setups, gpus, victims, node = SCENARIOS[name]
    made = []
    for s in setups:
        rsv = world.reserve(s.gpus, tenant=s.tenant, spot=s.spot)
        assert nodes_atoms(rsv) == s.where, (s, nodes_atoms(rsv))
        made.append(rsv)
    before = world.snapshot()
    rsv = world.reserve(gpus)
    assert rsv.state == State.PLACED
    assert rsv.during == Window(T0 + NOTICE, T0 + NOTICE + HOUR)
    assert [a.node_id for a in rsv.allocations] == [node]
    after = world.snapshot()
    changed = sorted(rid for rid in before if before[rid] != after[rid])
    assert changed == sorted(made[i].id for i in victims)
    for i in victims:
        v = world.get(made[i].id)
        assert v.during == Window(T0, T0 + NOTICE)
        assert v.preempt_deadline == T0 + NOTICE


# ---------------------------------------------------------------- cut back or requeue

TR = T0 + HOUR  # when the regular request arrives
DEADLINE = TR + NOTICE

CASES = {
    "active": (None, True),
    "starts before the deadline": (TR + MIN, True),
    "starts 1 ms before the deadline": (DEADLINE - 1, True),
    "starts at the deadline": (DEADLINE, False),
    "starts after the deadline": (TR + HOUR, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cut_back_or_requeue_on_each_side_of_the_deadline(one_node: World, case: str) -> None:
    w = one_node
    start, cut = CASES[case]
    victim = w.reserve(8, tenant="globex", spot=True, duration_ms=4 * HOUR, start=start)
    w.tick(T0)
    vstart = T0 if start is None else start
    assert w.get(victim.id).state == (State.ACTIVE if start is None else State.PLACED)
    w.now = TR
    regular = w.reserve(8, tenant="acme", duration_ms=3 * HOUR)
    assert regular.state == State.PLACED
    assert regular.during == Window(DEADLINE, DEADLINE + 3 * HOUR)
    v = w.get(victim.id)
    if cut:
        assert v.state in LIVE_STATES
        assert v.during == Window(vstart, DEADLINE)
        assert v.preempt_deadline == DEADLINE
        assert [(c.type, c.reason, c.message) for c in v.conditions] == [
            ("Preempted", "SpotPreempted", OTHER)
        ]
        [ev] = w.events("reservation.preempting", victim.id)
        assert ev.data == {"at": DEADLINE} and ev.at == TR
        assert w.events("reservation.preempted", victim.id) == []
        assert {b[4] for b in w.bookings(victim.id)} == {DEADLINE}
        assert w.held("globex") == 8
        with pytest.raises(Conflict):
            booking.extend(w.ctx(), victim.id, HOUR)

        w.tick(DEADLINE - 1)
        assert w.get(victim.id).state != State.RELEASED
        assert w.get(regular.id).state == State.PLACED
        w.tick(DEADLINE)
        v = w.get(victim.id)
        assert v.state == State.RELEASED and v.release_reason == ReleaseReason.PREEMPTED
        assert w.held("globex") == 0  # refunded
        [rel] = w.events("reservation.released", victim.id)
        assert rel.at == DEADLINE and rel.data == {"reason": "preempted"}
        assert w.get(regular.id).state == State.ACTIVE
    else:
        assert v.state == State.PENDING
        assert v.during is None and v.allocations == ()
        assert [(c.type, c.reason, c.message) for c in v.conditions] == [
            ("Unschedulable", "SpotPreempted", OTHER)
        ]
        assert v.quota_charge == 8 and w.held("globex") == 8  # keeps its quota
        [ev] = w.events("reservation.preempted", victim.id)
        assert ev.data == {"requeued": True}
        assert w.events("reservation.preempting", victim.id) == []
        assert w.bookings(victim.id) == []
        assert v.next_attempt_at == TR + 30 * SEC
        # it retries every 30 s, quietly, like any pending reservation
        for k in (1, 2, 3):
            w.tick(TR + k * 30 * SEC)
            again = w.get(victim.id)
            assert again.state == State.PENDING
            assert again.next_attempt_at == TR + (k + 1) * 30 * SEC
            assert again.conditions[0].reason == "SpotPreempted"
        assert len(w.events("reservation.pending", victim.id)) <= 1
        # once the regular work is gone, a retry places it again
        w.tick(DEADLINE)
        booking.release(w.ctx(), regular.id)
        w.tick(DEADLINE + 30 * SEC)
        placed = w.get(victim.id)
        assert placed.state in LIVE_STATES
        assert placed.during is not None
        if start is not None and start > w.now:
            assert placed.during == Window(start, start + 4 * HOUR)
    # from the deadline on, nothing is held twice
    assert _double_bookings(w) == []


def test_same_tenant_notice_names_the_preempting_reservation(one_node: World) -> None:
    w = one_node
    active = w.reserve(4, tenant="globex", spot=True)  # [T0, T0+1h)
    later = w.reserve(4, tenant="globex", spot=True, start=T0 + HOUR)  # [T0+1h, T0+2h)
    w.tick(T0)
    assert w.get(active.id).state == State.ACTIVE
    regular = w.reserve(8, tenant="globex", duration_ms=2 * HOUR)
    assert regular.state == State.PLACED
    rid = regular.id
    cut = w.get(active.id)
    assert [(c.type, c.reason, c.message) for c in cut.conditions] == [
        ("Preempted", "SpotPreempted", f"preempted by {rid}")
    ]
    assert [e.data for e in w.events("reservation.preempting", active.id)] == [
        {"at": T0 + NOTICE, "by": rid}
    ]
    requeued = w.get(later.id)
    assert requeued.state == State.PENDING
    assert [(c.type, c.reason, c.message) for c in requeued.conditions] == [
        ("Unschedulable", "SpotPreempted", f"preempted by {rid}")
    ]
    assert [e.data for e in w.events("reservation.preempted", later.id)] == [
        {"requeued": True, "by": rid}
    ]


def test_gang_preemption_across_several_nodes_in_one_notice(world: World) -> None:
    s1 = world.reserve(8, tenant="globex", spot=True, duration_ms=5 * HOUR)
    s2 = world.reserve(8, tenant="globex", spot=True, duration_ms=5 * HOUR)
    world.tick(T0)
    assert world.get(s1.id).state == world.get(s2.id).state == State.ACTIVE
    world.now = T0 + HOUR
    gang = world.reserve(8, gang=2, topology_key="fabric.domain", duration_ms=HOUR)
    deadline = T0 + HOUR + NOTICE
    assert gang.state == State.PLACED
    assert sorted(a.node_id for a in gang.allocations) == ["n1", "n2"]
    assert gang.during == Window(deadline, deadline + HOUR)
    notices = world.events("reservation.preempting")
    assert sorted(str(e.reservation_id) for e in notices) == sorted([s1.id, s2.id])
    assert {e.at for e in notices} == {T0 + HOUR} and {e.data["at"] for e in notices} == {deadline}
    world.tick(deadline)
    for s in (s1, s2):
        assert world.get(s.id).release_reason == ReleaseReason.PREEMPTED
    assert world.get(gang.id).state == State.ACTIVE
    assert _double_bookings(world) == []


def test_a_spot_gang_is_one_victim_on_every_node(world: World) -> None:
    spot_gang = world.reserve(8, tenant="globex", spot=True, gang=2, duration_ms=5 * HOUR)
    world.tick(T0)
    regular = world.reserve(4)
    assert regular.state == State.PLACED
    cut = world.get(spot_gang.id)
    assert cut.during == Window(T0, T0 + NOTICE)
    assert {b[4] for b in world.bookings(spot_gang.id)} == {T0 + NOTICE}
    assert len(world.events("reservation.preempting", spot_gang.id)) == 1


def test_failure_halfway_leaves_every_spot_reservation_untouched(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    s1 = world.reserve(8, tenant="globex", spot=True, duration_ms=5 * HOUR)  # n1, active
    s2 = world.reserve(8, tenant="acme", spot=True, start=T0 + 10 * MIN)  # n2, later
    world.tick(T0)
    assert world.get(s1.id).state == State.ACTIVE and world.get(s2.id).state == State.PLACED
    before, bookings_before = world.snapshot(), world.bookings()
    last_seq = repo.events(world.db.conn, tenant=None, reservation=None, since=None)[-1].seq
    noticed: list[int] = []

    def lose(ctx: Ctx, *_: object) -> Reservation:
        # by now the victims were given their notice inside the savepoint
        noticed.append(
            ctx.db.conn.execute(
                "SELECT COUNT(*) FROM reservations WHERE preempt_deadline IS NOT NULL"
                " OR conditions LIKE '%SpotPreempted%'"
            ).fetchone()[0]
        )
        raise placing.LostRace("n1")

    monkeypatch.setattr(placing, "commit", lose)
    rsv = world.reserve(8, duration_ms=2 * HOUR)
    monkeypatch.undo()
    assert noticed and noticed[0] >= 1
    assert rsv.state == State.PENDING
    assert rsv.conditions[0].type == "Unschedulable"
    after = world.snapshot()
    del after[rsv.id]
    assert after == before
    assert world.bookings() == bookings_before
    new_events = repo.events(world.db.conn, tenant=None, reservation=None, since=last_seq)
    assert [e.type for e in new_events] == ["reservation.created", "reservation.pending"]


def test_spot_never_preempts(world: World) -> None:
    world.reserve(8, tenant="globex", spot=True)
    world.reserve(8, tenant="globex", spot=True)
    before = world.snapshot()
    rsv = world.reserve(8, tenant="acme", spot=True)
    assert rsv.state == State.PENDING
    assert rsv.conditions[0].reason == "NoCapacity"
    after = world.snapshot()
    del after[rsv.id]
    assert after == before
    assert world.events("reservation.preempting") == []
    # and its retries never preempt either
    world.tick(T0 + 30 * SEC)
    world.tick(T0 + 60 * SEC)
    assert world.events("reservation.preempting") == world.events("reservation.preempted") == []


def test_node_lease_never_preempts(world: World) -> None:
    world.reserve(8, tenant="globex", spot=True)
    world.reserve(8, tenant="globex", spot=True)
    lease = world.reserve(None, node_lease=True)
    assert lease.state == State.PENDING
    assert world.events("reservation.preempting") == []


def test_a_regular_request_that_fits_after_the_notice_without_victims_preempts_nothing(
    one_node: World,
) -> None:
    w = one_node
    w.reserve(8, tenant="globex", spot=True, duration_ms=MIN)  # ends before the deadline
    before = w.snapshot()
    rsv = w.reserve(8)
    assert rsv.state == State.PENDING  # waits; its retry places it once the spot job has ended
    after = w.snapshot()
    del after[rsv.id]
    assert after == before
    w.tick(T0 + MIN)
    w.tick(T0 + 90 * SEC)
    assert w.get(rsv.id).state in LIVE_STATES


def test_a_retry_that_preempts_with_no_notice_releases_its_victim_in_the_same_tick(
    one_node: World,
) -> None:
    """capacity.spotNoticeMs 0: a tick's retry that preempts makes its victim due at the tick's
    own instant. The same tick releases it (before the preempting reservation binds on its
    GPUs), and a second tick at that instant changes nothing (PRODUCT.md §5.4)."""
    w = one_node
    setup.config_set(w.ctx(), "capacity.spotNoticeMs", "0")
    spot = w.reserve(4, tenant="globex", spot=True, duration_ms=6 * HOUR)
    w.reserve(4, duration_ms=HOUR)
    waiting = w.reserve(8)
    assert waiting.state == State.PENDING  # the regular half cannot be preempted
    w.tick(T0)
    w.tick(T0 + HOUR)  # the regular half ends; the retry preempts the spot job from now
    assert w.get(waiting.id).state == State.ACTIVE
    cut = w.get(spot.id)
    assert cut.state == State.RELEASED
    assert cut.release_reason == ReleaseReason.PREEMPTED
    assert cut.during == Window(T0, T0 + HOUR)
    assert w.held("globex") == 0
    released = w.events("reservation.released", spot.id)
    assert [e.at for e in released] == [T0 + HOUR]
    binding = w.events("reservation.binding", waiting.id)
    assert released[0].seq < binding[0].seq
    snap = w.snapshot()
    assert w.tick(T0 + HOUR) == []
    assert w.snapshot() == snap


def test_a_notice_given_is_never_shortened_when_the_notice_is_lowered(one_node: World) -> None:
    """A victim told to stop by its deadline keeps it: after `capacity.spotNoticeMs` is lowered,
    a second regular request that would fit only by cutting it back sooner is not given its
    GPUs (preview promises no preemption, reserve waits), and its retry places it once they
    are free. A review found the victim told "by 00:10" and then "by 00:01"."""
    w = one_node
    setup.config_set(w.ctx(), "capacity.spotNoticeMs", str(10 * MIN))
    spot = w.reserve(8, tenant="globex", spot=True, duration_ms=5 * HOUR)
    w.tick(T0)
    first = w.reserve(8, duration_ms=HOUR)  # from the deadline: the spot work is cut back
    assert first.during == Window(T0 + 10 * MIN, T0 + 70 * MIN)
    assert w.get(spot.id).preempt_deadline == T0 + 10 * MIN
    setup.config_set(w.ctx(), "capacity.spotNoticeMs", str(MIN))
    ask = ReserveArgs("acme", None, 8, 5 * MIN)
    p = booking.preview(w.ctx(), ask)
    assert not p.fits and p.preemptible is None
    second = w.reserve(8, duration_ms=5 * MIN)
    assert second.state == State.PENDING
    victim = w.get(spot.id)
    assert victim.preempt_deadline == T0 + 10 * MIN
    assert victim.during == Window(T0, T0 + 10 * MIN)
    assert [e.data["at"] for e in w.events("reservation.preempting", spot.id)] == [T0 + 10 * MIN]
    w.tick(T0 + 10 * MIN)  # the victim ends at its deadline; `first` holds the node from then
    assert w.get(spot.id).state == State.RELEASED
    assert w.get(second.id).state == State.PENDING
    w.tick(T0 + 70 * MIN)
    assert w.get(second.id).state in LIVE_STATES


def test_a_started_victim_under_notice_is_not_offered_by_preview_with_a_zero_notice(
    one_node: World,
) -> None:
    """A spot job cut back and since started keeps its deadline, even where a zero notice makes
    a new request's window start at the job's own start: preview offers no preemption, and
    reserve waits, as preview says (a review: preview promised one that reserve then refused)."""
    w = one_node
    s = w.reserve(8, tenant="globex", spot=True, duration_ms=4 * HOUR, start=T0 + HOUR)
    w.now = T0 + 30 * MIN
    w.reserve(8, duration_ms=HOUR, start=T0 + 90 * MIN)  # cuts s back to end at 01:30
    assert w.get(s.id).preempt_deadline == T0 + 90 * MIN
    setup.config_set(w.ctx(), "capacity.spotNoticeMs", "0")
    w.tick(T0 + HOUR)
    assert w.get(s.id).state == State.ACTIVE
    p = booking.preview(w.ctx(), ReserveArgs("acme", None, 8, 10 * MIN))
    assert not p.fits and p.preemptible is None
    late = w.reserve(8, duration_ms=10 * MIN)
    assert late.state == State.PENDING
    assert w.get(s.id).preempt_deadline == T0 + 90 * MIN


# ---------------------------------------------------------------- preview


def test_preview_reports_preemptible_for_a_regular_request_only(one_node: World) -> None:
    w = one_node
    w.reserve(4, tenant="globex", spot=True)
    w.reserve(4, tenant="acme", spot=False, duration_ms=30 * MIN)
    snap = w.snapshot()
    p = booking.preview(w.ctx(), ReserveArgs("acme", None, 8, HOUR))
    assert not p.fits and p.candidates == ()
    assert p.preemptible is None  # the regular half cannot be preempted
    p = booking.preview(w.ctx(), ReserveArgs("acme", None, 4, HOUR))
    assert not p.fits and p.preemptible == (1, T0 + NOTICE)
    doc = js.preview(p)
    assert doc["preemptible"] == {"reservations": 1, "startsAt": T0 + NOTICE}
    later = booking.preview(w.ctx(), ReserveArgs("acme", None, 4, 10 * MIN, start=T0 + 10 * MIN))
    assert later.preemptible == (1, T0 + 10 * MIN)
    spot = booking.preview(w.ctx(), ReserveArgs("acme", None, 4, HOUR, spot=True))
    assert not spot.fits and spot.preemptible is None
    assert js.preview(spot)["preemptible"] is None
    setup.config_set(w.ctx(), "capacity.spotNoticeMs", str(5 * MIN))
    p = booking.preview(w.ctx(), ReserveArgs("acme", None, 4, HOUR))
    assert p.preemptible == (1, T0 + 5 * MIN)
    assert w.snapshot() == snap  # books nothing


# ---------------------------------------------------------------- properties

LIVE = tuple(s.value for s in LIVE_STATES)


def _double_bookings(w: World) -> list[tuple[Any, ...]]:
    rows = w.db.conn.execute(
        "SELECT a.node_id, a.atom, a.reservation_id, b.reservation_id FROM bookings a"
        " JOIN bookings b ON b.node_id = a.node_id AND b.atom = a.atom AND b.id > a.id"
        " WHERE a.start < b.end AND b.start < a.end"
    )
    return [tuple(r) for r in rows]


@dataclass(frozen=True)
class Reserve:
    tenant: str
    gpus: int
    spot: bool
    start_in: int | None
    duration_ms: int
    gang: bool


@dataclass(frozen=True)
class Tick:
    advance_ms: int


@dataclass(frozen=True)
class Release:
    index: int


Op = Reserve | Tick | Release

TENANTS = st.sampled_from(["acme", "globex"])
STARTS = st.sampled_from([None, None, MIN, NOTICE, 10 * MIN, HOUR])
DURATIONS = st.sampled_from([30 * MIN, HOUR, 3 * HOUR])
# Spot work first fills most of the pool, so that later regular requests have to preempt.
FILL = st.lists(
    st.builds(Reserve, TENANTS, st.sampled_from([4, 8]), st.just(True), STARTS, DURATIONS,
              st.just(False)),
    min_size=2,
    max_size=4,
)  # fmt: skip
MIXED = st.lists(
    st.one_of(
        st.builds(
            Reserve,
            TENANTS,
            st.sampled_from([2, 4, 8]),
            st.booleans(),
            STARTS,
            DURATIONS,
            st.sampled_from([False, False, False, True]),
        ),
        st.builds(Tick, st.sampled_from([0, 30 * SEC, NOTICE, 20 * MIN, HOUR])),
        st.builds(Release, st.integers(0, 20)),
    ),
    min_size=1,
    max_size=12,
)
OPS = st.tuples(FILL, MIXED).map(lambda pair: [*pair[0], *pair[1]])


def _check_privacy(w: World) -> None:
    owners = {r.id: r.tenant_id for r in w.all()}
    for tenant in ("acme", "globex"):
        others = [rid for rid, t in owners.items() if t != tenant]
        readable = json.dumps(
            [js.event(e) for page in views.event_pages(w.ctx(), tenant, None, None) for e in page]
            + [js.reservation(r) for r in booking.list_reservations(w.ctx(), tenant, None, [])]
        )
        leaked = [rid for rid in others if rid in readable]
        assert not leaked, f"{tenant} can read {leaked}"


def _regular_never_preempted(w: World) -> None:
    for r in w.all():
        if r.spot:
            continue
        assert r.preempt_deadline is None and r.release_reason != ReleaseReason.PREEMPTED, r
        assert all(c.reason != "SpotPreempted" for c in r.conditions), r


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(OPS)
def test_spot_properties(ops: list[Op]) -> None:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    folder = tempfile.mkdtemp(prefix="bc-spot-", dir=base)
    w = World(Path(folder) / "s.db")
    ids: list[str] = []
    seen: dict[str, list[tuple[str, tuple[int, ...]]]] = {}  # regular: where it was placed
    try:
        for op in ops:
            before = w.snapshot()
            if isinstance(op, Reserve):
                rsv = w.reserve(
                    op.gpus,
                    tenant=op.tenant,
                    spot=op.spot,
                    duration_ms=op.duration_ms,
                    start=None if op.start_in is None else w.now + op.start_in,
                    gang=2 if op.gang else None,
                )
                ids.append(rsv.id)
                after = w.snapshot()
                changed = [rid for rid in before if before[rid] != after[rid]]
                if op.spot:
                    assert changed == [], "a spot request changed other reservations"
                    if rsv.state == State.PENDING:
                        assert w.bookings(rsv.id) == []
                else:
                    assert all(before[rid]["spot"] for rid in changed), changed
                    if changed:
                        assert rsv.state == State.PLACED and rsv.during is not None
                        assert rsv.during.start == w.now + NOTICE or (
                            op.start_in is not None and rsv.during.start == w.now + op.start_in
                        )
            elif isinstance(op, Tick):
                w.tick(w.now + op.advance_ms)
            elif ids:
                rsv = w.get(ids[op.index % len(ids)])
                if rsv.state in LIVE_STATES:
                    booking.release(w.ctx(), rsv.id)
            for r in w.all():
                if r.spot or r.state not in LIVE_STATES:
                    continue
                where = nodes_atoms(r)
                assert seen.setdefault(r.id, where) == where, f"regular {r.id} was moved"
            _regular_never_preempted(w)
            assert _double_bookings(w) == []
            _check_privacy(w)
    finally:
        w.db.close()
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- tenant privacy through the CLI


def test_no_output_readable_by_the_victim_tenant_names_the_preemptor(solo: Cli) -> None:
    run = solo
    run.ok("config", "set", "placement.topN", "1")
    run.ok("meter", "create", "gpu.h100.spot.hours")
    spot = run.ok(
        "reserve", "--tenant", "globex", "--gpus", "8", "--for", "90m", "--spot", "--key", "s"
    )  # fmt: skip
    later = run.ok(
        "reserve", "--tenant", "globex", "--gpus", "8", "--for", "1h", "--spot",
        "--start", at(2 * HOUR), "--key", "s2",
    )  # fmt: skip
    assert later["state"] == "placed"
    run.ok("tick", now=at(MIN))
    urgent = run.ok(
        "reserve", "--tenant", "acme", "--gpus", "8", "--for", "4h", "--key", "u", now=at(HOUR)
    )
    assert urgent["state"] == "placed"
    deadline = NOW_MS + HOUR + NOTICE
    assert urgent["during"]["start"] == deadline
    acme_ids = {urgent["id"]}
    run.ok("tick", now=at(HOUR + NOTICE))
    run.ok("tick", now=at(3 * HOUR))

    reads = [
        run.ok("list", "--tenant", "globex", now=at(3 * HOUR)),
        run.ok("events", "--tenant", "globex", now=at(3 * HOUR)),
        run.ok("get", spot["id"], now=at(3 * HOUR)),
        run.ok("get", later["id"], now=at(3 * HOUR)),
        run.ok("usage", "--tenant", "globex", now=at(3 * HOUR)),
        run.ok("usage", "--tenant", "globex", "--dead-letter", now=at(3 * HOUR)),
        run.ok("timeline", "--tenant", "globex", now=at(3 * HOUR)),
    ]
    text = json.dumps(reads)
    for rid in acme_ids:
        assert rid not in text
    # what globex does see: the notice without a name
    got = run.ok("get", spot["id"], now=at(3 * HOUR))
    assert got["state"] == "released" and got["releaseReason"] == "preempted"
    assert got["during"]["end"] == deadline
    assert got["conditions"][0]["message"] == OTHER
    events = run.ok("events", "--tenant", "globex", now=at(3 * HOUR))
    preempting = [e for e in events if e["type"] == "reservation.preempting"]
    assert preempting and all("by" not in e["data"] for e in preempting)
    assert preempting[0]["data"]["at"] == deadline
    requeued = [e for e in events if e["type"] == "reservation.preempted"]
    assert requeued and requeued[0]["data"] == {"requeued": True}
    # and the human output too
    code, human, _ = run("events", "--tenant", "globex", json=False, now=at(3 * HOUR))
    assert code == 0 and urgent["id"] not in human
    code, human, _ = run("get", spot["id"], json=False, now=at(3 * HOUR))
    assert code == 0 and urgent["id"] not in human

    # the preempting tenant's own view is not affected
    mine = run.ok("get", urgent["id"], now=at(3 * HOUR))
    assert mine["state"] == "active"


def test_cli_preview_preemptible_shape(solo: Cli) -> None:
    run = solo
    run.ok("reserve", "--tenant", "globex", "--gpus", "8", "--for", "6h", "--spot", "--key", "s")
    doc = run.ok("preview", "--tenant", "acme", "--gpus", "4", "--for", "1h")
    assert doc["fits"] is False and doc["candidates"] == []
    assert doc["reason"] == "no node fits (1 nodes): 1 × fits: 0 of 4 gpu free"
    assert doc["preemptible"] == {"reservations": 1, "startsAt": NOW_MS + NOTICE}
    spot = run.ok("preview", "--tenant", "acme", "--gpus", "4", "--for", "1h", "--spot")
    assert spot["fits"] is False and spot["preemptible"] is None
