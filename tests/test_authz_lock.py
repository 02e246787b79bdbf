"""Rights are checked again once the write lock is held (PRODUCT.md §3, §6): a command resolves
its principal before it waits for the lock, and an admin removed meanwhile must not act."""

from __future__ import annotations

from dataclasses import replace

import pgtest
import pytest
from conftest import ME, NOW, Cli

from better_compute.errors import Forbidden
from better_compute.model import Event, Principal
from better_compute.service import booking, setup, ticking, views
from better_compute.service.context import open_ctx


def test_an_admin_removed_while_waiting_for_the_lock_writes_nothing(run: Cli) -> None:
    run.ok("admin", "add", "alice")
    # As open_ctx resolves them (on PostgreSQL a principal is the session's role, so it is set
    # here): alice as an admin, and bob through alice's --as.
    base = open_ctx(pgtest.ledger(str(run.db)), NOW, ME, None)
    alice = replace(base, who=Principal("alice", admin=True))
    acting = replace(base, who=Principal("bob", admin=False, acting_admin="alice"))
    ask = booking.ReserveArgs(tenant="acme", pool=None, gpus=1, duration_ms=3_600_000)
    try:
        run.ok("admin", "remove", "alice")  # committed while alice's commands were under way
        with pytest.raises(Forbidden, match="'alice' is no longer an admin"):
            setup.tenant_create(alice, "zz")
        with pytest.raises(Forbidden, match="'alice' is no longer an admin"):
            booking.reserve(acting, ask)  # bob may book for acme, but only alice made this bob
        ticking.tick(alice)  # the lifecycle's own work needs no rights (§6)
    finally:
        base.db.close()
    # an admin acting --as another admin: that one's rights were what it was judged by
    run.ok("admin", "add", "carol")
    base = open_ctx(pgtest.ledger(str(run.db)), NOW, ME, None)
    as_carol = replace(base, who=Principal("carol", admin=True, acting_admin=ME))
    try:
        run.ok("admin", "remove", "carol")
        with pytest.raises(Forbidden, match="'carol' is no longer an admin"):
            setup.tenant_create(as_carol, "xx")
    finally:
        base.db.close()
    assert {"id": "zz"} not in run.ok("tenant", "list")
    assert run.ok("list", "--tenant", "acme") == []
    # an admin that stays one is not held back, and one added meanwhile needs no new look
    other = open_ctx(pgtest.ledger(str(run.db)), NOW, "admin", None)
    try:
        run.ok("admin", "add", "dave")
        setup.tenant_create(other, "yy")
    finally:
        other.db.close()
    assert {"id": "yy"} in run.ok("tenant", "list")


def test_a_follow_loses_an_admins_view_when_the_admin_is_removed(run: Cli) -> None:
    """`events --follow` re-reads its rights each page, as it re-reads policies (a review: an
    admin removed meanwhile kept streaming every tenant's events)."""
    run.ok("policy", "set", "--tenant", "acme", "--principal", "carol")  # acme: carol's only
    run.ok("admin", "add", "alice")
    base = open_ctx(pgtest.ledger(str(run.db)), NOW, ME, None)
    alice = replace(base, who=Principal("alice", admin=True))
    acting = replace(base, who=Principal("bob", admin=False, acting_admin="alice"))
    try:
        since = run.ok("events")[-1]["seq"]
        run.ok("admin", "remove", "alice")
        run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "secret")
        run.ok("pool", "create", "later")  # the fleet's: alice still sees it
        seen: list[Event] = []

        class Enough(Exception):
            pass

        def on_event(event: Event) -> None:
            seen.append(event)
            if event.type == "pool.created":
                raise Enough

        with pytest.raises(Enough):
            views.follow_events(alice, None, None, since, on_event, poll_seconds=0)
        assert [e.type for e in seen] == ["admin.removed", "pool.created"]
        with pytest.raises(Forbidden):
            views.follow_events(acting, None, None, since, on_event, poll_seconds=0)
    finally:
        base.db.close()
