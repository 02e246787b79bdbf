"""Gangs (PRODUCT.md §5.3), node leases, and BookingRepair (§5.8), driven through the service layer.

The world: pool `p` of 4-GPU h100 nodes, placement.topN = 1 (best score, then name):

    a1 a2 a3   fabric c1.1, rack r1
    b1 b2      fabric c1.2, rack r2
    x1         no fabric,   rack r2
    y1         no fabric,   no rack
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from better_compute.errors import Conflict, Forbidden, InvalidInput, NotFound, QuotaExceeded
from better_compute.inventory import parse_inventory
from better_compute.model import LIVE_STATES, Event, Principal, Reservation, State, Window
from better_compute.service import accounting, booking, setup, ticking
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage import repo

T0 = 1_790_582_400_000  # 2026-09-28T08:00:00Z
SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
LEAD = 15 * MIN


def _node(name: str, clique: int | None = None, rack: str | None = None) -> dict[str, Any]:
    gpus: dict[str, Any] = {"count": 4, "model": "h100", "nvlinkGroups": 1}
    if clique is not None:
        gpus["fabric"] = {"cluster": "c1", "clique": clique}
    return {"name": name, "labels": {"rack": rack} if rack else {}, "gpus": gpus}


NODES = [
    _node("a1", 1, "r1"),
    _node("a2", 1, "r1"),
    _node("a3", 1, "r1"),
    _node("b1", 2, "r2"),
    _node("b2", 2, "r2"),
    _node("x1", None, "r2"),
    _node("y1"),
]
NODE_NAMES = [n["name"] for n in NODES]


class World:
    def __init__(self, path: Path) -> None:
        self.db = setup.init(str(path), T0, force=True, manual=True, admin="admin", group=None)[0]
        self.now = T0
        doc = {
            "pools": [{"name": "p", "nodes": NODES}],
            "tenants": [{"id": "acme", "quota": {"gpus": 1000}}, {"id": "globex"}],
        }
        setup.inventory_import(self.ctx(), parse_inventory(doc))
        setup.config_set(self.ctx(), "placement.topN", "1")

    def ctx(self, principal: str = "admin") -> Ctx:
        return Ctx(self.db, self.now, Principal(principal, admin=principal == "admin"))

    def reserve(self, gpus: int | None = 4, principal: str = "admin", **kw: Any) -> Reservation:
        args = {"tenant": "acme", "pool": None, "gpus": gpus, "duration_ms": HOUR, **kw}
        return booking.reserve(self.ctx(principal), ReserveArgs(**args))

    def tick(self, at: int) -> list[Event]:
        self.now = at
        return ticking.tick(self.ctx())

    def get(self, rsv_id: str) -> Reservation:
        return booking.get(self.ctx(), rsv_id)

    def nodes_of(self, rsv_id: str) -> list[str]:
        return sorted(a.node_id for a in self.get(rsv_id).allocations)

    def events(self, type_: str, rsv_id: str | None = None) -> list[Event]:
        rows = repo.events(self.db.conn, tenant=None, reservation=rsv_id, since=None)
        return [e for e in rows if e.type == type_]

    def bookings(self, rsv_id: str) -> list[tuple[str, int, int, int]]:
        rows = self.db.conn.execute(
            "SELECT node_id, atom, start, end FROM bookings WHERE reservation_id = ?"
            " ORDER BY node_id, atom, start",
            (rsv_id,),
        )
        return [(str(n), int(a), int(s), int(e)) for n, a, s, e in rows]

    def held(self, tenant: str = "acme") -> int:
        return setup.quota_show(self.ctx(), tenant)[0].held

    # hardware
    def cordon(self, node: str) -> None:
        setup.node_flag(
            self.ctx(), node, "node.cordoned", "why", schedulable=0, cordon_reason="why"
        )

    def uncordon(self, node: str) -> None:
        setup.node_uncordon(self.ctx(), node)

    def unreachable(self, node: str) -> None:
        setup.node_flag(self.ctx(), node, "node.unreachable", "down", reachable=0)

    def quarantine(self, node: str, index: int = 0) -> None:
        setup.device_health(self.ctx(), f"{node}:{index}", False, "xid-79")

    def raw_maintenance(self, node: str, window: Window) -> None:
        """A maintenance row alone, without the immediate repair `node cordon --from` runs."""
        with self.db.write() as conn:
            repo.insert_maintenance(conn, node, window, "firmware")


@pytest.fixture
def world(db_dir: Path) -> Iterator[World]:
    w = World(db_dir / "gang.db")
    yield w
    w.db.close()


def label(node: str, key: str) -> str | None:
    spec = next(n for n in NODES if n["name"] == node)
    if key == "fabric.domain":
        fabric = spec["gpus"].get("fabric")
        return None if fabric is None else f"{fabric['cluster']}.{fabric['clique']}"
    return spec["labels"].get(key)


# ---------------------------------------------------------------- gang placement


def test_gang_of_three_on_fabric_with_only_two_fitting_is_pending_with_the_exact_reason(
    world: World,
) -> None:
    world.cordon("a1")  # c1.1 keeps a2 and a3, c1.2 has b1 and b2
    rsv = world.reserve(gang=3, topology_key="fabric.domain")
    assert rsv.state == State.PENDING
    assert rsv.allocations == () and rsv.during is None
    assert [(c.type, c.reason, c.message) for c in rsv.conditions] == [
        (
            "Unschedulable",
            "NoCapacity",
            "no gang of 3 nodes fits in one fabric.domain (at most 2 nodes fit together)",
        )
    ]
    assert world.bookings(rsv.id) == []
    assert rsv.next_attempt_at == T0 + 30 * SEC


@pytest.mark.parametrize(
    ("size", "key", "busy", "expected"),
    [
        (3, "fabric.domain", [], ["a1", "a2", "a3"]),
        (2, "fabric.domain", ["a1", "a2"], ["b1", "b2"]),
        # a partly booked domain is preferred (bin-packing keeps whole domains free)
        (2, "fabric.domain", ["a1"], ["a2", "a3"]),
        (3, "rack", [], ["a1", "a2", "a3"]),
        # r1 has only two free nodes left: the gang moves whole to r2, whose x1 has no fabric
        (3, "rack", ["a1"], ["b1", "b2", "x1"]),
        (7, None, [], NODE_NAMES),
    ],
)
def test_gang_members_share_one_value_of_the_topology_key(
    world: World, size: int, key: str | None, busy: list[str], expected: list[str]
) -> None:
    for node in busy:  # a whole-node regular booking now makes the node unfit
        r = world.reserve(4)
        assert world.nodes_of(r.id) == [node]
    rsv = world.reserve(gang=size, topology_key=key)
    assert rsv.state == State.PLACED, rsv.conditions
    assert world.nodes_of(rsv.id) == sorted(expected)
    assert all(len(a.atoms) == 4 for a in rsv.allocations)
    if key is not None:
        assert len({label(n, key) for n in expected}) == 1


def test_nodes_without_the_label_never_join(world: World) -> None:
    world.cordon("a1")
    # six nodes fit (a2 a3 b1 b2 x1 y1), but at most two of them share a fabric.domain
    rsv = world.reserve(gang=3, topology_key="fabric.domain")
    assert rsv.state == State.PENDING
    assert rsv.conditions[0].message == (
        "no gang of 3 nodes fits in one fabric.domain (at most 2 nodes fit together)"
    )
    # and a rack gang of 2 never takes y1, the only node without a rack
    for _ in range(3):
        r = world.reserve(gang=2, topology_key="rack")
        if r.state != State.PLACED:
            break
        assert "y1" not in world.nodes_of(r.id)
    y1 = world.db.conn.execute("SELECT COUNT(*) FROM bookings WHERE node_id = 'y1'").fetchone()[0]
    assert y1 == 0


def test_gang_without_key_reason_names_the_pool(world: World) -> None:
    world.cordon("y1")  # 7 nodes could hold it, but only 6 can now: it waits (issue 7)
    rsv = world.reserve(gang=7)
    assert rsv.state == State.PENDING
    assert rsv.conditions[0].message == "no gang of 7 nodes fits in the pool (at most 6 nodes fit)"


@pytest.mark.parametrize("size", [1, 0, 65, 100])
def test_gang_size_out_of_range_is_invalid_input(world: World, size: int) -> None:
    with pytest.raises(InvalidInput, match="2 to 64"):
        world.reserve(gang=size)
    with pytest.raises(InvalidInput):
        booking.preview(world.ctx(), ReserveArgs("acme", None, 4, HOUR, gang=size))
    assert repo.reservations_where(world.db.conn) == []


def test_topology_key_without_gang_is_invalid_input(world: World) -> None:
    with pytest.raises(InvalidInput, match="--gang"):
        world.reserve(topology_key="rack")


def test_gang_larger_than_the_pool_is_refused(world: World) -> None:
    """A gang of 64 on 7 nodes could never be placed: refused, not left waiting (issue 7)."""
    with pytest.raises(InvalidInput, match="--gang 64: pool p has 7 nodes"):
        world.reserve(1, gang=64)
    assert repo.reservations_where(world.db.conn) == []


def test_quota_sees_the_whole_gang(world: World) -> None:
    setup.quota_set(world.ctx(), "acme", None, 15)
    with pytest.raises(QuotaExceeded, match="needs 16 more"):
        world.reserve(gang=4)  # 4 nodes x 4 GPUs = 16 > 15, even though it would only wait
    assert repo.reservations_where(world.db.conn) == []
    setup.quota_set(world.ctx(), "acme", None, 16)
    rsv = world.reserve(gang=4)
    assert rsv.quota_charge == 16
    assert world.held() == 16


def test_policy_draft_sees_gpu_count_times_size(world: World) -> None:
    accounting.policy_set(world.ctx(), "acme", "bob", 7, False, False)
    with pytest.raises(Forbidden, match=r"max-gpus 7.*8 GPUs \(a gang of 2\)"):
        world.reserve(4, principal="bob", gang=2)
    accounting.policy_set(world.ctx(), "acme", "bob", 8, False, False)
    rsv = world.reserve(4, principal="bob", gang=2)
    assert rsv.state == State.PLACED and rsv.quota_charge == 8


def test_preview_of_a_gang_lists_the_members_of_the_best_gang(world: World) -> None:
    p = booking.preview(
        world.ctx(), ReserveArgs("acme", None, 4, HOUR, gang=2, topology_key="rack")
    )
    assert p.fits
    assert sorted(c.node_id for c in p.candidates) == ["a1", "a2"]
    world.cordon("a1")
    p = booking.preview(
        world.ctx(), ReserveArgs("acme", None, 4, HOUR, gang=3, topology_key="fabric.domain")
    )
    assert not p.fits and p.candidates == ()
    assert p.reason == "no gang of 3 nodes fits in one fabric.domain (at most 2 nodes fit together)"


def test_a_gang_larger_than_every_value_of_its_key_is_refused(world: World) -> None:
    """Whatever the nodes' state: a1 cordoned still counts for c1.1, which has three nodes."""
    world.cordon("a1")
    history = repo.events(world.db.conn, tenant="acme", reservation=None, since=None)
    for gang, key, message in [
        (4, "fabric.domain", "at most 3 of pool p's nodes with 4 or more GPUs share one"),
        (4, "rack", "so a gang on one rack is at most 3 nodes"),
        (2, "zone", "--topology-key zone: no node of pool p with 4 or more GPUs has the label"),
    ]:
        args = ReserveArgs("acme", None, 4, HOUR, gang=gang, topology_key=key)
        for call in (booking.reserve, booking.preview):
            with pytest.raises(InvalidInput, match=message):
                call(world.ctx(), args)
    assert (
        world.held() == 0
        and repo.events(world.db.conn, tenant="acme", reservation=None, since=None) == history
    )


# ---------------------------------------------------------------- gang lifecycle


def test_gang_is_active_only_when_every_member_reports_bound(world: World) -> None:
    setup.config_set(world.ctx(), "binding.autoBind", "false")
    rsv = world.reserve(gang=3, topology_key="fabric.domain")
    assert rsv.state == State.PLACED
    world.tick(T0)
    assert world.get(rsv.id).state == State.BINDING
    for i, node in enumerate(["a1", "a2", "a3"]):
        world.tick(T0 + (i + 1) * MIN)  # ticks alone never bind without autoBind
        assert world.get(rsv.id).state == State.BINDING
        world.now = T0 + (i + 1) * MIN + SEC
        after = ticking.report_bound(world.ctx(), node, rsv.id)
        bound = {a.node_id for a in after.allocations if a.bound}
        assert bound == set(["a1", "a2", "a3"][: i + 1])
        assert after.state == (State.ACTIVE if i == 2 else State.BINDING)
    assert len(world.events("reservation.active", rsv.id)) == 1
    # billing opened once every member was bound: one window per allocation
    rows = world.db.conn.execute(
        "SELECT allocation_id, start FROM usage WHERE reservation_id = ?", (rsv.id,)
    ).fetchall()
    assert len(rows) == 3 and {r[1] for r in rows} == {T0 + 3 * MIN + SEC}
    with pytest.raises(NotFound):
        ticking.report_bound(world.ctx(), "b1", rsv.id)


def test_report_bound_before_binding_is_a_conflict(world: World) -> None:
    rsv = world.reserve(gang=2, topology_key="fabric.domain", start=T0 + HOUR)
    with pytest.raises(Conflict):
        ticking.report_bound(world.ctx(), "a1", rsv.id)


def test_extend_moves_every_member_or_none(world: World) -> None:
    later = world.reserve(4, start=T0 + HOUR)  # a1 for [T0+1h, T0+2h)
    assert world.nodes_of(later.id) == ["a1"]
    gang = world.reserve(gang=2, topology_key="fabric.domain")  # a1, a2 for [T0, T0+1h)
    assert world.nodes_of(gang.id) == ["a1", "a2"]
    before = world.bookings(gang.id)
    with pytest.raises(Conflict, match="a1"):
        booking.extend(world.ctx(), gang.id, 30 * MIN)
    assert world.bookings(gang.id) == before  # a2 was not moved either
    assert world.get(gang.id).during == Window(T0, T0 + HOUR)
    assert world.events("reservation.extended", gang.id) == []

    booking.cancel(world.ctx(), later.id)
    after = booking.extend(world.ctx(), gang.id, 30 * MIN)
    assert after.during == Window(T0, T0 + HOUR + 30 * MIN)
    assert {end for _, _, _, end in world.bookings(gang.id)} == {T0 + HOUR + 30 * MIN}
    assert {n for n, _, _, _ in world.bookings(gang.id)} == {"a1", "a2"}


def test_release_and_cancel_free_every_member(world: World) -> None:
    gang = world.reserve(gang=3, topology_key="fabric.domain")
    world.tick(T0 + MIN)
    assert world.get(gang.id).state == State.ACTIVE
    world.now = T0 + 10 * MIN
    done = booking.release(world.ctx(), gang.id)
    assert done.state == State.RELEASED and done.release_reason is not None
    assert all(end == T0 + 10 * MIN for _, _, _, end in world.bookings(gang.id))
    assert {n for n, _, _, _ in world.bookings(gang.id)} == {"a1", "a2", "a3"}
    usage = world.db.conn.execute(
        "SELECT end FROM usage WHERE reservation_id = ?", (gang.id,)
    ).fetchall()
    assert [r[0] for r in usage] == [T0 + 10 * MIN] * 3
    again = world.reserve(gang=3, topology_key="fabric.domain")
    assert world.nodes_of(again.id) == ["a1", "a2", "a3"]

    later = world.reserve(gang=2, topology_key="fabric.domain", start=T0 + 5 * HOUR)
    assert world.held() == 12 + 8
    booking.cancel(world.ctx(), later.id)
    assert world.bookings(later.id) == []
    assert world.held() == 12


# ---------------------------------------------------------------- node leases


def test_node_lease_takes_every_atom_and_is_charged_what_it_leased(world: World) -> None:
    one = world.reserve(1)  # a1:0 now
    lease = world.reserve(None, node_lease=True)
    assert lease.state == State.PLACED
    assert [(a.node_id, a.atoms) for a in lease.allocations] == [("a2", (0, 1, 2, 3))]
    assert lease.quota_charge == 4
    assert world.nodes_of(one.id) == ["a1"]


def test_spot_node_lease_is_invalid_input(world: World) -> None:
    with pytest.raises(InvalidInput, match="node lease"):
        world.reserve(None, node_lease=True, spot=True)
    with pytest.raises(InvalidInput):
        booking.preview(
            world.ctx(), ReserveArgs("acme", None, None, HOUR, spot=True, node_lease=True)
        )


def test_node_lease_is_repaired_only_before_its_window(world: World) -> None:
    future = world.reserve(None, node_lease=True, start=T0 + 2 * HOUR)
    assert world.nodes_of(future.id) == ["a1"]
    world.quarantine("a1", 3)  # any GPU of a leased node: it is no longer leasable
    world.tick(T0 + 2 * HOUR - LEAD)
    assert world.nodes_of(future.id) == ["a2"]
    assert len(world.events("reservation.repaired", future.id)) == 1

    # a lease whose window has begun is the metal's to deploy: never repaired
    now_lease = world.reserve(None, node_lease=True)
    device = world.reserve(4)
    node_lease_node, device_node = world.nodes_of(now_lease.id)[0], world.nodes_of(device.id)[0]
    world.cordon(node_lease_node)
    world.cordon(device_node)
    ticking.repair(world.ctx(), None)
    assert world.nodes_of(now_lease.id) == [node_lease_node]
    assert world.events("reservation.repaired", now_lease.id) == []
    assert world.nodes_of(device.id) != [device_node]
    assert len(world.events("reservation.repaired", device.id)) == 1


# ---------------------------------------------------------------- BookingRepair

START = T0 + 2 * HOUR


def _break_cordon(w: World, node: str) -> None:
    w.cordon(node)


def _break_unreachable(w: World, node: str) -> None:
    w.unreachable(node)


def _break_quarantine(w: World, node: str) -> None:
    w.quarantine(node, 2)


def _break_maintenance(w: World, node: str) -> None:
    w.raw_maintenance(node, Window(START + 30 * MIN, START + 90 * MIN))


BREAKS: dict[str, Callable[[World, str], None]] = {
    "cordoned": _break_cordon,
    "unreachable": _break_unreachable,
    "quarantined booked atom": _break_quarantine,
    "maintenance overlapping": _break_maintenance,
}


@pytest.mark.parametrize("cause", list(BREAKS))
def test_calendar_booking_is_moved_at_lead_time_for_the_same_window(
    world: World, cause: str
) -> None:
    rsv = world.reserve(4, start=START)
    assert world.nodes_of(rsv.id) == ["a1"]
    BREAKS[cause](world, "a1")
    world.tick(START - LEAD - SEC)  # not yet due
    assert world.nodes_of(rsv.id) == ["a1"]
    assert world.events("reservation.repaired", rsv.id) == []

    world.tick(START - LEAD)
    after = world.get(rsv.id)
    assert after.state == State.PLACED
    assert after.during == Window(START, START + HOUR)
    assert world.nodes_of(rsv.id) == ["a2"]
    assert after.quota_charge == 4 and world.held() == 4
    [event] = world.events("reservation.repaired", rsv.id)
    assert event.at == START - LEAD
    assert event.data["from"] == ["a1"] and event.data["nodeIds"] == ["a2"]
    assert (event.data["start"], event.data["end"]) == (START, START + HOUR)
    assert world.bookings(rsv.id) == [("a2", i, START, START + HOUR) for i in range(4)]
    # the node it left keeps nothing for that window
    assert not world.db.conn.execute(
        "SELECT 1 FROM bookings WHERE node_id = 'a1' AND end > ?", (START,)
    ).fetchone()


@pytest.mark.parametrize(
    "harmless",
    [
        lambda w: w.quarantine("a1", 3),  # an atom the booking does not hold
        lambda w: w.raw_maintenance("a1", Window(T0, START)),  # ends as the booking starts
        lambda w: w.cordon("b1"),  # another node
    ],
)
def test_a_healthy_booking_is_not_moved(world: World, harmless: Callable[[World], None]) -> None:
    rsv = world.reserve(2, start=START)
    assert [(a.node_id, a.atoms) for a in rsv.allocations] == [("a1", (0, 1))]
    harmless(world)
    world.tick(START - LEAD)
    world.tick(START)
    assert world.nodes_of(rsv.id) == ["a1"]
    assert world.events("reservation.repaired", rsv.id) == []
    assert world.get(rsv.id).state == State.ACTIVE


def test_maintenance_window_moves_an_overlapping_booking_by_lead_time(world: World) -> None:
    rsv = world.reserve(4, start=START)
    setup.node_maintenance(world.ctx(), "a1", Window(START - HOUR, START + 10 * MIN), "bios")
    world.tick(START - LEAD)
    assert world.nodes_of(rsv.id) == ["a2"]
    assert len(world.events("reservation.repaired", rsv.id)) == 1
    assert world.get(rsv.id).during == Window(START, START + HOUR)


def test_checked_once_at_lead_and_again_at_start(world: World) -> None:
    rsv = world.reserve(4, start=START)
    world.tick(START - LEAD)
    assert world.nodes_of(rsv.id) == ["a1"]
    world.cordon("a1")
    world.tick(START - 10 * MIN)  # the lead check ran already: not again before the start
    world.tick(START - SEC)
    assert world.nodes_of(rsv.id) == ["a1"]
    assert world.events("reservation.repaired", rsv.id) == []

    world.tick(START)  # caught at the start, then binds on the new node
    [event] = world.events("reservation.repaired", rsv.id)
    assert event.at == START and event.data["from"] == ["a1"] and event.data["nodeIds"] == ["a2"]
    after = world.get(rsv.id)
    assert after.state == State.ACTIVE
    assert [a.node_id for a in after.allocations] == ["a2"]
    assert after.during == Window(START, START + HOUR)


def test_repair_that_fits_nowhere_goes_pending_and_retries_for_the_same_window(
    world: World,
) -> None:
    for node in NODE_NAMES[1:]:
        world.cordon(node)
    rsv = world.reserve(4, start=START)
    assert world.nodes_of(rsv.id) == ["a1"]
    world.cordon("a1")
    world.tick(START - LEAD)
    waiting = world.get(rsv.id)
    assert waiting.state == State.PENDING
    assert waiting.allocations == () and waiting.during is None
    assert [(c.type, c.reason) for c in waiting.conditions] == [
        ("Unschedulable", "BookingRepairFailed")
    ]
    assert waiting.quota_charge == 4 and world.held() == 4
    assert waiting.next_attempt_at == START - LEAD + 30 * SEC
    assert world.bookings(rsv.id) == []
    [event] = world.events("reservation.pending", rsv.id)[-1:]
    assert event.data["reason"] == "BookingRepairFailed" and event.data["from"] == ["a1"]

    world.tick(START - LEAD + 30 * SEC)  # due, still nothing fits
    assert world.get(rsv.id).state == State.PENDING
    assert world.get(rsv.id).next_attempt_at == START - LEAD + 60 * SEC
    world.uncordon("b2")
    world.tick(START - LEAD + 45 * SEC)  # not due yet
    assert world.get(rsv.id).state == State.PENDING
    world.tick(START - LEAD + 60 * SEC)
    placed = world.get(rsv.id)
    assert placed.state == State.PLACED
    assert placed.during == Window(START, START + HOUR)  # the same window
    assert world.nodes_of(rsv.id) == ["b2"]
    assert placed.quota_charge == 4 and world.held() == 4


def test_repair_command_checks_now_whatever_the_start(world: World) -> None:
    far = world.reserve(4, start=T0 + 20 * HOUR)
    world.cordon("a1")
    events = ticking.repair(world.ctx(), far.id)
    assert [e.type for e in events] == ["reservation.repaired"]
    assert world.nodes_of(far.id) == ["a2"]
    assert ticking.repair(world.ctx(), None) == []  # nothing else is wrong
    with pytest.raises(NotFound):
        ticking.repair(world.ctx(), "rsv_nope")
    pending = world.reserve(4, gang=3, topology_key="fabric.domain")  # a1 is cordoned
    assert pending.state == State.PENDING
    with pytest.raises(Conflict):
        ticking.repair(world.ctx(), pending.id)


# ---------------------------------------------------------------- gang repair


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (["a1"], ["a2", "a3"]),  # stays on c1.1
        (["a2"], ["a1", "a3"]),
        (["a1", "a2"], ["b1", "b2"]),  # c1.1 too small now: moves whole to c1.2
        (["a1", "b1"], ["a2", "a3"]),
    ],
)
def test_gang_repair_keeps_its_topology_value_when_it_can(
    world: World, bad: list[str], expected: list[str]
) -> None:
    gang = world.reserve(gang=2, topology_key="fabric.domain", start=START)
    assert world.nodes_of(gang.id) == ["a1", "a2"]
    for node in bad:
        world.cordon(node)
    world.tick(START - LEAD)
    assert world.nodes_of(gang.id) == expected
    [event] = world.events("reservation.repaired", gang.id)
    left = sorted({"a1", "a2"} - set(expected))  # `from`: the nodes it actually left
    assert event.data["from"] == left and sorted(event.data["nodeIds"]) == expected
    assert world.get(gang.id).during == Window(START, START + HOUR)


def test_gang_repair_stays_on_its_value_even_when_another_value_scores_better(
    world: World,
) -> None:
    gang = world.reserve(1, gang=2, topology_key="fabric.domain", start=START)
    assert world.nodes_of(gang.id) == ["a1", "a2"]
    # b1 and b2 are then 3/4 booked in the same window: a fresh 1-GPU gang would prefer c1.2
    for node in ("a1", "a2", "a3", "x1", "y1"):
        world.cordon(node)
    for _ in range(2):
        world.reserve(3, start=START)
    for node in ("a1", "a2", "a3", "x1", "y1"):
        world.uncordon(node)
    fresh = booking.preview(
        world.ctx(), ReserveArgs("acme", None, 1, HOUR, gang=2, topology_key="fabric.domain",
                                 start=START)
    )  # fmt: skip
    assert sorted(c.node_id for c in fresh.candidates) == ["b1", "b2"]
    world.cordon("a1")
    world.tick(START - LEAD)
    assert world.nodes_of(gang.id) == ["a2", "a3"]


def test_gang_repair_that_fits_nowhere_leaves_no_member_behind(world: World) -> None:
    gang = world.reserve(gang=2, topology_key="fabric.domain", start=START)
    for node in ("a1", "a2", "b1"):
        world.cordon(node)
    world.tick(START - LEAD)
    after = world.get(gang.id)
    assert after.state == State.PENDING and after.allocations == ()
    assert after.conditions[0].reason == "BookingRepairFailed"
    assert world.bookings(gang.id) == []
    assert after.quota_charge == 8


# ---------------------------------------------------------------- properties

LIVE = tuple(s.value for s in LIVE_STATES)


def _double_bookings(w: World) -> list[tuple[Any, ...]]:
    marks = ",".join("?" * len(LIVE))
    rows = w.db.conn.execute(
        "SELECT a.node_id, a.atom, a.reservation_id, b.reservation_id FROM bookings a"
        " JOIN bookings b ON b.node_id = a.node_id AND b.atom = a.atom AND b.id > a.id"
        " JOIN reservations ra ON ra.id = a.reservation_id"
        " JOIN reservations rb ON rb.id = b.reservation_id"
        f" WHERE a.start < b.end AND b.start < a.end AND ra.state IN ({marks})"
        f" AND rb.state IN ({marks})",
        (*LIVE, *LIVE),
    )
    return [tuple(r) for r in rows]


def _check_gangs(w: World) -> None:
    assert _double_bookings(w) == []
    for rsv in repo.reservations_where(w.db.conn):
        if rsv.gang_size is None:
            continue
        nodes = [a.node_id for a in rsv.allocations]
        live_rows = [b for b in w.bookings(rsv.id) if b[3] > w.now]
        if rsv.state == State.PENDING:
            assert nodes == [] and live_rows == [], rsv
            continue
        if rsv.state == State.RELEASED and not nodes:
            continue
        assert len(nodes) == rsv.gang_size == len(set(nodes)), rsv
        if rsv.topology_key is not None:
            values = {label(n, rsv.topology_key) for n in nodes}
            assert len(values) == 1 and None not in values, (rsv.id, nodes)
        if rsv.state in LIVE_STATES:
            assert rsv.during is not None
            want = sorted(
                (a.node_id, i, rsv.during.start, rsv.during.end)
                for a in rsv.allocations
                for i in a.atoms
            )
            assert w.bookings(rsv.id) == want, rsv.id


HW_OPS = st.lists(
    st.tuples(
        st.sampled_from(["cordon", "uncordon", "unreachable", "quarantine", "repair", "tick"]),
        st.sampled_from(NODE_NAMES),
        st.integers(0, 3),
        st.sampled_from([0, 30 * SEC, 5 * MIN, 20 * MIN, HOUR]),
    ),
    min_size=1,
    max_size=12,
)
GANGS = st.lists(
    st.tuples(
        st.integers(2, 3),
        st.sampled_from(["fabric.domain", "rack", None]),
        st.sampled_from([20 * MIN, HOUR, 2 * HOUR]),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(GANGS, HW_OPS)
def test_repair_never_leaves_a_half_moved_gang(
    gangs: list[tuple[int, str | None, int, int]], ops: list[tuple[str, str, int, int]]
) -> None:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    folder = tempfile.mkdtemp(prefix="bc-gang-", dir=base)
    w = World(Path(folder) / "g.db")
    try:
        for size, key, start_in, gpus in gangs:
            w.reserve(gpus, gang=size, topology_key=key, start=T0 + start_in)
        _check_gangs(w)
        for op, node, index, advance in ops:
            if op == "cordon":
                w.cordon(node)
            elif op == "uncordon":
                w.uncordon(node)
            elif op == "unreachable":
                w.unreachable(node)
            elif op == "quarantine":
                w.quarantine(node, index)
            elif op == "repair":
                for e in ticking.repair(w.ctx(), None):
                    if e.type == "reservation.repaired":
                        rsv = w.get(str(e.reservation_id))
                        assert len(e.data["nodeIds"]) == rsv.gang_size  # type: ignore[arg-type]
            else:
                w.tick(w.now + advance)
            _check_gangs(w)
    finally:
        w.db.close()
        shutil.rmtree(folder, ignore_errors=True)
