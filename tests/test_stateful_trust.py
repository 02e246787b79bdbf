"""A state machine that mixes principals and clocks (issue 7) through the real service layer.

The ledger runs on a manual clock or on the real one (drawn once). Every write comes from a
principal (an admin, one named by a tenant's policy, one named nowhere, one denied) at an instant
that may be pinned ahead, lagging behind the ledger, or the real clock (stood in for by a clock the
test controls, so a "real" clock can lag too). Invariants after every step:

- no event is earlier than the one before it (history only moves forward);
- no principal touched a tenant it may not act for: every event a principal caused names a tenant
  it may act for, and every refusal of another tenant's reservation was NOT_FOUND;
- usage is never lost: a metered window never disappears, never moves its start, and once closed
  never changes its end; the GPU-hours of closed windows never go down;
- `--now` on a real-clock ledger writes nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from better_compute import clock
from better_compute.errors import BetterComputeError, Forbidden, InvalidInput, NotFound
from better_compute.inventory import parse_inventory
from better_compute.model import Principal
from better_compute.service import accounting, booking, setup, ticking
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage import ledger
from better_compute.storage.db import Database

T0 = 1_790_582_400_000
MIN = 60_000
HOUR = 60 * MIN

INVENTORY = parse_inventory(
    {
        "pools": [
            {
                "name": "p",
                "nodes": [
                    {"name": f"n{i}", "gpus": {"count": 4, "model": "h100"}} for i in range(1, 5)
                ],
            }
        ],
        "tenants": [{"id": "acme"}, {"id": "globex"}, {"id": "initech"}],
    }
)

ADMIN = Principal("root-admin", admin=True)
#: acme names alice; initech denies bob; globex has no policies (open to anyone).
PRINCIPALS = ("root-admin", "alice", "bob", "mallory")
MAY_ACT_FOR = {
    "root-admin": {"acme", "globex", "initech"},
    "alice": {"acme", "globex"},
    "bob": {"globex"},
    "mallory": {"globex"},
}

#: How a write picks its instant, relative to the ledger's latest: ahead, equal or lagging.
offsets = st.sampled_from([-2 * HOUR, -MIN, 0, 0, 30_000, MIN, 10 * MIN, HOUR])


class Trust(RuleBasedStateMachine):
    reservations = Bundle("reservations")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory(prefix="bc-trust-")
        self.db: Database | None = None
        self.real_now = T0
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(clock, "real_ms", lambda: self.real_now)
        self.windows: dict[int, tuple[int, int | None]] = {}
        self.closed_hours = 0.0

    @initialize(manual=st.booleans())
    def start(self, manual: bool) -> None:
        self.manual = manual
        self.db = setup.init(
            str(Path(self.tmp.name) / "bc.db"),
            T0,
            force=True,
            manual=manual,
            admin=ADMIN.name,
            group=None,
        )[0]
        setup.inventory_import(Ctx(self.db, T0, ADMIN), INVENTORY)
        admin = Ctx(self.db, T0, ADMIN)
        accounting.policy_set(admin, "acme", "alice", None, False, False)
        accounting.policy_set(admin, "initech", "bob", None, False, True)
        accounting.meter_create(Ctx(self.db, T0, ADMIN), "gpu.h100.hours")

    def teardown(self) -> None:
        self.patch.undo()
        if self.db is not None:
            self.db.close()
        self.tmp.cleanup()

    # ------------------------------------------------------------ helpers

    def latest(self) -> int:
        assert self.db is not None
        with self.db.read() as conn:
            return ledger.clock_state(conn).last_at

    def who(self, name: str) -> Principal:
        return ADMIN if name == ADMIN.name else Principal(name, admin=False)

    def ctx(self, name: str, offset: int) -> Ctx:
        """A command by `name` whose clock reads the ledger's latest instant plus `offset`."""
        assert self.db is not None
        wanted = self.latest() + offset
        if self.manual:  # a pinned --now, ahead or lagging
            return Ctx(self.db, wanted, self.who(name), asked=wanted, asked_by_flag=True)
        self.real_now = wanted  # this host's clock, ahead or lagging
        return Ctx(self.db, wanted, self.who(name))

    def tenant_of(self, rsv_id: str) -> str:
        with self.admin_read() as conn:
            return str(
                conn.execute(
                    "SELECT tenant_id FROM reservations WHERE id = ?", (rsv_id,)
                ).fetchone()[0]
            )

    def admin_read(self) -> Any:
        assert self.db is not None
        return self.db.read()

    # ------------------------------------------------------------ rules

    @rule(
        target=reservations,
        name=st.sampled_from(PRINCIPALS),
        tenant=st.sampled_from(["acme", "globex", "initech"]),
        gpus=st.integers(1, 4),
        hours=st.integers(1, 3),
        offset=offsets,
        spot=st.booleans(),
    )
    def reserve(
        self, name: str, tenant: str, gpus: int, hours: int, offset: int, spot: bool
    ) -> str | None:
        args = ReserveArgs(tenant, None, gpus, hours * HOUR, spot=spot)
        try:
            rsv = booking.reserve(self.ctx(name, offset), args)
        except Forbidden:
            assert tenant not in MAY_ACT_FOR[name]
            return None
        assert tenant in MAY_ACT_FOR[name], (name, tenant)
        return rsv.id

    @rule(
        rsv=reservations,
        name=st.sampled_from(PRINCIPALS),
        verb=st.sampled_from(["release", "cancel", "extend", "get"]),
        offset=offsets,
    )
    def touch(self, rsv: str | None, name: str, verb: str, offset: int) -> None:
        if rsv is None:
            return
        allowed = self.tenant_of(rsv) in MAY_ACT_FOR[name]
        c = self.ctx(name, offset)
        try:
            if verb == "release":
                booking.release(c, rsv)
            elif verb == "cancel":
                booking.cancel(c, rsv)
            elif verb == "extend":
                booking.extend(c, rsv, HOUR)
            else:
                booking.get(c, rsv)
        except NotFound:
            assert not allowed, (name, verb, rsv)
            return
        except BetterComputeError:  # the state forbids it, or an extend collides
            assert allowed, (name, verb, rsv)
            return
        assert allowed, (name, verb, rsv)

    @rule(name=st.sampled_from(PRINCIPALS), offset=offsets)
    def tick(self, name: str, offset: int) -> None:
        ticking.tick(self.ctx(name, offset))

    @rule(name=st.sampled_from(PRINCIPALS), offset=offsets)
    def repair(self, name: str, offset: int) -> None:
        ticking.repair(self.ctx(name, offset), None)

    @rule(offset=offsets)
    def now_flag_on_a_real_clock_writes_nothing(self, offset: int) -> None:
        if self.manual:
            return
        assert self.db is not None
        before = self.snapshot()
        wanted = self.latest() + offset
        c = Ctx(self.db, wanted, ADMIN, asked=wanted, asked_by_flag=True)
        with pytest.raises(InvalidInput):
            ticking.tick(c)
        assert self.snapshot() == before

    def snapshot(self) -> tuple[Any, ...]:
        with self.admin_read() as conn:
            return (
                conn.execute("SELECT MAX(seq) FROM events").fetchone()[0],
                ledger.clock_state(conn).last_at,
            )

    # ------------------------------------------------------------ invariants

    @invariant()
    def history_only_moves_forward(self) -> None:
        if self.db is None:
            return
        with self.admin_read() as conn:
            ats = [r[0] for r in conn.execute("SELECT at FROM events ORDER BY seq")]
            last = ledger.clock_state(conn).last_at
        assert ats == sorted(ats)
        assert not ats or ats[-1] <= last

    @invariant()
    def no_principal_touched_a_tenant_it_may_not_act_for(self) -> None:
        if self.db is None:
            return
        with self.admin_read() as conn:
            rows = conn.execute(
                "SELECT actor, tenant_id, type FROM events WHERE tenant_id IS NOT NULL"
                " AND actor != 'system'"
            ).fetchall()
        for actor, tenant, type_ in rows:
            assert tenant in MAY_ACT_FOR[actor], (actor, tenant, type_)

    @invariant()
    def usage_is_never_lost(self) -> None:
        if self.db is None:
            return
        with self.admin_read() as conn:
            rows = conn.execute("SELECT id, start, end, gpus FROM usage").fetchall()
        now = {r[0]: (r[1], r[2]) for r in rows}
        for wid, (start, end) in self.windows.items():
            assert wid in now, f"usage window {wid} disappeared"
            assert now[wid][0] == start
            if end is not None:
                assert now[wid][1] == end, f"closed window {wid} changed its end"
        self.windows = now
        closed = sum(g * (e - s) / HOUR for _, s, e, g in rows if e is not None)
        assert closed >= self.closed_hours - 1e-9
        self.closed_hours = closed


Trust.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestTrust = Trust.TestCase
