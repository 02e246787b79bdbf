"""Migration 13: every booking names its reservation's tenant, so a GPU-hour budget's sums read
one range of bookings_tenant instead of a lookup per reservation of the tenant (issue 8 at fleet
scale: a budget made a `reserve` of a tenant with 20,000 reservations 0.5 s slower).

The column is only as good as the writes that fill it, so a ledger's whole history (placing,
gangs, updates that keep or move a place, extends, spot work preempted and requeued, repairs,
releases) is checked for a booking without its tenant, and an older ledger's bookings are
checked to be named by the migration itself. The budget's shortcut (the bound service/budgets.
_fullest tries first) is checked against the exact fullest period it stands in for.
"""

from __future__ import annotations

import sqlite3

import pgtest
import pytest
from conftest import DAY, HOUR, Cli, at
from hypothesis import given
from hypothesis import strategies as st

from better_compute.model import Window
from better_compute.service.budgets import fullest_period
from better_compute.storage.db import open_ledger
from better_compute.storage.schema import SCHEMA_VERSION

#: Bookings whose tenant is not their reservation's (NULL included).
_MISNAMED = """SELECT COUNT(*) FROM bookings b JOIN reservations r ON r.id = b.reservation_id
WHERE b.tenant_id IS NULL OR b.tenant_id <> r.tenant_id"""


def _counts(cli: Cli) -> tuple[int, int]:
    """(bookings, bookings not named by their reservation's tenant)."""
    ledger = open_ledger(pgtest.ledger(str(cli.db)))
    try:
        with ledger.read() as conn:
            total = int(conn.execute("SELECT COUNT(*) FROM bookings").fetchone()[0])
            return total, int(conn.execute(_MISNAMED).fetchone()[0])
    finally:
        ledger.close()


def test_every_write_of_bookings_names_the_tenant(run: Cli) -> None:
    def reserve(tenant: str, *args: object, now: str | None = None) -> dict[str, object]:
        extra = {} if now is None else {"now": now}
        doc: dict[str, object] = run.ok("reserve", "--tenant", tenant, *args, **extra)
        return doc

    reserve("acme", "--gpus", "3", "--for", "2h")
    reserve("globex", "--gpus", "4", "--gang", "2", "--for", "1h", "--start", at(2 * HOUR))
    later = reserve("acme", "--gpus", "2", "--for", "1h", "--start", at(5 * HOUR))
    run.ok("update", later["id"], "--for", "2h")  # keeps its place: rebooked in place
    assert _counts(run)[1] == 0  # before a later write moves it
    run.ok("update", later["id"], "--gpus", "8")  # placed afresh
    active = reserve("globex", "--gpus", "1", "--for", "1h")
    run.ok("extend", active["id"], "--by", "1h")
    # spot work over the whole pool, then regular work that preempts some of it
    spot = reserve("globex", "--gpus", "8", "--gang", "2", "--for", "6h", "--spot")
    reserve("acme", "--gpus", "8", "--gang", "5", "--for", "1h", "--start", at(HOUR))
    run.ok("tick", now=at(HOUR))
    kinds = {e["type"] for e in run.ok("events", now=at(HOUR)) if e["reservationId"] == spot["id"]}
    assert "reservation.preempting" in kinds, "the regular gang preempted the spot one"
    # a node going bad moves the future bookings on it (BookingRepair)
    node = run.ok("get", later["id"])["allocations"][0]["nodeId"]
    run.ok("node", "cordon", node, "--reason", "fan failure", now=at(HOUR))
    run.ok("repair", now=at(HOUR))
    run.ok("release", active["id"], now=at(HOUR))
    run.ok("tick", now=at(DAY))
    total, misnamed = _counts(run)
    assert total > 0 and misnamed == 0


@pytest.mark.sqlite_only(reason="turns an SQLite file back into one migration 12 left")
def test_the_migration_names_the_tenant_of_older_bookings(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "1000", "--period", "7d")
    for tenant, gpus in (("acme", 4), ("globex", 8), ("acme", 2)):
        run.ok("reserve", "--tenant", tenant, "--gpus", gpus, "--for", "5h", "--start", at(HOUR))
    before = run.ok("quota", "show", "--tenant", "acme")
    conn = sqlite3.connect(str(run.db), isolation_level=None)
    try:
        # What migration 12 left: no column, no index, version 12.
        conn.execute("DROP TRIGGER bookings_tenant_named")
        conn.execute("DROP INDEX bookings_tenant")
        conn.execute("ALTER TABLE bookings DROP COLUMN tenant_id")
        conn.execute("PRAGMA user_version = 12")
    finally:
        conn.close()
    after = run.ok("quota", "show", "--tenant", "acme")  # opening it runs migration 13
    assert after == before and after["budgets"][0]["bookedAhead"] == 30
    total, misnamed = _counts(run)
    assert total == 4 + 8 + 2 and misnamed == 0


@pytest.mark.sqlite_only(reason="turns an SQLite file back into one migration 13 left")
@pytest.mark.parametrize("with_trigger", [False, True], ids=["13", "13-with-trigger"])
def test_a_ledger_at_version_13_gains_the_trigger(run: Cli, with_trigger: bool) -> None:
    """Migration 13 shipped without the trigger, and for a while a commit had put it into 13
    (a review: such a ledger's schema then matched neither): both kinds open and reach the
    current version."""
    conn = sqlite3.connect(str(run.db), isolation_level=None)
    try:
        if not with_trigger:
            conn.execute("DROP TRIGGER bookings_tenant_named")
        conn.execute("PRAGMA user_version = 13")
    finally:
        conn.close()
    assert run.ok("pool", "list")  # opening it runs migration 14
    conn = sqlite3.connect(str(run.db))
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        named = conn.execute(
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'bookings_tenant_named'"
        ).fetchone()[0]
    finally:
        conn.close()
    assert (version, named) == (SCHEMA_VERSION, 1)


def test_a_booking_written_without_its_tenant_is_named_by_the_ledger(run: Cli) -> None:
    """A process of the version before migration 13, still running when another one migrated
    the ledger, inserts bookings without the column (a hostile review: a budget then never
    counted them). The ledger's trigger names the tenant from the reservation."""
    rsv = run.ok("reserve", "--tenant", "globex", "--gpus", "2", "--for", "1h")
    ledger = open_ledger(pgtest.ledger(str(run.db)))
    try:
        with ledger.write() as conn:
            conn.execute(
                "INSERT INTO bookings(pool_id, node_id, atom, allocation_id, reservation_id,"
                ' spot, start, "end") SELECT pool_id, node_id, 7, allocation_id,'
                ' reservation_id, spot, start, "end" FROM bookings WHERE reservation_id = ?'
                " AND atom = (SELECT MIN(atom) FROM bookings WHERE reservation_id = ?)",
                (rsv["id"], rsv["id"]),
            )
            named = conn.execute(
                "SELECT tenant_id FROM bookings WHERE reservation_id = ? AND atom = 7",
                (rsv["id"],),
            ).fetchall()
    finally:
        ledger.close()
    assert [tuple(r) for r in named] == [("globex",)]
    assert _counts(run)[1] == 0


@given(
    st.lists(st.tuples(st.integers(0, 80), st.integers(1, 30), st.integers(1, 4)), max_size=8),
    st.integers(0, 80),
    st.integers(1, 30),
    st.integers(1, 40),
    st.integers(1, 4),
)
def test_the_shortcut_bounds_the_fullest_period(
    spans: list[tuple[int, int, int]], start: int, length: int, period: int, gpus: int
) -> None:
    """The bound admits (budgets._fullest answers None) when what is booked in [start - period,
    end + period), plus the request's whole GPU-time, fits the budget. That sum is never less
    than the fullest period with the request in it, so whatever the shortcut admits the exact
    check admits too."""
    window = Window(start, start + length)
    spans = [(s, s + d, n) for s, d, n in spans]
    near = Window(window.start - period, window.end + period)
    booked = sum(n * max(0, min(e, near.end) - max(s, near.start)) for s, e, n in spans)
    _, most = fullest_period([*spans, (window.start, window.end, gpus)], window, period)
    assert most <= booked + gpus * length


def test_a_budget_near_its_limit_still_takes_the_exact_check(run: Cli) -> None:
    """Far from the limit the shortcut admits; near it, the fullest period decides. 20 GPU-hours
    a day: 16 booked today and 16 tomorrow leave 4 for a request that reaches into both days,
    which the sum over both (32) would refuse without the exact check."""
    run.ok("quota", "set", "--tenant", "acme", "--gpu-hours", "20", "--period", "1d")
    run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "2h")
    run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "2h", "--start", at(DAY + HOUR))
    # [20h, 21h): every day it reaches into holds one of the two (16) and it: 20, admitted
    run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "1h", "--start", at(20 * HOUR))
    err = run.fails(
        5, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--start", at(21 * HOUR)
    )
    assert "has booked 20 of its 20 GPU-hour budget" in err["message"]
