"""Integer scores for one node's share; higher is better (PRODUCT.md §5.1 step 3).

Bin-packing dominates (×10 over a 0..1000 fill ratio) so partly booked nodes fill up first and whole
nodes stay free for gangs; the topology term (0..9) only separates nodes of equal fill.
"""

from __future__ import annotations

from collections.abc import Sequence

from better_compute.engine.atoms import spot_held
from better_compute.model import NodeSnapshot


def busy_count(snap: NodeSnapshot, *, free_spot: bool = False) -> int:
    """Atoms of the node booked in the window; with free_spot, spot-held atoms count as free."""
    freed = spot_held(snap) if free_spot else {}
    indices = {a.index for a in snap.node.atoms}
    return sum(1 for i in sorted(snap.busy) if i in indices and i not in freed)


def fill(held: int, total: int) -> int:
    """0..10000 in steps of 10: how full a node of `total` GPUs is with `held` of them booked."""
    if total == 0:
        return 0
    return 10 * (held * 1000 // total)


def packing(snap: NodeSnapshot, taken: Sequence[int], *, free_spot: bool = False) -> int:
    """0..10000: how full the node is once `taken` is booked."""
    return fill(busy_count(snap, free_spot=free_spot) + len(taken), len(snap.node.atoms))


#: The most the topology term adds: packing (steps of 10) always outweighs it.
TOPOLOGY_MAX = 9


def topology(snap: NodeSnapshot, taken: Sequence[int]) -> int:
    """9 when the taken atoms share one NVLink group, one less per extra group spanned, floor 0."""
    group = {a.index: a.nvlink_group for a in snap.node.atoms}
    spanned = len({group[i] for i in taken if i in group})
    return max(0, TOPOLOGY_MAX + 1 - max(1, spanned))


def score(snap: NodeSnapshot, taken: Sequence[int], *, free_spot: bool = False) -> int:
    return packing(snap, taken, free_spot=free_spot) + topology(snap, taken)
