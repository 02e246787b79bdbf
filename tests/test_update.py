"""`update RSV [--start] [--for] [--gpus]` (issue 12): change before it starts, in one transaction,
keeping nodes and atoms where they fit; CONFLICT leaves the old booking as it was."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DAY, HOUR, MIN, NOW_MS, Cli, at, init_db
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_trust import be

from better_compute.demo import DEMO_INVENTORY
from better_compute.errors import BetterComputeError
from better_compute.identity import os_user
from better_compute.service import booking, setup, updating
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage.db import Database


def reserve(cli: Cli, *flags: object, tenant: str = "acme") -> Any:
    return cli.ok("reserve", "--tenant", tenant, *flags)


def placement(rsv: dict[str, Any]) -> dict[str, tuple[str, list[int]]]:
    return {a["nodeId"]: (a["id"], a["atoms"]) for a in rsv["allocations"]}


def test_moving_a_calendar_booking_keeps_its_nodes_atoms_and_allocations(run: Cli) -> None:
    rsv = reserve(run, "--gpus", "8", "--gang", "2", "--for", "2h", "--start", "+1d", "--name", "x")
    moved = run.ok("update", rsv["id"], "--start", "+2d", "--for", "3h")
    assert moved["state"] == "placed"
    assert moved["during"] == {"start": NOW_MS + 2 * DAY, "end": NOW_MS + 2 * DAY + 3 * HOUR}
    assert (moved["start"], moved["durationMs"]) == (NOW_MS + 2 * DAY, 3 * HOUR)
    assert placement(moved) == placement(rsv)
    assert (moved["quotaCharge"], moved["name"]) == (16, "x")
    assert run.ok("get", rsv["id"]) == moved
    ev = run.ok("events", "--reservation", rsv["id"])[-1]
    assert ev["type"] == "reservation.updated"
    assert ev["data"] == {
        "from": {
            "start": NOW_MS + DAY,
            "end": NOW_MS + DAY + 2 * HOUR,
            "durationMs": 2 * HOUR,
            "gpus": 8,
            "gpuCount": 16,
        },
        "to": {
            "start": NOW_MS + 2 * DAY,
            "end": NOW_MS + 2 * DAY + 3 * HOUR,
            "durationMs": 3 * HOUR,
            "gpus": 8,
            "gpuCount": 16,
        },
        "nodeIds": sorted(placement(rsv)),
    }
    # people read the nested windows as UTC times, as every other event's (epoch ms before)
    line = run("events", "--reservation", rsv["id"], json=False)[1].splitlines()[-1]
    assert '"from": {"durationMs": 7200000, "end": "2026-09-29T10:00:00Z"' in line
    assert str(NOW_MS + 2 * DAY) not in line
    # the old window is free again: a full-pool gang fits there now
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "56")
    full = ("--gpus", "8", "--gang", "7", "--for", "2h", "--start", "+1d")
    assert reserve(run, *full, tenant="globex")["state"] == "placed"


def test_fewer_then_more_gpus_returns_the_same_atoms(solo: Cli) -> None:
    solo.ok("reserve", "--tenant", "globex", "--gpus", "1", "--for", "1d")
    rsv = reserve(solo, "--gpus", "3", "--for", "2h", "--start", "+1h")
    fewer = solo.ok("update", rsv["id"], "--gpus", "1")
    assert set(fewer["allocations"][0]["atoms"]) < set(rsv["allocations"][0]["atoms"])
    assert fewer["quotaCharge"] == 1
    back = solo.ok("update", rsv["id"], "--gpus", "3")
    assert back["allocations"] == rsv["allocations"]
    assert back["quotaCharge"] == 3


def test_a_gang_moves_as_a_whole_when_a_member_cannot_stay(run: Cli) -> None:
    rsv = reserve(run, "--gpus", "8", "--gang", "2", "--for", "2h", "--start", "+1d")
    first = sorted(placement(rsv))
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "100")
    # another tenant takes one GPU of the first member in the window we want to move to
    blocker = reserve(
        run, "--gpus", "8", "--gang", "5", "--for", "1h", "--start", "+2d", tenant="globex"
    )
    blocked = {a["nodeId"] for a in blocker["allocations"]}
    assert not blocked.isdisjoint(first)  # 5 of 7 nodes: at least one member is in the way
    moved = run.ok("update", rsv["id"], "--start", "+2d")
    nodes = sorted(placement(moved))
    assert len(nodes) == 2 and set(nodes).isdisjoint(blocked)
    assert all(len(atoms) == 8 for _, atoms in placement(moved).values())
    assert moved["during"]["start"] == NOW_MS + 2 * DAY


def test_no_fit_is_conflict_and_leaves_everything(run: Cli) -> None:
    rsv = reserve(run, "--gpus", "8", "--gang", "2", "--for", "2h", "--start", "+1d")
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "100")
    reserve(run, "--gpus", "8", "--gang", "6", "--for", "1h", "--start", "+2d", tenant="globex")
    before = (
        run.ok("get", rsv["id"]),
        run.ok("timeline", "--from", "+1d", "--to", "+3d", "--step", "60"),
    )
    err = run.fails(4, "update", rsv["id"], "--start", "+2d")
    assert "does not fit" in err["message"] and "nothing was changed" in err["message"]
    assert "no gang of 2 nodes" in err["message"]
    after = (
        run.ok("get", rsv["id"]),
        run.ok("timeline", "--from", "+1d", "--to", "+3d", "--step", "60"),
    )
    assert after == before
    assert run.ok("events", "--reservation", rsv["id"])[-1]["type"] == "reservation.placed"


@pytest.mark.sqlite_only(
    reason=(
        "acts as another OS user (test_trust.be); on PostgreSQL the principal is the"
        " server's role, tested with real roles in test_postgres.py"
    )
)
def test_refusals(run: Cli, monkeypatch: Any) -> None:
    later = reserve(run, "--gpus", "2", "--for", "2h", "--start", "+1d")
    now = reserve(run, "--gpus", "2", "--for", "2h")
    assert "window began" in run.fails(4, "update", now["id"], "--for", "1h")["message"]
    run.ok("tick")
    assert "it is active" in run.fails(4, "update", now["id"], "--for", "1h")["message"]
    # a bad value is bad input whatever the state (it was CONFLICT "window began")
    assert run.fails(2, "update", now["id"], "--start", "garbage")["code"] == "INVALID_INPUT"
    assert "nothing to change" in run.fails(2, "update", later["id"])["message"]
    assert "in the past" in run.fails(2, "update", later["id"], "--start", "-1h")["message"]
    assert "--gpus must be" in run.fails(2, "update", later["id"], "--gpus", "0")["message"]
    assert "largest node" in run.fails(2, "update", later["id"], "--gpus", "9")["message"]
    assert run.fails(2, "update", later["id"], "--for", "0s")["code"] == "INVALID_INPUT"
    assert run.fails(2, "update", later["id"], "--start", "someday")["code"] == "INVALID_INPUT"
    assert run.fails(3, "update", "rsv_nope", "--for", "1h")["code"] == "NOT_FOUND"
    # quota (acme: 64) is judged on the difference, and nothing changes
    big = reserve(run, "--gpus", "8", "--gang", "7", "--for", "1h", "--start", "+3d")
    err = run.fails(5, "update", later["id"], "--gpus", "8")
    assert "holds 60 of its 64-GPU quota" in err["message"] and "needs 6 more" in err["message"]
    assert run.ok("get", later["id"])["quotaCharge"] == 2
    run.ok("cancel", big["id"])
    assert "released" in run.fails(4, "update", big["id"], "--for", "1h")["message"]
    # policy: judged on the new draft
    run.ok("policy", "set", "--tenant", "acme", "--principal", "alice", "--max-gpus", "4")
    be(monkeypatch, "alice")
    mine = reserve(run, "--gpus", "2", "--for", "1h", "--start", "+1d")
    err = run.fails(6, "update", mine["id"], "--gpus", "6")
    assert "policy max-gpus 4" in err["message"]
    assert run.ok("update", mine["id"], "--gpus", "4")["quotaCharge"] == 4
    be(monkeypatch, "mallory")
    assert run.fails(3, "update", mine["id"], "--for", "2h")["code"] == "NOT_FOUND"


def test_a_pending_reservation_takes_the_new_shape_and_is_retried(run: Cli) -> None:
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "100")
    reserve(run, "--gpus", "4", "--gang", "7", "--for", "1d", tenant="globex")
    waiting = reserve(run, "--gpus", "8", "--for", "2h")
    assert waiting["state"] == "pending"
    still = run.ok("update", waiting["id"], "--for", "3h")
    assert still["state"] == "pending" and still["durationMs"] == 3 * HOUR
    placed = run.ok("update", waiting["id"], "--gpus", "4", "--start", "+1h")
    assert placed["state"] == "placed" and placed["quotaCharge"] == 4
    assert placed["during"] == {"start": NOW_MS + HOUR, "end": NOW_MS + 4 * HOUR}
    types = [e["type"] for e in run.ok("events", "--reservation", waiting["id"])]
    assert types[-3:] == ["reservation.updated", "reservation.updated", "reservation.placed"]


def test_an_update_keeps_repair_and_binding_on_the_new_window(run: Cli) -> None:
    rsv = reserve(run, "--gpus", "2", "--for", "1h", "--start", "+10m")
    run.ok("tick")  # within repair.leadMs: BookingRepair checked it
    moved = run.ok("update", rsv["id"], "--start", "+1h")
    run.ok("tick", now=at(30 * MIN))
    assert run.ok("get", rsv["id"], now=at(30 * MIN))["state"] == "placed"
    run.ok("tick", now=at(HOUR))
    assert run.ok("get", rsv["id"])["state"] == "active"
    assert placement(run.ok("get", rsv["id"])) == placement(moved)


# ---------------------------------------------------------------- the round trip, as a property

_TEMPLATE: list[Path] = []


def _template() -> Path:
    """The demo ledger (7 × 8 h100 in two NVLink groups), made once per test session."""
    if not _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="bc-update-"))
        path = folder / "template.db"
        db, _ = setup.init(
            str(path),
            NOW_MS,
            False,
            manual=True,
            admin=os_user(),
            group=None,
            fill=DEMO_INVENTORY,
        )
        ctx = Ctx(db, NOW_MS)
        for tenant in ("acme", "globex"):  # quota is tested above; here, room for any draw
            setup.quota_set(ctx, tenant, None, 10_000)
        db.close()
        _TEMPLATE.append(path)
    return _TEMPLATE[0]


@pytest.fixture(scope="module", autouse=True)
def _template_removed_after() -> Iterator[None]:
    """The session's template ledger goes when this module's tests are done."""
    yield
    for path in _TEMPLATE:
        shutil.rmtree(path.parent, ignore_errors=True)
    _TEMPLATE.clear()


def _ledger(path: Path) -> tuple[list[Any], list[Any], list[Any]]:
    conn = sqlite3.connect(path)
    try:
        bookings = sorted(
            conn.execute(
                'SELECT node_id, atom, start, "end", reservation_id, allocation_id FROM bookings'
            )
        )
        allocations = sorted(conn.execute("SELECT id, node_id, atoms, released FROM allocations"))
        reservations = sorted(
            conn.execute(
                "SELECT id, state, gpus, start, duration_ms, during_start, during_end, quota_charge"
                " FROM reservations"
            )
        )
        return bookings, allocations, reservations
    finally:
        conn.close()


def _per_node(ledger: tuple[list[Any], list[Any], list[Any]]) -> list[tuple[str, str, int]]:
    counts: dict[tuple[str, str], int] = {}
    for node, _, _, _, rsv, _ in ledger[0]:
        counts[(node, rsv)] = counts.get((node, rsv), 0) + 1
    return sorted((node, rsv, n) for (node, rsv), n in counts.items())


other = st.tuples(st.integers(1, 8), st.integers(0, 12), st.integers(1, 6), st.booleans())
shape = st.tuples(st.integers(1, 8), st.integers(1, 12), st.integers(1, 6))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    others=st.lists(other, max_size=8),
    gang=st.sampled_from([None, 2]),
    target=shape,
    change=st.tuples(
        st.none() | st.integers(1, 8), st.none() | st.integers(1, 12), st.none() | st.integers(1, 6)
    ),
)
def test_update_then_update_back_leaves_the_ledger_as_it_was(
    others: list[tuple[int, int, int, bool]],
    gang: int | None,
    target: tuple[int, int, int],
    change: tuple[int | None, int | None, int | None],
) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bc-update-"))
    path = folder / "l.db"
    shutil.copy(_template(), path)
    db = Database(path, 5000)
    try:
        ctx = Ctx(db, NOW_MS)
        for gpus, start_h, hours, gangs in others:
            booking.reserve(
                ctx,
                ReserveArgs(
                    tenant="globex",
                    pool=None,
                    gpus=gpus,
                    duration_ms=hours * HOUR,
                    start=NOW_MS + start_h * HOUR,
                    gang=2 if gangs else None,
                ),
            )
        gpus, start_h, hours = target
        rsv = booking.reserve(
            ctx,
            ReserveArgs(
                tenant="acme",
                pool=None,
                gpus=gpus,
                duration_ms=hours * HOUR,
                start=NOW_MS + start_h * HOUR,
                gang=gang,
            ),
        )
        if rsv.state.value != "placed":
            return
        before = _ledger(path)
        new_gpus, new_start, new_hours = change
        forward = updating.Change(
            None if new_start is None else str(NOW_MS + new_start * HOUR),
            None if new_hours is None else new_hours * HOUR,
            new_gpus,
        )
        try:
            changed = updating.update(ctx, rsv.id, forward)
        except BetterComputeError:
            assert _ledger(path) == before  # refused: nothing was changed
            return
        kept = {a.id for a in changed.allocations} == {a.id for a in rsv.allocations}
        resized = forward.gpus not in (None, rsv.gpus)
        backward = updating.Change(str(rsv.start), rsv.duration_ms, rsv.gpus)
        updating.update(ctx, rsv.id, backward)
        after = _ledger(path)
        assert after[2] == before[2]  # every reservation's shape, window and charge
        if kept and not resized:  # it stayed: the same atoms, bookings and allocations
            assert after == before
        elif kept:
            # Fewer GPUs then more again keeps the nodes and counts, but not always the very
            # atoms: without memory no rule can (docs/launch.md gives the two histories that
            # end in the same ledger yet began on different atoms).
            assert _per_node(after) == _per_node(before)
    finally:
        db.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_node_lease_moves_whole_and_stays_charged_what_it_leases(run: Cli) -> None:
    rsv = reserve(run, "--node-lease", "--gang", "2", "--for", "2h", "--start", "+1h")
    assert rsv["quotaCharge"] == 16
    moved = run.ok("update", rsv["id"], "--start", "+5h", "--gpus", "4")
    assert placement(moved) == placement(rsv)
    assert moved["quotaCharge"] == 16 and moved["devices"][0]["count"] == 4
    assert all(len(atoms) == 8 for _, atoms in placement(moved).values())


def test_a_node_lease_given_more_gpus_moves_onto_a_larger_node(db_dir: Path) -> None:
    """A 4-GPU lease on the 4-GPU node, updated to --gpus 8, was admitted for 8 and then planned
    with no node larger than the one it held: CONFLICT "lease admitted for 4", with the 8-GPU
    node free. It moves there, charged what it leases."""
    cli = Cli(init_db(db_dir / "lease.db"))
    cli.ok("pool", "create", "p")
    for name, gpus in (("small", "4"), ("big", "8")):
        cli.ok("node", "add", name, "--pool", "p", "--gpus", gpus, "--model", "h100")
    cli.ok("tenant", "create", "t")
    rsv = reserve(cli, "--node-lease", "--gpus", "4", "--for", "2h", "--start", "+1d", tenant="t")
    assert [a["nodeId"] for a in rsv["allocations"]] == ["small"] and rsv["quotaCharge"] == 4
    grown = cli.ok("update", rsv["id"], "--gpus", "8")
    assert [a["nodeId"] for a in grown["allocations"]] == ["big"]
    assert grown["quotaCharge"] == 8 and grown["allocations"][0]["atoms"] == list(range(8))
    back = cli.ok("update", rsv["id"], "--gpus", "4")
    assert [a["nodeId"] for a in back["allocations"]] == ["big"]  # it fits where it is
    later = cli.ok("update", rsv["id"], "--start", "+3d")  # its time alone: kept where it is
    assert [a["nodeId"] for a in later["allocations"]] == ["big"] and later["quotaCharge"] == 8


def test_a_moved_window_gets_its_own_starting_notice(run: Cli) -> None:
    rsv = reserve(run, "--gpus", "2", "--for", "1h", "--start", "+1h")
    run.ok("tick", now=at(50 * MIN))  # within repair.leadMs: checked, and the notice is given
    run.ok("update", rsv["id"], "--start", "+3h", now=at(50 * MIN))
    run.ok("tick", now=at(220 * MIN))  # the new start is at 3h50m
    starting = [
        e["at"]
        for e in run.ok("events", "--reservation", rsv["id"])
        if e["type"] == "reservation.starting"
    ]
    assert starting == [NOW_MS + 50 * MIN, NOW_MS + 220 * MIN]


def test_a_pool_calendar_policy_judges_the_new_shape_and_commit_refuses(run: Cli) -> None:
    free = reserve(run, "--gpus", "2", "--for", "2h", "--start", "+1d")  # before any policy
    run.ok("pool", "policy", "set", "west", "--max-duration", "4h")
    err = run.fails(2, "update", free["id"], "--for", "5h")
    assert "calendar policy" in err["message"] and "4h" in err["message"]
    assert run.ok("get", free["id"])["durationMs"] == 2 * HOUR
    run.ok("pool", "policy", "set", "west", "--max-duration", "4h", "--commit")
    final = reserve(run, "--gpus", "2", "--for", "2h", "--start", "+2d")
    err = run.fails(4, "update", final["id"], "--start", "+3d")
    assert "--commit" in err["message"]
    assert run.ok("get", final["id"]) == final
    # booked before the --commit policy: still changeable, and final once changed under it
    assert run.ok("update", free["id"], "--for", "3h")["durationMs"] == 3 * HOUR
    assert "--commit" in run.fails(4, "update", free["id"], "--for", "2h")["message"]


def test_update_refuses_a_shape_no_nvlink_group_could_hold(run: Cli) -> None:
    """As reserve does: 5 GPUs in one NVLink group of 4 would wait forever, holding quota."""
    for n in range(1, 8):
        run.ok("node", "cordon", f"west-0{n}")
    waiting = reserve(run, "--gpus", "4", "--topology", "nvlink-all", "--for", "1h")
    assert waiting["state"] == "pending"
    error = run.fails(2, "update", waiting["id"], "--gpus", "5")
    assert error["message"] == (
        "--gpus 5 --topology nvlink-all: the largest NVLink group of pool west's nodes has 4 GPUs"
    )
    assert run.ok("get", waiting["id"])["devices"][0]["count"] == 4


def two_nodes(path: Path) -> Cli:
    """Pool p: n1 and n2, 8 h100 GPUs each; tenant acme; placement.topN 1 (n1 first)."""
    cli = Cli(init_db(path))
    cli.ok("pool", "create", "p")
    for name in ("n1", "n2"):
        cli.ok("node", "add", name, "--pool", "p", "--gpus", "8", "--model", "h100")
    cli.ok("tenant", "create", "acme")
    cli.ok("config", "set", "placement.topN", "1")
    return cli


def _starting(cli: Cli, rsv_id: str) -> list[Any]:
    events = cli.ok("events", "--reservation", rsv_id)
    return [(e["at"], e["data"]["nodeIds"]) for e in events if e["type"] == "reservation.starting"]


def test_a_booking_moved_to_other_nodes_is_checked_there_and_noticed_again(
    db_dir: Path,
) -> None:
    """update --gpus 8 after the starting notice moves the booking from n1 to n2 in the same
    window: the next tick checks n2 and gives a notice naming it (the first named n1, where the
    job no longer runs). A change of its end alone keeps start and nodes: no second notice."""
    cli = two_nodes(db_dir / "moved.db")
    reserve(cli, "--gpus", "4", "--for", "1h", "--start", "+2h", tenant="acme")
    rsv = reserve(cli, "--gpus", "4", "--for", "1h", "--start", "+2h", tenant="acme")
    assert [a["nodeId"] for a in rsv["allocations"]] == ["n1"]
    cli.ok("tick", now=at(105 * MIN))  # the lead check passes on n1
    assert _starting(cli, rsv["id"]) == [(NOW_MS + 105 * MIN, ["n1"])]
    moved = cli.ok("update", rsv["id"], "--gpus", "8", now=at(108 * MIN))
    assert [a["nodeId"] for a in moved["allocations"]] == ["n2"]
    assert moved["during"] == rsv["during"]
    cli.ok("tick", now=at(109 * MIN))
    assert _starting(cli, rsv["id"]) == [
        (NOW_MS + 105 * MIN, ["n1"]),
        (NOW_MS + 109 * MIN, ["n2"]),
    ]
    longer = cli.ok("update", rsv["id"], "--for", "2h", now=at(110 * MIN))
    assert [a["nodeId"] for a in longer["allocations"]] == ["n2"]
    cli.ok("tick", now=at(111 * MIN))
    assert len(_starting(cli, rsv["id"])) == 2  # same start, same nodes: nothing new to say


def test_a_booking_placed_again_after_its_notice_is_noticed_where_it_runs(db_dir: Path) -> None:
    """The starting notice named n1. Moved by BookingRepair to n2 (n1 cordoned), or failed by
    it and placed on n2 by a later retry, the booking gave no notice naming n2."""
    cli = two_nodes(db_dir / "again.db")
    rsv = reserve(cli, "--gpus", "8", "--for", "1h", "--start", "+2h", tenant="acme")
    cli.ok("tick", now=at(105 * MIN))
    blocker = reserve(cli, "--gpus", "8", "--for", "3h", "--start", "+106m", tenant="acme")
    assert [a["nodeId"] for a in blocker["allocations"]] == ["n2"]
    cli.ok("node", "cordon", "n1", now=at(107 * MIN))
    cli.ok("repair", rsv["id"], now=at(107 * MIN))  # no node free for it: pending
    assert cli.ok("get", rsv["id"], now=at(107 * MIN))["state"] == "pending"
    cli.ok("cancel", blocker["id"], now=at(108 * MIN))
    cli.ok("tick", now=at(109 * MIN))  # the retry places it on n2, and the notice says so
    cli.ok("tick", now=at(110 * MIN))
    assert _starting(cli, rsv["id"]) == [
        (NOW_MS + 105 * MIN, ["n1"]),
        (NOW_MS + 109 * MIN, ["n2"]),
    ]
    cli.ok("node", "uncordon", "n1", now=at(111 * MIN))
    cli.ok("node", "cordon", "n2", now=at(112 * MIN))
    cli.ok("repair", rsv["id"], now=at(112 * MIN))  # moved back to n1
    cli.ok("tick", now=at(113 * MIN))
    assert _starting(cli, rsv["id"])[-1] == (NOW_MS + 113 * MIN, ["n1"])
