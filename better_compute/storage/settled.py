"""Reads of the ledger's settings, kept across a replay's transactions (service/simulate.py).

Every request of a replay reads the same settings again: the admins, the pools, whether its
tenant exists, the tenant's quota caps and budgets, the pool's calendar policy and auto-bind, a
node's GPU model. A replay writes none of them (it books, ticks and meters), so between two of
its transactions only another process can change them, and that changes the data version
(storage/simulation.data_version). While a replay holds a connection (`holding`), the reads
below keep their answers for as long as the version the replay saw at the start of each of its
transactions stays the same; the first transaction that sees another version starts afresh.
Outside a replay every read goes to the database, as always.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from better_compute.storage.conn import Conn

_T = TypeVar("_T")

#: Per connection held by a replay (by id: a connection object is neither hashable on every
#: backend nor ours to add attributes to): the data version its answers hold for, and them.
_held: dict[int, tuple[int | None, dict[Hashable, Any]]] = {}


@contextmanager
def holding(conn: Conn) -> Iterator[None]:
    """The replay's span: reads on `conn` may be kept (once `seen` says at which version)."""
    _held[id(conn)] = (None, {})
    try:
        yield
    finally:
        del _held[id(conn)]


def seen(conn: Conn, version: int) -> bool:
    """A replay's transaction read the data version `version` (inside it, with the write lock
    held): the answers kept stand if it is the one they were read at, else they are dropped.
    True when they were (or nothing was kept yet): the caller drops what it keeps itself."""
    held = _held.get(id(conn))
    if held is not None and held[0] != version:
        _held[id(conn)] = (version, {})
        return True
    return held is None


def kept(conn: Conn, key: Hashable, read: Callable[[], _T]) -> _T:
    """`read()`, or its answer kept at this data version while a replay holds `conn`."""
    held = _held.get(id(conn))
    if held is None or held[0] is None:
        return read()
    answers = held[1]
    if key not in answers:
        answers[key] = read()
    answer: _T = answers[key]
    return answer
