"""What a tick reads about its own work, narrowed so that a tick costs what is due (issue 8).

Kept apart from repo.py: `simulate` ticks at every due instant of a replay, so the reads here
answer exactly what repo's plain queries answer, for fewer rows or fewer statements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from better_compute.model import ReleaseReason, Reservation, State, Window
from better_compute.storage import repo
from better_compute.storage.repo import Conn, per_live_state

#: `state <> 'released'` says nothing more, but lets SQLite use the indexes of what is due,
#: which hold no released row (migration 11): SQLite proves a partial index's WHERE only from
#: the same term in the query.
_LIVE = "state IN ('placed', 'binding', 'active') AND state <> 'released'"
#: Each side of an OR says it again: SQLite proves a partial index for each side on its own.
_ENDS = "(state <> 'released' AND during_end <= ?)"
_DEADLINES = "(state <> 'released' AND preempt_deadline <= ?)"
_NOT_NOTICED = (
    "NOT EXISTS (SELECT 1 FROM notices n WHERE n.reservation_id = r.id"
    " AND n.type = 'reservation.expiring')"
)


def expiring_since(
    conn: Conn, now: int, by: int, through: int, seen: int, states: Sequence[str]
) -> tuple[list[str], int]:
    """What webhooks.ending_between(now, by) answers, when every reservation in `states` that
    ends by `through` was looked at before event `seen` and none has changed since without an
    event on it: those ending in (max(now, through), by], plus those named by an event after
    `seen` that end in (now, by]. Ids with no expiring notice yet, oldest first; and the newest
    event read (`seen` when none), which the next look may start after.

    One statement of two seeks: a short range of the ends index, and the few newest events by
    their primary key with their reservations by id (`|| ''` and `+ 0` keep SQLite off the
    state and end indexes there, which would walk the whole range). Rows of the range carry no
    event (NULL)."""
    marks = ",".join("?" * len(states))
    found: dict[str, int] = {}
    newest = seen
    for event, rsv_id, rsv_seq in conn.execute(
        f"SELECT NULL, r.id, r.seq FROM reservations r WHERE r.state IN ({marks})"
        " AND r.state <> 'released'"
        f" AND r.during_end > ? AND r.during_end <= ? AND {_NOT_NOTICED}"
        " UNION ALL"
        " SELECT e.seq, r.id, r.seq FROM events e LEFT JOIN reservations r"
        f" ON r.id = e.reservation_id AND r.state || '' IN ({marks})"
        f" AND r.during_end + 0 > ? AND r.during_end + 0 <= ? AND {_NOT_NOTICED}"
        " WHERE e.seq > ?",
        (*states, max(now, through), by, *states, now, by, seen),
    ):
        if event is not None:
            newest = max(newest, int(event))
        if rsv_id is not None:
            found[str(rsv_id)] = int(rsv_seq)
    return sorted(found, key=found.__getitem__), newest


def reachable(conn: Conn, names: Sequence[str]) -> dict[str, bool]:
    """Whether each of these nodes is reachable (absent names are left out): all that tick's
    binding step asks of a node, without building it."""
    found: dict[str, bool] = {}
    for first in range(0, len(names), 500):
        chunk = list(names[first : first + 500])
        rows = conn.execute(
            f"SELECT name, reachable FROM nodes WHERE name IN ({','.join('?' * len(chunk))})",
            chunk,
        )
        found.update((str(n), bool(r)) for n, r in rows)
    return found


def node_health(conn: Conn, names: Sequence[str]) -> dict[str, tuple[bool, bool, frozenset[int]]]:
    """(schedulable, reachable, indexes of unhealthy GPUs) of each of these nodes (absent names
    are left out): what BookingRepair asks of a node, without building it with every GPU. One
    statement: each node with its unhealthy GPUs joined (one row with none when all are well)."""
    found: dict[str, tuple[bool, bool, frozenset[int]]] = {}
    for first in range(0, len(names), 500):
        chunk = list(names[first : first + 500])
        sick: dict[str, set[int]] = {}
        for name, schedulable, reachable, idx in conn.execute(
            "SELECT n.name, n.schedulable, n.reachable, a.idx FROM nodes n"
            " LEFT JOIN atoms a ON a.node_id = n.name AND a.healthy = 0"
            f" WHERE n.name IN ({','.join('?' * len(chunk))})",
            chunk,
        ):
            bad = sick.setdefault(str(name), set())
            if idx is not None:
                bad.add(int(idx))
            found[str(name)] = (bool(schedulable), bool(reachable), frozenset(bad))
    return found


def placed_on_suspect_nodes(conn: Conn) -> list[Reservation]:
    """The placed reservations BookingRepair could find something wrong with, oldest first: a
    live allocation on a node that is cordoned or unreachable, that has a GPU not healthy, or
    that has maintenance overlapping the reservation's window. A superset of
    lifecycle.tick.bad_nodes's (any sick GPU of the node counts, not only the booking's own),
    read in SQL: `repair` of a whole fleet built every placed reservation to find none. It
    starts from the few suspect nodes, not from every placed reservation: on the benchmark's
    big pool (about 70,000 placed) that took about a second to find nothing. (A node is never
    deleted, and allocations reference it, so none can be on a node that is gone.)"""
    rows = conn.execute(
        "WITH bad(node_id) AS (SELECT name FROM nodes WHERE schedulable = 0 OR reachable = 0"
        " UNION SELECT node_id FROM atoms WHERE healthy = 0),"
        " suspect(node_id) AS (SELECT node_id FROM bad UNION SELECT node_id FROM maintenance)"
        " SELECT r.* FROM reservations r WHERE r.id IN (SELECT a.reservation_id FROM allocations a"
        " WHERE a.released = 0 AND a.node_id IN (SELECT node_id FROM suspect))"
        " AND r.state = 'placed' AND EXISTS (SELECT 1 FROM allocations a"
        " WHERE a.reservation_id = r.id AND a.released = 0"
        " AND (a.node_id IN (SELECT node_id FROM bad) OR EXISTS (SELECT 1 FROM maintenance m"
        ' WHERE m.node_id = a.node_id AND m."end" > r.during_start AND m.start < r.during_end)))'
        " ORDER BY r.seq"
    ).fetchall()
    return repo.with_allocations(conn, rows)


def ids_in_state(conn: Conn, state: str) -> list[str]:
    """The ids of the reservations in `state`, oldest first (repo.reservations_in's rows, by id
    alone: the caller may hold most of them already)."""
    rows = conn.execute(
        f"SELECT id FROM reservations WHERE state = ?{repo.live_only(state)} ORDER BY seq", (state,)
    )
    return [str(r[0]) for r in rows]


def reservations_named(conn: Conn, ids: Sequence[str]) -> list[Reservation]:
    """These reservations as repo.get_reservation reads them, oldest first (absent ids are left
    out): one read per 500 instead of two reads each."""
    found: list[Reservation] = []
    for first in range(0, len(ids), 500):
        chunk = list(ids[first : first + 500])
        rows = list(
            conn.execute(
                f"SELECT * FROM reservations WHERE id IN ({','.join('?' * len(chunk))})", chunk
            )
        )
        found.extend(repo.with_allocations(conn, rows))
    return sorted(found, key=lambda r: r.seq)


def mark_checked(conn: Conn, rsv_id: str, lead_checked: bool, start_checked: bool) -> None:
    """BookingRepair's marks alone: repo.save_reservation of the same reservation with only
    these two changed writes the same row, but rewrites every index on state and window and
    runs the quota summary's triggers, since it sets those columns too."""
    conn.execute(
        "UPDATE reservations SET lead_checked = ?, start_checked = ? WHERE id = ?",
        (int(lead_checked), int(start_checked), rsv_id),
    )


class Due(NamedTuple):
    """Which of a tick's reads have rows, as tickwork.due_first finds them before step 1."""

    ending: bool  # a live reservation's end or preemption deadline has come
    waited: bool  # a pending one was created by now - pending.maxWaitMs
    retrying: bool  # a pending one's next attempt is due
    starting: bool  # a placed one starts by now + repair.leadMs
    binding: bool  # one is in state binding


#: due_first's statement, built once (it runs at every tick of a replay).
_DUE_FIRST = (
    "SELECT "
    + per_live_state(
        "EXISTS (SELECT 1 FROM reservations WHERE {live} AND during_end <= :now)"
        " OR EXISTS (SELECT 1 FROM reservations WHERE {live} AND preempt_deadline <= :now)",
        glue=" OR ",
    )
    + ", EXISTS (SELECT 1 FROM reservations WHERE state = 'pending' AND state <> 'released'"
    "  AND created_at <= :created),"
    " EXISTS (SELECT 1 FROM reservations WHERE state = 'pending' AND state <> 'released'"
    "  AND next_attempt_at <= :now),"
    " EXISTS (SELECT 1 FROM reservations WHERE state = 'placed' AND state <> 'released'"
    "  AND during_start <= :lead),"
    " EXISTS (SELECT 1 FROM reservations WHERE state = 'binding' AND state <> 'released')"
)


def due_first(conn: Conn, now: int, created_by: int, lead_by: int) -> Due:
    """Whether each read of a tick's first five steps has anything to read, in one statement.
    Each is an EXISTS on the same rows (and index) that repo.reservations_ending,
    pending_created_by, pending_due, placed_starting_by(lead_by) and ids_in_state('binding')
    read; a tick with one release pays one statement instead of five."""
    row = conn.execute(
        _DUE_FIRST,
        {"now": now, "created": created_by, "lead": lead_by},
    ).fetchone()
    return Due(*(bool(x) for x in row))


@dataclass(frozen=True)
class Ending:
    """What releasing a reservation at a tick reads of it (booking.finish reads a whole
    Reservation with its allocations; a release writes none of the rest)."""

    id: str
    tenant_id: str
    state: State
    during: Window | None
    preempt_deadline: int | None
    preempted_by: str | None


def endings_due(conn: Conn, at: int) -> list[Ending]:
    """repo.reservations_ending's rows (the same WHERE, so the same index), oldest first, as
    the few columns a release reads: no allocations read, no reservation built."""
    rows = conn.execute(
        "SELECT id, tenant_id, state, during_start, during_end, preempt_deadline, preempted_by"
        f" FROM reservations WHERE {_LIVE} AND ({_ENDS} OR {_DEADLINES})"
        " ORDER BY seq",
        (at, at),
    )
    return [
        Ending(
            str(i),
            str(t),
            State(s),
            None if start is None else Window(int(start), int(end)),
            None if d is None else int(d),
            None if by is None else str(by),
        )
        for i, t, s, start, end, d, by in rows
    ]


def mark_released(conn: Conn, rsv_id: str, reason: ReleaseReason, kept: Window | None) -> None:
    """The columns booking.finish's save of a released reservation changes, alone: its state,
    reason, kept window and no next attempt (the others it writes back as they are)."""
    conn.execute(
        "UPDATE reservations SET state = 'released', during_start = ?, during_end = ?,"
        " release_reason = ?, next_attempt_at = NULL WHERE id = ?",
        (
            None if kept is None else kept.start,
            None if kept is None else kept.end,
            reason.value,
            rsv_id,
        ),
    )


def set_state(conn: Conn, rsv_id: str, state: State) -> None:
    """A move that changes the state alone (placed to binding, binding to active): the row
    repo.save_reservation would write, without encoding and writing back the rest."""
    conn.execute("UPDATE reservations SET state = ? WHERE id = ?", (state.value, rsv_id))
