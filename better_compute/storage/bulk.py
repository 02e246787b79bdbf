"""Bulk inventory writes: the nodes an import adds, and their GPUs, in a few multi-row INSERTs
(Ledger.insert_rows: sqlite-utils on SQLite, pipelined executemany on PostgreSQL) instead of a
statement per node and per GPU. Nodes that exist already are updated one by one (repo.move_node):
their live bookings must be checked node by node anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

from better_compute.model import Atom
from better_compute.storage.conn import Conn, Ledger
from better_compute.storage.repo import _labels_json as labels_json  # one JSON form of labels

#: A node to add: its name, labels and GPUs.
NewNode = tuple[str, Sequence[tuple[str, str]], Sequence[Atom]]

NODE_COLUMNS = ("name", "pool_id", "labels")
ATOM_COLUMNS = ("node_id", "idx", "model", "nvlink_group", "fabric_cluster", "fabric_clique")

#: Names per `IN (…)` list: under every SQLite build's bound-parameter limit (999).
_NAMES_PER_QUERY = 500


def node_pools(conn: Conn, names: Sequence[str]) -> dict[str, str]:
    """The pool of each of these nodes that exists already; a name not in the answer is new."""
    found: dict[str, str] = {}
    for first in range(0, len(names), _NAMES_PER_QUERY):
        chunk = list(names[first : first + _NAMES_PER_QUERY])
        rows = conn.execute(
            f"SELECT name, pool_id FROM nodes WHERE name IN ({','.join('?' * len(chunk))})", chunk
        )
        found.update((str(name), str(pool_id)) for name, pool_id in rows)
    return found


def same_but_case(conn: Conn, names: Sequence[str]) -> dict[str, str]:
    """The nodes whose names equal one of `names` apart from case, but not exactly: new name ->
    the existing node's. Node names are hosts, which resolve without regard to case. Reads every
    node name once (no index folds case); called only for names that are new."""
    if not names:
        return {}
    wanted = {name.lower(): name for name in names}
    found: dict[str, str] = {}
    for (existing,) in conn.execute("SELECT name FROM nodes"):
        new = wanted.get(str(existing).lower())
        if new is not None and new != existing:
            found[new] = str(existing)
    return found


def insert_nodes(db: Ledger, pool_id: str, nodes: Sequence[NewNode]) -> None:
    """Add these nodes (none of which exists) to the pool, with their GPUs, inside the caller's
    write transaction on `db`."""
    if not nodes:
        return
    db.insert_rows(
        "nodes", NODE_COLUMNS, [(name, pool_id, labels_json(labels)) for name, labels, _ in nodes]
    )
    db.insert_rows(
        "atoms",
        ATOM_COLUMNS,
        [
            (name, a.index, a.model, a.nvlink_group, a.fabric_cluster, a.fabric_clique)
            for name, _, atoms in nodes
            for a in atoms
        ],
    )
