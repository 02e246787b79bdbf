"""Which starts could possibly fit, from GPU counts alone: the search's cheap first test.

Planning a window (the real planner) costs a query and a snapshot per node; on a busy fleet most
candidate starts fail. This module answers, once per stretch of the range, the starts at which
enough nodes (`size` of them in one topology group for a gang) have at least `need` GPUs free
for the whole shortest window. It ignores what only the planner knows (NVLink groups, GPU
health), so it never refuses a start the planner would accept: a necessary condition, never a
verdict.

Input per node: its bookings in the span read, one per (start, end) with the GPUs it holds as a
bit mask (storage sums them in SQL, so Python walks one row per booking, not one per GPU). A
booking [a, z) holds its GPUs for every window start in [a - d + 1, z - 1] (d the window's
length): the starts where a node has `need` free are where fewer than `gpus - need + 1` of its
GPUs are held, found by one sweep over those start intervals (for whole nodes, the complement
of their union). `Free` works a stretch of starts out a batch of nodes at a time; `Chunked`
walks the range a stretch at a time and also names, for one start, the nodes worth planning and
how long a window could last.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from better_compute.model import Window

#: A closed interval of starts [first, last].
Span = tuple[int, int]


class NodeFree(NamedTuple):
    """One eligible node over the searched span (a tuple: a pool has thousands)."""

    name: str
    group: str | None  # its topology value; None: lacks the label (never joins a gang)
    gpus: int  # its GPUs, numbered from 0 (bit i of a mask is GPU i)
    #: (start, end, GPUs held as a bit mask) of its bookings in the span, in any order.
    busy: Sequence[tuple[int, int, int]] = ()
    blocked: Sequence[tuple[int, int]] = ()  # maintenance windows [start, end)

    @property
    def full(self) -> int:
        return (1 << self.gpus) - 1


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


def node_starts(node: NodeFree, need: int, first: int, last: int, length: int) -> list[Span]:
    """Starts in [first, last] at which the node has `need` GPUs free for `length`."""
    if node.gpus < need:
        return []
    shift = length - 1  # a booking from a holds its GPUs for starts from a - length + 1
    if need == node.gpus:  # the whole node: free exactly outside what any booking holds
        cuts = [(a - shift, z - 1) for a, z, _ in node.busy]
        cuts += [(a - shift, z - 1) for a, z in node.blocked]
        return _outside(cuts, first, last)
    full = node.full
    held: list[tuple[int, int, int]] = []  # (first start, last start, mask) each one holds
    union = 0
    for a, z, mask in node.busy:
        lo, hi = a - shift, z - 1
        if lo <= last and hi >= first:
            held.append((lo if lo > first else first, hi if hi < last else last, mask))
            union |= mask
    for m_start, m_end in node.blocked:  # maintenance holds every GPU
        lo, hi = m_start - shift, m_end - 1
        if lo <= last and hi >= first:
            held.append((lo if lo > first else first, hi if hi < last else last, full))
            union = full
    if (full & ~union).bit_count() >= need:
        return [(first, last)]  # never short, whatever overlaps
    return _sweep(held, need, full, first, last)


def _outside(cuts: list[tuple[int, int]], first: int, last: int) -> list[Span]:
    """[first, last] minus the closed intervals `cuts`."""
    out: list[Span] = []
    cursor = first
    for lo, hi in sorted(cuts):
        if lo > last:
            break
        if lo > cursor:
            out.append((cursor, lo - 1))
        if hi >= cursor:
            cursor = hi + 1
            if cursor > last:
                return out
    if cursor <= last:
        out.append((cursor, last))
    return out


def _sweep(
    held: list[tuple[int, int, int]], need: int, full: int, first: int, last: int
) -> list[Span]:
    """Where at least `need` of the node's GPUs are held by none of `held`."""
    edges = sorted({first, *(lo for lo, _, _ in held), *(hi + 1 for _, hi, _ in held)})
    out: list[Span] = []
    for i, t in enumerate(edges):
        if t > last:
            break
        busy = 0
        for lo, hi, mask in held:
            if lo <= t <= hi:
                busy |= mask
        if (full & ~busy).bit_count() < need:
            continue
        end = edges[i + 1] - 1 if i + 1 < len(edges) else last
        if out and out[-1][1] == t - 1:
            out[-1] = (out[-1][0], min(end, last))
        else:
            out.append((t, min(end, last)))
    return out


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
    or None if it has not `need` free at `start`. Bookings past `horizon` (the end of the span
    read) are unknown, so free time reaching it counts as reaching `cap`."""
    if any(m_start <= start < m_end for m_start, m_end in node.blocked):
        return None
    taken = 0
    later = []
    for a, z, mask in node.busy:
        if a <= start < z:
            taken |= mask
        elif start < a < horizon:
            later.append((a, mask))
    free = node.full & ~taken
    if free.bit_count() < need:
        return None
    until = cap
    for a, mask in sorted(later):  # the first start at which fewer than `need` stay free
        free &= ~mask
        if free.bit_count() < need:
            until = min(until, a)
            break
    for m_start, _ in node.blocked:
        if m_start > start:
            until = min(until, m_start)
    return until


def best_reach(untils: Iterable[tuple[NodeFree, int]], *, size: int, gang: bool) -> int | None:
    """The latest end up to which `size` of the nodes (of one group for a gang) stay free."""
    groups: dict[str, list[int]] = {}
    for node, until in untils:
        key = node.group if gang else ""
        if key is not None:
            groups.setdefault(key, []).append(until)
    best = [sorted(u, reverse=True)[size - 1] for u in groups.values() if len(u) >= size]
    return max(best, default=None)


class Free:
    """One stretch of starts [first, last] worked out: the nodes' free time and the possible
    starts, a batch of nodes at a time. Eager (every batch read at once) unless `lazy`: then a
    batch is read only when the ones before cannot answer (`covers`, or `more` from the caller),
    so a start that fits on the first nodes read costs only those. Laziness is for single-node
    requests: a gang's possible starts count nodes of one group, read whole."""

    def __init__(
        self,
        batches: Iterable[Sequence[NodeFree]],
        *,
        need: int,
        size: int,
        gang: bool,
        first: int,
        last: int,
        length: int,
        horizon: int,
        lazy: bool = False,
    ) -> None:
        if lazy and (gang or size != 1):
            raise ValueError("only a single-node request is worked out lazily")
        self._batches = iter(batches)
        self._need, self._size, self._gang = need, size, gang
        self._first, self._last, self._length = first, last, length
        self.horizon = horizon  # the end of the span the bookings were read over
        self.nodes: list[NodeFree] = []  # the nodes read so far
        #: Each node's own possible starts (nodes with none are left out).
        self.by_node: dict[str, list[Span]] = {}
        self.spans: list[Span] = []  # the possible starts, as far as the nodes read tell
        self.complete = False
        if not lazy:
            batch = [node for b in self._batches for node in b]
            self.spans = possible_starts(
                batch, need=need, size=size, gang=gang, first=first, last=last, length=length,
                by_node=self.by_node,
            )  # fmt: skip
            self.nodes, self.complete = batch, True

    def more(self) -> bool:
        """Read the next batch of nodes; False once every node is read."""
        if self.complete:
            return False
        batch = next(self._batches, None)
        if batch is None:
            self.complete = True
            return False
        found: list[Span] = []
        for node in batch:
            mine = node_starts(node, self._need, self._first, self._last, self._length)
            if mine:
                self.by_node[node.name] = mine
                found.extend(mine)
        self.nodes.extend(batch)
        self.spans = _union([*self.spans, *found])
        return True

    def covers(self, t: int) -> bool:
        """Could a window from t fit? Reads batches until one of their nodes could take it, or
        every node is read."""
        while not covers(self.spans, t):
            if not self.more():
                return False
        return True


def _union(spans: list[Span]) -> list[Span]:
    """Closed spans merged into sorted disjoint ones (adjacent integers merge too)."""
    merged: list[Span] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


@dataclass(frozen=True)
class Candidates:
    """The nodes worth planning for a window, those with the most free time first. `complete`:
    every node that could take a share is there (a superset of those the planner finds
    fitting); else only some that could, enough to try first."""

    names: list[str]
    complete: bool


class Chunked:
    """`possible_starts` worked out a stretch of the range at a time, as an ascending search
    reaches it: a search that finds its window early reads only the start of the range.

    For the start last asked about it also answers which nodes could take a share of a window
    from there (`candidates`) and how long a window could be (`reach`). A single-node request
    needs only `enough` nodes for either, so nodes are looked at one by one until that many
    are found; a gang needs every node of its group."""

    def __init__(
        self,
        compute: Callable[[int, int], Free],
        last: int,
        step: int,
        *,
        need: int,
        size: int,
        gang: bool,
        length: int = 1,
        enough: int = 8,
        plan_first: bool = False,
    ) -> None:
        self._compute, self._last, self._step = compute, last, max(1, step)
        #: Let the first start go to the planner untested: when it often fits (a single node on
        #: a fleet with room), working out the free time first would cost more than it saves.
        self._plan_first = plan_first
        self._need, self._size, self._gang = need, size, gang
        self._length, self._enough = length, max(1, enough)
        self._upto: int | None = None
        self._free = Free((), need=need, size=size, gang=gang, first=0, last=0, length=1, horizon=0)
        self._at: _AtStart | None = None

    def __call__(self, window: Window) -> bool:
        """Could a window from this start fit? (Starts come in ascending order.)"""
        t = window.start
        if self._plan_first:
            self._plan_first = False
            return True
        if self._upto is None or t > self._upto:
            upto = min(self._last, t + self._step - 1)
            self._free, self._upto, self._at = self._compute(t, upto), upto, None
            self._step *= 2
        return self._free.covers(t)

    def _start(self, start: int) -> _AtStart:
        if self._at is None or self._at.start != start:
            self._at = _AtStart(self._free, start, self._need)
        return self._at

    def candidates(self, window: Window) -> Candidates | None:
        """The nodes that could take a share of `window` (by name); None before any chunk."""
        if self._upto is None:
            return None
        at = self._start(window.start)
        if not self._gang:
            some = at.lasting(window.end, self._enough)
            if len(some) >= self._enough:
                return Candidates([n.name for n, _ in some], False)
        if window.end <= window.start + self._length:  # the counted test's own window
            return Candidates([n.name for n in at.able()], True)
        ranked = sorted((-u, n.name) for n, u in at.all_untils() if u >= window.end)
        return Candidates([name for _, name in ranked], True)

    def reach(self, start: int, cap: int) -> int | None:
        """See `reach`; `start` must have been asked about last (None before any chunk)."""
        if self._upto is None:
            return None
        at = self._start(start)
        if not self._gang and len(at.lasting(cap, self._enough)) >= self._enough:
            return cap  # enough nodes stay free to the cap: no need to look at the others
        best = best_reach(at.all_untils(), size=self._size, gang=self._gang)
        return None if best is None else min(best, cap)


class _AtStart:
    """How long each node able to start at `start` stays free, worked out node by node as far
    as asked (reading more batches of nodes when those read run out)."""

    def __init__(self, free: Free, start: int, need: int) -> None:
        self.start, self._free, self._need = start, free, need
        self._able: list[NodeFree] = []
        self._untils: list[tuple[NodeFree, int]] = []
        self._seen = 0  # how many of free.nodes have been looked at
        self._timed = 0  # how many of _able have their free time worked out

    def _next(self) -> NodeFree | None:
        """The next node that could start a window at `start`, or None after the last."""
        free, start = self._free, self.start
        while True:
            while self._seen < len(free.nodes):
                node = free.nodes[self._seen]
                self._seen += 1
                spans = free.by_node.get(node.name)
                if spans is not None and covers(spans, start):
                    self._able.append(node)
                    return node
            if not free.more():
                return None

    def _more(self) -> tuple[bool, tuple[NodeFree, int] | None]:
        """Work out the next able node's free time: (whether there was one, it and its until
        if it has `need` free at the start)."""
        if self._timed < len(self._able):
            node: NodeFree | None = self._able[self._timed]
        else:
            node = self._next()
        if node is None:
            return False, None
        self._timed += 1
        until = free_until(node, self._need, self.start, self._free.horizon, UNCAPPED)
        if until is None:
            return True, None
        self._untils.append((node, until))
        return True, (node, until)

    def able(self) -> list[NodeFree]:
        """Every node that could start a window at `start` (their free time not worked out:
        the caller needs only the counted test's window)."""
        while self._next() is not None:
            pass
        return self._able

    def lasting(self, end: int, enough: int) -> list[tuple[NodeFree, int]]:
        """Up to `enough` nodes that stay free until `end` or later, looking no further."""
        found = [(n, u) for n, u in self._untils if u >= end][:enough]
        while len(found) < enough:
            more, seen = self._more()
            if not more:
                break
            if seen is not None and seen[1] >= end:
                found.append(seen)
        return found

    def all_untils(self) -> list[tuple[NodeFree, int]]:
        while self._more()[0]:
            pass
        return self._untils


#: No cap on how long a node stays free (free_until's answer is capped by the caller).
UNCAPPED = 2**62
