"""Which nodes to plan, best first, and when planning more cannot change the outcome (issue 8).

Storage names the nodes that could possibly take one node's share (schedulable, reachable, out of
maintenance, enough healthy GPUs free in the window) with how many of their GPUs the window
books. Every node the full planner finds fitting is among them, so planning all of them finds
every fit (gangs need that). For a single node only the best topN plans matter: a candidate's
packing term is exact from those counts (scorers.fill) and its topology term is at most
TOPOLOGY_MAX, so `best_key` bounds the rank it could reach. Planning candidates in order of that
bound (then name, the planner's own tie-break) and stopping once the topN plans found so far all
rank before the next candidate's bound gives exactly the full planner's best topN.

Before any of that, `perfect` lets placement read the pool in name order, a few nodes at a time,
without asking every node's bookings: no plan scores above MAX_SCORE (the node full once the share
is booked, every taken GPU in one NVLink group), and plans of equal score rank by name. Once
`enough` plans score MAX_SCORE, no node later in name order can rank before any of them, so they
are the full planner's best `enough`. Packing drives nodes towards full, so such a node is seldom
far away; when none is near, the bound order above takes over.

A gang (engine/gang.py) offers each topology group's best `size` fitting nodes, ranked by their
summed score, then group name. A group's best gang can sum no more than its `size` best member
bounds (`gang_bounds`), and within a group the member bound order above settles its best `size`
exactly. So groups are planned in order of that bound, each only until its best `size` are
known, and planning stops once topN gangs found rank before the next group's bound
(`keys_settled`): exactly the full planner's best topN. When no group makes a gang, the reason
names the most nodes any group fits: groups are then planned in full, largest first, until no
group left has more candidates than that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from better_compute.engine.scorers import TOPOLOGY_MAX, fill
from better_compute.model import NodePlan, Request


@dataclass(frozen=True)
class Candidate:
    """A node that might fit: `busy` of its `gpus` GPUs are booked in the window."""

    name: str
    busy: int
    gpus: int


def share(request: Request, gpus: int) -> int:
    """The GPUs one node's share takes on a node of `gpus` (a node lease takes them all)."""
    if request.node_lease:
        return gpus
    if request.gpus is None:
        raise ValueError("request.gpus is required unless the request is a node lease")
    return request.gpus


#: The best score any single-node plan can have (scorers.score): full after booking, one group.
MAX_SCORE = fill(1, 1) + TOPOLOGY_MAX


def perfect(plans: Sequence[NodePlan], enough: int) -> bool:
    """Whether `enough` of the plans of the first nodes in name order score MAX_SCORE: then those
    are the best `enough` of the whole pool, whatever its later nodes hold."""
    return sum(1 for p in plans if p.score >= MAX_SCORE) >= enough


def could_be_perfect(request: Request, gpus: int, healthy: int, busy: int) -> bool:
    """Whether a node of `gpus` GPUs, `healthy` of them healthy and `busy` booked in the window,
    could hold a MAX_SCORE plan: only if the share leaves it exactly full (scorers.fill) and it
    has that many healthy GPUs. Name-order reading plans no other node."""
    if gpus == 0:
        return False
    need = share(request, gpus)
    return busy + need == gpus and healthy >= need


def best_score(request: Request, c: Candidate) -> int:
    """The best score a plan on this node could have: its packing term is exact from the counts
    (scorers.fill), its topology term at most TOPOLOGY_MAX."""
    return fill(c.busy + share(request, c.gpus), c.gpus) + TOPOLOGY_MAX


def best_key(request: Request, c: Candidate) -> tuple[int, str]:
    """The best ranking key (-score, node) a plan on this node could have: rank_single's order."""
    return (-best_score(request, c), c.name)


def ordered(request: Request, candidates: Sequence[Candidate]) -> list[tuple[tuple[int, str], str]]:
    """(best key, name) of every candidate, most promising first."""
    return sorted((best_key(request, c), c.name) for c in candidates)


def settled(plans: Sequence[NodePlan], enough: int, next_best: tuple[int, str] | None) -> bool:
    """Whether the best `enough` of `plans` are the best `enough` overall: no candidate left
    (next_best None), or the `enough`-th best plan ranks before any plan the next could make."""
    return keys_settled([(-p.score, p.node_id) for p in plans], enough, next_best)


def keys_settled(
    keys: Sequence[tuple[int, str]], enough: int, next_best: tuple[int, str] | None
) -> bool:
    """settled, for ranking keys (-score, name) already made: of plans, or of gangs by group."""
    if next_best is None:
        return True
    ranked = sorted(keys)
    return len(ranked) >= enough and ranked[enough - 1] < next_best


def gang_bounds(
    request: Request, groups: Mapping[str, Sequence[Candidate]], size: int
) -> list[tuple[tuple[int, str], str]]:
    """(best key a gang of the group could have, group) of every group with at least `size`
    candidates, most promising first: rank_gangs' key (-summed score, group), each member at
    its best_score."""
    bounds = []
    for value, members in groups.items():
        if len(members) >= size:
            best = sorted((best_score(request, c) for c in members), reverse=True)[:size]
            bounds.append(((-sum(best), value), value))
    return sorted(bounds)


def gang_key(plans: Sequence[NodePlan], size: int, group: str) -> tuple[int, str] | None:
    """rank_gangs' key (-summed score, group) of the gang of a group's best `size` plans, when
    they are the group's best (None: too few fit)."""
    if len(plans) < size:
        return None
    return (-sum(sorted((p.score for p in plans), reverse=True)[:size]), group)
