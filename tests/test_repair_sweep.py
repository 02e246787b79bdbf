"""`repair` of the whole ledger (issue 8: every command at fleet scale). It used to build every
placed reservation to check each one's nodes; now SQL names those on a node BookingRepair could
find something wrong with (storage/tickwork.placed_on_suspect_nodes), and only they are checked.
The narrowing must never drop one that the check itself would find bad."""

from __future__ import annotations

import random

import pgtest
import pytest
from conftest import DAY, HOUR, NOW_MS, Cli, at

from better_compute.lifecycle.tick import NodeHealth, bad_nodes
from better_compute.model import State
from better_compute.storage import due, repo, tickwork
from better_compute.storage.db import open_ledger


def _book(run: Cli, rng: random.Random) -> None:
    """A dozen bookings ahead: device bookings of 1 to 8 GPUs and gangs of whole nodes."""
    for _ in range(12):
        start = at(rng.randrange(1, 72) * HOUR)
        tenant = rng.choice(["acme", "globex"])
        flags = ["--tenant", tenant, "--for", f"{rng.randrange(1, 12)}h", "--start", start]
        if rng.random() < 0.25:
            flags += ["--gpus", "8", "--gang", "2"]
        else:
            flags += ["--gpus", str(rng.choice([1, 2, 4, 8]))]
        run("reserve", *flags)  # some do not fit, or exceed a quota: those are skipped


def _break(run: Cli, rng: random.Random) -> None:
    """Hardware trouble written straight into the ledger, so that no command repairs it first:
    a node cordoned or unreachable, a GPU not healthy, a maintenance window."""
    ledger = open_ledger(pgtest.ledger(str(run.db)))
    try:
        with ledger.write() as conn:
            names = [str(r[0]) for r in conn.execute("SELECT name FROM nodes ORDER BY name")]
            for name in rng.sample(names, rng.randrange(1, 5)):
                kind = rng.choice(["cordon", "unreachable", "sick", "maintenance"])
                if kind == "cordon":
                    conn.execute("UPDATE nodes SET schedulable = 0 WHERE name = ?", (name,))
                elif kind == "unreachable":
                    conn.execute("UPDATE nodes SET reachable = 0 WHERE name = ?", (name,))
                elif kind == "sick":
                    conn.execute(
                        "UPDATE atoms SET healthy = 0 WHERE node_id = ? AND idx = ?",
                        (name, rng.randrange(8)),
                    )
                else:
                    start = NOW_MS + rng.randrange(0, 80) * HOUR
                    end = start + rng.randrange(1, 24) * HOUR
                    conn.execute(
                        'INSERT INTO maintenance(node_id, start, "end") VALUES (?, ?, ?)',
                        (name, start, end),
                    )
    finally:
        ledger.close()


def _found_bad(run: Cli) -> tuple[set[str], set[str]]:
    """(the placed reservations the check finds bad, reading each one's nodes as repair_one
    does; those the narrowing names)."""
    ledger = open_ledger(pgtest.ledger(str(run.db)))
    try:
        with ledger.read() as conn:
            bad = set()
            for rsv in repo.reservations_in(conn, State.PLACED):
                assert rsv.during is not None
                names = sorted({a.node_id for a in rsv.allocations})
                health = {n: NodeHealth(*h) for n, h in tickwork.node_health(conn, names).items()}
                maintenance = due.maintenance_on(conn, names, rsv.during)
                if bad_nodes(rsv, health, maintenance, NOW_MS):
                    bad.add(rsv.id)
            named = {r.id for r in tickwork.placed_on_suspect_nodes(conn)}
    finally:
        ledger.close()
    return bad, named


@pytest.mark.parametrize("seed", range(16))
def test_the_sweep_names_every_reservation_the_check_finds_bad(run: Cli, seed: int) -> None:
    rng = random.Random(seed)
    _book(run, rng)
    healthy_bad, healthy_named = _found_bad(run)
    assert healthy_bad == healthy_named == set()  # a healthy fleet: nothing is even read
    _break(run, rng)
    bad, named = _found_bad(run)
    assert bad <= named
    events = run.ok("repair")["changes"]
    moved = {
        e["reservationId"]
        for e in events
        if e["type"] in ("reservation.repaired", "reservation.pending")
    }
    assert moved == bad
    assert _found_bad(run)[0] == set()  # what is still placed is on nodes that can serve it


def test_a_maintenance_window_names_only_the_bookings_it_overlaps(run: Cli) -> None:
    booked = [
        run.ok("reserve", "--tenant", "acme", "--gpus", 8, "--for", "2h", "--start", at(k * DAY))
        for k in range(1, 5)
    ]
    third = booked[2]
    node = third["allocations"][0]["nodeId"]
    ledger = open_ledger(pgtest.ledger(str(run.db)))
    try:
        with ledger.write() as conn:
            conn.execute(
                'INSERT INTO maintenance(node_id, start, "end") VALUES (?, ?, ?)',
                (node, NOW_MS + 3 * DAY + HOUR, NOW_MS + 3 * DAY + 5 * HOUR),
            )
    finally:
        ledger.close()
    bad, named = _found_bad(run)
    assert bad == named == {third["id"]}
