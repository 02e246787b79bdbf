"""Which starts could possibly fit, from GPU counts alone: the search's cheap first test.

Planning a window (the real planner) costs a query and a snapshot per node; on a busy fleet most
candidate starts fail. This module answers, once per search, the starts at which enough nodes
(`size` of them in one topology group for a gang) have at least `need` healthy GPUs free for the
whole shortest window. It ignores what only the planner knows (NVLink groups), so it never
refuses a start the planner would accept: a necessary condition, never a verdict.

Input per node: the healthy GPUs free over the whole span, and for the others the gaps between
their bookings that are long enough. An atom is free for [s, s + d) exactly when s lies in
[gap start, gap end - d] of one of its gaps.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from better_compute.model import Window

#: A closed interval of starts [first, last].
Span = tuple[int, int]


@dataclass(frozen=True)
class NodeFree:
    """One eligible node over the searched span."""

    name: str
    group: str | None  # its topology value; None: lacks the label (never joins a gang)
    always: int  # healthy GPUs with no booking in the span
    gaps: tuple[tuple[int, int, int], ...] = ()  # (atom, gap start, gap end) of the others
    blocked: tuple[tuple[int, int], ...] = field(default=())  # maintenance windows [start, end)


def _at_least(spans: Iterable[Span], k: int) -> list[Span]:
    """Where at least k of the closed intervals overlap, as disjoint closed intervals."""
    if k <= 0:
        raise ValueError("k must be positive")
    events = sorted([(a, 0) for a, _ in spans] + [(b, 1) for _, b in spans])
    out: list[Span] = []
    depth, opened = 0, 0
    for t, kind in events:  # at one instant, openings (0) come before closings (1)
        if kind == 0:
            depth += 1
            if depth == k:
                opened = t
        else:
            if depth == k:
                out.append((opened, t))
            depth -= 1
    return out


def _minus(spans: list[Span], holes: Sequence[Span]) -> list[Span]:
    """Closed spans with the open intervals `holes` (lo, hi) taken out."""
    for lo, hi in holes:
        cut: list[Span] = []
        for a, b in spans:
            if b <= lo or a >= hi:
                cut.append((a, b))
                continue
            if a <= lo:
                cut.append((a, lo))
            if b >= hi:
                cut.append((hi, b))
        spans = cut
    return spans


def node_starts(node: NodeFree, need: int, first: int, last: int, length: int) -> list[Span]:
    """Starts in [first, last] at which the node has `need` GPUs free for `length`."""
    if node.always >= need:
        spans = [(first, last)]
    else:
        atom_spans = [
            (max(a, first), min(z - length, last)) for _, a, z in node.gaps if z - length >= a
        ]
        spans = _at_least([s for s in atom_spans if s[0] <= s[1]], need - node.always)
    holes = [(m_start - length, m_end) for m_start, m_end in node.blocked]
    return _minus(spans, holes)


def possible_starts(
    nodes: Sequence[NodeFree],
    *,
    need: int,
    size: int,
    gang: bool,
    first: int,
    last: int,
    length: int,
    by_node: dict[str, list[Span]] | None = None,
) -> list[Span]:
    """Starts where `size` nodes (of one group for a gang) have `need` GPUs free for `length`,
    as sorted disjoint closed intervals. Each node's own starts go into `by_node` if given."""
    groups: dict[str, list[Span]] = {}
    for node in nodes:
        key = node.group if gang else ""
        if key is None:
            continue  # nodes without the label never join a gang
        mine = node_starts(node, need, first, last, length)
        if by_node is not None and mine:
            by_node[node.name] = mine
        groups.setdefault(key, []).extend(mine)
    found = sorted(s for spans in groups.values() for s in _at_least(spans, size))
    merged: list[Span] = []
    for a, b in found:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def covers(spans: Sequence[Span], t: int) -> bool:
    """Whether t lies in one of the sorted disjoint closed spans."""
    i = bisect_right(spans, t, key=lambda s: s[0]) - 1
    return i >= 0 and spans[i][0] <= t <= spans[i][1]


def free_until(node: NodeFree, need: int, start: int, horizon: int, cap: int) -> int | None:
    """The latest end (at most `cap`) up to which the node keeps `need` GPUs free from `start`,
    or None if it has not `need` free at `start`. A gap reaching `horizon` (the span's end) runs
    on past it, so it counts as reaching `cap`."""
    if any(m_start <= start < m_end for m_start, m_end in node.blocked):
        return None
    ends = [cap] * node.always + [
        cap if z >= horizon else min(z, cap) for _, a, z in node.gaps if a <= start < z
    ]
    if len(ends) < need:
        return None
    until = sorted(ends, reverse=True)[need - 1]
    for m_start, _ in node.blocked:
        if m_start > start:
            until = min(until, m_start)
    return until


def reach(
    nodes: Sequence[NodeFree],
    *,
    need: int,
    size: int,
    gang: bool,
    start: int,
    horizon: int,
    cap: int,
) -> int | None:
    """An upper bound on the end of any window from `start` that fits (None: none does), from
    counts: the latest end up to which `size` nodes (of one group for a gang) stay free."""
    groups: dict[str, list[int]] = {}
    for node in nodes:
        key = node.group if gang else ""
        if key is None:
            continue
        until = free_until(node, need, start, horizon, cap)
        if until is not None:
            groups.setdefault(key, []).append(until)
    best = [sorted(u, reverse=True)[size - 1] for u in groups.values() if len(u) >= size]
    return max(best, default=None)


@dataclass(frozen=True)
class Free:
    """One stretch of the range worked out: the nodes' free time and the possible starts."""

    nodes: tuple[NodeFree, ...]
    spans: tuple[Span, ...]
    horizon: int  # the end of the span the gaps were read over
    #: Each node's own possible starts (nodes with none are left out).
    by_node: dict[str, list[Span]] = field(default_factory=dict)


class Chunked:
    """`possible_starts` worked out a stretch of the range at a time, as an ascending search
    reaches it: a search that finds its window early reads only the start of the range."""

    def __init__(
        self,
        compute: Callable[[int, int], Free],
        last: int,
        step: int,
        *,
        need: int,
        size: int,
        gang: bool,
        plan_first: bool = False,
    ) -> None:
        self._compute, self._last, self._step = compute, last, max(1, step)
        #: Let the first start go to the planner untested: when it often fits (a single node on
        #: a fleet with room), working out the free time first would cost more than it saves.
        self._plan_first = plan_first
        self._need, self._size, self._gang = need, size, gang
        self._upto: int | None = None
        self._free = Free((), (), 0)

    def __call__(self, window: Window) -> bool:
        """Could a window from this start fit? (Starts come in ascending order.)"""
        t = window.start
        if self._plan_first:
            self._plan_first = False
            return True
        if self._upto is None or t > self._upto:
            upto = min(self._last, t + self._step - 1)
            self._free, self._upto = self._compute(t, upto), upto
            self._step *= 2
        return covers(self._free.spans, t)

    def candidates(self, start: int) -> list[str] | None:
        """The nodes that could take a share of a window from `start` (a superset of those the
        planner finds fitting, by name); None before any chunk is worked out."""
        if self._upto is None:
            return None
        return sorted(n for n, spans in self._free.by_node.items() if covers(spans, start))

    def reach(self, start: int, cap: int) -> int | None:
        """See `reach`; `start` must have been asked about last (None before any chunk)."""
        if self._upto is None:
            return None
        by_node = self._free.by_node
        able = [n for n in self._free.nodes if n.name in by_node and covers(by_node[n.name], start)]
        return reach(
            able,
            need=self._need,
            size=self._size,
            gang=self._gang,
            start=start,
            horizon=self._free.horizon,
            cap=cap,
        )
