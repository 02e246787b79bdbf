"""A state machine that drives the whole lifecycle through the real service layer.

Rules: reserve (now or later, spot or not, gangs), cancel, release, extend, tick forward in time,
cordon and uncordon a node, BookingRepair of one or every placed reservation. A model records each
reservation's expected state, tenant and quota charge; every rule says which states each
reservation may be in afterwards (exactly one when the outcome is determined), and the observed
state must be one of them.

Invariants after every step: states move only along pending → placed → binding → active →
released (placed → pending only for BookingRepair or a requeued spot victim); no atom is booked
twice at once; a live reservation books exactly its allocations (one per gang member) over its
window; a released or pending reservation holds no booking after now; the quota a tenant holds
(quota_charge of its reservations that are not released) is what the model says.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pgtest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from better_compute.errors import Conflict, QuotaExceeded
from better_compute.inventory import parse_inventory
from better_compute.model import LIVE_STATES, ReleaseReason, Reservation, State, Window
from better_compute.service import booking, setup, ticking
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage.conn import Ledger

T0 = 1_790_582_400_000  # 2026-09-28T08:00:00Z
SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
RETRY_MS = 30 * SEC
NOTICE_MS = 2 * MIN
BETA_QUOTA = 16
NODES = ("n1", "n2", "n3", "n4", "n5")


def _node(name: str, clique: int) -> dict[str, Any]:
    return {
        "name": name,
        "gpus": {
            "count": 4,
            "model": "h100",
            "nvlinkGroups": 2,
            "fabric": {"cluster": "c1", "clique": clique},
        },
    }


INVENTORY = parse_inventory(
    {
        "pools": [
            {
                "name": "p",
                "nodes": [
                    _node("n1", 1),
                    _node("n2", 1),
                    _node("n3", 1),
                    _node("n4", 2),
                    _node("n5", 2),
                ],
            }
        ],
        "tenants": [{"id": "acme"}, {"id": "beta", "quota": {"gpus": BETA_QUOTA}}],
    }
)

#: Where each state can get to along the lifecycle (placed → pending included).
REACHABLE: dict[State, frozenset[State]] = {
    State.PENDING: frozenset(State),
    State.PLACED: frozenset(State),
    State.BINDING: frozenset({State.BINDING, State.ACTIVE, State.RELEASED}),
    State.ACTIVE: frozenset({State.ACTIVE, State.RELEASED}),
    State.RELEASED: frozenset({State.RELEASED}),
}


@dataclass
class Expect:
    """What the model knows of one reservation."""

    tenant: str
    charge: int
    spot: bool
    gang: int | None
    duration_ms: int
    start: int | None
    state: State
    release_reason: ReleaseReason | None = None


class Lifecycle(RuleBasedStateMachine):
    reservations = Bundle("reservations")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory(prefix="bc-state-")
        self.db: Ledger = setup.init(
            pgtest.ledger(str(Path(self.tmp.name) / "bc.db")),  # on --backend postgres, a schema
            T0,
            force=True,
            manual=True,
            admin="admin",
            group=None,
        )[0]
        setup.inventory_import(Ctx(self.db, T0), INVENTORY)
        self.now = T0
        self.model: dict[str, Expect] = {}
        self.cordoned: set[str] = set()

    def teardown(self) -> None:
        self.db.close()
        self.tmp.cleanup()

    # ------------------------------------------------------------ helpers

    def ctx(self) -> Ctx:
        return Ctx(self.db, self.now)

    def observed(self) -> dict[str, Reservation]:
        return {r.id: r for r in booking.list_reservations(self.ctx(), None, None, [])}

    def held(self, tenant: str) -> int:
        return sum(
            e.charge
            for e in self.model.values()
            if e.tenant == tenant and e.state != State.RELEASED
        )

    def unchanged(self) -> dict[str, frozenset[State]]:
        return {rid: frozenset({e.state}) for rid, e in self.model.items()}

    def on_cordoned(self, rsv: Reservation) -> bool:
        return any(a.node_id in self.cordoned for a in rsv.allocations)

    def settle(
        self,
        allowed: dict[str, frozenset[State]],
        before: dict[str, Reservation],
        reasons: dict[str, ReleaseReason] | None = None,
    ) -> dict[str, Reservation]:
        """Check every reservation is in an allowed state, moved legally; update the model."""
        after = self.observed()
        assert set(after) == set(self.model), "reservations appeared or vanished"
        for rid, rsv in after.items():
            exp = self.model[rid]
            old = exp.state
            assert rsv.state in allowed[rid], (
                f"{rid} is {rsv.state}, expected one of {sorted(allowed[rid])} (was {old})"
            )
            assert rsv.state in REACHABLE[old], f"{rid} moved {old} → {rsv.state}"
            if old == State.PLACED and rsv.state == State.PENDING:
                prior = before[rid]
                assert exp.spot or self.on_cordoned(prior), (
                    f"{rid} fell back to pending without a bad node or a preemption: {rsv}"
                )
                assert rsv.conditions and rsv.conditions[0].reason in (
                    "BookingRepairFailed",
                    "SpotPreempted",
                ), rsv.conditions
            if rsv.state == State.RELEASED and old != State.RELEASED:
                want = (reasons or {}).get(rid)
                if want is not None:
                    assert rsv.release_reason == want, (rid, rsv.release_reason, want)
                if rsv.release_reason == ReleaseReason.PREEMPTED:
                    assert exp.spot, f"{rid} is not spot but was preempted"
                exp.release_reason = rsv.release_reason
            exp.state = rsv.state
        return after

    # ------------------------------------------------------------ rules

    @initialize()
    def start(self) -> None:
        assert self.observed() == {}

    @rule(
        target=reservations,
        tenant=st.sampled_from(["acme", "acme", "beta"]),
        gpus=st.sampled_from([1, 2, 4, 4]),
        gang=st.sampled_from([None, None, 2, 3]),
        key=st.booleans(),
        spot=st.booleans(),
        duration=st.sampled_from([30 * MIN, HOUR, 2 * HOUR]),
    )
    def reserve_now(
        self, tenant: str, gpus: int, gang: int | None, key: bool, spot: bool, duration: int
    ) -> Any:
        return self._reserve(tenant, gpus, gang, key, spot, None, duration)

    @rule(
        target=reservations,
        tenant=st.sampled_from(["acme", "acme", "beta"]),
        gpus=st.sampled_from([1, 2, 4, 4]),
        gang=st.sampled_from([None, None, 2, 3]),
        key=st.booleans(),
        spot=st.booleans(),
        start_in=st.sampled_from([2 * MIN, 10 * MIN, 20 * MIN, HOUR]),
        duration=st.sampled_from([30 * MIN, HOUR, 2 * HOUR]),
    )
    def reserve_later(
        self,
        tenant: str,
        gpus: int,
        gang: int | None,
        key: bool,
        spot: bool,
        start_in: int,
        duration: int,
    ) -> Any:
        return self._reserve(tenant, gpus, gang, key, spot, start_in, duration)

    def _reserve(
        self,
        tenant: str,
        gpus: int,
        gang: int | None,
        key: bool,
        spot: bool,
        start_in: int | None,
        duration: int,
    ) -> Any:
        start = None if start_in is None else self.now + start_in
        args = ReserveArgs(
            tenant=tenant,
            pool=None,
            gpus=gpus,
            duration_ms=duration,
            gang=gang,
            topology_key="fabric.domain" if gang is not None and key else None,
            start=start,
            spot=spot,
        )
        charge = gpus * (gang or 1)
        over = tenant == "beta" and self.held(tenant) + charge > BETA_QUOTA
        before = self.observed()
        try:
            rsv = booking.reserve(self.ctx(), args)
        except QuotaExceeded:
            assert over, f"quota refused {charge} GPUs for {tenant} holding {self.held(tenant)}"
            self.settle(self.unchanged(), before)
            return multiple()
        assert not over, f"{tenant} holds {self.held(tenant)} of {BETA_QUOTA}, got {charge} more"
        assert rsv.id not in self.model
        assert rsv.quota_charge == charge
        assert rsv.state in (State.PLACED, State.PENDING), rsv
        wanted = start if start is not None else self.now
        if rsv.state == State.PLACED:
            assert rsv.during is not None
            starts = {wanted} if spot else {wanted, max(wanted, self.now + NOTICE_MS)}
            assert rsv.during.start in starts, (rsv.during, starts)
            assert rsv.during.end == rsv.during.start + duration
            assert len(rsv.allocations) == (gang or 1)
        else:
            assert rsv.during is None and rsv.allocations == ()
            assert rsv.next_attempt_at == self.now + RETRY_MS
        self.model[rsv.id] = Expect(tenant, charge, spot, gang, duration, start, rsv.state)
        # A regular request may have preempted spot work: cut back (still live) or requeued.
        allowed = self.unchanged()
        for rid, prior in before.items():
            if self.model[rid].spot and not spot and prior.state in LIVE_STATES:
                allowed[rid] = allowed[rid] | {State.PENDING}
        after = self.settle(allowed, before)
        for rid, prior in before.items():
            if prior.state == State.PLACED and after[rid].state == State.PENDING:
                assert after[rid].conditions[0].reason == "SpotPreempted"
        return rsv.id

    @rule(rsv=reservations)
    def cancel(self, rsv: str) -> None:
        before = self.observed()
        allowed = self.unchanged()
        cancellable = self.model[rsv].state in (State.PENDING, State.PLACED)
        try:
            done = booking.cancel(self.ctx(), rsv)
        except Conflict:
            assert not cancellable, f"cancel of {self.model[rsv].state} {rsv} refused"
            self.settle(allowed, before)
            return
        assert cancellable, f"cancel of {self.model[rsv].state} {rsv} accepted"
        assert done.state == State.RELEASED
        allowed[rsv] = frozenset({State.RELEASED})
        self.settle(allowed, before, {rsv: ReleaseReason.CANCELLED})

    @rule(rsv=reservations)
    def release(self, rsv: str) -> None:
        before = self.observed()
        allowed = self.unchanged()
        releasable = self.model[rsv].state in LIVE_STATES
        try:
            booking.release(self.ctx(), rsv)
        except Conflict:
            assert not releasable, f"release of {self.model[rsv].state} {rsv} refused"
            self.settle(allowed, before)
            return
        assert releasable, f"release of {self.model[rsv].state} {rsv} accepted"
        allowed[rsv] = frozenset({State.RELEASED})
        self.settle(allowed, before, {rsv: ReleaseReason.RELEASED})

    @rule(rsv=reservations, by=st.sampled_from([10 * MIN, HOUR]))
    def extend(self, rsv: str, by: int) -> None:
        before = self.observed()
        prior = before[rsv]
        possible = (
            prior.state in LIVE_STATES
            and prior.preempt_deadline is None
            and prior.during is not None
            and prior.during.end + by > self.now
        )
        try:
            done = booking.extend(self.ctx(), rsv, by)
        except Conflict:
            self.settle(self.unchanged(), before)
            assert self.observed()[rsv].during == prior.during, "a refused extend moved the end"
            return
        assert possible, f"extend of {prior} accepted"
        assert prior.during is not None and done.during is not None
        assert done.during == Window(prior.during.start, prior.during.end + by)
        # durationMs is the booked window's length from now on; a requeue retries for that long
        self.model[rsv].duration_ms = done.during.end - done.during.start
        self.settle(self.unchanged(), before)

    @rule(advance=st.sampled_from([0, 30 * SEC, 2 * MIN, 5 * MIN]))
    def tick_soon(self, advance: int) -> None:
        self._tick(advance)

    @rule(advance=st.sampled_from([16 * MIN, 45 * MIN, HOUR, 3 * HOUR]))
    def tick_later(self, advance: int) -> None:
        self._tick(advance)

    def _tick(self, advance: int) -> None:
        self.now += advance
        t = self.now
        before = self.observed()
        allowed: dict[str, frozenset[State]] = {}
        reasons: dict[str, ReleaseReason] = {}
        for rid, r in before.items():
            exp = self.model[rid]
            if r.state == State.RELEASED:
                allowed[rid] = frozenset({State.RELEASED})
            elif (
                r.state in LIVE_STATES
                and r.preempt_deadline is not None
                and r.preempt_deadline <= t
            ):
                allowed[rid] = frozenset({State.RELEASED})
                reasons[rid] = ReleaseReason.PREEMPTED
            elif r.state in LIVE_STATES and r.during is not None and r.during.end <= t:
                allowed[rid] = frozenset({State.RELEASED})
                reasons[rid] = ReleaseReason.EXPIRED
            elif r.state in (State.ACTIVE, State.BINDING):
                # every node is reachable and autoBind is on: binding never outlives a tick
                allowed[rid] = frozenset({State.ACTIVE})
            elif r.state == State.PLACED:
                assert r.during is not None
                started = r.during.start <= t
                # started: bound in this tick (after a repair at its start, if one was due);
                # pending only when a repair failed or a spot victim was requeued (see settle)
                allowed[rid] = frozenset({State.ACTIVE if started else State.PLACED, State.PENDING})
            elif r.next_attempt_at is not None and r.next_attempt_at <= t:
                allowed[rid] = frozenset({State.PENDING, State.PLACED, State.ACTIVE})
            else:
                allowed[rid] = frozenset({State.PENDING})
            if exp.state != r.state:
                raise AssertionError(f"model lost track of {rid}")
        events = ticking.tick(self.ctx())
        after = self.settle(allowed, before, reasons)
        for rid, r in after.items():
            prior, exp = before[rid], self.model[rid]
            if prior.state == State.PENDING and r.state in LIVE_STATES:
                assert r.during is not None
                wanted = exp.start if exp.start is not None and exp.start > t else t
                starts = {wanted} if exp.spot else {wanted, max(wanted, t + NOTICE_MS)}
                assert r.during.start in starts, (rid, r.during, starts)
                if r.preempt_deadline is None:
                    assert r.during.end - r.during.start == exp.duration_ms
                else:  # placed by this tick's retry, then preempted by a later retry in it
                    assert exp.spot and r.during.end == r.preempt_deadline
            if r.state == State.PENDING:
                assert r.next_attempt_at is not None and r.next_attempt_at > t, r
            if r.state == State.PLACED:
                assert r.during is not None and r.during.start > t, r
        assert ticking.tick(self.ctx()) == [], "a second tick at the same instant changed things"
        assert all(e.at <= t for e in events)

    @precondition(lambda self: len(self.cordoned) < 2)
    @rule(node=st.sampled_from(NODES))
    def cordon(self, node: str) -> None:
        before = self.observed()
        setup.node_flag(self.ctx(), node, "node.cordoned", None, schedulable=0, cordon_reason="x")
        self.cordoned.add(node)
        self.settle(self.unchanged(), before)

    @precondition(lambda self: bool(self.cordoned))
    @rule(data=st.data())
    def uncordon(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(self.cordoned)))
        before = self.observed()
        setup.node_uncordon(self.ctx(), node)
        self.cordoned.discard(node)
        self.settle(self.unchanged(), before)

    def _repair_expectations(
        self, before: dict[str, Reservation], targets: set[str]
    ) -> dict[str, frozenset[State]]:
        allowed = self.unchanged()
        for rid in targets:
            under_notice = before[rid].preempt_deadline is not None
            if (
                before[rid].state == State.PLACED
                and self.on_cordoned(before[rid])
                and not under_notice
            ):
                allowed[rid] = frozenset({State.PLACED, State.PENDING})
        return allowed

    def _check_repaired(
        self, before: dict[str, Reservation], after: dict[str, Reservation], targets: set[str]
    ) -> None:
        for rid, r in after.items():
            prior = before[rid]
            # A spot reservation under notice ends at its deadline: repair leaves it alone.
            untouched = prior.state != State.PLACED or prior.preempt_deadline is not None
            if untouched or rid not in targets:
                assert r.allocations == prior.allocations, f"repair touched {rid}"
                continue
            if not self.on_cordoned(prior):
                assert r.allocations == prior.allocations, f"repair moved healthy {rid}"
            elif r.state == State.PLACED:
                assert not self.on_cordoned(r), f"repair left {rid} on a cordoned node"
                assert r.during == prior.during, "repair must keep the window"

    @rule()
    def repair_all(self) -> None:
        before = self.observed()
        allowed = self._repair_expectations(before, set(before))
        ticking.repair(self.ctx(), None)
        self._check_repaired(before, self.settle(allowed, before), set(before))

    @rule(rsv=reservations)
    def repair_one(self, rsv: str) -> None:
        before = self.observed()
        allowed = self._repair_expectations(before, {rsv})
        try:
            ticking.repair(self.ctx(), rsv)
        except Conflict:
            assert before[rsv].state != State.PLACED, f"repair of placed {rsv} refused"
            self.settle(self.unchanged(), before)
            return
        assert before[rsv].state == State.PLACED, f"repair of {before[rsv].state} {rsv} accepted"
        self._check_repaired(before, self.settle(allowed, before), {rsv})

    # ------------------------------------------------------------ invariants

    @invariant()
    def model_matches(self) -> None:
        seen = {rid: r.state for rid, r in self.observed().items()}
        assert seen == {rid: e.state for rid, e in self.model.items()}

    @invariant()
    def no_double_booking(self) -> None:
        clash = self.db.conn.execute(
            "SELECT a.node_id, a.atom, a.reservation_id, b.reservation_id FROM bookings a"
            " JOIN bookings b ON b.node_id = a.node_id AND b.atom = a.atom AND b.id > a.id"
            ' WHERE a.start < b."end" AND b.start < a."end" AND a.start < a."end"'
            ' AND b.start < b."end"'
        ).fetchall()
        assert not clash, f"atoms booked twice at once: {[tuple(c) for c in clash]}"

    @invariant()
    def live_bookings_are_the_allocations(self) -> None:
        for rsv in self.observed().values():
            rows = sorted(
                tuple(r)
                for r in self.db.conn.execute(
                    'SELECT node_id, atom, start, "end" FROM bookings WHERE reservation_id = ?',
                    (rsv.id,),
                )
            )
            if rsv.state in LIVE_STATES:
                assert rsv.during is not None
                want = sorted(
                    (a.node_id, atom, rsv.during.start, rsv.during.end)
                    for a in rsv.allocations
                    for atom in a.atoms
                )
                assert rows == want, f"{rsv.id} books {rows}, its allocations say {want}"
                assert len(rsv.allocations) == (rsv.gang_size or 1), rsv

    @invariant()
    def released_hold_no_future_bookings(self) -> None:
        rows = self.db.conn.execute(
            'SELECT b.reservation_id, b.node_id, b.atom, b.start, b."end" FROM bookings b'
            " JOIN reservations r ON r.id = b.reservation_id"
            " WHERE r.state IN ('released', 'pending') AND b.\"end\" > ?",
            (self.now,),
        ).fetchall()
        assert not rows, (
            f"released or pending reservations hold bookings: {[tuple(r) for r in rows]}"
        )

    @invariant()
    def quota_held_matches_the_model(self) -> None:
        for tenant in ("acme", "beta"):
            held = self.db.conn.execute(
                "SELECT COALESCE(SUM(quota_charge), 0) FROM reservations"
                " WHERE tenant_id = ? AND state != 'released'",
                (tenant,),
            ).fetchone()[0]
            assert held == self.held(tenant), (tenant, held, self.held(tenant))
        assert self.held("beta") <= BETA_QUOTA


Lifecycle.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLifecycle = Lifecycle.TestCase
