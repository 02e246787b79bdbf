"""`list --json` at fleet scale (issue 8): reservation rows checked and handed over as plain
tuples, without building a Reservation (30 fields, frozen) and its allocations for every row.

A listing of 8,525 reservations spent most of its time making model objects that only became a
JSON document again. Here each row is type-checked exactly as repo._reservation checks it (a
damaged row is UNAVAILABLE, naming it), and its values stay as SQL gave them, in the order the
document wants them (render/json.listed_text). Both backends give the same tuples, so the same
bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from better_compute.model import SERIES_MARK, Binding, Condition, ReleaseReason, State
from better_compute.storage.conn import Conn, plain_rows
from better_compute.storage.repo import (
    _ATOMS_TEXT,
    _DECODE_ERRORS,
    _conditions,
    _int,
    _json_of,
    _labels,
    _str,
    among,
    atom_list,
    damaged,
)

#: A listed allocation: (id, node, atoms as JSON text in json.dumps's form, bound).
ListedAllocation = tuple[str, str, str, bool]


class ListedReservation(NamedTuple):
    """What `list --json` prints of a reservation: render.json.reservation's document, its
    values as stored (checked), the allocations not released in id order per node."""

    id: str
    tenant_id: str
    pool_id: str
    state: str
    gpus: int | None
    models: tuple[str, ...]
    topology: str | None
    gang_size: int | None
    topology_key: str | None
    spot: bool
    binding: str
    duration_ms: int
    start: int | None
    during_start: int | None
    during_end: int | None
    conditions: tuple[Condition, ...]
    allocations: tuple[ListedAllocation, ...]
    quota_charge: int
    idempotency_key: str | None
    release_reason: str | None
    created_at: int
    next_attempt_at: int | None
    name: str | None
    labels: tuple[tuple[str, str], ...]
    series_id: str | None


#: The reservation's columns read, in this order (see _checked), then its allocation's.
_COLUMNS = ", ".join(
    f"r.{name}"
    for name in [
        "id",
        "tenant_id",
        "pool_id",
        "state",
        "gpus",
        "models",
        "topology",
        "gang_size",
        "topology_key",
        "spot",
        "binding",
        "duration_ms",
        "start",
        "during_start",
        "during_end",
        "conditions",
        "quota_charge",
        "idempotency_key",
        "release_reason",
        "created_at",
        "next_attempt_at",
        "name",
        "labels",
        "series_id",
        "seq",
        "principal",
        "preempt_deadline",
        "preempted_by",
    ]
)
_ALLOCATION = 28  # where the allocation's id, node, atoms and bound begin
_STATES = frozenset(s.value for s in State)
_BINDINGS = frozenset(b.value for b in Binding)
_REASONS = frozenset(r.value for r in ReleaseReason)
#: Positions of the columns repo._check_reservation_types checks, by the type they must have.
_INTS = (11, 16, 19, 24)  # duration_ms, quota_charge, created_at, seq
_OPT_INTS = (4, 7, 12, 13, 14, 20, 26)  # gpus, gang_size, start, during_*, next_attempt, deadline
_STRS = (0, 1, 2, 25)  # id, tenant_id, pool_id, principal
_OPT_STRS = (6, 8, 17, 23, 27, 21)  # topology, topology_key, key, series, preempted_by, name


@dataclass(frozen=True)
class Query:
    """`list`'s filters, as the ledger reads them; None or empty means "any". `by_start`:
    ordered by the start of each window (else oldest first)."""

    tenants: Sequence[str] | None = None
    pool_id: str | None = None
    key: str | None = None
    states: Sequence[str] = ()
    name: str | None = None
    labels: Sequence[tuple[str, str]] = ()
    since: int | None = None  # --from: windows that end after it
    until: int | None = None  # --to: windows that start before it
    by_start: bool = False


def reservation_pages(
    conn: Conn, q: Query, now: int, size: int = 500
) -> Iterator[list[ListedReservation]]:
    """fleet.reservation_pages's reservations (the same query, in the same order), `size` at a
    time, as checked rows, each with its allocations not released (by node, then id).

    One query joins each reservation to its allocations, so most reservations are one row; a
    gang's are one row per member, in a run."""
    selection, args = selected(q, now, alias="r.")
    rows = plain_rows(
        conn,
        f"SELECT {_COLUMNS}, a.id, a.node_id, a.atoms, a.bound FROM reservations r"
        " LEFT JOIN allocations a ON a.reservation_id = r.id AND a.released = 0"
        f" WHERE {selection}, a.node_id, a.id",
        args,
    )
    page: list[ListedReservation] = []
    held: tuple[Any, ...] | None = None
    allocations: list[ListedAllocation] = []
    for row in rows:
        if held is not None and row[0] == held[0]:
            allocations.append(_allocation(conn, row))
            continue
        if held is not None:
            page.append(_checked(conn, held, tuple(allocations)))
            if len(page) == size:
                yield page
                page = []
        held = row
        allocations = [] if row[_ALLOCATION] is None else [_allocation(conn, row)]
    if held is not None:
        page.append(_checked(conn, held, tuple(allocations)))
    if page:
        yield page


def id_pages(conn: Conn, q: Query, now: int, size: int = 5000) -> Iterator[list[str]]:
    """The ids of fleet.reservation_pages's reservations, in the same order, `size` at a time:
    `list --ids` reads nothing else."""
    selection, args = selected(q, now)
    cursor = conn.execute(f"SELECT id FROM reservations WHERE {selection}", args)
    while rows := cursor.fetchmany(size):
        yield [str(row[0]) for row in rows]


def selected(q: Query, now: int, *, alias: str = "") -> tuple[str, list[object]]:
    """`q` as the text after WHERE, its ORDER BY included, and its arguments in order (`alias`:
    "r." when the query names the table r). The order is SQL's, so a listing sorted by start
    is read page by page like any other, never held whole to be sorted."""
    a = alias
    clauses, args = ["1 = 1"], []  # type: tuple[list[str], list[object]]
    if q.tenants is not None:
        clauses.append(among(f"{a}tenant_id", len(q.tenants)))
        args.extend(q.tenants)
    for column, value in (("pool_id", q.pool_id), ("name", q.name)):
        if value is not None:
            clauses.append(f"{a}{column} = ?")
            args.append(value)
    if q.key is not None:
        clauses.append(KEY_CLAUSE.format(column=f"{a}idempotency_key"))
        args.extend(key_args(q.key))
    if q.states:
        clauses.append(f"{a}state IN ({','.join('?' * len(q.states))})")
        if "released" not in q.states:  # the state index holds live rows only (migration 12)
            clauses.append(f"{a}state <> 'released'")
        args.extend(q.states)
    for key, value in q.labels:
        clauses.append(
            f"{a}id IN (SELECT reservation_id FROM reservation_labels WHERE key = ? AND value = ?)"
        )
        args.extend((key, value))
    if q.since is not None:
        clauses.append(f"{_END.format(a=a)} > ?")
        args.extend((now, now, q.since))
    if q.until is not None:
        clauses.append(f"{_START.format(a=a)} < ?")
        args.extend((now, now, q.until))
    order = f"{a}seq"
    if q.by_start:  # the window's start; none (released before it held time) last
        order = f"COALESCE({_START.format(a=a)}, {_LAST}), {a}seq"
        args.extend((now, now))
    return f"{' AND '.join(clauses)} ORDER BY {order}", args


#: The window a reservation has or wants: its booked `during`, or for a pending one the window a
#: retry now would book, [max(start, now), + duration) (lifecycle.tick.retry_window). A released
#: reservation that never held time has none (NULL), so no range finds it. Portable SQL: CASE
#: rather than SQLite's MAX(a, b), so the PostgreSQL ledger runs the same statements.
_START = (
    "(CASE WHEN {a}during_start IS NOT NULL THEN {a}during_start WHEN {a}state = 'pending' THEN"
    " (CASE WHEN {a}start > ? THEN {a}start ELSE ? END) END)"
)
_END = (
    "(CASE WHEN {a}during_start IS NOT NULL THEN {a}during_end WHEN {a}state = 'pending' THEN"
    " (CASE WHEN {a}start > ? THEN {a}start ELSE ? END) + {a}duration_ms END)"
)
#: After every instant a window can have (SQLite's and PostgreSQL's largest 64-bit integer).
_LAST = 9_223_372_036_854_775_807


#: A key names its reservation, or the occurrences of its series (KEY#1, KEY#2, …): those whose
#: key begins with "KEY#". A prefix compared with substr, not a range of keys, which only byte
#: order (SQLite, PostgreSQL's C collation) would keep to the prefix. The length is cast: on
#: PostgreSQL every integer parameter is a bigint (storage/postgres.py), and substr takes an int.
KEY_CLAUSE = "({column} = ? OR substr({column}, 1, CAST(? AS INTEGER)) = ?)"


def key_args(key: str) -> list[object]:
    """KEY_CLAUSE's arguments for `key`."""
    return [key, len(key) + 1, key + SERIES_MARK]


def _allocation(conn: Conn, row: tuple[Any, ...]) -> ListedAllocation:
    """The row's allocation, checked as repo._allocation checks it; its atoms stay the stored
    text when that is exactly json.dumps of the sorted list (as insert_allocation writes it)."""
    alloc_id, node, atoms, bound = row[_ALLOCATION:]
    try:
        if type(alloc_id) is not str or type(node) is not str:
            raise TypeError("expected text in an allocation's id or node")
        if type(atoms) is not str or not _ATOMS_TEXT.fullmatch(atoms):
            atoms = "[" + ", ".join(map(str, atom_list(atoms))) + "]"
    except _DECODE_ERRORS as exc:
        raise damaged(conn, f"allocation {alloc_id}", exc) from None
    return (alloc_id, node, atoms, bool(bound))


def _checked(
    conn: Conn, row: tuple[Any, ...], allocations: tuple[ListedAllocation, ...]
) -> ListedReservation:
    """One row, checked as repo._reservation checks it (damage is UNAVAILABLE, naming it)."""
    try:
        for i in _INTS:
            if type(row[i]) is not int:
                _int(row[i])
        for i in _OPT_INTS:
            if row[i] is not None and type(row[i]) is not int:
                _int(row[i])
        for i in _STRS:
            if type(row[i]) is not str:
                _str(row[i])
        for i in _OPT_STRS:
            if row[i] is not None and type(row[i]) is not str:
                _str(row[i])
        state, binding, reason = row[3], row[10], row[18]
        if state not in _STATES:
            State(state)  # raises ValueError, as the model path does
        if binding not in _BINDINGS:
            Binding(binding)
        if reason and reason not in _REASONS:
            ReleaseReason(reason)
        models = row[5]
        during_start, during_end = row[13], row[14]
        if during_start is not None:
            _int(during_end)
        return ListedReservation(
            row[0],
            row[1],
            row[2],
            state,
            row[4],
            () if models == "[]" else tuple(_str(m) for m in _json_of(models, list)),
            row[6],
            row[7],
            row[8],
            bool(row[9]),
            binding,
            row[11],
            row[12],
            during_start,
            during_end if during_start is not None else None,
            _conditions(row[15]),
            allocations,
            row[16],
            row[17],
            reason or None,
            row[19],
            row[20],
            row[21],
            () if row[22] == "{}" else _labels(row[22]),
            row[23],
        )
    except _DECODE_ERRORS as exc:
        raise damaged(conn, f"reservation {row[0]}", exc) from None
