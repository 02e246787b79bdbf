"""Issue 8, replay: the fleet `simulate` keeps in memory answers exactly as SQL does, and notices
every change another process commits.

The first property builds random fleets and bookings (test_shortlist's worlds) in a real ledger
and compares engine/fleet.PoolIndex with the storage queries it stands in for: snapshots, the
shortlist's candidates (less the nodes whose models the request refuses), the pool's capacity,
and the plan placement makes from each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_shortlist import (
    WINDOW,
    Ask,
    BookingSpec,
    NodeSpec,
    context,
    ledger,
    rolled_back,
    worlds,
    write_world,
)

from better_compute.engine import shortlist
from better_compute.service import placing
from better_compute.service.fleet import Fleet
from better_compute.storage import repo


def _accepts(models: tuple[str, ...], node_models: set[str]) -> bool:
    accepted = {m.casefold() for m in models}
    return not models or {m.casefold() for m in node_models} <= accepted


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(worlds(), st.sampled_from([0, 0, 1, 29, 30, 31, 60, 100]), st.integers(0, 100))
def test_the_fleet_in_memory_answers_as_sql(
    world: tuple[list[NodeSpec], list[BookingSpec], Ask], lead_h: int, earlier_h: int
) -> None:
    fleet, held, ask = world
    db, pool_id = ledger()
    with rolled_back(db):
        subject = write_world(db, pool_id, fleet, held, ask)
        conn = db.conn
        request = subject.request(WINDOW)
        # Held from an instant before the window's start, then moved on to another one (what
        # ended by then is dropped; what began by then is filed in a bucket).
        horizon = WINDOW.start - lead_h * 3_600_000
        kept = Fleet()
        kept.index(conn, pool_id, horizon - earlier_h * 3_600_000)
        pool = kept.index(conn, pool_id, horizon)
        assert pool.covers(WINDOW)

        sql_snaps = repo.snapshots(conn, pool_id, WINDOW, ignore_reservation=subject.id)
        assert pool.snapshots(WINDOW, subject.id) == sql_snaps
        names = [s.node.name for s in sql_snaps][::2]
        assert pool.snapshots(WINDOW, subject.id, names) == repo.snapshots(
            conn, pool_id, WINDOW, ignore_reservation=subject.id, names=names
        )

        rows = repo.fit_candidates(
            conn,
            pool_id,
            WINDOW,
            ignore_reservation=subject.id,
            need=request.gpus or 0,
            whole_node=request.node_lease,
        )
        models = {s.name: {a.model for a in s.atoms} for s in fleet}
        expected = [
            (shortlist.best_key(request, shortlist.Candidate(*row)), row[0])
            for row in rows
            if _accepts(request.models, models[row[0]])
        ]
        assert list(pool.candidates(request, subject.id)) == expected

        share = ask.gpus or 1
        assert pool.capacity(subject.models, share) == repo.node_capacity(
            conn, pool_id, subject.models, share
        )

        # And so placement plans the same from either.
        ctx = context(db, ask.top_n)
        from_sql = placing.plan(ctx, subject, WINDOW, ask.exclude)
        ctx.fleet = Fleet()
        ctx.now = horizon
        assert placing.plan(ctx, subject, WINDOW, ask.exclude) == from_sql
