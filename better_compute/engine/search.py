"""Availability windows for `advice` and `reserve --start-range` (PRODUCT.md §5.6).

Exact without trying every minute. Whether a window fits depends only on which bookings and
maintenance windows overlap it (node state and health do not change with time). Take a start s
that fits and let c be the latest candidate at or before s, where the candidates are the range's
first start and every instant a booking or maintenance window ends. Nothing ends in (c, s], so
whatever overlaps [c, c + d) also overlaps [s, s + d): c fits too. So the earliest fitting start
is a candidate, and walking the candidates in order misses none.

At one start, a longer window only adds what it overlaps, so the windows that fit are those up
to some longest end; that end is either the latest allowed or the start of a booking or
maintenance window (the first that no longer leaves room). A binary search over those instants
finds it with a few plans instead of one per minute.

`fits` is injected: the service passes the real planner (the one `reserve` runs, gang planner
included), so every window found can be booked at once; tests pass a brute force.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from better_compute.model import Window

#: Does a request fit in this window right now? (the real planner, in the service)
Fits = Callable[[Window], bool]
#: The instants (booking or maintenance starts or ends) in [a, b], ascending.
Between = Callable[[int, int], Sequence[int]]


@dataclass(frozen=True)
class Ask:
    """Which windows are wanted: a start in [first, last], a length in [min_ms, max_ms], an end in
    [end_from, end_to] (an end range, a policy's horizon). Every bound is inclusive."""

    first: int
    last: int
    min_ms: int
    max_ms: int
    end_from: int | None = None
    end_to: int | None = None

    def ends(self, start: int) -> tuple[int, int] | None:
        """(shortest end, longest end) allowed for a window starting at `start`; None if none."""
        lo = max(start + max(1, self.min_ms), self.end_from or 0)
        hi = start + self.max_ms if self.end_to is None else min(start + self.max_ms, self.end_to)
        return (lo, hi) if lo <= hi else None

    def opening(self) -> int:
        """The earliest start from which an allowed end can be reached: with an end range, a
        start before end_from - max_ms has none (and is no candidate), this one may."""
        if self.end_from is None:
            return self.first
        return max(self.first, self.end_from - self.max_ms)


def candidate_starts(ask: Ask, change_ends: Iterable[int]) -> Iterator[int]:
    """The instants worth trying, ascending: the range's opening and every change in range.
    `change_ends` (booking and maintenance ends) must ascend; it is read only as far as the
    walk goes (see `in_chunks`)."""
    opening = ask.opening()
    if opening > ask.last:
        return
    yield opening
    previous = opening
    for t in change_ends:
        if t > ask.last:
            return
        if t > previous:
            previous = t
            yield t


def in_chunks(read: Between, first: int, last: int, step: int) -> Iterator[int]:
    """read(lo, hi) over [first, last], a day at first and twice as long each time: a walk that
    stops early (a window found at the range's start) reads only the start of the range."""
    lo, step = first, max(1, step)
    while lo <= last:
        hi = min(last, lo + step - 1)
        yield from read(lo, hi)
        lo, step = hi + 1, step * 2


def longest_end(lo: int, hi: int, change_starts: Between, start: int, fits: Fits) -> int:
    """The latest end in [lo, hi] at which [start, end) fits, knowing [start, lo) fits.
    `change_starts(a, b)` gives the booking and maintenance starts in [a, b], ascending."""
    if hi == lo:
        return lo
    inner = [t for t in change_starts(lo + 1, hi - 1) if lo < t < hi]
    ends = [*dict.fromkeys(inner), hi]  # ascending; fitting ones form a prefix (see the top)
    best, low, high = lo, 0, len(ends) - 1
    while low <= high:
        mid = (low + high) // 2
        if fits(Window(start, ends[mid])):
            best, low = ends[mid], mid + 1
        else:
            high = mid - 1
    return best


def _between(instants: Sequence[int]) -> Between:
    """A sorted list of instants as a reader of those in [a, b]."""
    return lambda a, b: instants[bisect_left(instants, a) : bisect_right(instants, b)]


def windows(
    ask: Ask,
    change_ends: Iterable[int],
    change_starts: Sequence[int] | Between,
    fits: Fits,
    *,
    limit: int,
    maybe: Fits | None = None,
    reach: Callable[[int, int], int | None] | None = None,
) -> list[Window]:
    """Up to `limit` fitting windows, earliest start first, each the longest allowed at its start.

    `change_ends` ascends and is read only as far as the walk goes; `change_starts` may be
    given as a reader of the starts in [a, b], called only when a window's end must be searched.
    `maybe`, if given, is a cheaper test that never says no to a window `fits` accepts; a window
    it refuses is not planned. `reach(start, cap)`, if given, bounds from above the end of any
    window from `start` that fits (at most cap): the planner first tries the latest candidate
    end within it, and one plan usually settles the window."""
    starts = change_starts if callable(change_starts) else _between(change_starts)
    found: list[Window] = []
    for start in candidate_starts(ask, change_ends):
        span = ask.ends(start)
        if span is None:
            continue
        lo, hi = span
        shortest = Window(start, lo)
        if maybe is not None and not maybe(shortest):
            continue
        bound = reach(start, hi) if reach is not None and hi > lo else None
        if bound is not None:
            hi = max(lo, min(hi, bound))  # no longer window fits
            if hi > lo and fits(Window(start, hi)):
                found.append(Window(start, hi))  # one plan settles it
                if len(found) >= limit:
                    break
                continue
        if not fits(shortest):
            continue
        found.append(Window(start, longest_end(lo, hi, starts, start, fits)))
        if len(found) >= limit:
            break
    return found
