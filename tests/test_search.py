"""The window search of `advice` (engine/search.py), on in-memory pools with the real planner.

Table-driven cases (busy pools, holes too short, gangs across fabrics, duration and end ranges,
maintenance, policies) and a hypothesis property against a brute force minute by minute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from better_compute.engine import freetime, search
from better_compute.engine.place import place
from better_compute.model import (
    Atom,
    CalendarPolicy,
    Node,
    NodeSnapshot,
    Plan,
    Request,
    Window,
)
from better_compute.service.windows import bounded

M = 60_000  # a minute
H = 60 * M


@dataclass
class Pool:
    """Nodes (name -> (GPUs, fabric clique)), bookings (node, atoms, start, end), maintenance."""

    nodes: dict[str, tuple[int, int]]
    bookings: list[tuple[str, tuple[int, ...], int, int]] = field(default_factory=list)
    maintenance: list[tuple[str, int, int]] = field(default_factory=list)

    def snapshots(self, window: Window) -> list[NodeSnapshot]:
        snaps = []
        for name, (gpus, clique) in sorted(self.nodes.items()):
            atoms = tuple(Atom(i, "h100", 0, "c1", clique) for i in range(gpus))
            busy = {
                a
                for n, held, s, e in self.bookings
                if n == name and Window(s, e).overlaps(window)
                for a in held
            }
            blocked = any(
                n == name and Window(s, e).overlaps(window) for n, s, e in self.maintenance
            )
            node = Node(name, "p", atoms)
            snaps.append(NodeSnapshot(node, frozenset(busy), (), "m" if blocked else None))
        return snaps

    def fits(self, gpus: int, gang: int | None = None, key: str | None = None):  # type: ignore[no-untyped-def]
        def test(window: Window) -> bool:
            request = Request(window, gpus, gang_size=gang, topology_key=key)
            return isinstance(place(request, self.snapshots(window), seed=0, top_n=1), Plan)

        return test

    def ends(self) -> list[int]:
        return sorted({e for *_, e in self.bookings} | {e for _, _, e in self.maintenance})

    def starts(self) -> list[int]:
        return sorted({s for _, _, s, _ in self.bookings} | {s for _, s, _ in self.maintenance})


def find(pool: Pool, ask: search.Ask, gpus: int, limit: int = 3, **gang: object) -> list[Window]:
    fits = pool.fits(gpus, **gang)  # type: ignore[arg-type]
    return search.windows(ask, pool.ends(), pool.starts(), fits, limit=limit)


FULL = (0, 1, 2, 3)

CASES = [
    # (purpose, pool, ask, gpus, gang kwargs, expected windows as (start, end) in minutes)
    (
        "an idle pool fits at the range's start",
        Pool({"a": (4, 1)}),
        search.Ask(0, 600 * M, 60 * M, 60 * M),
        4,
        {},
        [(0, 60)],
    ),
    (
        "a busy node: the earliest start is when its booking ends, then the next change",
        Pool({"a": (4, 1)}, [("a", FULL, 0, 90 * M), ("a", (0,), 100 * M, 110 * M)]),
        search.Ask(0, 600 * M, 60 * M, 60 * M),
        3,
        {},
        [(90, 150), (110, 170)],
    ),
    (
        "a hole too short is skipped: 30 minutes free between bookings, an hour wanted",
        Pool({"a": (4, 1)}, [("a", FULL, 0, 60 * M), ("a", FULL, 90 * M, 200 * M)]),
        search.Ask(0, 600 * M, 60 * M, 60 * M),
        4,
        {},
        [(200, 260)],
    ),
    (
        "a start range that closes before anything frees is an empty answer",
        Pool({"a": (4, 1)}, [("a", FULL, 0, 600 * M)]),
        search.Ask(0, 300 * M, 60 * M, 60 * M),
        1,
        {},
        [],
    ),
    (
        "a gang waits until one fabric holds it whole: free nodes split across fabrics do not",
        Pool(
            {"a1": (4, 1), "a2": (4, 1), "b1": (4, 2), "b2": (4, 2)},
            [("a2", FULL, 0, 120 * M), ("b1", FULL, 0, 60 * M)],
        ),
        search.Ask(0, 600 * M, 30 * M, 30 * M),
        4,
        {"gang": 2, "key": "fabric.domain"},
        [(60, 90), (120, 150)],
    ),
    (
        "a duration range takes the longest that fits at each start, up to the next booking",
        Pool({"a": (4, 1)}, [("a", FULL, 0, 60 * M), ("a", FULL, 200 * M, 300 * M)]),
        search.Ask(0, 600 * M, 60 * M, 240 * M),
        4,
        {},
        [(60, 200), (300, 540)],
    ),
    (
        "an end range: the latest end allowed, starts only where one can still be reached",
        Pool({"a": (4, 1)}, [("a", FULL, 0, 60 * M)]),
        search.Ask(0, 600 * M, 1, 100 * M, end_from=150 * M, end_to=160 * M),
        4,
        {},
        [(60, 160)],
    ),
    (
        "maintenance counts like a booking: its end is a candidate start",
        Pool({"a": (4, 1)}, maintenance=[("a", 0, 45 * M)]),
        search.Ask(0, 600 * M, 60 * M, 60 * M),
        1,
        {},
        [(45, 105)],
    ),
]


@pytest.mark.parametrize(
    ("purpose", "pool", "ask", "gpus", "gang", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_window_search(
    purpose: str,
    pool: Pool,
    ask: search.Ask,
    gpus: int,
    gang: dict[str, object],
    expected: list[tuple[int, int]],
) -> None:
    got = find(pool, ask, gpus, **gang)
    assert [(w.start // M, w.end // M) for w in got] == expected, purpose


def test_a_policy_narrows_the_ask_and_refuses_what_it_cannot_allow() -> None:
    ask = search.Ask(0, 10 * H, 1 * H, 8 * H)
    policy = CalendarPolicy("p", min_duration_ms=2 * H, max_duration_ms=4 * H, min_lead_ms=3 * H)
    narrowed = bounded(ask, policy, 0, 8)
    assert isinstance(narrowed, search.Ask)
    assert (narrowed.first, narrowed.min_ms, narrowed.max_ms) == (3 * H, 2 * H, 4 * H)
    pool = Pool({"a": (8, 1)})
    got = search.windows(narrowed, [], [], pool.fits(8), limit=1)
    assert got == [Window(3 * H, 7 * H)]
    sized = bounded(ask, CalendarPolicy("p", sizes=(16, 32)), 0, 8)
    assert sized == "size 8 GPUs is not allowed (allowed sizes: 16, 32)"
    too_long = bounded(search.Ask(0, H, 9 * H, 9 * H), policy, 0, 8)
    assert isinstance(too_long, str) and "from 2h to 4h" in too_long
    horizon = bounded(ask, CalendarPolicy("p", max_horizon_ms=30 * M), 0, 8)
    assert isinstance(horizon, str) and "horizon" in horizon


# ---------------------------------------------------------------- the property


@st.composite
def pools(draw: st.DrawFn) -> tuple[Pool, int, int, int, int]:
    """Two or three small nodes with bookings on the minute grid, a request and a range."""
    count = draw(st.integers(2, 3))
    nodes = {f"n{i}": (draw(st.integers(1, 4)), draw(st.integers(1, 2))) for i in range(count)}
    bookings = []
    for _ in range(draw(st.integers(0, 8))):
        name = draw(st.sampled_from(sorted(nodes)))
        gpus = nodes[name][0]
        atoms = tuple(sorted(draw(st.sets(st.integers(0, gpus - 1), min_size=1))))
        start = draw(st.integers(0, 100))
        bookings.append((name, atoms, start * M, (start + draw(st.integers(1, 60))) * M))
    maintenance = []
    for _ in range(draw(st.integers(0, 1))):
        start = draw(st.integers(0, 100))
        name = draw(st.sampled_from(sorted(nodes)))
        maintenance.append((name, start * M, (start + draw(st.integers(1, 40))) * M))
    gpus = draw(st.integers(1, 4))
    first = draw(st.integers(0, 60))
    last = first + draw(st.integers(0, 80))
    return Pool(nodes, bookings, maintenance), gpus, first, last, draw(st.integers(1, 50))


def brute_first(
    pool: Pool, gpus: int, first: int, last: int, minutes: int, gang: int | None
) -> int | None:
    fits = pool.fits(gpus, gang)
    for m in range(first, last + 1):
        if fits(Window(m * M, (m + minutes) * M)):
            return m
    return None


@settings(max_examples=150, deadline=None)
@given(pools(), st.sampled_from([None, 2]))
def test_the_search_misses_no_earlier_start_and_every_window_fits(
    case: tuple[Pool, int, int, int, int], gang: int | None
) -> None:
    pool, gpus, first, last, minutes = case
    ask = search.Ask(first * M, last * M, minutes * M, minutes * M)
    fits = pool.fits(gpus, gang)
    got = search.windows(ask, pool.ends(), pool.starts(), fits, limit=3)
    assert all(fits(w) and w.duration == minutes * M for w in got)
    assert [w.start for w in got] == sorted({w.start for w in got})
    expected = brute_first(pool, gpus, first, last, minutes, gang)
    assert (got[0].start // M if got else None) == expected


@settings(max_examples=100, deadline=None)
@given(pools(), st.integers(1, 60))
def test_a_duration_range_gives_the_longest_window_at_its_start(
    case: tuple[Pool, int, int, int, int], extra: int
) -> None:
    pool, gpus, first, last, minutes = case
    ask = search.Ask(first * M, last * M, minutes * M, (minutes + extra) * M)
    fits = pool.fits(gpus)
    got = search.windows(ask, pool.ends(), pool.starts(), fits, limit=2)
    assert (got[0].start // M if got else None) == brute_first(
        pool, gpus, first, last, minutes, None
    )
    for w in got:
        longest = max(
            d for d in range(minutes, minutes + extra + 1) if fits(Window(w.start, w.start + d * M))
        )
        assert w.duration == longest * M


# ---------------------------------------------------------------- the cheap first test


def free_nodes(pool: Pool, lo: int, hi: int, length: int, gang: bool) -> list[freetime.NodeFree]:
    """What storage/calendar.py answers, worked out in Python: per node, its bookings overlapping
    [lo, hi) with their GPUs as a bit mask (those with the same start and end merged), by start,
    and its maintenance windows."""
    del length  # read whatever overlaps, as storage does
    nodes = []
    for name, (gpus, clique) in sorted(pool.nodes.items()):
        masks: dict[tuple[int, int], int] = {}
        for n, atoms, s, e in pool.bookings:
            if n == name and e > lo and s < hi:
                masks[(s, e)] = masks.get((s, e), 0) | sum(1 << a for a in set(atoms))
        # In no particular order, as SQL's GROUP BY gives them: here, latest first.
        busy = tuple((s, e, m) for (s, e), m in sorted(masks.items(), reverse=True))
        blocked = tuple((s, e) for n, s, e in pool.maintenance if n == name and e > lo and s < hi)
        nodes.append(freetime.NodeFree(name, f"c1.{clique}" if gang else "", gpus, busy, blocked))
    return nodes


def counted(
    pool: Pool, gpus: int, gang: int | None, a: int, b: int, length: int, hi: int
) -> freetime.Free:
    """The cheap test over starts [a, b] as the service works it out: a gang's nodes read at
    once; a single node's lazily, here one node per batch (the service reads hundreds)."""
    nodes = free_nodes(pool, a, hi, length, gang is not None)
    batches = [nodes] if gang else [[n] for n in nodes]
    return freetime.Free(
        batches, need=gpus, size=gang or 1, gang=gang is not None, first=a, last=b,
        length=length, horizon=hi, lazy=gang is None,
    )  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(pools(), st.sampled_from([None, 2]))
def test_the_cheap_test_never_refuses_a_start_the_planner_takes(
    case: tuple[Pool, int, int, int, int], gang: int | None
) -> None:
    pool, gpus, first, last, minutes = case
    length = minutes * M
    nodes = free_nodes(pool, first * M, last * M + length, length, gang is not None)
    spans = freetime.possible_starts(
        nodes, need=gpus, size=gang or 1, gang=gang is not None, first=first * M,
        last=last * M, length=length,
    )  # fmt: skip
    fits = pool.fits(gpus, gang, "fabric.domain" if gang else None)
    for m in range(first, last + 1):
        window = Window(m * M, m * M + length)
        if fits(window):
            assert freetime.covers(spans, window.start), (m, spans)
    # Counted GPUs are all the planner needs here (no NVLink groups): the test is exact too.
    for m in range(first, last + 1):
        window = Window(m * M, m * M + length)
        assert freetime.covers(spans, window.start) == fits(window), m
    # Worked out lazily (a node at a time, asked latest first), it answers the same.
    lazy = counted(pool, gpus, gang, first * M, last * M, length, last * M + length)
    for m in range(last, first - 1, -1):
        assert lazy.covers(m * M) == freetime.covers(spans, m * M), m


@settings(max_examples=150, deadline=None)
@given(pools(), st.integers(0, 60), st.sampled_from([None, 2]))
def test_the_counted_shortcuts_change_no_answer(
    case: tuple[Pool, int, int, int, int], extra: int, gang: int | None
) -> None:
    """With the cheap test and the counted bound on the end, the search answers exactly what
    the planner alone answers (in chunks of 10 minutes of starts)."""
    pool, gpus, first, last, minutes = case
    ask = search.Ask(first * M, last * M, minutes * M, (minutes + extra) * M)
    fits = pool.fits(gpus, gang, "fabric.domain" if gang else None)
    plain = search.windows(ask, pool.ends(), pool.starts(), fits, limit=3)

    def compute(a: int, b: int) -> freetime.Free:
        return counted(pool, gpus, gang, a, b, ask.min_ms, b + ask.max_ms)

    chunked = freetime.Chunked(
        compute,
        ask.last,
        10 * M,
        need=gpus,
        size=gang or 1,
        gang=gang is not None,
        length=ask.min_ms,
        plan_first=extra % 2 == 1,
    )
    quick = search.windows(
        ask, pool.ends(), pool.starts(), fits, limit=3, maybe=chunked, reach=chunked.reach
    )
    assert quick == plain


@settings(max_examples=150, deadline=None)
@given(pools(), st.integers(0, 60), st.integers(1, 3))
def test_the_counted_candidates_hold_every_node_that_fits(
    case: tuple[Pool, int, int, int, int], extra: int, enough: int
) -> None:
    """Planning only the counted candidates of a window is exact: every node on which the
    planner alone fits the window is among them, and the bound on the end is never short."""
    pool, gpus, first, last, minutes = case
    ask = search.Ask(first * M, last * M, minutes * M, (minutes + extra) * M)

    def compute(a: int, b: int) -> freetime.Free:
        return counted(pool, gpus, None, a, b, ask.min_ms, b + ask.max_ms)

    chunked = freetime.Chunked(
        compute, ask.last, 10 * M, need=gpus, size=1, gang=False, length=ask.min_ms, enough=enough
    )
    for m in range(first, last + 1):
        start = m * M
        if not chunked(Window(start, start + ask.min_ms)):
            continue
        cap = start + ask.max_ms
        bound = chunked.reach(start, cap)
        for d in range(minutes, minutes + extra + 1):
            window = Window(start, start + d * M)
            found = chunked.candidates(window)
            assert found is not None
            fitting = [
                name
                for name in pool.nodes
                if Pool({name: pool.nodes[name]}, pool.bookings, pool.maintenance).fits(gpus)(
                    window
                )
            ]
            if fitting:
                assert bound is not None and window.end <= bound, (window, bound)
            if found.complete:
                assert set(fitting) <= set(found.names), (window, fitting, found)
            else:  # a few to try first: each stays free long enough, by the counts
                assert len(found.names) == enough, found
