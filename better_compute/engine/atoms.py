"""Which free atoms to take on one node (PRODUCT.md §5.1 step 2, §5.5).

Callers run the filters first; these functions only choose among atoms that are known to suffice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from better_compute.model import NVLINK_ALL, Atom, Node, NodeSnapshot, Request


def needed(request: Request, node: Node) -> int:
    """Atoms one node's share takes: a node lease takes the whole node."""
    if request.node_lease:
        return len(node.atoms)
    if request.gpus is None:
        raise ValueError("request.gpus is required unless the request is a node lease")
    return request.gpus


def spot_held(snap: NodeSnapshot) -> dict[int, tuple[str, ...]]:
    """Busy atoms held only by live spot reservations -> their holders' ids (sorted)."""
    return {index: tuple(sorted(ids)) for index, ids in snap.spot_holders if index in snap.busy}


def free_atoms(snap: NodeSnapshot, *, free_spot: bool = False) -> tuple[Atom, ...]:
    """Healthy atoms not booked in the window (spot-held ones too with free_spot), by index."""
    freed = spot_held(snap) if free_spot else {}
    return tuple(
        atom
        for atom in sorted(snap.node.atoms, key=lambda a: a.index)
        if atom.healthy and (atom.index not in snap.busy or atom.index in freed)
    )


def by_group(atoms: Iterable[Atom]) -> dict[int, list[int]]:
    """NVLink group -> atom indices, ascending."""
    groups: dict[int, list[int]] = {}
    for atom in sorted(atoms, key=lambda a: (a.nvlink_group, a.index)):
        groups.setdefault(atom.nvlink_group, []).append(atom.index)
    return groups


def victims_of(snap: NodeSnapshot, taken: Iterable[int]) -> tuple[str, ...]:
    """Spot reservations that must give up their bookings for `taken`, sorted."""
    held = spot_held(snap)
    return tuple(sorted({rid for index in taken for rid in held.get(index, ())}))


def pick_atoms(request: Request, snap: NodeSnapshot, *, free_spot: bool = False) -> tuple[int, ...]:
    """The atoms to take, ascending; () when none suffice (the filters should have said so)."""
    node = snap.node
    if request.node_lease:
        return tuple(sorted(atom.index for atom in node.atoms))
    n = needed(request, node)
    whole = request.topology == NVLINK_ALL
    taken = _pick_free(by_group(free_atoms(snap)), n, whole_group=whole)
    if taken is None and free_spot:
        taken = _pick_with_spot(snap, n, whole_group=whole)
    return tuple(sorted(taken)) if taken is not None else ()


def _pick_free(
    groups: Mapping[int, Sequence[int]], n: int, *, whole_group: bool
) -> list[int] | None:
    """Best-fit one NVLink group; otherwise (unless whole_group) fill the fullest groups first."""
    fitting = [g for g in sorted(groups) if len(groups[g]) >= n]
    if fitting:
        best = min(fitting, key=lambda g: (len(groups[g]), g))
        return list(groups[best][:n])
    if whole_group:
        return None
    taken: list[int] = []
    for g in sorted(groups, key=lambda g: (-len(groups[g]), g)):
        taken.extend(groups[g][: n - len(taken)])
        if len(taken) == n:
            return taken
    return None


def _pick_with_spot(snap: NodeSnapshot, n: int, *, whole_group: bool) -> list[int] | None:
    """Truly free atoms first, then spot-held atoms of as few holders as possible.

    Keeping NVLink groups whole yields to fewer victims here: a victim costs someone their job.
    """
    truly = {a.index for a in free_atoms(snap)}
    held = spot_held(snap)
    spots = {a.index for a in free_atoms(snap, free_spot=True)} - truly
    atoms = {a.index: a for a in snap.node.atoms}
    if not whole_group:
        return _cover(sorted(truly), {i: held[i] for i in sorted(spots)}, n)
    options: list[tuple[int, int, int, list[int]]] = []
    for g in sorted({atoms[i].nvlink_group for i in truly | spots}):
        g_truly = sorted(i for i in truly if atoms[i].nvlink_group == g)
        g_spots = {i: held[i] for i in sorted(spots) if atoms[i].nvlink_group == g}
        taken = _cover(g_truly, g_spots, n)
        if taken is not None:
            victims = {rid for i in taken for rid in held.get(i, ())}
            options.append((len(victims), len(g_truly) + len(g_spots), g, taken))
    return min(options, key=lambda o: o[:3])[3] if options else None


def _cover(truly: list[int], spots: Mapping[int, tuple[str, ...]], n: int) -> list[int] | None:
    """Greedy set cover: free next the holder that frees the most atoms (tie by id) until n fit.

    Counting atoms actually freed, not merely held, matters when several spot reservations share
    an atom over the window: freeing one of them alone frees nothing there.
    """
    taken = truly[:n]
    need = n - len(taken)
    holders = sorted({rid for ids in spots.values() for rid in ids})
    chosen: set[str] = set()
    freed: list[int] = []
    while len(freed) < need:
        gains = {
            rid: [i for i in sorted(spots) if i not in freed and set(spots[i]) <= chosen | {rid}]
            for rid in holders
            if rid not in chosen
        }
        if not gains:
            return None
        best = min(gains, key=lambda rid: (-len(gains[rid]), rid))
        chosen.add(best)
        freed += gains[best]
    return taken + freed[:need]
