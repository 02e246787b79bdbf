"""Billing meters and usage windows (PRODUCT.md §8, and the spot seed's billing section).

The world: pool `p` with n1 (8 × h100) and n2 (8 × a100), tenants acme and globex,
placement.topN = 1, the default 2-minute spot notice.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NOW_MS, Cli, at

from better_compute.errors import Conflict, InvalidInput
from better_compute.inventory import parse_inventory
from better_compute.model import Event, ReleaseReason, Reservation, State
from better_compute.service import accounting, booking, setup, ticking
from better_compute.service.accounting import UsageWindow
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage import repo

T0 = 1_790_582_400_000  # 2026-09-28T08:00:00Z
SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
NOTICE = 2 * MIN


class World:
    def __init__(self, path: Path, nodes: tuple[tuple[str, str], ...]) -> None:
        self.db = setup.init(str(path), T0, force=True, manual=True, admin="admin", group=None)[0]
        self.now = T0
        doc = {
            "pools": [
                {
                    "name": "p",
                    "nodes": [
                        {"name": n, "gpus": {"count": 8, "model": m, "nvlinkGroups": 2}}
                        for n, m in nodes
                    ],
                }
            ],
            "tenants": [{"id": "acme"}, {"id": "globex"}],
        }
        setup.inventory_import(self.ctx(), parse_inventory(doc))
        setup.config_set(self.ctx(), "placement.topN", "1")

    def ctx(self) -> Ctx:
        return Ctx(self.db, self.now)

    def reserve(
        self, gpus: int = 8, tenant: str = "acme", spot: bool = False, **kw: Any
    ) -> Reservation:
        args = {"tenant": tenant, "pool": None, "gpus": gpus, "duration_ms": HOUR, "spot": spot}
        return booking.reserve(self.ctx(), ReserveArgs(**{**args, **kw}))

    def tick(self, instant: int) -> list[Event]:
        self.now = instant
        return ticking.tick(self.ctx())

    def get(self, rsv_id: str) -> Reservation:
        return booking.get(self.ctx(), rsv_id)

    def usage(
        self,
        tenant: str | None = None,
        start: int | None = None,
        end: int | None = None,
        dead: bool = False,
    ) -> list[UsageWindow]:
        return accounting.usage(self.ctx(), tenant, start, end, dead)

    def everything(self) -> list[UsageWindow]:
        """Every window, metered or dead-lettered."""
        return sorted(
            self.usage() + self.usage(dead=True), key=lambda u: (u.start, u.allocation_id)
        )

    def of(self, rsv_id: str) -> list[UsageWindow]:
        return [u for u in self.everything() if u.reservation_id == rsv_id]


@pytest.fixture
def world(db_dir: Path) -> Iterator[World]:
    w = World(db_dir / "bill.db", (("n1", "h100"), ("n2", "a100")))
    yield w
    w.db.close()


@pytest.fixture
def one_node(db_dir: Path) -> Iterator[World]:
    w = World(db_dir / "bill1.db", (("n1", "h100"),))
    yield w
    w.db.close()


def hours(gpus: int, ms: int) -> float:
    return round(gpus * ms / HOUR, 6)


# ---------------------------------------------------------------- meters


@pytest.mark.parametrize(
    ("model", "spot", "meter"),
    [
        ("h100", False, "gpu.h100.hours"),
        ("h100", True, "gpu.h100.spot.hours"),
        ("a100", False, "gpu.a100.hours"),
        ("a100", True, "gpu.a100.spot.hours"),
    ],
)
def test_meter_names(world: World, model: str, spot: bool, meter: str) -> None:
    rsv = world.reserve(4, spot=spot, models=(model,))
    world.tick(T0)
    [u] = world.of(rsv.id)
    assert u.meter == meter
    assert u.tenant_id == "acme" and u.reservation_id == rsv.id
    assert u.allocation_id == rsv.allocations[0].id and u.gpus == 4


def test_windows_without_a_meter_appear_only_in_the_dead_letter_list(world: World) -> None:
    regular = world.reserve(4, models=("h100",))
    spot = world.reserve(4, spot=True, models=("h100",), tenant="globex")
    world.tick(T0)
    world.now = T0 + HOUR
    assert world.usage() == []
    assert {u.reservation_id for u in world.usage(dead=True)} == {regular.id, spot.id}
    accounting.meter_create(world.ctx(), "gpu.h100.hours")
    assert [u.reservation_id for u in world.usage()] == [regular.id]
    assert [u.reservation_id for u in world.usage(dead=True)] == [spot.id]
    assert [u.meter for u in world.usage(dead=True)] == ["gpu.h100.spot.hours"]
    accounting.meter_create(world.ctx(), "gpu.h100.spot.hours")
    assert world.usage(dead=True) == []
    assert {u.reservation_id for u in world.usage()} == {regular.id, spot.id}
    # tenant-scoped
    assert [u.reservation_id for u in world.usage(tenant="globex")] == [spot.id]


# ---------------------------------------------------------------- windows


def test_a_window_opens_at_activation_not_at_placement(world: World) -> None:
    rsv = world.reserve(4, start=T0 + HOUR)
    world.tick(T0 + 30 * MIN)
    assert world.of(rsv.id) == []  # placed: nothing yet
    world.tick(T0 + HOUR + 30 * SEC)  # cron ran late: billing starts when it became active
    assert world.get(rsv.id).state == State.ACTIVE
    [u] = world.of(rsv.id)
    assert u.start == T0 + HOUR + 30 * SEC and u.end is None
    world.now = T0 + HOUR + 30 * MIN + 30 * SEC
    [u] = world.of(rsv.id)
    assert u.quantity == 2.0  # an open window counts up to now...
    world.now = T0 + 3 * HOUR
    [u] = world.of(rsv.id)
    assert u.quantity == round(4 * (HOUR - 30 * SEC) / HOUR, 6)  # ...never past its end


def test_binding_bills_nothing_until_every_node_is_bound(world: World) -> None:
    setup.config_set(world.ctx(), "binding.autoBind", "false")
    rsv = world.reserve(8, gang=2)
    world.tick(T0)
    assert world.get(rsv.id).state == State.BINDING
    world.now = T0 + 10 * MIN
    ticking.report_bound(world.ctx(), "n1", rsv.id)
    assert world.of(rsv.id) == []
    world.now = T0 + 20 * MIN
    ticking.report_bound(world.ctx(), "n2", rsv.id)
    windows = world.of(rsv.id)
    assert len(windows) == 2  # one per allocation
    assert {u.allocation_id for u in windows} == {a.id for a in world.get(rsv.id).allocations}
    assert {u.start for u in windows} == {T0 + 20 * MIN}
    assert {u.meter for u in windows} == {"gpu.h100.hours", "gpu.a100.hours"}


def test_a_window_closes_at_release_and_at_expiry(world: World) -> None:
    released = world.reserve(8, models=("h100",), duration_ms=3 * HOUR)
    expired = world.reserve(8, models=("a100",), duration_ms=HOUR)
    world.tick(T0)
    world.now = T0 + 90 * MIN
    booking.release(world.ctx(), released.id)
    world.tick(T0 + 5 * HOUR)  # late: the expired one still closes at its end
    assert world.get(expired.id).release_reason == ReleaseReason.EXPIRED
    [r] = world.of(released.id)
    assert (r.start, r.end, r.quantity) == (T0, T0 + 90 * MIN, 12.0)
    [e] = world.of(expired.id)
    assert (e.start, e.end, e.quantity) == (T0, T0 + HOUR, 8.0)


def test_a_release_after_the_end_bills_to_the_end_as_the_tick_would(world: World) -> None:
    """A user's release that comes after the end (no tick ran in between) closes the window at
    the end and releases the reservation as `expired`: the ledger a timely tick leaves."""
    late = world.reserve(8, models=("h100",), duration_ms=HOUR)
    world.tick(T0)
    world.now = T0 + 90 * MIN
    done = booking.release(world.ctx(), late.id)
    assert done.release_reason == ReleaseReason.EXPIRED
    assert done.during is not None and done.during.end == T0 + HOUR
    [u] = world.of(late.id)
    assert (u.start, u.end, u.quantity) == (T0, T0 + HOUR, 8.0)


def test_late_verbs_meet_what_the_tick_would_have_done(world: World) -> None:
    """Past its end, a committed calendar booking is released as expired (the commit forbids an
    early release, not a late one); a pending one past pending.maxWaitMs cancels as timed out;
    an extend past the end is refused, so no read of the past is rewritten."""
    from better_compute.model import CalendarPolicy
    from better_compute.service import calendar

    pool_id = repo.pool_rows(world.db.conn)[0]["id"]
    calendar.policy_set(world.ctx(), "p", CalendarPolicy(pool_id, commit=True))
    committed = world.reserve(8, models=("h100",), start=T0 + HOUR)
    world.now = T0 + 3 * HOUR
    done = booking.release(world.ctx(), committed.id)
    assert done.release_reason == ReleaseReason.EXPIRED
    calendar.policy_clear(world.ctx(), "p")
    setup.config_set(world.ctx(), "pending.maxWaitMs", str(HOUR))
    ended = world.reserve(8, models=("a100",), duration_ms=HOUR)
    waiting = world.reserve(8, models=("a100",), duration_ms=HOUR)
    assert waiting.state == State.PENDING
    world.now = T0 + 5 * HOUR
    with pytest.raises(Conflict, match="ended at"):
        booking.extend(world.ctx(), ended.id, HOUR)
    assert booking.cancel(world.ctx(), waiting.id).release_reason == ReleaseReason.TIMEOUT


def test_a_release_after_a_preemption_deadline_bills_to_the_deadline(one_node: World) -> None:
    w = one_node
    victim = w.reserve(8, tenant="globex", spot=True, duration_ms=6 * HOUR)
    w.tick(T0)
    w.now = T0 + 10 * MIN
    w.reserve(8, duration_ms=HOUR)  # preempts the spot job: deadline T0 + 12 min
    deadline = T0 + 10 * MIN + NOTICE
    w.now = T0 + 30 * MIN
    done = booking.release(w.ctx(), victim.id)
    assert done.release_reason == ReleaseReason.PREEMPTED
    [u] = w.of(victim.id)
    assert (u.start, u.end) == (T0, deadline)
    assert u.quantity == hours(8, 12 * MIN)
    _no_atom_billed_twice(w)


def test_preempted_victim_bills_until_its_deadline_and_a_requeued_one_nothing(
    one_node: World,
) -> None:
    w = one_node
    running = w.reserve(8, tenant="globex", spot=True, duration_ms=90 * MIN)
    queued = w.reserve(8, tenant="globex", spot=True, start=T0 + 2 * HOUR)
    w.tick(T0)
    w.now = T0 + HOUR
    urgent = w.reserve(8, duration_ms=2 * HOUR)
    deadline = T0 + HOUR + NOTICE
    assert urgent.during is not None and urgent.during.start == deadline
    assert w.get(queued.id).state == State.PENDING
    w.tick(deadline + 10 * MIN)  # even when the tick comes late
    [u] = w.of(running.id)
    assert u.meter == "gpu.h100.spot.hours"
    assert (u.start, u.end) == (T0, deadline)
    assert u.quantity == hours(8, HOUR + NOTICE)
    assert w.of(queued.id) == []
    [r] = w.of(urgent.id)
    assert r.meter == "gpu.h100.hours" and r.start == deadline + 10 * MIN


def test_each_gpu_hour_is_billed_once_across_a_preempt_and_a_re_place(one_node: World) -> None:
    w = one_node
    spot = w.reserve(8, tenant="globex", spot=True, duration_ms=90 * MIN)  # [T0, T0+1.5h)
    later = w.reserve(8, tenant="globex", spot=True, start=T0 + 2 * HOUR)  # [T0+2h, T0+3h)
    ticking.tick_until(Ctx(w.db, T0), T0 + HOUR, 30 * SEC)
    w.now = T0 + HOUR
    urgent = w.reserve(8, duration_ms=2 * HOUR)  # from the deadline, T0+1h02m
    deadline = T0 + HOUR + NOTICE
    assert w.get(spot.id).during is not None
    assert w.get(later.id).state == State.PENDING
    ticking.tick_until(Ctx(w.db, T0 + HOUR), T0 + 6 * HOUR, 30 * SEC)
    w.now = T0 + 6 * HOUR
    again = w.get(later.id)
    assert again.state == State.RELEASED and again.release_reason == ReleaseReason.EXPIRED

    windows = w.everything()
    assert all(u.end is not None for u in windows)
    # each side pays for what it held
    by_rsv = {rid: [u for u in windows if u.reservation_id == rid] for rid in (spot.id, urgent.id)}
    assert [(u.start, u.end) for u in by_rsv[spot.id]] == [(T0, deadline)]
    assert [(u.start, u.end) for u in by_rsv[urgent.id]] == [(deadline, deadline + 2 * HOUR)]
    [re_placed] = [u for u in windows if u.reservation_id == later.id]
    assert re_placed.start >= deadline + 2 * HOUR  # only once the urgent work was gone
    assert re_placed.end is not None
    assert re_placed.end - re_placed.start == HOUR
    # the sum over the timeline equals the GPU-hours actually active, and no GPU is billed twice
    active = _active_gpu_ms(w)
    assert round(sum(u.quantity for u in windows), 4) == round(active / HOUR, 4)
    assert round(sum(u.quantity for u in windows), 4) == round(8 * (62 + 120 + 60) / 60, 4)
    _no_atom_billed_twice(w)


def _active_gpu_ms(w: World) -> int:
    """From the event log: per reservation, GPUs x (released.at - active.at)."""
    total = 0
    for rsv in repo.reservations_where(w.db.conn):
        evs = repo.events(w.db.conn, tenant=None, reservation=rsv.id, since=None)
        starts = [e.at for e in evs if e.type == "reservation.active"]
        ends = [e.at for e in evs if e.type == "reservation.released"]
        if starts:
            gpus = sum(len(a.atoms) for a in rsv.allocations)
            total += gpus * ((ends[0] if ends else w.now) - starts[0])
    return total


def _no_atom_billed_twice(w: World) -> None:
    rows = w.db.conn.execute(
        "SELECT a.node_id, a.atoms, u.start, COALESCE(u.end, ?) FROM usage u"
        " JOIN allocations a ON a.id = u.allocation_id",
        (w.now,),
    ).fetchall()
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for node, atoms, start, end in rows:
        for atom in json.loads(atoms):
            spans.setdefault((node, atom), []).append((start, end))
    for key, items in spans.items():
        items.sort()
        for (_, e1), (s2, _) in itertools.pairwise(items):
            assert e1 <= s2, f"{key} billed twice: {items}"


# ---------------------------------------------------------------- --from / --to


def test_from_and_to_clip_quantities(world: World) -> None:
    rsv = world.reserve(8, models=("h100",), duration_ms=2 * HOUR)
    world.tick(T0)
    world.now = T0 + 15 * MIN
    [open_] = world.of(rsv.id)
    assert open_.end is None and open_.quantity == 2.0
    world.tick(T0 + 3 * HOUR)
    accounting.meter_create(world.ctx(), "gpu.h100.hours")
    [whole] = world.usage()
    assert (whole.start, whole.end, whole.quantity) == (T0, T0 + 2 * HOUR, 16.0)
    [mid] = world.usage(start=T0 + 30 * MIN, end=T0 + HOUR)
    assert (mid.start, mid.end, mid.quantity) == (T0 + 30 * MIN, T0 + HOUR, 4.0)
    [tail] = world.usage(start=T0 + 90 * MIN)
    assert (tail.start, tail.end, tail.quantity) == (T0 + 90 * MIN, T0 + 2 * HOUR, 4.0)
    [head] = world.usage(end=T0 + 6 * MIN)
    assert head.quantity == 0.8
    assert world.usage(start=T0 + 2 * HOUR) == []  # windows are half-open
    assert world.usage(end=T0) == []


def test_usage_as_of_an_earlier_now_counts_what_was_used_by_then(world: World) -> None:
    """A read may ask any --now (§2): as of it, a window closed later was still open, and one
    opened later did not exist; a period holding nothing of a window lists nothing of it."""
    short = world.reserve(8, models=("h100",), duration_ms=2 * HOUR)
    long_ = world.reserve(8, models=("a100",), duration_ms=6 * HOUR)
    world.tick(T0)
    later = world.reserve(4, models=("h100",), duration_ms=2 * HOUR, start=T0 + 2 * HOUR)
    world.tick(T0 + 3 * HOUR)  # short closed at 10:00; later active since this tick, 11:00
    world.now = T0 + HOUR  # as of 09:00
    got = {u.reservation_id: u for u in world.everything()}
    assert set(got) == {short.id, long_.id}
    assert (got[short.id].end, got[short.id].quantity) == (None, 8.0)
    assert (got[long_.id].end, got[long_.id].quantity) == (None, 8.0)
    # --to before now: the row says the interval it counts, open windows included
    cut = {u.reservation_id: u for u in world.usage(end=T0 + 30 * MIN)}
    cut.update((u.reservation_id, u) for u in world.usage(end=T0 + 30 * MIN, dead=True))
    assert {(u.start, u.end, u.quantity) for u in cut.values()} == {(T0, T0 + 30 * MIN, 4.0)}
    world.now = T0 + 210 * MIN
    got = {u.reservation_id: u for u in world.everything()}
    assert (got[short.id].end, got[short.id].quantity) == (T0 + 2 * HOUR, 16.0)
    assert got[later.id].quantity == 2.0
    # after every reservation's end, an open window (no tick closed it) holds nothing of it
    assert world.usage(start=T0 + 7 * HOUR) + world.usage(start=T0 + 7 * HOUR, dead=True) == []


@pytest.mark.parametrize("span", [(HOUR, 30 * MIN), (HOUR, HOUR)])
def test_to_must_be_after_from(world: World, span: tuple[int, int]) -> None:
    with pytest.raises(InvalidInput, match="--to must be after --from"):
        world.usage(start=T0 + span[0], end=T0 + span[1])


def test_cli_usage_from_to_json(run: Cli) -> None:
    run.ok("config", "set", "placement.topN", "1")
    run.ok("meter", "create", "gpu.h100.hours")
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--key", "k")
    run.ok("tick")
    open_rows = run.ok("usage", now=at(HOUR))
    assert open_rows[0]["end"] is None and open_rows[0]["quantity"] == 4.0
    run.ok("tick", now=at(3 * HOUR))  # expired at 2h: the window closes at its end
    rows = run.ok("usage", "--from", at(30 * MIN), "--to", at(HOUR), now=at(3 * HOUR))
    assert rows == [
        {
            "meter": "gpu.h100.hours",
            "tenantId": "acme",
            "reservationId": rsv["id"],
            "allocationId": rsv["allocations"][0]["id"],
            "start": NOW_MS + 30 * MIN,
            "end": NOW_MS + HOUR,
            "quantity": 2.0,
        }
    ]
    [whole] = run.ok("usage", now=at(3 * HOUR))
    assert (whole["start"], whole["end"], whole["quantity"]) == (NOW_MS, NOW_MS + 2 * HOUR, 8.0)
    assert run.ok("usage", "--tenant", "globex", now=at(HOUR)) == []
    assert run.ok("usage", "--dead-letter", now=at(HOUR)) == []
    err = run.fails(2, "usage", "--from", at(2 * HOUR), "--to", at(HOUR), now=at(3 * HOUR))
    assert err == {"code": "INVALID_INPUT", "message": "--to must be after --from"}
