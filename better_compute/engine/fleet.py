"""One pool held in memory between requests: nodes, maintenance and bookings (issue 8, replay).

A long-running command (`simulate`) places thousands of requests; reading the pool's candidates
and snapshots from SQL for each one costs far more than planning them. This index answers the
same two questions storage answers (`repo.fit_candidates` and `repo.snapshots`) from memory, for
any window that starts at or after its `horizon`: bookings that end by then are dropped, since no
such window can overlap them. Keeping it equal to the ledger is the service's business
(service/fleet.py); this module only holds values.

Candidates come out lazily in engine/shortlist.best_key order. A node with no booking and no
maintenance left ("plain") has nothing booked in any window, so its key depends only on its GPU
count: plain nodes wait in buckets by (GPUs, healthy GPUs, models), sorted by name, and only the
few booked nodes are counted per request. Nodes whose models the request does not accept are
left out: the planner would refuse every one of them, so they could never change which plans win
(shortlist.settled only stops earlier).
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from better_compute.engine.scorers import TOPOLOGY_MAX, fill
from better_compute.model import Maintenance, Node, NodeSnapshot, Request, Window

#: One booked GPU: (start, end, atom, reservation, spot, reservation live).
Booked = tuple[int, int, int, str, bool, bool]
#: The key shortlist.best_key gives a candidate, and the candidate's name.
Keyed = tuple[tuple[int, str], str]


class BookingRow(NamedTuple):
    """One row of `bookings`, with whether its reservation is live (placed, binding, active)."""

    reservation_id: str
    node_id: str
    atom: int
    start: int
    end: int
    spot: bool
    live: bool


@dataclass
class _Static:
    """What never changes while the inventory does not: derived once per node."""

    node: Node
    gpus: int
    healthy: frozenset[int]
    models: frozenset[str]  # casefolded
    usable: bool  # schedulable and reachable: the only nodes storage would list as candidates

    @property
    def bucket(self) -> tuple[int, int, frozenset[str]]:
        return (self.gpus, len(self.healthy), self.models)


@dataclass
class PoolIndex:
    """The pool's nodes, maintenance and bookings that end after `horizon`."""

    horizon: int
    nodes: dict[str, _Static] = field(default_factory=dict)
    maintenance: dict[str, list[Maintenance]] = field(default_factory=dict)
    booked: dict[str, list[Booked]] = field(default_factory=dict)
    by_rsv: dict[str, list[tuple[str, Booked]]] = field(default_factory=dict)
    #: Plain usable nodes by (GPUs, healthy GPUs, models), each list sorted by name.
    buckets: dict[tuple[int, int, frozenset[str]], list[str]] = field(default_factory=dict)
    #: (latest end, reservation): when to look at a reservation's bookings again to drop them.
    ends: list[tuple[int, str]] = field(default_factory=list)
    _capacity: dict[tuple[tuple[str, ...], int], tuple[int, int]] = field(default_factory=dict)

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
        rows: dict[str, list[BookingRow]] = defaultdict(list)
        for row in bookings:
            rows[row.reservation_id].append(row)
        for name in sorted(index.nodes):
            if index._plain(name):
                index.buckets.setdefault(index.nodes[name].bucket, []).append(name)
        for rsv_id, booked in rows.items():
            index.set_reservation(rsv_id, booked)
        return index

    # ------------------------------------------------------------ keeping it current

    def _plain(self, name: str) -> bool:
        return self.nodes[name].usable and name not in self.booked and name not in self.maintenance

    def _touch(self, name: str, was_plain: bool) -> None:
        """Move a node into or out of its bucket when it gains its first booking or loses its
        last."""
        now_plain = self._plain(name)
        if was_plain == now_plain:
            return
        bucket = self.nodes[name].bucket
        if now_plain:
            insort(self.buckets.setdefault(bucket, []), name)
        else:
            self.buckets[bucket].remove(name)

    def set_reservation(self, rsv_id: str, rows: Sequence[BookingRow]) -> None:
        """Replace what the index holds of one reservation by its rows as they are now."""
        for name, booked in self.by_rsv.pop(rsv_id, []):
            was_plain = self._plain(name)
            held = self.booked[name]
            held.remove(booked)
            if not held:
                del self.booked[name]
            self._touch(name, was_plain)
        kept: list[tuple[str, Booked]] = []
        for row in rows:
            if row.end <= self.horizon or row.node_id not in self.nodes:
                continue
            booked = (row.start, row.end, row.atom, rsv_id, row.spot, row.live)
            was_plain = self._plain(row.node_id)
            self.booked.setdefault(row.node_id, []).append(booked)
            self._touch(row.node_id, was_plain)
            kept.append((row.node_id, booked))
        if kept:
            self.by_rsv[rsv_id] = kept
            heapq.heappush(self.ends, (max(b[1] for _, b in kept), rsv_id))

    def advance(self, horizon: int) -> None:
        """Windows start at `horizon` or later from now on: drop what ends by then."""
        if horizon <= self.horizon:
            return
        self.horizon = horizon
        while self.ends and self.ends[0][0] <= horizon:
            _, rsv_id = heapq.heappop(self.ends)
            held = self.by_rsv.get(rsv_id)
            if held is not None and max(b[1] for _, b in held) <= horizon:
                self.set_reservation(rsv_id, ())
        over = [n for n, ms in self.maintenance.items() if all(m.window.end <= horizon for m in ms)]
        for name in over:
            del self.maintenance[name]
            self._touch(name, False)

    # ------------------------------------------------------------ answering

    def covers(self, window: Window) -> bool:
        """Whether this index can answer for the window (it starts at or after the horizon)."""
        return window.start >= self.horizon

    def _busy(self, name: str, window: Window, ignore: str | None) -> set[int]:
        return {
            b[2]
            for b in self.booked.get(name, ())
            if b[0] < window.end and b[1] > window.start and b[3] != ignore
        }

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
        (shortlist.best_key, name), most promising first."""
        window, whole = request.window, request.node_lease
        need = request.gpus or 0
        least = max(need, 1)
        accepted = {m.casefold() for m in request.models} if request.models else None
        streams: list[Iterable[Keyed]] = []
        for (gpus, healthy, models), names in self.buckets.items():
            share = gpus if whole else need
            if not names or gpus < least or healthy < share:
                continue
            if accepted is not None and not models <= accepted:
                continue
            key = -(fill(share, gpus) + TOPOLOGY_MAX)
            streams.append(_keyed(key, names))
        odd: list[Keyed] = []
        for name in set(self.booked) | set(self.maintenance):
            static = self.nodes[name]
            if not static.usable or static.gpus < least:
                continue
            if accepted is not None and not static.models <= accepted:
                continue
            if self._blocked(name, window) is not None:
                continue
            busy = self._busy(name, window, ignore)
            share = static.gpus if whole else need
            if len(static.healthy - busy) < share:
                continue
            key = -(fill(len(busy) + share, static.gpus) + TOPOLOGY_MAX)
            odd.append(((key, name), name))
        odd.sort()
        streams.append(odd)
        return heapq.merge(*streams)

    def snapshots(
        self, window: Window, ignore: str | None, names: Sequence[str] | None = None
    ) -> list[NodeSnapshot]:
        """repo.snapshots for these nodes (every node of the pool when None), by name."""
        chosen = sorted(self.nodes) if names is None else sorted(names)
        result = []
        for name in chosen:
            held = [
                b
                for b in self.booked.get(name, ())
                if b[0] < window.end and b[1] > window.start and b[3] != ignore
            ]
            regular = {b[2] for b in held if not (b[4] and b[5])}
            holders: dict[int, set[str]] = defaultdict(set)
            for b in held:
                if b[4] and b[5]:
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

    def capacity(self, models: Sequence[str], share: int) -> tuple[int, int]:
        """repo.node_capacity: (most GPUs of the accepted models on one node, nodes with at
        least `share` of them), whatever the nodes' state. Models are compared as stored
        (lowercased), as the SQL compares them."""
        key = (tuple(models), share)
        if key not in self._capacity:
            accepted = set(models)
            counts = [
                sum(1 for a in s.node.atoms if not accepted or a.model in accepted)
                for s in self.nodes.values()
            ]
            self._capacity[key] = (max(counts, default=0), sum(1 for c in counts if c >= share))
        return self._capacity[key]


def _keyed(key: int, names: Sequence[str]) -> Iterator[Keyed]:
    """A bucket's nodes as candidates: one key for all, in name order."""
    for name in names:
        yield (key, name), name
