"""One pool held in memory between requests: nodes, maintenance and bookings (issue 8, replay).

A long-running command (`simulate`) places thousands of requests; reading the pool's candidates
and snapshots from SQL for each one costs far more than planning them. This index answers the
same two questions storage answers (`repo.fit_candidates` and `repo.snapshots`) from memory, for
any window that starts at or after its `horizon`: bookings that end by then are dropped, since no
such window can overlap them. Keeping it equal to the ledger is the service's business
(service/fleet.py); this module only holds values.

Candidates come out lazily in engine/shortlist.best_key order, and a node is counted by itself
only when its count for the window is not already known:

- Each node keeps its bookings sorted by start. With the pool's longest booking as a bound, the
  bookings that can overlap a window [s, e) are those that start in [s - longest, e): a bisect
  and a short slice, not the node's whole future.
- The pool keeps, per hour of start ("slot"), which nodes have a booking starting then. So the
  nodes whose count a window might change are found from the few slots the window reaches, not
  by walking the pool.
- For a window that opens at the horizon, a node's count is its *current* bookings (begun by the
  horizon) plus those that begin before the window ends. Nodes wait in buckets by their current
  (GPUs, healthy GPUs free, GPUs booked, models), sorted by name: every node with no booking
  starting before the window ends shares its bucket's key. For a later window (a calendar
  start), the buckets are of nodes with nothing booked: every node with no booking starting in
  [s - longest, e) has the whole node free.
- The other nodes ("touched": a booking starts in the window's slots, maintenance, or the
  reservation being replanned holds GPUs there) are not counted up front: each enters the merge
  with the best key any plan on a node of its size could have (the node full once the share is
  booked) and is counted only when that bound reaches the head of the merge. Packing drives
  nodes towards full, so the first few counted usually settle the shortlist.

Nodes whose models the request does not accept are left out: the planner would refuse every one
of them, so they could never change which plans win (shortlist.settled only stops earlier).

A request that keeps waiting is retried every 30 s; `no_fit` and `nothing_to_preempt` remember
what a retry found and plan again only what changed since (see there).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from better_compute.engine.filters import refusal
from better_compute.engine.fit import plan_node
from better_compute.engine.place import no_node_fits
from better_compute.engine.scorers import TOPOLOGY_MAX, fill
from better_compute.model import (
    Atom,
    Maintenance,
    Node,
    NodeSnapshot,
    NoFit,
    Request,
    Window,
    frees,
)

#: One booked GPU: (start, end, atom, reservation, spot flag (model.frees), reservation live).
Booked = tuple[int, int, int, str, int, bool]
#: The key shortlist.best_key gives a candidate, and the candidate's name.
Keyed = tuple[tuple[int, str], str]
#: Later than any instant: an answer that no booking will ever change.
MAX = 2**63 - 1
#: Remembered answers kept per pool at most (one per pending request, each up to one refusal
#: per node): all are dropped past it, so memory stays bounded however many requests wait.
MEMO_KEYS = 256


class BookingRow(NamedTuple):
    """One row of `bookings`, with whether its reservation is live (placed, binding, active)."""

    reservation_id: str
    node_id: str
    atom: int
    start: int
    end: int
    spot: int  # model.REGULAR, SPOT or UNDER_NOTICE
    live: bool


@dataclass
class _Static:
    """What never changes while the inventory does not: derived once per node."""

    node: Node
    gpus: int
    healthy: frozenset[int]
    models: frozenset[str]  # casefolded
    usable: bool  # schedulable and reachable: the only nodes storage would list as candidates


#: A bucket: (GPUs, healthy GPUs free, GPUs booked, models). At the horizon, of nodes by their
#: current bookings (begun by then); for later windows, of nodes with nothing booked.
Bucket = tuple[int, int, int, frozenset[str]]
#: Bookings are filed by the hour they start in: a window looks at the few hours it reaches.
SLOT = 3_600_000


@dataclass
class PoolIndex:
    """The pool's nodes, maintenance and bookings that end after `horizon`.

    Every usable node is either in a bucket by its current bookings (no maintenance left) or
    odd (maintenance ahead), and every usable node without maintenance also sits in `blank`,
    the buckets of nodes with nothing booked. Which bucket answers for a node, and which nodes
    are counted one by one, depends on the window (`candidates`)."""

    horizon: int
    nodes: dict[str, _Static] = field(default_factory=dict)
    maintenance: dict[str, list[Maintenance]] = field(default_factory=dict)
    #: Each node's bookings, sorted (so by start).
    booked: dict[str, list[Booked]] = field(default_factory=dict)
    by_rsv: dict[str, list[tuple[str, Booked]]] = field(default_factory=dict)
    #: Nodes by their current bucket, each list sorted by name; and which bucket each node is in.
    buckets: dict[Bucket, list[str]] = field(default_factory=dict)
    bucket_of: dict[str, Bucket] = field(default_factory=dict)
    #: Usable nodes by the bucket they would be in with nothing booked, sorted by name.
    blank: dict[Bucket, list[str]] = field(default_factory=dict)
    odd: set[str] = field(default_factory=set)
    #: Per slot (start // SLOT): (start, node) of every booking starting in it, sorted, so the
    #: nodes with a booking starting in any part of a slot are a bisection away.
    slots: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    #: The longest booking ever held (never lowered): no booking that starts before
    #: s - longest can overlap a window that opens at s.
    longest: int = 0
    #: (an end, reservation): when to look at a reservation's bookings again to drop those over.
    ends: list[tuple[int, str]] = field(default_factory=list)
    #: (start, node) of bookings that begin after the horizon: when the node changes bucket.
    starts: list[tuple[int, str]] = field(default_factory=list)
    _capacity: dict[tuple[tuple[str, ...], int], tuple[int, int]] = field(default_factory=dict)
    _topology: dict[tuple[str, tuple[str, ...], int], dict[str, str | None]] = field(
        default_factory=dict
    )
    _nvlink: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: Bumped whenever a booking is added, removed or changed (not when one merely ends):
    #: for the whole pool, and per node. Remembered answers compare them.
    generation: int = 0
    node_gen: dict[str, int] = field(default_factory=dict)
    #: Per pending request: each node's refusal, as of (node generation, window starts it holds
    #: for). See no_fit.
    _refusals: dict[object, dict[str, tuple[str, int, int, int]]] = field(default_factory=dict)
    #: Per request: (pool generation, window starts) for which nothing was found to preempt.
    _nothing: dict[object, tuple[int, int, int]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        horizon: int,
        nodes: Iterable[Node],
        maintenance: Iterable[Maintenance],
        bookings: Iterable[BookingRow],
    ) -> PoolIndex:
        index = cls(horizon)
        for node in nodes:
            index.nodes[node.name] = _Static(
                node,
                len(node.atoms),
                frozenset(a.index for a in node.atoms if a.healthy),
                frozenset(a.model.casefold() for a in node.atoms),
                node.schedulable and node.reachable,
            )
        for m in maintenance:
            if m.window.end > horizon and m.node_id in index.nodes:
                index.maintenance.setdefault(m.node_id, []).append(m)
        index._hold_all(bookings)
        for name in sorted(index.nodes):
            static = index.nodes[name]
            if static.usable:
                key = (static.gpus, len(static.healthy), 0, static.models)
                index.blank.setdefault(key, []).append(name)
            index._place(name)
        return index

    # ------------------------------------------------------------ keeping it current

    def _bucket(self, name: str) -> Bucket | None:
        """The node's bucket by its current bookings, or None when it is odd."""
        static = self.nodes[name]
        if name in self.maintenance:
            return None
        busy = set()
        for b in self.booked.get(name, ()):
            if b[0] > self.horizon:
                break  # sorted by start: the rest begin later
            if b[1] > self.horizon:  # one over waits to be dropped with its reservation's others
                busy.add(b[2])
        free = len(static.healthy - busy)
        return (static.gpus, free, len(busy), static.models)

    def _place(self, name: str) -> None:
        """File a node (anew) in its bucket or among the odd ones."""
        if not self.nodes[name].usable:
            return
        old = self.bucket_of.pop(name, None)
        if old is not None:
            self.buckets[old].remove(name)
        self.odd.discard(name)
        new = self._bucket(name)
        if new is None:
            self.odd.add(name)
        else:
            insort(self.buckets.setdefault(new, []), name)
            self.bucket_of[name] = new

    def _file(self, name: str, start: int, step: int) -> None:
        """File a booking of the node starting at `start` into its slot (step 1) or out (-1)."""
        slot = start // SLOT
        if step > 0:
            insort(self.slots.setdefault(slot, []), (start, name))
            return
        filed = self.slots[slot]
        filed.pop(bisect_left(filed, (start, name)))
        if not filed:
            del self.slots[slot]

    def _hold(self, rsv_id: str, rows: Sequence[BookingRow]) -> set[str]:
        """Replace the reservation's bookings; returns the nodes whose bookings changed."""
        changed = set()
        before = self.by_rsv.pop(rsv_id, [])
        for name, booked in before:
            held = self.booked[name]
            held.remove(booked)
            if not held:
                del self.booked[name]
            self._file(name, booked[0], -1)
            changed.add(name)
        kept: list[tuple[str, Booked]] = []
        for row in rows:
            if row.end <= self.horizon or row.node_id not in self.nodes:
                continue
            booked = (row.start, row.end, row.atom, rsv_id, row.spot, row.live)
            insort(self.booked.setdefault(row.node_id, []), booked)
            self._file(row.node_id, row.start, 1)
            self.longest = max(self.longest, row.end - row.start)
            kept.append((row.node_id, booked))
            changed.add(row.node_id)
            if row.start > self.horizon:
                heapq.heappush(self.starts, (row.start, row.node_id))
        if kept:
            self.by_rsv[rsv_id] = kept
            for end in {b[1] for _, b in kept}:  # each end: a cut-back member may end first
                heapq.heappush(self.ends, (end, rsv_id))
        if sorted(before) != sorted(kept):
            self.generation += 1
            for name in {n for n, _ in before} | {n for n, _ in kept}:
                self.node_gen[name] = self.node_gen.get(name, 0) + 1
        return changed

    def _hold_all(self, rows: Iterable[BookingRow]) -> None:
        """_hold of every reservation's rows, on an index that holds none yet: each list is
        sorted once and each heap made once, where _hold inserts row by row (a ledger with a
        month ahead holds some 150,000 bookings). The same structures as _hold would build
        (tests/test_fleet_memory.py compares them)."""
        booked: dict[str, list[Booked]] = defaultdict(list)
        slots: dict[int, list[tuple[int, str]]] = defaultdict(list)
        by_rsv: dict[str, list[tuple[str, Booked]]] = defaultdict(list)
        ends: set[tuple[int, str]] = set()
        for row in rows:
            if row.end <= self.horizon or row.node_id not in self.nodes:
                continue
            held = (row.start, row.end, row.atom, row.reservation_id, row.spot, row.live)
            booked[row.node_id].append(held)
            slots[row.start // SLOT].append((row.start, row.node_id))
            by_rsv[row.reservation_id].append((row.node_id, held))
            self.longest = max(self.longest, row.end - row.start)
            ends.add((row.end, row.reservation_id))
            if row.start > self.horizon:
                self.starts.append((row.start, row.node_id))
        for table in (booked, slots):
            for filed in table.values():
                filed.sort()
        self.booked.update(booked)
        self.slots.update(slots)
        self.by_rsv.update(by_rsv)
        self.ends.extend(ends)
        heapq.heapify(self.ends)
        heapq.heapify(self.starts)
        # _hold bumps the generations once per reservation, and each of its nodes once.
        self.generation += len(by_rsv)
        for kept in by_rsv.values():
            for name in {n for n, _ in kept}:
                self.node_gen[name] = self.node_gen.get(name, 0) + 1

    def set_reservation(self, rsv_id: str, rows: Sequence[BookingRow]) -> None:
        """Replace what the index holds of one reservation by its rows as they are now."""
        for name in self._hold(rsv_id, rows):
            self._place(name)

    def advance(self, horizon: int) -> None:
        """Windows start at `horizon` or later from now on: drop what ends by then, and file
        again the nodes whose bookings began or ended."""
        if horizon <= self.horizon:
            return
        self.horizon = horizon
        moved: set[str] = set()
        while self.ends and self.ends[0][0] <= horizon:
            _, rsv_id = heapq.heappop(self.ends)
            held = self.by_rsv.get(rsv_id)
            if held is not None and any(b[1] <= horizon for _, b in held):
                rest = [BookingRow(rsv_id, n, b[2], b[0], b[1], b[4], b[5]) for n, b in held]
                moved |= self._hold(rsv_id, rest)  # keeps those that end after the horizon
        while self.starts and self.starts[0][0] <= horizon:
            moved.add(heapq.heappop(self.starts)[1])
        over = [n for n, ms in self.maintenance.items() if all(m.window.end <= horizon for m in ms)]
        for name in over:
            del self.maintenance[name]
            moved.add(name)
        for name in moved:
            self._place(name)

    # ------------------------------------------------------------ answering

    def covers(self, window: Window) -> bool:
        """Whether this index can answer for the window (it starts at or after the horizon)."""
        return window.start >= self.horizon

    def _overlapping(self, name: str, window: Window) -> list[Booked]:
        """The node's bookings that overlap the window: only those that start in
        [start - longest, end) can, found by bisection."""
        held = self.booked.get(name)
        if not held:
            return []
        lo = bisect_left(held, (window.start - self.longest,))
        hi = bisect_left(held, (window.end,), lo)
        return [b for b in held[lo:hi] if b[1] > window.start]

    def _busy(self, name: str, window: Window, ignore: str | None) -> set[int]:
        return {b[2] for b in self._overlapping(name, window) if b[3] != ignore}

    def _starting(self, lo: int, hi: int) -> set[str]:
        """Every node with a booking that starts in [lo, hi). The hours wholly inside the range
        are read whole; in the first and last hour only the bookings in the range are read (a
        bisection): a replay arrives many times an hour, and every node booked earlier in the
        current hour would otherwise be looked at for each request."""
        first, last = lo // SLOT, (hi - 1) // SLOT
        found: set[str] = set()
        if last - first + 1 > len(self.slots):  # a very long range: read the slots there are
            for slot, filed in self.slots.items():
                if first < slot < last:
                    found.update(name for _, name in filed)
        else:
            for slot in range(first + 1, last):
                found.update(name for _, name in self.slots.get(slot, ()))
        for slot in {first, last}:
            filed = self.slots.get(slot, [])
            i = bisect_left(filed, (lo,))
            j = bisect_left(filed, (hi,), i)
            found.update(name for _, name in filed[i:j])
        return found

    def _blocked(self, name: str, window: Window) -> str | None:
        """The reason of the node's last overlapping maintenance by start, as repo.snapshots
        words it (maintenance is held in its query's order)."""
        reason = None
        for m in self.maintenance.get(name, ()):
            if m.window.end > window.start and m.window.start < window.end:
                reason = m.reason or "maintenance"
        return reason

    def candidates(self, request: Request, ignore: str | None) -> Iterator[Keyed]:
        """repo.fit_candidates' nodes, less those whose models the request refuses, as
        (shortlist.best_key, name), most promising first.

        Untouched nodes come from buckets, one key per bucket; touched nodes (module docstring)
        are counted when their best possible key reaches the head (_merge)."""
        window, whole = request.window, request.node_lease
        need = request.gpus or 0
        least = max(need, 1)
        accepted = _accepting(request)
        skip = {name for name, _ in self.by_rsv.get(ignore, ())} if ignore is not None else set()
        if window.start == self.horizon:  # current bookings all overlap the window
            families = self.buckets
            touched = self._starting(self.horizon + 1, window.end)
        else:  # no booking that starts before start - longest reaches the window
            families = self.blank
            touched = self._starting(window.start - self.longest, window.end)
        touched |= self.odd | skip
        streams: list[Iterator[Keyed]] = []
        for (gpus, free, busy, models), names in families.items():
            if not names or gpus < least:
                continue
            if not _takes(models, accepted):
                continue
            share = gpus if whole else need
            if free < share:
                continue
            key = -(fill(busy + share, gpus) + TOPOLOGY_MAX)
            streams.append(_keyed(key, names, touched))
        pending: dict[int, list[str]] = defaultdict(list)
        for name in touched:
            static = self.nodes[name]
            if not static.usable or static.gpus < least:
                continue
            if not _takes(static.models, accepted):
                continue
            if len(static.healthy) < (static.gpus if whole else need):
                continue
            pending[static.gpus].append(name)
        bounded = []
        for gpus, names in pending.items():
            heapq.heapify(names)
            bounded.append((-(fill(gpus, gpus) + TOPOLOGY_MAX), names))
        return _merge(streams, bounded, lambda name: self._key(name, request, ignore))

    def _key(self, name: str, request: Request, ignore: str | None) -> int | None:
        """A touched node's shortlist key for the request, counted; None when it cannot fit."""
        static, window = self.nodes[name], request.window
        if self._blocked(name, window) is not None:
            return None
        held = self._busy(name, window, ignore)
        share = static.gpus if request.node_lease else (request.gpus or 0)
        if len(static.healthy - held) < share:
            return None
        return -(fill(len(held) + share, static.gpus) + TOPOLOGY_MAX)

    def snapshots(
        self, window: Window, ignore: str | None, names: Sequence[str] | None = None
    ) -> list[NodeSnapshot]:
        """repo.snapshots for these nodes (every node of the pool when None), by name."""
        chosen = sorted(self.nodes) if names is None else sorted(names)
        result = []
        for name in chosen:
            held = [b for b in self._overlapping(name, window) if b[3] != ignore]
            regular = {b[2] for b in held if not frees(b[4], b[5], b[0], window)}
            holders: dict[int, set[str]] = defaultdict(set)
            for b in held:
                if frees(b[4], b[5], b[0], window):
                    holders[b[2]].add(b[3])
            result.append(
                NodeSnapshot(
                    node=self.nodes[name].node,
                    busy=frozenset(b[2] for b in held),
                    spot_holders=tuple(
                        sorted(
                            (atom, tuple(sorted(ids)))
                            for atom, ids in holders.items()
                            if atom not in regular
                        )
                    ),
                    blocked=self._blocked(name, window),
                )
            )
        return result

    def preemption_candidates(self, request: Request, ignore: str | None) -> list[str]:
        """The nodes, by name, that preemption's planning (engine/preempt.py) could plan the
        request's share on: usable, out of maintenance in the window, of models it accepts, and
        with the share in healthy GPUs that no booking but live spot work holds then. The
        filters refuse every other node whatever spot work is freed (free_atoms with free_spot
        leaves exactly the healthy atoms no regular booking holds), so the plans made from these
        nodes' snapshots are the plans made from all of them (service/placing's
        preemption_snapshots reads the same from SQL, less the models). In a full pool most
        nodes hold regular work, and a pending request retried every 30 s built every node's
        snapshot to find that out."""
        window, share = request.window, request.gpus or 0
        accepted = _accepting(request)
        found = []
        for name in sorted(self.nodes):
            static = self.nodes[name]
            if not static.usable or len(static.healthy) < share:
                continue
            if not _takes(static.models, accepted):
                continue
            if self._blocked(name, window) is not None:
                continue
            regular = {
                b[2]
                for b in self._overlapping(name, window)
                if b[3] != ignore and not frees(b[4], b[5], b[0], window)
            }
            if len(static.healthy - regular) >= share:
                found.append(name)
        return found

    # ------------------------------------------------------------ answers that stay true

    def _still(self, booked: Iterable[tuple[int, int]], window: Window) -> int:
        """The first window start (for windows as long as `window`, starting at or after it)
        at which one of these intervals would begin or cease to overlap: until then, every
        snapshot of them is the same."""
        length, until = window.end - window.start, MAX
        for start, end in booked:
            if start < window.end and end > window.start:
                until = min(until, end)  # overlaps until the window starts at its end
            elif start >= window.end:
                until = min(until, start - length + 1)  # overlaps once the window reaches it
        return until

    def _node_still(self, name: str, window: Window) -> int:
        spans = [(b[0], b[1]) for b in self.booked.get(name, ())]
        spans += [(m.window.start, m.window.end) for m in self.maintenance.get(name, ())]
        return self._still(spans, window)

    def _pool_still(self, window: Window) -> int:
        """_still over every booking and maintenance of the pool, reading only the bookings
        that overlap the window and the first one that starts at or after its end."""
        spans = [(m.window.start, m.window.end) for ms in self.maintenance.values() for m in ms]
        for name in self._starting(window.start - self.longest, window.end):
            spans += [(b[0], b[1]) for b in self._overlapping(name, window)]
        following = self._first_start(window.end)
        if following is not None:
            spans.append((following, following + 1))
        return self._still(spans, window)

    def _first_start(self, at: int) -> int | None:
        """The earliest start at or after `at` of any booking held, slot by slot."""
        for slot in sorted(s for s in self.slots if s >= at // SLOT):
            filed = self.slots[slot]
            i = bisect_left(filed, (at,))
            if i < len(filed):
                return filed[i][0]
        return None

    def no_fit(self, request: Request, ignore: str | None, exclude: frozenset[str]) -> NoFit | None:
        """The full planner's no-fit reason for a single-node request (every node's refusal,
        counted), or None when some node fits. A pending request is retried every 30 s: each
        node's refusal is kept and planned again only when that node's bookings changed or the
        window has moved past one of them, so a retry costs what changed, not the pool."""
        window = request.window
        key = (ignore, replace(request, window=Window(0, window.end - window.start)), exclude)
        if key not in self._refusals and len(self._refusals) >= MEMO_KEYS:
            self._refusals.clear()
        memo = self._refusals.setdefault(key, {})
        accepted = _accepting(request)
        refused = []
        for name in sorted(self.nodes):
            gen = self.node_gen.get(name, 0)
            hit = memo.get(name)
            if hit is not None and hit[1] == gen and hit[3] <= window.start < hit[2]:
                refused.append((name, hit[0]))
                continue
            static, said = self.nodes[name], None
            if name in exclude:
                said = "excluded"
            elif not static.usable or not _takes(static.models, accepted):
                said = self._refusal_by_node(request, name, window)  # its bookings unread
            if said is None:
                result = plan_node(request, self.snapshots(window, ignore, [name])[0])
                if not isinstance(result, str):
                    del self._refusals[key]  # it fits: placed now, never asked again
                    return None
                said = result
            memo[name] = (said, gen, self._node_still(name, window), window.start)
            refused.append((name, said))
        return no_node_fits(len(self.nodes), refused)

    def _refusal_by_node(self, request: Request, name: str, window: Window) -> str | None:
        """The filters' reason for a node they refuse before counting its free GPUs (in
        maintenance in the window, cordoned, unreachable, or of a model the request refuses):
        the same as from its snapshot, without reading its bookings, which those checks never
        look at. None when they would go on to count them."""
        bare = NodeSnapshot(self.nodes[name].node, frozenset(), (), self._blocked(name, window))
        return refusal(request, bare)

    def nothing_to_preempt(self, key: object, window: Window) -> bool:
        """Whether preemption planning found nothing for `key` on this very pool (no booking
        changed since) for a window that starts where this one does, as far as bookings go."""
        seen = self._nothing.get(key)
        return seen is not None and seen[0] == self.generation and seen[2] <= window.start < seen[1]

    def found_nothing_to_preempt(self, key: object, window: Window) -> None:
        if key not in self._nothing and len(self._nothing) >= MEMO_KEYS:
            self._nothing.clear()
        self._nothing[key] = (self.generation, self._pool_still(window), window.start)

    def capacity(self, models: Sequence[str], share: int) -> tuple[int, int]:
        """repo.node_capacity: (most GPUs of the accepted models on one node, nodes with at
        least `share` of them), whatever the nodes' state. Models are compared as stored
        (lowercased), as the SQL compares them."""
        key = (tuple(models), share)
        if key not in self._capacity:
            counts = [len(_accepted(s.node, models)) for s in self.nodes.values()]
            self._capacity[key] = (max(counts, default=0), sum(1 for c in counts if c >= share))
        return self._capacity[key]

    def largest_nvlink_group(self, models: Sequence[str]) -> int:
        """storage/fleet.largest_nvlink_group: the most GPUs of the accepted models in one
        NVLink group of one node, whatever its state."""
        asked = tuple(models)
        if asked not in self._nvlink:
            groups = Counter(
                (name, a.nvlink_group)
                for name, s in self.nodes.items()
                for a in _accepted(s.node, models)
            )
            self._nvlink[asked] = max(groups.values(), default=0)
        return self._nvlink[asked]

    def topology_values(self, key: str, models: Sequence[str], share: int) -> dict[str, str | None]:
        """storage/fitting.topology_values(holding=(models, share)): each node's value of `key`,
        of every node with at least `share` GPUs of the accepted models, whatever its state."""
        asked = (key, tuple(models), share)
        if asked not in self._topology:
            self._topology[asked] = {
                name: s.node.label(key)
                for name, s in self.nodes.items()
                if len(_accepted(s.node, models)) >= share
            }
        return self._topology[asked]


def _accepting(request: Request) -> set[str] | None:
    """The models the request accepts, casefolded as a node's are kept; None: any model."""
    return {m.casefold() for m in request.models} if request.models else None


def _takes(models: frozenset[str], accepted: set[str] | None) -> bool:
    """Whether a node of these models (casefolded) may take a request accepting `accepted`:
    the filters refuse a node with any GPU of a model the request does not name."""
    return accepted is None or models <= accepted


def _accepted(node: Node, models: Sequence[str]) -> list[Atom]:
    """The node's GPUs of the accepted models (all of them when none is named), whatever their
    state: what the pool could ever hold, as the SQL counts it (models as stored, lowercased)."""
    return [a for a in node.atoms if not models or a.model in models]


def _keyed(key: int, names: Sequence[str], skip: set[str]) -> Iterator[Keyed]:
    """A bucket's nodes as candidates: one key for all, in name order (less `skip`)."""
    for name in names:
        if name not in skip:
            yield (key, name), name


def _merge(
    streams: Sequence[Iterator[Keyed]],
    bounded: Sequence[tuple[int, list[str]]],
    count: Callable[[str], int | None],
) -> Iterator[Keyed]:
    """Candidates in key order: `streams` yield exact keys in order; each of `bounded` is a key
    no node of it can beat and a heap of names, counted (`count`: its exact key, or None when it
    cannot fit) only once that bound reaches the head. A node's exact key is never before its
    bound, so nothing yielded can be overtaken by a node not yet counted."""
    heap: list[tuple[tuple[int, str], int, Iterator[Keyed] | tuple[int, list[str]] | None]] = []
    for stream in streams:
        first = next(stream, None)
        if first is not None:
            heap.append((first[0], 0, stream))
    for bound, names in bounded:
        heap.append(((bound, heapq.heappop(names)), 2, (bound, names)))
    heapq.heapify(heap)
    while heap:
        keyed, kind, ref = heap[0]
        if kind == 2:  # a node known only by its bound: count it, put its next one in line
            assert isinstance(ref, tuple)
            bound, names = ref
            if names:
                heapq.heapreplace(heap, ((bound, heapq.heappop(names)), 2, ref))
            else:
                heapq.heappop(heap)
            key = count(keyed[1])
            if key is not None:
                heapq.heappush(heap, ((key, keyed[1]), 1, None))
            continue
        yield keyed, keyed[1]
        following = next(ref, None) if isinstance(ref, Iterator) else None
        if following is not None:
            heapq.heapreplace(heap, (following[0], 0, ref))
        else:
            heapq.heappop(heap)
