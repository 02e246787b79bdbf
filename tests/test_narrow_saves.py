"""A save writes only the columns that changed from the row as stored (repo.save_reservation's
`stored`). A pending request is retried every 30 s (PRODUCT.md §5.4), and a retry that fails
changes only its next attempt: rewriting the whole row updated every index of `reservations`,
about a seventh of a waiting replay's time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pgtest
from conftest import HOUR, ME, NOW_MS, Cli, at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_partial_indexes import _statements

from better_compute.model import Condition, ReleaseReason, State, Window
from better_compute.service import ticking
from better_compute.service.context import open_ctx
from better_compute.storage import repo
from better_compute.storage.db import open_ledger


def _pending(solo: Cli) -> str:
    """A reservation that waits: the only node is booked whole for two hours."""
    solo.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "2h")
    waiting = solo.ok("reserve", "--tenant", "globex", "--gpus", "4", "--for", "1h")
    assert waiting["state"] == "pending"
    solo.ok("tick")  # the first one starts: a tick 30 s later only retries the other
    return str(waiting["id"])


def _updates(ctx: Any, call: Any) -> list[str]:
    """The UPDATEs of `reservations` that `call` runs on the command's connection."""
    return [sql for sql, _ in _statements(ctx.db, call, "UPDATE RESERVATIONS")]


def test_a_failed_retry_writes_only_its_next_attempt(solo: Cli) -> None:
    rsv_id = _pending(solo)
    ctx = open_ctx(pgtest.ledger(str(solo.db)), at(HOUR // 120), ME, None)  # 30 s later
    try:
        updates = _updates(ctx, lambda: ticking.tick(ctx))
    finally:
        ctx.db.close()
    assert len(updates) == 1 and " next_attempt_at = " in updates[0], updates
    assert "state" not in updates[0] and "conditions" not in updates[0], updates
    got = solo.ok("get", rsv_id, now=at(HOUR // 120))
    assert got["state"] == "pending" and got["nextAttemptAt"] == NOW_MS + 60_000


def test_the_retry_that_places_it_writes_the_whole_change(solo: Cli) -> None:
    rsv_id = _pending(solo)
    solo.ok("tick", now=at(2 * HOUR))
    got = solo.ok("get", rsv_id, now=at(2 * HOUR))
    assert got["state"] in ("placed", "binding", "active"), got
    assert got["during"]["start"] == NOW_MS + 2 * HOUR and got["nextAttemptAt"] is None


_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "state": st.sampled_from([State.PENDING, State.PLACED, State.RELEASED]),
        "during": st.none() | st.builds(Window, st.just(1000), st.integers(2000, 9000)),
        "conditions": st.sampled_from([(), (Condition("Unschedulable", "NoCapacity", "full"),)]),
        "quota_charge": st.integers(0, 64),
        "release_reason": st.none() | st.just(ReleaseReason.CANCELLED),
        "next_attempt_at": st.none() | st.integers(0, 10**13),
        "lead_checked": st.booleans(),
        "start_checked": st.booleans(),
        "preempt_deadline": st.none() | st.integers(0, 10**13),
        "preempted_by": st.none() | st.just("rsv_other"),
        "duration_ms": st.integers(60_000, 10**9),
    },
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=_CHANGES, second=_CHANGES)
def test_a_narrow_save_leaves_the_row_a_whole_save_would(
    solo: Cli, first: dict[str, Any], second: dict[str, Any]
) -> None:
    """From any stored row, saving a changed reservation with `stored` gives the same row as
    saving it whole (the row is put back as it was after each example)."""
    waiting = solo.ok("list", "--state", "pending")  # the fixture outlives one example
    rsv_id = waiting[0]["id"] if waiting else _pending(solo)
    ledger = open_ledger(pgtest.ledger(str(solo.db)))
    try:
        with ledger.write() as conn:
            base = repo.get_reservation(conn, rsv_id)
            stored = dataclasses.replace(base, **first)
            repo.save_reservation(conn, stored)
            changed = dataclasses.replace(stored, **second)
            repo.save_reservation(conn, changed, stored=stored)
            narrow = _row(conn, rsv_id)
            repo.save_reservation(conn, changed)
            assert _row(conn, rsv_id) == narrow
            repo.save_reservation(conn, base)
    finally:
        ledger.close()


def _row(conn: Any, rsv_id: str) -> tuple[Any, ...]:
    return tuple(conn.execute("SELECT * FROM reservations WHERE id = ?", (rsv_id,)).fetchone())
