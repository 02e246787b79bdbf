"""What tick reads to check the work that is due, narrowed to the rows it needs (issue 8).

Kept apart from repo.py: a tick runs at every due instant of a replay, so each of its reads must
cost what its answer costs, not what the pool holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from better_compute.model import Maintenance, Window
from better_compute.storage.repo import Conn


def maintenance_on(conn: Conn, nodes: Sequence[str], window: Window) -> list[Maintenance]:
    """The maintenance windows of these nodes that overlap `window`, by node and start, as
    repo.maintenance_overlapping lists them for a whole pool: one index seek per node
    (maintenance_node) instead of a probe for every node of the pool."""
    found: list[Maintenance] = []
    for name in sorted(nodes):
        rows = conn.execute(
            'SELECT id, node_id, start, "end", reason FROM maintenance'
            ' WHERE node_id = ? AND "end" > ? AND start < ? ORDER BY start',
            (name, window.start, window.end),
        )
        found.extend(
            Maintenance(int(i), str(n), Window(int(s), int(e)), r) for i, n, s, e, r in rows
        )
    return found
