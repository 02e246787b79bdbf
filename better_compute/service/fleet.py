"""The fleet a long-running command keeps in memory between requests (issue 8, replay).

`simulate` places thousands of requests in a row. Each one still runs as its own transaction
through the real use case; only what placement reads about the pool (candidates, snapshots, what
the pool could ever hold) comes from an engine/fleet.PoolIndex instead of SQL. The index must be
the ledger, exactly, whenever placement asks, so it is checked inside the write transaction,
with the write lock held:

- another process's commit changes the ledger's data_version (SQLite's `PRAGMA data_version`;
  on PostgreSQL a count kept on the clock row, storage/simulation.data_version): everything is
  dropped and reloaded;
- this process's own commits name every reservation whose bookings or state they changed, in
  the events they write: those reservations' bookings are read again (one indexed query),
  except where the events themselves say what they are. A reservation whose only change is its
  placement by this process (placing.commit hands the fleet the rows it has just written) is
  held as written; one whose only change is its release holds nothing any more (a release
  ends its bookings at its instant, which the fleet's horizon has reached).

What the index plans is still booked through placing.commit, which re-checks inside the
transaction that the atoms are free (a lost race excludes the node and plans again).
"""

from __future__ import annotations

from dataclasses import dataclass

from better_compute.engine.fleet import BookingRow, PoolIndex
from better_compute.lifecycle.notices import EXPIRING, STARTING
from better_compute.model import Reservation
from better_compute.storage import repo
from better_compute.storage import simulation as store
from better_compute.storage.repo import Conn

#: Events that change neither a reservation's bookings nor whether it is live (created: it has
#: no booking yet; binding and active: placed, binding and active are all live; the starting
#: and expiring notices only tell). Any other event on a reservation, of whatever type, makes
#: the fleet read its bookings again.
UNCHANGED = ("reservation.created", "reservation.binding", "reservation.active", STARTING, EXPIRING)
PLACED = "reservation.placed"
RELEASED = "reservation.released"


@dataclass(frozen=True)
class Looked:
    """The last lookup for expiring notices by a tick of this process (service/notices.py):
    every running reservation ending by `through` was looked at, as the ledger stood at event
    `seen`. Void once another process has committed (`version`, PRAGMA data_version) or the
    notice period changed."""

    version: int
    notice_ms: int
    through: int
    seen: int


class Fleet:
    """Pool indexes, kept equal to the ledger this connection sees (module docstring)."""

    def __init__(self) -> None:
        self.pools: dict[str, PoolIndex] = {}
        #: Set by a tick once its transaction has committed, never before (service/ticking.py).
        self.looked: Looked | None = None
        self.version: int | None = None
        self.seen = 0  # the last event seq whose changes the indexes hold
        self.appended = -1  # repo.events_appended() when `seen` was read
        #: The bookings placing.commit wrote in this process since the last catch-up, by
        #: reservation, as (pool, row): see booked().
        self.written: dict[str, list[tuple[str, BookingRow]]] = {}
        self.reloads = 0  # full reloads after another process's commit (for tests and docs)

    def index(self, conn: Conn, pool_id: str, now: int, *, version: int | None = None) -> PoolIndex:
        """The pool as the ledger holds it now, for windows that start at `now` or later.
        Call it inside the transaction that will act on the answer. `version`: the ledger's
        data_version as read in it, when the caller has it (storage/simulation.data_version_of)."""
        if version is None:
            version = store.data_version(conn)
        if version != self.version:
            if self.version is not None:
                self.reloads += 1
            self.pools.clear()
            self.written.clear()
            self.version = version
            self.appended = repo.events_appended()
            self.seen = repo.last_event_seq(conn)
        else:
            self._catch_up(conn)
        pool = self.pools.get(pool_id)
        if pool is None:
            pool = PoolIndex.build(
                now,
                repo.load_nodes(conn, pool_id),
                store.pool_maintenance_after(conn, pool_id, now),
                (BookingRow(*row) for row in store.pool_bookings_after(conn, pool_id, now)),
            )
            self.pools[pool_id] = pool
        pool.advance(now)
        return pool

    def booked(self, rsv: Reservation) -> None:
        """placing.commit has just booked `rsv`, placed with its allocations: the catch-up that
        finds its placement the only change to it since takes these rows instead of reading
        them back. Forgotten at the next catch-up, whatever it finds."""
        if rsv.during is None:  # not placed: nothing booked
            return
        start, end = rsv.during.start, rsv.during.end
        self.written[rsv.id] = [
            (rsv.pool_id, BookingRow(rsv.id, a.node_id, atom, start, end, rsv.spot, True))
            for a in rsv.allocations
            for atom in a.atoms
        ]

    def _catch_up(self, conn: Conn) -> None:
        """Bring the indexes up to this process's own commits (module docstring). The data
        version says no other process wrote; if this one appended no event either since `seen`
        was read, the log has nothing newer and is not asked."""
        appended = repo.events_appended()
        if appended == self.appended:
            return
        last, touched = store.touched_since(conn, self.seen, UNCHANGED)
        self.seen, self.appended = last, appended
        written, self.written = self.written, {}
        if not touched or not self.pools:
            return
        found: dict[str, list[tuple[str, BookingRow]]] = {}
        unread = []
        for rsv_id, types in touched.items():
            if types == {PLACED} and rsv_id in written:
                found[rsv_id] = written[rsv_id]
            elif types == {RELEASED}:
                found[rsv_id] = []
            else:
                unread.append(rsv_id)
        if unread:
            read = store.bookings_of(conn, sorted(unread))
            for rsv_id in unread:
                found[rsv_id] = [(p, BookingRow(*r)) for p, r in read.get(rsv_id, [])]
        for rsv_id in sorted(touched):
            rows = found[rsv_id]
            for pool_id, pool in self.pools.items():
                pool.set_reservation(rsv_id, [r for p, r in rows if p == pool_id])

    def after_rollback(self, conn: Conn) -> None:
        """A write transaction that consulted the index rolled back: if the index caught up
        with events that were never committed (their seqs will be used again), start afresh.
        What placing.commit handed over is forgotten: it may be what was rolled back."""
        self.written.clear()
        if repo.last_event_seq(conn) < self.seen:
            self.pools.clear()
            self.version = None
