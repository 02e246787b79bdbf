"""The only place rows become model values and back. Every function takes an open connection.

Overlap queries are indexed SQL ("end > :from AND start < :to" on (pool_id|node_id, end, start)), so
placing a request reads only the bookings that overlap its window, never a pool's whole history.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import Any, TypeVar

from better_compute.errors import InvalidInput, NotFound, Unavailable
from better_compute.model import (
    LIVE_STATES,
    NAME_RE,
    Allocation,
    Atom,
    Binding,
    Condition,
    Event,
    JsonValue,
    Maintenance,
    Node,
    NodeSnapshot,
    Policy,
    ReleaseReason,
    Reservation,
    Settings,
    State,
    Window,
    frees,
)
from better_compute.storage import settled
from better_compute.storage.conn import Conn as Conn  # re-exported: use cases type with it
from better_compute.storage.conn import Row, json_text, plain_rows, where

T = TypeVar("T")

# ---------------------------------------------------------------- decoding stored values

#: What damaged bytes in a row can raise while it becomes a model value (bad JSON, a text where an
#: integer belongs, an unknown state): none of them is a bug of ours, all of them are damage.
_DECODE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError)


def damaged(conn: Conn, what: str, exc: BaseException) -> Unavailable:
    """UNAVAILABLE naming the file and the row that could not be read (§3: not a bug)."""
    path = where(conn)
    detail = f"{type(exc).__name__}: {exc}"[:200]
    return Unavailable(f"database {path!r} is damaged: {what} cannot be read ({detail})")


def decoded(conn: Conn, what: str, build: Callable[[], T]) -> T:
    """Run `build` (rows to model values), turning a decode error of stored data into damage."""
    try:
        return build()
    except _DECODE_ERRORS as exc:
        raise damaged(conn, what, exc) from None


def _int(value: object) -> int:
    """An INTEGER column's value; SQLite would hand back text or a blob from a damaged record."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _setting_int(value: object) -> int:
    return int(_str(value))


def _opt_int(value: object) -> int | None:
    return None if value is None else _int(value)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def _opt_str(value: object) -> str | None:
    return None if value is None else _str(value)


def _json_of(text: object, kind: type[T]) -> T:
    """A JSON column's document, which must be a `kind` (dict or list)."""
    doc = json.loads(_str(text))
    if not isinstance(doc, kind):
        raise TypeError(f"expected a JSON {kind.__name__}, got {type(doc).__name__}")
    return doc


#: The atoms column as insert_allocation writes it (json.dumps of a list of indexes).
_ATOMS_TEXT = re.compile(r"\[(?:(?:0|[1-9][0-9]*)(?:, (?:0|[1-9][0-9]*))*)?\]")


def atom_list(text: object) -> tuple[int, ...]:
    """An allocation's `atoms` column: a JSON list of GPU indexes. The usual text is split
    without the JSON parser (a listing reads thousands); anything else is parsed and checked."""
    if isinstance(text, str) and _ATOMS_TEXT.fullmatch(text):
        return tuple(map(int, text[1:-1].split(", "))) if len(text) > 2 else ()
    return tuple(_int(a) for a in _json_of(text, list))


# ---------------------------------------------------------------- ids and settings

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
#: Ten bits as two characters of _ALPHABET, the lower five first.
_ALPHABET_PAIRS = tuple(_ALPHABET[v & 31] + _ALPHABET[v >> 5] for v in range(1024))

#: json.dumps(value, sort_keys=True), without building an encoder per call (dumps does, for any
#: argument but the defaults): every event's data, tens of thousands in a replay.
_sorted_json = json.JSONEncoder(sort_keys=True).encode


def among(column: str, count: int) -> str:
    """`column IN (?, …)` for `count` values; for none, `IN (NULL)`, which nothing matches:
    `IN ()` is SQLite's alone, a syntax error on PostgreSQL (a principal that may act for no
    tenant lists nothing)."""
    return f"{column} IN ({','.join('?' * count) or 'NULL'})"


def db_id(conn: Conn) -> str:
    row = conn.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()
    if row is None:
        raise damaged(conn, "its id (meta db_id)", LookupError("no row"))
    return str(row[0])


def next_id(conn: Conn, prefix: str) -> str:
    """`rsv_…`: a per-database counter hashed with the database id, so copies replay identically.
    The token is the digest's low 60 bits, five at a time from the lowest, in _ALPHABET."""
    key = f"counter:{prefix}"
    # The database id and the counter in one read: a replay takes two ids per request.
    ledger_id, count = conn.execute(
        "SELECT (SELECT value FROM meta WHERE key = 'db_id'),"
        " (SELECT value FROM meta WHERE key = ?)",
        (key,),
    ).fetchone()
    if ledger_id is None:
        raise damaged(conn, "its id (meta db_id)", LookupError("no row"))
    n = 1 if count is None else decoded(conn, f"meta {key}", lambda: _setting_int(count)) + 1
    conn.execute(
        "INSERT INTO meta(key, value) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, str(n)),
    )
    digest = int.from_bytes(hashlib.sha256(f"{ledger_id}:{prefix}:{n}".encode()).digest()[:8])
    pairs = _ALPHABET_PAIRS  # ten bits, two characters, at a time: six lookups, not twelve
    return f"{prefix}_" + "".join([pairs[(digest >> shift) & 1023] for shift in range(0, 60, 10)])


def next_seq(conn: Conn, table: str) -> int:
    row = conn.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {table}").fetchone()
    return int(row[0])


SETTING_KEYS: dict[str, str] = {
    "capacity.spotNoticeMs": "spot_notice_ms",
    "placement.topN": "top_n",
    "placement.maxAttempts": "max_attempts",
    "pending.retryMs": "retry_ms",
    "pending.maxWaitMs": "pending_max_wait_ms",
    "repair.leadMs": "repair_lead_ms",
    "timeline.maxBuckets": "timeline_max_buckets",
    "binding.autoBind": "auto_bind",
    "db.busyTimeoutMs": "busy_timeout_ms",
    "inventory.maxBytes": "inventory_max_bytes",
    "notice.expiringMs": "notice_expiring_ms",
    "webhook.timeoutMs": "webhook_timeout_ms",
    "webhook.retryForMs": "webhook_retry_for_ms",
    "webhook.tickBudgetMs": "webhook_budget_ms",
}


def load_settings(conn: Conn) -> Settings:
    values: dict[str, int | bool] = {}
    for key, value in conn.execute("SELECT key, value FROM config ORDER BY key"):
        field_name = SETTING_KEYS.get(key)
        if field_name is None:
            continue
        if field_name == "auto_bind":
            values[field_name] = value == "true"
        else:
            values[field_name] = decoded(conn, f"setting {key}", partial(_setting_int, value))
    return Settings(**values)  # type: ignore[arg-type]


def config_value(conn: Conn, key: str) -> str | None:
    """A setting's stored text; None while it has its default (never set)."""
    row = conn.execute("SELECT value FROM config WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_config(conn: Conn, key: str, value: str) -> None:
    conn.execute(
        "INSERT INTO config(key, value) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


# ---------------------------------------------------------------- pools, nodes, atoms


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    data = _json_of(text, dict)
    return tuple(sorted((str(k), str(v)) for k, v in data.items()))


def _labels_json(labels: Iterable[tuple[str, str]]) -> str:
    return json.dumps(dict(sorted(labels)), sort_keys=True)


def insert_pool(conn: Conn, name: str, labels: Sequence[tuple[str, str]]) -> str:
    pool_id = next_id(conn, "pool")
    conn.execute(
        "INSERT INTO pools(id, name, labels, seq) VALUES (?, ?, ?, ?)",
        (pool_id, name, _labels_json(labels), next_seq(conn, "pools")),
    )
    return pool_id


def pool_rows(conn: Conn) -> list[Row]:
    return settled.kept(
        conn, "pools", lambda: list(conn.execute("SELECT * FROM pools ORDER BY name"))
    )


def find_pool(conn: Conn, ref: str | None) -> Row:
    """A pool by id or name; with no ref, the only pool there is."""
    if ref is None:
        rows = pool_rows(conn)
        if len(rows) == 1:
            return rows[0]
        if not rows:
            raise NotFound(
                "no pool exists yet; create one with `pool create` or `inventory import`"
            )
        names = ", ".join(r["name"] for r in rows)
        raise InvalidInput(f"several pools exist ({names}); choose one with --pool")
    row = conn.execute("SELECT * FROM pools WHERE id = ? OR name = ?", (ref, ref)).fetchone()
    if row is None:
        raise NotFound(f"no pool {ref!r}; `pool list` shows the pools")
    return row


def pool_name_taken(conn: Conn, name: str) -> bool:
    return conn.execute("SELECT 1 FROM pools WHERE name = ?", (name,)).fetchone() is not None


def pool_id_named(conn: Conn, name: str) -> str | None:
    """The id of the pool with this exact name (ids are not matched, unlike find_pool)."""
    row = conn.execute("SELECT id FROM pools WHERE name = ?", (name,)).fetchone()
    return None if row is None else str(row["id"])


def pool_name(conn: Conn, pool_id: str) -> str:
    """The name of a pool known to exist (a node's or a quota's pool)."""
    return str(conn.execute("SELECT name FROM pools WHERE id = ?", (pool_id,)).fetchone()[0])


def set_pool_labels(conn: Conn, pool_id: str, labels: Sequence[tuple[str, str]]) -> None:
    conn.execute("UPDATE pools SET labels = ? WHERE id = ?", (_labels_json(labels), pool_id))


def pool_auto_bind(conn: Conn, pool_id: str) -> bool | None:
    """The pool's own binding.autoBind; None means the ledger-wide setting applies."""

    def read() -> bool | None:
        row = conn.execute("SELECT auto_bind FROM pools WHERE id = ?", (pool_id,)).fetchone()
        return None if row["auto_bind"] is None else bool(row["auto_bind"])

    return settled.kept(conn, ("auto_bind", pool_id), read)


def set_pool_auto_bind(conn: Conn, pool_id: str, auto_bind: bool | None) -> None:
    value = None if auto_bind is None else int(auto_bind)
    conn.execute("UPDATE pools SET auto_bind = ? WHERE id = ?", (value, pool_id))


def pool_labels(conn: Conn, row: Row) -> tuple[tuple[str, str], ...]:
    return decoded(conn, f"the labels of pool {row['name']}", lambda: _labels(row["labels"]))


def insert_node(
    conn: Conn,
    name: str,
    pool_id: str,
    labels: Sequence[tuple[str, str]],
    atoms: Sequence[Atom],
) -> None:
    conn.execute(
        "INSERT INTO nodes(name, pool_id, labels) VALUES (?, ?, ?)",
        (name, pool_id, _labels_json(labels)),
    )
    conn.executemany(
        "INSERT INTO atoms(node_id, idx, model, nvlink_group, fabric_cluster, fabric_clique)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [
            (name, a.index, a.model, a.nvlink_group, a.fabric_cluster, a.fabric_clique)
            for a in atoms
        ],
    )


def _nodes_from_rows(conn: Conn, rows: Sequence[Row]) -> list[Node]:
    return decoded(conn, "a node or GPU row", lambda: _build_nodes(conn, rows))


def _build_nodes(conn: Conn, rows: Sequence[Row]) -> list[Node]:
    """Nodes with their GPUs. A fleet's GPUs repeat a few shapes (index, model, group, fabric,
    health) and its nodes a few label sets, and both are immutable: each distinct one is
    checked and built once and shared, so 4,000 nodes cost a few dozen objects beyond
    themselves, not 32,000 (placement of a gang, preemption and BookingRepair build them)."""
    if not rows:
        return []
    names = [r["name"] for r in rows]
    atoms: dict[str, list[Atom]] = defaultdict(list)
    shapes: dict[tuple[Any, ...], Atom] = {}
    marks = ",".join("?" * len(names))
    for node_id, *shape in conn.execute(
        "SELECT node_id, idx, model, nvlink_group, fabric_cluster, fabric_clique, healthy,"
        f" health_reason FROM atoms WHERE node_id IN ({marks}) ORDER BY node_id, idx",
        names,
    ):
        key = tuple(shape)
        atom = shapes.get(key)
        if atom is None:
            idx, model, group, cluster, clique, healthy, reason = key
            atom = shapes[key] = Atom(
                index=_int(idx),
                model=_str(model),
                nvlink_group=_int(group),
                fabric_cluster=_opt_str(cluster),
                fabric_clique=_opt_int(clique),
                healthy=bool(healthy),
                health_reason=reason,
            )
        atoms[node_id].append(atom)
    label_sets: dict[object, tuple[tuple[str, str], ...]] = {}
    nodes = []
    for r in rows:
        text = r["labels"]
        labels = label_sets.get(text)
        if labels is None:
            labels = label_sets[text] = _labels(text)
        nodes.append(
            Node(
                name=_str(r["name"]),
                pool_id=_str(r["pool_id"]),
                atoms=tuple(atoms[r["name"]]),
                labels=labels,
                schedulable=bool(r["schedulable"]),
                reachable=bool(r["reachable"]),
                cordon_reason=r["cordon_reason"],
            )
        )
    return nodes


def load_nodes(conn: Conn, pool_id: str | None = None) -> list[Node]:
    if pool_id is None:
        rows = list(conn.execute("SELECT * FROM nodes ORDER BY name"))
    else:
        rows = list(conn.execute("SELECT * FROM nodes WHERE pool_id = ? ORDER BY name", (pool_id,)))
    return _nodes_from_rows(conn, rows)


def get_node(conn: Conn, name: str) -> Node:
    row = conn.execute("SELECT * FROM nodes WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise NotFound(
            f"no node {name!r}{_spelt_otherwise(conn, name)}; `node list` shows the nodes"
        )
    return _nodes_from_rows(conn, [row])[0]


def _spelt_otherwise(conn: Conn, name: str) -> str:
    """A node whose name differs only in case (a node agent's `$(hostname)` in capitals): named
    exactly is how every command takes it, so say which. Read only on the way to NOT_FOUND."""
    row = conn.execute(
        "SELECT name FROM nodes WHERE lower(name) = lower(?) ORDER BY name LIMIT 1", (name,)
    ).fetchone()
    return "" if row is None else f" (names match exactly: did you mean {str(row[0])!r}?)"


def update_node(conn: Conn, name: str, **columns: object) -> None:
    sets = ", ".join(f"{k} = ?" for k in columns)
    conn.execute(f"UPDATE nodes SET {sets} WHERE name = ?", (*columns.values(), name))


def node_pool_id(conn: Conn, name: str) -> str | None:
    """The pool a node belongs to; None when there is no such node."""
    row = conn.execute("SELECT pool_id FROM nodes WHERE name = ?", (name,)).fetchone()
    return None if row is None else str(row["pool_id"])


def move_node(
    conn: Conn, name: str, pool_id: str, labels: Sequence[tuple[str, str]], atoms: Sequence[Atom]
) -> None:
    """An inventory upsert of an existing node: its pool, its labels, and exactly `atoms`.

    GPUs past the new count go; the others are updated in place, keeping their health.
    """
    conn.execute(
        "UPDATE nodes SET pool_id = ?, labels = ? WHERE name = ?",
        (pool_id, _labels_json(labels), name),
    )
    conn.execute("DELETE FROM atoms WHERE node_id = ? AND idx >= ?", (name, len(atoms)))
    for atom in atoms:
        conn.execute(
            "INSERT INTO atoms(node_id, idx, model, nvlink_group, fabric_cluster, fabric_clique)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(node_id, idx) DO UPDATE SET"
            " model = excluded.model,"
            " nvlink_group = excluded.nvlink_group, fabric_cluster = excluded.fabric_cluster,"
            " fabric_clique = excluded.fabric_clique",
            (
                name,
                atom.index,
                atom.model,
                atom.nvlink_group,
                atom.fabric_cluster,
                atom.fabric_clique,
            ),
        )


def largest_node_size(conn: Conn, pool_id: str) -> int:
    """GPUs on the pool's largest node (0 without nodes): a node lease's charge until placed."""
    row = conn.execute(
        "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM atoms a JOIN nodes d"
        " ON d.name = a.node_id WHERE d.pool_id = ? GROUP BY a.node_id) AS sizes",
        (pool_id,),
    ).fetchone()
    return int(row[0])


def first_model(conn: Conn, node: str) -> str:
    """The model of a node's lowest GPU: it names the meter its usage is counted on."""

    def read() -> str:
        row = conn.execute(
            "SELECT model FROM atoms WHERE node_id = ? ORDER BY idx LIMIT 1", (node,)
        ).fetchone()
        return str(row[0])

    return settled.kept(conn, ("first_model", node), read)


def set_node_labels(conn: Conn, name: str, labels: Sequence[tuple[str, str]]) -> None:
    conn.execute("UPDATE nodes SET labels = ? WHERE name = ?", (_labels_json(labels), name))


def node_capacity(conn: Conn, pool_id: str, models: Sequence[str], share: int) -> tuple[int, int]:
    """(the most GPUs of the accepted models any node of the pool has, how many nodes have at
    least `share` of them), whatever the nodes' or the GPUs' state: what the pool could ever
    hold. All GPUs count when no model is given. Counted in SQL: no per-node rows."""
    sql = "SELECT COUNT(a.idx) AS c FROM nodes n LEFT JOIN atoms a ON a.node_id = n.name"
    args: list[object] = []
    if models:
        sql += f" AND a.model IN ({','.join('?' * len(models))})"
        args.extend(models)
    sql += " WHERE n.pool_id = ? GROUP BY n.name"
    row = conn.execute(
        f"SELECT COALESCE(MAX(c), 0), COUNT(CASE WHEN c >= ? THEN 1 END) FROM ({sql}) AS counts",
        [share, *args, pool_id],
    ).fetchone()
    return int(row[0]), int(row[1])


#: The live reservations with an allocation on node `?` (given twice), as `r`: read from the
#: node's own bookings (a live allocation books each of its GPUs, so none is missed), a node's
#: history of about 1,400 rows on the benchmark's big pool, instead of every live reservation of
#: the fleet through the state index (72,000 rows: 0.15 s a node, which an inventory import
#: relabelling nodes paid for each, 10 minutes for the whole fleet). CROSS JOIN keeps SQLite in
#: that order.
_LIVE_ON_NODE = (
    " FROM (SELECT DISTINCT reservation_id AS id FROM bookings WHERE node_id = ?) AS held"
    " CROSS JOIN reservations r JOIN allocations a ON a.reservation_id = r.id"
    " WHERE r.id = held.id AND a.node_id = ? AND a.released = 0"
    " AND r.state IN ('placed', 'binding', 'active') AND r.state <> 'released'"
)


def live_gang_keys(conn: Conn, node: str) -> list[tuple[str, str]]:
    """(reservation, topology key) of every live gang with a member on `node`, oldest first."""
    rows = conn.execute(
        "SELECT DISTINCT r.id, r.topology_key, r.seq"
        f"{_LIVE_ON_NODE} AND r.topology_key IS NOT NULL ORDER BY r.seq",
        (node, node),
    )
    return [(str(r["id"]), str(r["topology_key"])) for r in rows]


def live_lease_on(conn: Conn, node: str) -> str | None:
    """The live node lease (placed, binding or active) holding `node` whole, if any."""
    row = conn.execute(
        f"SELECT r.id{_LIVE_ON_NODE} AND r.binding = 'node' ORDER BY r.seq LIMIT 1", (node, node)
    ).fetchone()
    return None if row is None else str(row[0])


def set_atom_health(conn: Conn, node: str, index: int, healthy: bool, reason: str | None) -> None:
    conn.execute(
        "UPDATE atoms SET healthy = ?, health_reason = ? WHERE node_id = ? AND idx = ?",
        (int(healthy), reason, node, index),
    )


def insert_maintenance(conn: Conn, node: str, window: Window, reason: str | None) -> int:
    row = conn.execute(
        'INSERT INTO maintenance(node_id, start, "end", reason) VALUES (?, ?, ?, ?) RETURNING id',
        (node, window.start, window.end, reason),
    ).fetchone()
    return int(row[0])


def maintenance_overlapping(conn: Conn, pool_id: str, window: Window) -> list[Maintenance]:
    rows = conn.execute(
        "SELECT m.* FROM maintenance m JOIN nodes n ON n.name = m.node_id"
        ' WHERE n.pool_id = ? AND m."end" > ? AND m.start < ? ORDER BY m.node_id, m.start',
        (pool_id, window.start, window.end),
    )
    return [_maintenance(r) for r in rows]


def _maintenance(r: Row) -> Maintenance:
    return Maintenance(r["id"], r["node_id"], Window(r["start"], r["end"]), r["reason"])


def maintenance_for_node(conn: Conn, node: str, since: int) -> list[Maintenance]:
    rows = conn.execute(
        'SELECT * FROM maintenance WHERE node_id = ? AND "end" > ? ORDER BY start', (node, since)
    )
    return [_maintenance(r) for r in rows]


def maintenance_covering(conn: Conn, now: int, node: str | None = None) -> dict[str, Maintenance]:
    """The maintenance window each node (or only `node`) is in at `now`: of overlapping ones,
    the last to end, so node list and node show name the same one."""
    sql = 'SELECT * FROM maintenance WHERE start <= ? AND "end" > ?'
    args: list[object] = [now, now]
    if node is not None:
        sql += " AND node_id = ?"
        args.append(node)
    return {r["node_id"]: _maintenance(r) for r in conn.execute(sql + ' ORDER BY "end", id', args)}


def delete_maintenance(conn: Conn, node: str) -> int:
    return conn.execute("DELETE FROM maintenance WHERE node_id = ?", (node,)).rowcount


# ---------------------------------------------------------------- snapshots for the engine


def longest_booking(conn: Conn, pool_id: str) -> int:
    """An upper bound on the length of any booking of the pool (0 without bookings): an overlap
    query adds "end < :to + longest" so its index range stops where no overlap can lie."""
    row = conn.execute(
        "SELECT longest FROM booking_bounds WHERE pool_id = ?", (pool_id,)
    ).fetchone()
    return 0 if row is None else max(0, int(row[0]))


def longest_booking_anywhere(conn: Conn) -> int:
    """longest_booking over every pool: for checks on a node's bookings whatever their pool."""
    row = conn.execute("SELECT MAX(longest) FROM booking_bounds").fetchone()
    return 0 if row[0] is None else max(0, int(row[0]))


def load_nodes_named(conn: Conn, names: Sequence[str]) -> list[Node]:
    """These nodes (by name order), as load_nodes builds them."""
    rows: list[Row] = []
    for chunk_start in range(0, len(names), 500):
        chunk = list(names[chunk_start : chunk_start + 500])
        marks = ",".join("?" * len(chunk))
        rows.extend(conn.execute(f"SELECT * FROM nodes WHERE name IN ({marks})", chunk))
    rows.sort(key=lambda r: r["name"])
    return _nodes_from_rows(conn, rows)


FIT_CANDIDATES_SQL = """
WITH held AS (
  SELECT DISTINCT b.node_id, b.atom FROM bookings b
  WHERE b.pool_id = :pool AND b."end" > :from AND b."end" < :bound AND b.start < :to
    AND b.reservation_id IS DISTINCT FROM :ignore
), busy AS (
  SELECT h.node_id, COUNT(*) AS busy, COUNT(CASE WHEN a.healthy != 0 THEN 1 END) AS busy_healthy
  FROM held h JOIN atoms a ON a.node_id = h.node_id AND a.idx = h.atom
  GROUP BY h.node_id
), sizes AS (
  SELECT a.node_id, COUNT(*) AS gpus, COUNT(CASE WHEN a.healthy != 0 THEN 1 END) AS healthy
  FROM nodes n JOIN atoms a ON a.node_id = n.name
  WHERE n.pool_id = :pool AND n.schedulable != 0 AND n.reachable != 0
  GROUP BY a.node_id
)
SELECT s.node_id, COALESCE(busy.busy, 0), s.gpus FROM sizes s
LEFT JOIN busy ON busy.node_id = s.node_id
WHERE s.healthy - COALESCE(busy.busy_healthy, 0) >= CASE WHEN :whole != 0 THEN s.gpus ELSE :need END
  AND s.gpus >= :least
  AND NOT EXISTS (SELECT 1 FROM maintenance m
                  WHERE m.node_id = s.node_id AND m."end" > :from AND m.start < :to)
-- engine/shortlist.best_key: the fullest a share would leave the node (scorers.fill), then name
ORDER BY 10 * ((COALESCE(busy.busy, 0) + CASE WHEN :whole != 0 THEN s.gpus ELSE :need END) * 1000
               / s.gpus) DESC, s.node_id
"""


def fit_candidates(
    conn: Conn,
    pool_id: str,
    window: Window,
    *,
    ignore_reservation: str | None,
    need: int,
    whole_node: bool,
) -> list[tuple[str, int, int]]:
    """(node, GPUs booked in the window, GPUs) of every node of the pool that might take a share:
    schedulable, reachable, out of maintenance, with at least `need` healthy GPUs free in the
    window (`whole_node`: every GPU healthy and free, and at least max(need, 1) of them). A
    superset of the nodes the planner finds fitting: models and NVLink groups are its business.
    Most promising first, in engine/shortlist.best_key's order (sorted by SQLite, so no
    candidate becomes a Python object before it is planned). One aggregate query.

    Placement asks storage/fitting.fit_candidates, which sizes nodes from their own rows; this
    plain form, from the GPU rows, is what the tests hold it to."""
    params = window_params(conn, pool_id, window, ignore_reservation)
    params.update(need=need, whole=int(whole_node), least=max(need, 1))
    rows = conn.execute(FIT_CANDIDATES_SQL, params)
    return [(str(n), int(b), int(g)) for n, b, g in rows]


def window_params(
    conn: Conn, pool_id: str, window: Window, ignore_reservation: str | None
) -> dict[str, object]:
    """The named parameters of the queries that count a pool's bookings in a window: the pool,
    the window, the bound on the ends that can overlap it (its end + the longest booking), and
    the reservation whose own bookings do not count."""
    return {
        "pool": pool_id,
        "from": window.start,
        "to": window.end,
        "bound": window.end + longest_booking(conn, pool_id),
        "ignore": ignore_reservation,
    }


#: A booking's spot flag as planning reads it (joined with its reservation `r`): model.REGULAR,
#: SPOT, or UNDER_NOTICE for a spot reservation given a preemption deadline (model.frees). Not
#: its state: a long-running command's fleet (service/fleet.py) re-reads a reservation's
#: bookings on the events that change them, and starting changes none.
PREEMPTIBLE = "CASE WHEN b.spot = 0 THEN 0 WHEN r.preempt_deadline IS NULL THEN 1 ELSE 2 END"


def snapshots(
    conn: Conn,
    pool_id: str,
    window: Window,
    *,
    ignore_reservation: str | None = None,
    nodes: Sequence[Node] | None = None,
    names: Sequence[str] | None = None,
) -> list[NodeSnapshot]:
    """The pool's nodes (only those `names`, if given) as the engine needs them for one window:
    only overlapping bookings load. For `names`, `+b.pool_id` keeps SQLite on the nodes' index
    rather than walking the pool's window for a handful of nodes."""
    if nodes is not None:
        pool_nodes = list(nodes)
    elif names is not None:
        pool_nodes = load_nodes_named(conn, names)
    else:
        pool_nodes = load_nodes(conn, pool_id)
    busy: dict[str, set[int]] = defaultdict(set)
    regular: dict[str, set[int]] = defaultdict(set)
    holders: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    bound = window.end + longest_booking(conn, pool_id)
    if names is None:
        rows = list(
            conn.execute(
                f"SELECT b.node_id, b.atom, b.reservation_id, {PREEMPTIBLE}, r.state, b.start"
                " FROM bookings b"
                " JOIN reservations r ON r.id = b.reservation_id"
                ' WHERE b.pool_id = ? AND b."end" > ? AND b."end" < ? AND b.start < ?'
                " AND b.reservation_id IS DISTINCT FROM ?",
                (pool_id, window.start, bound, window.end, ignore_reservation),
            )
        )
    else:
        rows = []
        for chunk_start in range(0, len(names), 500):
            chunk = list(names[chunk_start : chunk_start + 500])
            rows.extend(
                conn.execute(
                    f"SELECT b.node_id, b.atom, b.reservation_id, {PREEMPTIBLE}, r.state, b.start"
                    " FROM bookings b"
                    " JOIN reservations r ON r.id = b.reservation_id"
                    f" WHERE b.node_id IN ({','.join('?' * len(chunk))})"
                    # `|| ''` keeps the planner on the node index (bookings_node_window)
                    " AND b.pool_id || '' = ?"
                    ' AND b."end" > ? AND b."end" < ? AND b.start < ?'
                    " AND b.reservation_id IS DISTINCT FROM ?",
                    (*chunk, pool_id, window.start, bound, window.end, ignore_reservation),
                )
            )
    for node_id, atom, rsv_id, spot, state, start in rows:
        busy[node_id].add(atom)
        if frees(int(spot), state in LIVE_STATES, int(start), window):
            holders[node_id][atom].add(rsv_id)
        else:
            regular[node_id].add(atom)
    blocked = {
        m.node_id: m.reason or "maintenance" for m in maintenance_overlapping(conn, pool_id, window)
    }
    result = []
    for node in pool_nodes:
        # Per node, not a pass over every holder for every node (quadratic on a large pool).
        spot_only = sorted(
            (atom, tuple(sorted(ids)))
            for atom, ids in holders.get(node.name, {}).items()
            if atom not in regular[node.name]
        )
        result.append(
            NodeSnapshot(
                node=node,
                busy=frozenset(busy[node.name]),
                spot_holders=tuple(spot_only),
                blocked=blocked.get(node.name),
            )
        )
    return result


# ---------------------------------------------------------------- tenants, quotas, policies


def tenant_exists(conn: Conn, tenant: str) -> bool:
    def read() -> bool:
        return conn.execute("SELECT 1 FROM tenants WHERE id = ?", (tenant,)).fetchone() is not None

    return settled.kept(conn, ("tenant", tenant), read)


def require_tenant(conn: Conn, tenant: str) -> None:
    if not tenant_exists(conn, tenant):
        # The command to type only for an id `tenant create` takes: one line, nothing to escape.
        hint = f"create it with `tenant create {tenant}`" if NAME_RE.fullmatch(tenant) else ""
        raise NotFound(f"no tenant {tenant!r}; {hint or '`tenant list` shows the tenants'}")


def insert_tenant(conn: Conn, tenant: str) -> None:
    conn.execute("INSERT INTO tenants(id, seq) VALUES (?, ?)", (tenant, next_seq(conn, "tenants")))


def tenant_ids(conn: Conn) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT id FROM tenants ORDER BY id")]


def set_quota(conn: Conn, tenant: str, pool_id: str, gpus: int) -> None:
    conn.execute(
        "INSERT INTO quotas(tenant_id, pool_id, gpus) VALUES (?, ?, ?)"
        " ON CONFLICT (tenant_id, pool_id) DO UPDATE SET gpus = excluded.gpus",
        (tenant, pool_id, gpus),
    )


def quotas(conn: Conn, tenant: str) -> list[tuple[str, int]]:
    """(pool_id or '' for everywhere, cap) pairs."""
    rows = conn.execute(
        "SELECT pool_id, gpus FROM quotas WHERE tenant_id = ? ORDER BY pool_id", (tenant,)
    )
    return [(str(p), int(g)) for p, g in rows]


def quota_caps(conn: Conn, tenant: str, pool_id: str) -> list[tuple[str, int]]:
    """The caps that bind a request in one pool: that pool's and the tenant-wide one ('')."""

    def read() -> list[tuple[str, int]]:
        rows = conn.execute(
            "SELECT pool_id, gpus FROM quotas WHERE tenant_id = ? AND pool_id IN ('', ?)"
            " ORDER BY pool_id",
            (tenant, pool_id),
        )
        return [(str(p), int(g)) for p, g in rows]

    return settled.kept(conn, ("quota_caps", tenant, pool_id), read)


def held_charge(conn: Conn, tenant: str, pool_id: str) -> int:
    """GPUs a tenant holds now: every reservation not released; pool_id '' means every pool."""
    sql = "SELECT COALESCE(SUM(quota_charge), 0) FROM reservations"
    sql += " WHERE tenant_id = ? AND state != 'released'"
    args: list[object] = [tenant]
    if pool_id:
        sql += " AND pool_id = ?"
        args.append(pool_id)
    return int(conn.execute(sql, args).fetchone()[0])


def set_policy(conn: Conn, policy: Policy) -> None:
    conn.execute(
        "INSERT INTO policies(tenant_id, principal, max_gpus, spot_only, deny)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant_id, principal) DO UPDATE SET"
        " max_gpus = excluded.max_gpus, spot_only = excluded.spot_only, deny = excluded.deny",
        (
            policy.tenant_id,
            policy.principal,
            policy.max_gpus,
            int(policy.spot_only),
            int(policy.deny),
        ),
    )


def policies(conn: Conn, tenant: str | None) -> list[Policy]:
    """Every principal's policy (in one tenant, if given), by tenant then principal."""
    sql, args = "SELECT * FROM policies", []  # type: str, list[object]
    if tenant is not None:
        sql += " WHERE tenant_id = ?"
        args.append(tenant)
    rows = conn.execute(sql + " ORDER BY tenant_id, principal", args)
    return [
        Policy(r["tenant_id"], r["principal"], r["max_gpus"], bool(r["spot_only"]), bool(r["deny"]))
        for r in rows
    ]


def delete_policy(conn: Conn, tenant: str, principal: str) -> bool:
    """True when there was such a policy."""
    cur = conn.execute(
        "DELETE FROM policies WHERE tenant_id = ? AND principal = ?", (tenant, principal)
    )
    return cur.rowcount > 0


# ---------------------------------------------------------------- reservations


def _conditions(text: str) -> tuple[Condition, ...]:
    if text == "[]":  # most rows: skip the JSON parser (issue 8: list of thousands)
        return ()
    return tuple(
        Condition(_str(c["type"]), _str(c["reason"]), _str(c["message"]))
        for c in _json_of(text, list)
    )


def conditions_json(conditions: Sequence[Condition]) -> str:
    if not conditions:
        return "[]"  # json.dumps([]): most saves carry no condition
    return json.dumps(
        [{"type": c.type, "reason": c.reason, "message": c.message} for c in conditions]
    )


#: A reservation row's columns by the type SQLite must hand back (the optional ones may be NULL).
_RSV_INTS = ("seq", "duration_ms", "quota_charge", "created_at")
_RSV_OPT_INTS = (
    "gpus",
    "gang_size",
    "start",
    "during_start",
    "during_end",
    "next_attempt_at",
    "preempt_deadline",
)
_RSV_STRS = ("id", "tenant_id", "pool_id", "principal")
_RSV_OPT_STRS = ("topology", "topology_key", "idempotency_key", "series_id", "preempted_by")


def _check_reservation_types(row: Row) -> None:
    """Every typed column of a reservation row, checked in one pass (a listing reads thousands):
    a wrong type raises what _int or _str raises."""
    for name in _RSV_INTS:
        if type(row[name]) is not int:
            _int(row[name])
    for name in _RSV_OPT_INTS:
        value = row[name]
        if value is not None and type(value) is not int:
            _int(value)
    for name in _RSV_STRS:
        if type(row[name]) is not str:
            _str(row[name])
    for name in _RSV_OPT_STRS:
        value = row[name]
        if value is not None and type(value) is not str:
            _str(value)


def _reservation(row: Row, allocations: tuple[Allocation, ...]) -> Reservation:
    """A reservation row as a model value; every column is type-checked (see `decoded`).

    The row is read by name some sixty times, so first into a dict: sqlite3.Row finds a name
    by comparing it with each column's in turn (about 0.2 µs a lookup on these 31 columns;
    the dict takes 2 µs to build and 0.03 µs a lookup)."""
    row = dict(zip(row.keys(), row, strict=True))
    _check_reservation_types(row)
    start = row["during_start"]
    return Reservation(
        id=row["id"],
        seq=row["seq"],
        tenant_id=row["tenant_id"],
        pool_id=row["pool_id"],
        state=State(row["state"]),
        gpus=row["gpus"],
        models=()
        if row["models"] == "[]"
        else tuple(_str(m) for m in _json_of(row["models"], list)),
        topology=row["topology"],
        gang_size=row["gang_size"],
        topology_key=row["topology_key"],
        spot=bool(row["spot"]),
        binding=Binding(row["binding"]),
        duration_ms=row["duration_ms"],
        start=row["start"],
        during=None if start is None else Window(start, _int(row["during_end"])),
        conditions=_conditions(row["conditions"]),
        quota_charge=row["quota_charge"],
        idempotency_key=row["idempotency_key"],
        release_reason=ReleaseReason(row["release_reason"]) if row["release_reason"] else None,
        created_at=row["created_at"],
        next_attempt_at=row["next_attempt_at"],
        principal=row["principal"],
        series_id=row["series_id"],
        lead_checked=bool(row["lead_checked"]),
        start_checked=bool(row["start_checked"]),
        preempt_deadline=row["preempt_deadline"],
        preempted_by=row["preempted_by"],
        allocations=allocations,
        name=_opt_str(row["name"]),
        labels=() if row["labels"] == "{}" else _labels(row["labels"]),
    )


def allocations_of(conn: Conn, reservation_ids: Sequence[str]) -> dict[str, tuple[Allocation, ...]]:
    result: dict[str, list[Allocation]] = defaultdict(list)
    for chunk_start in range(0, len(reservation_ids), 500):
        chunk = list(reservation_ids[chunk_start : chunk_start + 500])
        marks = ",".join("?" * len(chunk))
        for r in conn.execute(
            f"SELECT * FROM allocations WHERE reservation_id IN ({marks}) AND released = 0"
            " ORDER BY reservation_id, node_id, id",
            chunk,
        ):
            try:  # no per-row closure or message: a listing reads thousands (issue 8)
                result[r["reservation_id"]].append(_allocation(r))
            except _DECODE_ERRORS as exc:
                raise damaged(conn, f"allocation {r['id']}", exc) from None
    return {k: tuple(v) for k, v in result.items()}


def _allocation(r: Row) -> Allocation:
    return Allocation(
        id=_str(r["id"]),
        reservation_id=_str(r["reservation_id"]),
        node_id=_str(r["node_id"]),
        atoms=atom_list(r["atoms"]),
        bound=bool(r["bound"]),
    )


def with_allocations(conn: Conn, rows: Sequence[Row]) -> list[Reservation]:
    """Reservation rows (SELECT *) as model values, each with its allocations not released."""
    allocs = allocations_of(conn, [r["id"] for r in rows])
    out = []
    for r in rows:
        try:  # as decoded() does, without a closure and a message per row
            out.append(_reservation(r, allocs.get(r["id"], ())))
        except _DECODE_ERRORS as exc:
            raise damaged(conn, f"reservation {r['id']}", exc) from None
    return out


def get_reservation(conn: Conn, rsv_id: str) -> Reservation:
    row = conn.execute("SELECT * FROM reservations WHERE id = ?", (rsv_id,)).fetchone()
    if row is None:
        raise NotFound(f"no reservation {rsv_id!r}; `list` shows the reservations")
    return with_allocations(conn, [row])[0]


def reservation_by_key(conn: Conn, tenant: str, key: str) -> tuple[Reservation, str] | None:
    row = conn.execute(
        "SELECT * FROM reservations WHERE tenant_id = ? AND idempotency_key = ?", (tenant, key)
    ).fetchone()
    if row is None:
        return None
    params = decoded(conn, f"the request of {row['id']}", lambda: _json_of(row["params"], dict))
    return with_allocations(conn, [row])[0], json.dumps(params, sort_keys=True)


def reservations_where(
    conn: Conn, where: str = "1 = 1", args: Sequence[object] = ()
) -> list[Reservation]:
    rows = list(conn.execute(f"SELECT * FROM reservations WHERE {where} ORDER BY seq", args))
    return with_allocations(conn, rows)


def reservations_in(conn: Conn, state: State) -> list[Reservation]:
    return reservations_where(conn, f"state = ?{live_only(state.value)}", (state.value,))


def live_only(*states: str) -> str:
    """` AND state <> 'released'` when no state asked for is released, else nothing: the
    state index holds live rows only (migration 12), and SQLite uses a partial index only
    when the query says its WHERE in so many words."""
    return "" if "released" in states else " AND state <> 'released'"


def per_live_state(select: str, glue: str = " UNION ALL ") -> str:
    """`select` once per live state, its `{live}` naming that state, joined by `glue`: what
    `select` with `state IN ('placed', 'binding', 'active')` answers, for the statements a
    replay runs at every instant (simulation.next_due, tickwork.due_first). SQLite builds a
    table of an IN list of three constants at every run of the statement; `state = ?` is one
    seek of the index's section for that state."""
    return glue.join(
        select.format(live=f"state = '{state.value}' AND state <> 'released'")
        for state in LIVE_STATES
    )


def reservations_ending(conn: Conn, at: int) -> list[Reservation]:
    """Live reservations whose window or preemption deadline has come by `at`."""
    return reservations_where(
        conn,
        # `state <> 'released'` on each side: the partial indexes of what is due (migration 11)
        "state IN ('placed', 'binding', 'active') AND ((state <> 'released' AND during_end <= ?)"
        " OR (state <> 'released' AND preempt_deadline <= ?))",
        (at, at),
    )


def pending_created_by(conn: Conn, at: int) -> list[Reservation]:
    """Pending reservations created at or before `at` (those that may have waited too long)."""
    return reservations_where(
        conn, "state = 'pending' AND state <> 'released' AND created_at <= ?", (at,)
    )


def pending_due(conn: Conn, at: int) -> list[Reservation]:
    """Pending reservations whose next placement attempt is due by `at`."""
    return reservations_where(
        conn, "state = 'pending' AND state <> 'released' AND next_attempt_at <= ?", (at,)
    )


def placed_starting_by(conn: Conn, at: int) -> list[Reservation]:
    """Placed reservations whose window starts at or before `at`."""
    return reservations_where(
        conn, "state = 'placed' AND state <> 'released' AND during_start <= ?", (at,)
    )


def placed_on_node_during(conn: Conn, node: str, window: Window) -> list[Reservation]:
    """Placed reservations holding an allocation on `node` whose window overlaps `window`."""
    return reservations_where(
        conn,
        "state = 'placed' AND state <> 'released' AND during_end > ? AND during_start < ? AND id IN"
        " (SELECT reservation_id FROM allocations WHERE node_id = ? AND released = 0)",
        (window.start, window.end, node),
    )


def started_on_node_during(conn: Conn, node: str, window: Window, now: int) -> list[str]:
    """Ids of binding or active reservations holding an allocation on `node` that still run
    after `now` and inside `window` (to their end, or a preemption deadline before it): they run
    where they are (BookingRepair moves only what has not begun). One whose end or deadline has
    come is over, though no tick has released it yet (lifecycle/tick.ended_at)."""
    since = max(window.start, now)
    rows = conn.execute(
        "SELECT id FROM reservations WHERE state IN ('binding', 'active') AND state <> 'released'"
        " AND during_end > ? AND (preempt_deadline IS NULL OR preempt_deadline > ?)"
        " AND during_start < ? AND id IN"
        " (SELECT reservation_id FROM allocations WHERE node_id = ? AND released = 0)"
        " ORDER BY seq",
        (since, since, window.end, node),
    )
    return [str(r[0]) for r in rows]


def tenant_of(conn: Conn, rsv_id: str) -> str | None:
    """The tenant of a reservation; None when there is no such reservation."""
    row = conn.execute("SELECT tenant_id FROM reservations WHERE id = ?", (rsv_id,)).fetchone()
    return None if row is None else str(row[0])


def insert_reservation(conn: Conn, rsv: Reservation, params: str) -> None:
    """One INSERT with every column, mutable ones as save_reservation writes them (an INSERT
    and then an UPDATE ran the index and quota-summary triggers twice for the same row)."""
    conn.execute(
        "INSERT INTO reservations(id, seq, tenant_id, pool_id, principal, state, gpus, models,"
        " topology, gang_size, topology_key, spot, binding, duration_ms, start, conditions,"
        " quota_charge, idempotency_key, params, created_at, series_id, during_start, during_end,"
        " release_reason, next_attempt_at, lead_checked, start_checked, preempt_deadline,"
        " preempted_by)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
        " ?, ?)",
        (
            rsv.id,
            rsv.seq,
            rsv.tenant_id,
            rsv.pool_id,
            rsv.principal,
            rsv.state.value,
            rsv.gpus,
            json.dumps(list(rsv.models)),
            rsv.topology,
            rsv.gang_size,
            rsv.topology_key,
            int(rsv.spot),
            rsv.binding.value,
            rsv.duration_ms,
            rsv.start,
            conditions_json(rsv.conditions),
            rsv.quota_charge,
            rsv.idempotency_key,
            params,
            rsv.created_at,
            rsv.series_id,
            rsv.during.start if rsv.during else None,
            rsv.during.end if rsv.during else None,
            rsv.release_reason.value if rsv.release_reason else None,
            rsv.next_attempt_at,
            int(rsv.lead_checked),
            int(rsv.start_checked),
            rsv.preempt_deadline,
            rsv.preempted_by,
        ),
    )


def save_reservation(conn: Conn, rsv: Reservation, *, stored: Reservation | None = None) -> None:
    """Write the mutable columns of a reservation (allocations are written separately).

    `duration_ms` is mutable because `extend` lengthens the booked window (§7's durationMs).
    `stored`: the row as the ledger holds it now; only the columns that differ from it are
    written (none: no statement), so an index over the others is left alone. A pending
    request's failed retry changes only its next attempt, and the row has a dozen indexes."""
    values = _mutable_columns(rsv)
    if stored is not None:
        before = _mutable_columns(stored)
        values = {k: v for k, v in values.items() if before[k] != v}
        if not values:
            return
    sets = ", ".join(f"{column} = ?" for column in values)
    conn.execute(f"UPDATE reservations SET {sets} WHERE id = ?", (*values.values(), rsv.id))


def _mutable_columns(rsv: Reservation) -> dict[str, object]:
    """save_reservation's columns and their values for `rsv`."""
    return {
        "state": rsv.state.value,
        "during_start": rsv.during.start if rsv.during else None,
        "during_end": rsv.during.end if rsv.during else None,
        "conditions": conditions_json(rsv.conditions),
        "quota_charge": rsv.quota_charge,
        "release_reason": rsv.release_reason.value if rsv.release_reason else None,
        "next_attempt_at": rsv.next_attempt_at,
        "lead_checked": int(rsv.lead_checked),
        "start_checked": int(rsv.start_checked),
        "preempt_deadline": rsv.preempt_deadline,
        "preempted_by": rsv.preempted_by,
        "duration_ms": rsv.duration_ms,
    }


def pending_since(conn: Conn, rsv: Reservation) -> int:
    """When a pending reservation last began to wait: its creation, or the latest time it lost a
    placement (a spot requeue's `reservation.preempted`, a failed BookingRepair's
    `reservation.pending`, the only pending event that carries `from`)."""
    row = conn.execute(
        "SELECT MAX(at) FROM events WHERE reservation_id = ? AND (type = 'reservation.preempted'"
        " OR (type = 'reservation.pending' AND "
        + json_text(conn, "data", "from")
        + " IS NOT NULL))",
        (rsv.id,),
    ).fetchone()
    return max(rsv.created_at, int(row[0])) if row[0] is not None else rsv.created_at


# ---------------------------------------------------------------- allocations and bookings


def insert_allocation(
    conn: Conn, rsv: Reservation, node_id: str, atoms: Sequence[int], window: Window
) -> Allocation:
    alloc_id = next_id(conn, "alc")
    span = (window.start, window.end)
    conn.execute(
        "INSERT INTO allocations(id, reservation_id, node_id, atoms) VALUES (?, ?, ?, ?)",
        (alloc_id, rsv.id, node_id, json.dumps(sorted(atoms))),
    )
    conn.executemany(
        "INSERT INTO bookings(pool_id, node_id, atom, allocation_id, reservation_id, tenant_id,"
        ' spot, start, "end") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)',
        [
            (rsv.pool_id, node_id, a, alloc_id, rsv.id, rsv.tenant_id, int(rsv.spot), *span)
            for a in sorted(atoms)
        ],
    )
    return Allocation(alloc_id, rsv.id, node_id, tuple(sorted(atoms)))


def set_bound(conn: Conn, allocation_id: str) -> None:
    conn.execute("UPDATE allocations SET bound = 1 WHERE id = ?", (allocation_id,))


def atoms_booked(conn: Conn, node: str, atoms: Sequence[int], window: Window) -> bool:
    """Whether any of these atoms is booked in the window: a plan made from a snapshot may have
    lost the race to another writer since."""
    row = conn.execute(
        'SELECT COUNT(*) FROM bookings WHERE node_id = ? AND "end" > ? AND start < ?'
        f" AND atom IN ({','.join('?' * len(atoms))})",
        (node, window.start, window.end, *atoms),
    ).fetchone()
    return bool(row[0])


def first_clash(
    conn: Conn, node: str, atoms: Sequence[int], window: Window, rsv_id: str
) -> int | None:
    """The lowest of these atoms another reservation books in the window (extend's check)."""
    row = conn.execute(
        'SELECT reservation_id, atom FROM bookings WHERE node_id = ? AND "end" > ?'
        f" AND start < ? AND reservation_id != ? AND atom IN ({','.join('?' * len(atoms))})"
        " ORDER BY atom LIMIT 1",
        (node, window.start, window.end, rsv_id, *atoms),
    ).fetchone()
    return None if row is None else int(row["atom"])


def live_since(conn: Conn, now: int) -> int:
    """Where live_atoms' walk starts: every booking from `now` on, and one that ended before
    `now` when no tick has released its reservation yet (still active to `get` and `launch`),
    so from the earliest end of any live reservation, if that is earlier. One read for a whole
    inventory import."""
    row = conn.execute(
        "SELECT MIN(during_end) FROM reservations WHERE state IN ('placed', 'binding', 'active')"
        " AND state <> 'released'"
    ).fetchone()
    return now + 1 if row[0] is None else min(now + 1, int(row[0]))


def live_atoms(conn: Conn, node: str, since: int) -> set[int]:
    """A node's atoms booked by reservations not released, in bookings that end at `since`
    (live_since) or later: what must not vanish."""
    rows = conn.execute(
        "SELECT DISTINCT b.atom FROM bookings b JOIN reservations r ON r.id = b.reservation_id"
        " WHERE b.node_id = ? AND b.\"end\" >= ? AND r.state != 'released'",
        (node, since),
    )
    return {int(r[0]) for r in rows}


def count_atoms_in_use(conn: Conn, pool_id: str, now: int) -> int:
    """(node, atom) pairs with a booking that covers `now` (PRODUCT.md §4's inUse), counted in
    SQL. A released reservation's bookings are cut back to its release, so as of an instant
    before the release they cover what it held then, and after it nothing."""
    row = conn.execute(
        "SELECT COUNT(*) FROM (SELECT DISTINCT node_id, atom FROM bookings b"
        ' WHERE b.pool_id = ? AND b."end" > ? AND b."end" <= ? AND b.start <= ?) AS held',
        (pool_id, now, now + longest_booking(conn, pool_id), now),
    ).fetchone()
    return int(row[0])


#: A node `n` whose healthy GPUs are allocatable at `:now`: schedulable, reachable, and under no
#: maintenance window then. pool_inventory_counts and storage/fleet.unallocatable count by it.
USABLE_NOW = (
    "n.schedulable != 0 AND n.reachable != 0 AND NOT EXISTS (SELECT 1 FROM maintenance m"
    ' WHERE m.node_id = n.name AND m."end" > :now AND m.start < :now + 1)'
)


def pool_inventory_counts(conn: Conn, pool_id: str, now: int) -> tuple[int, int, int]:
    """(nodes, GPUs, allocatable GPUs) of a pool: allocatable GPUs are healthy GPUs of
    schedulable, reachable nodes with no maintenance window at `now` (what placement may use:
    an unreachable node counted as allocatable had `pool show` offer GPUs `preview` refused).
    From the nodes' own GPU counts (kept by triggers on atoms, migration 10): one pass over the
    pool's nodes in their index, not over every GPU (4,000 nodes: 0.9 ms instead of 6)."""
    row = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(n.gpus), 0),"
        f" COALESCE(SUM(CASE WHEN {USABLE_NOW} THEN n.healthy_gpus ELSE 0 END), 0)"
        " FROM nodes n WHERE n.pool_id = :pool",
        {"pool": pool_id, "now": now},
    ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def atoms_reserved_later(conn: Conn, pool_id: str, now: int) -> int:
    """Atoms whose next booking begins later than `now` and none covers now (§4's reserved).

    The distinct atoms with a booking starting later come from the covering index alone; each
    is then checked once: nothing holds the atom now (a range bounded by the longest booking).
    A released reservation keeps no booking after its release (count_atoms_in_use).
    """
    row = conn.execute(
        "SELECT COUNT(*) FROM (SELECT DISTINCT node_id, atom FROM bookings"
        ' WHERE pool_id = :pool AND "end" > :now AND start > :now) f'
        " WHERE NOT EXISTS (SELECT 1 FROM bookings c WHERE c.node_id = f.node_id"
        ' AND c.atom = f.atom AND c.start <= :now AND c."end" > :now AND c."end" <= :bound)',
        {"pool": pool_id, "now": now, "bound": now + longest_booking_anywhere(conn)},
    ).fetchone()
    return int(row[0])


def node_assignment_rows(conn: Conn, node: str) -> list[Row]:
    """A node's allocations of binding and active reservations, by start then reservation id:
    id, tenant_id, alloc, atoms (JSON), state, during_start, during_end, bound."""
    return list(
        conn.execute(
            "SELECT r.id, r.tenant_id, a.id AS alloc, a.atoms, r.state, r.during_start,"
            " r.during_end, a.bound FROM allocations a JOIN reservations r"
            " ON r.id = a.reservation_id"
            " WHERE a.node_id = ? AND a.released = 0 AND r.state IN ('binding', 'active')"
            " AND r.state <> 'released'"
            " ORDER BY r.during_start, r.id",
            (node,),
        )
    )


def end_bookings(conn: Conn, rsv_id: str, at: int) -> None:
    """Give back every booking from `at` on; the part already used stays as history."""
    conn.execute("DELETE FROM bookings WHERE reservation_id = ? AND start >= ?", (rsv_id, at))
    conn.execute(
        'UPDATE bookings SET "end" = ? WHERE reservation_id = ? AND "end" > ?', (at, rsv_id, at)
    )


def drop_allocations(conn: Conn, rsv_id: str, at: int) -> None:
    """Release every allocation of a reservation (repair, requeue): bookings from `at` go."""
    end_bookings(conn, rsv_id, at)
    conn.execute("UPDATE allocations SET released = 1 WHERE reservation_id = ?", (rsv_id,))


def move_bookings_end(conn: Conn, rsv_id: str, old_end: int, new_end: int) -> None:
    conn.execute(
        'UPDATE bookings SET "end" = ? WHERE reservation_id = ? AND "end" = ?',
        (new_end, rsv_id, old_end),
    )


def bucket_span(alias: str) -> tuple[str, str]:
    """SQL for a booking's first and last bucket of a window of `:count` buckets `:step` wide
    from `:from` (the last ends at the window's end), for the timeline's two reads (this one and
    storage/buckets.py's windows). `alias`: how the booking's columns are named ("b." or "")."""
    start, end = f"{alias}start", f'{alias}"end"'
    return (
        f"(CASE WHEN {start} > :from THEN {start} ELSE :from END - :from) / :step",
        f"CASE WHEN {end} - :from - 1 < :count * :step THEN ({end} - :from - 1) / :step"
        " ELSE :count - 1 END",
    )


def bucket_args(
    conn: Conn, pool_id: str, window: Window, step: int, count: int
) -> dict[str, object]:
    """The parameters of bucket_span's SQL and of the overlap test both reads make (a booking
    overlaps the window when it ends after `:from`, and before `:bound`, and starts before
    `:to`): window_params's, no reservation ignored, and the buckets'."""
    params = window_params(conn, pool_id, window, None)
    del params["ignore"]
    return {**params, "step": step, "count": count}


def booking_buckets(
    conn: Conn,
    pool_id: str,
    window: Window,
    step: int,
    tenant: str | None = None,
    nodes: Sequence[str] | None = None,
) -> Iterator[tuple[str, int, int, int]]:
    """(node, atom, first, last) for every booking overlapping a window (only one tenant's, or
    only on these nodes, if given): the indexes of the first and last of the window's
    `step`-wide buckets it overlaps (the last bucket ends at the window's end), ordered by
    node, atom, first. For the timeline."""
    count = -(-(window.end - window.start) // step)
    first, last = bucket_span("b.")
    if tenant is not None:
        # A tenant's: its own bookings through their tenant's index (migration 13), not every
        # booking of the pool's window looked up in the reservations (`|| ''` keeps SQLite off
        # the pool's index, on both backends' syntax).
        where = " b.tenant_id = :tenant AND b.pool_id || '' = :pool"
    elif nodes is not None:  # a few nodes: through the node index, as snapshots reads them
        names = ", ".join(f":n{i}" for i in range(len(nodes))) or "NULL"
        where = f" b.node_id IN ({names}) AND b.pool_id || '' = :pool"
    else:
        where = " b.pool_id = :pool"
    sql = (
        f"SELECT b.node_id, b.atom, {first}, {last} FROM bookings b WHERE{where}"
        ' AND b."end" > :from AND b."end" < :bound AND b.start < :to'
    )
    args = bucket_args(conn, pool_id, window, step, count)
    if tenant is not None:
        args["tenant"] = tenant
    elif nodes is not None:
        args.update((f"n{i}", name) for i, name in enumerate(nodes))
    # Plain tuples, read as consumed: a week holds a hundred thousand of these rows, and the
    # caller folds them as they come.
    return plain_rows(conn, sql + " ORDER BY b.node_id, b.atom, 3", args)


# ---------------------------------------------------------------- events


#: How many events this process has appended (committed or rolled back). A reader that caught
#: up with the event log at a count, on a ledger no other process has written since, has
#: nothing newer to read while the count stands (service/fleet.Fleet's catch-up: on PostgreSQL
#: a round trip per placement attempt, thousands in a replay of retries).
_appended = [0]


def events_appended() -> int:
    return _appended[0]


def append_event(
    conn: Conn,
    type_: str,
    at: int,
    tenant: str | None,
    rsv_id: str | None,
    data: dict[str, JsonValue],
    actor: str,
    acting_admin: str | None,
) -> None:
    # The next number, not the column's own: a PostgreSQL identity spends its values in
    # transactions that roll back (a series that did not fit, a killed command), so its log had
    # gaps SQLite's has not, and `events --json` differed by backend. Writers take the ledger's
    # write lock first, so no two number an event at once.
    conn.execute(
        "INSERT INTO events(seq, type, at, tenant_id, reservation_id, data, actor, acting_admin)"
        " VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM events), ?, ?, ?, ?, ?, ?, ?)",
        (type_, at, tenant, rsv_id, _sorted_json(data), actor, acting_admin),
    )
    _appended[0] += 1


def events(
    conn: Conn,
    *,
    tenant: str | None,
    reservation: str | None,
    since: int | None,
    tenants: Sequence[str] | None = None,
) -> list[Event]:
    """Events in seq order; `tenants` (when given) limits them to those tenants' and the fleet's.
    All of them at once, from one statement: for answers of a tick or a page (event_pages
    streams a whole log)."""
    sql, args = _events_sql(tenant, reservation, since, tenants)
    return _decoded_events(conn, conn.execute(sql, args).fetchall())


#: Events decoded at a time by event_pages.
EVENT_PAGE = 2000


def event_pages(
    conn: Conn,
    tenant: str | None,
    reservation: str | None,
    since: int | None,
    tenants: Sequence[str] | None = None,
    *,
    first_page: bool = False,
) -> Iterator[list[Event]]:
    """`events`, EVENT_PAGE at a time: the whole log of a fleet (a million events) is never held
    at once, as rows (PostgreSQL: a server-side cursor) or as objects. Read inside the caller's
    transaction. With `first_page`, only the first page is read (the database returns no more)."""
    sql, args = _events_sql(tenant, reservation, since, tenants)
    if first_page:
        yield _decoded_events(conn, conn.execute(f"{sql} LIMIT {EVENT_PAGE}", args).fetchall())
        return
    rows = plain_rows(conn, sql, args)
    while page := list(islice(rows, EVENT_PAGE)):
        yield _decoded_events(conn, page)


def _events_sql(
    tenant: str | None, reservation: str | None, since: int | None, tenants: Sequence[str] | None
) -> tuple[str, list[object]]:
    clauses, args = ["1 = 1"], []  # type: tuple[list[str], list[object]]
    if tenants is not None:
        clauses.append(f"(tenant_id IS NULL OR {among('tenant_id', len(tenants))})")
        args.extend(tenants)
    if tenant is not None:
        clauses.append("tenant_id = ?")
        args.append(tenant)
    if reservation is not None:
        clauses.append("reservation_id = ?")
        args.append(reservation)
    if since is not None:
        clauses.append("seq > ?")
        args.append(since)
    where = " AND ".join(clauses)
    return f"SELECT {EVENT_COLUMNS} FROM events WHERE {where} ORDER BY seq", args


def _decoded_events(conn: Conn, rows: Sequence[Sequence[Any]]) -> list[Event]:
    return [decoded(conn, f"event {r[0]}", partial(_event, r)) for r in rows]


#: An event's columns in the order _event reads them.
EVENT_COLUMNS = "seq, type, at, tenant_id, reservation_id, data, actor, acting_admin"


def _event(r: Sequence[Any]) -> Event:
    """The event of a row of EVENT_COLUMNS (a plain tuple or a row)."""
    seq, kind, at, tenant, reservation, data, actor, acting = r
    return Event(
        _int(seq),
        _str(kind),
        _int(at),
        _opt_str(tenant),
        _opt_str(reservation),
        _json_of(data, dict),
        _str(actor),
        _opt_str(acting),
    )


def last_event_seq(conn: Conn) -> int:
    """The seq of the latest event, 0 when there is none."""
    return int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0])


# ---------------------------------------------------------------- meters and usage


def meter_exists(conn: Conn, name: str) -> bool:
    return conn.execute("SELECT 1 FROM meters WHERE name = ?", (name,)).fetchone() is not None


def insert_meter(conn: Conn, name: str) -> None:
    conn.execute("INSERT INTO meters(name, seq) VALUES (?, ?)", (name, next_seq(conn, "meters")))


def meter_names(conn: Conn) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT name FROM meters ORDER BY name")]


def open_usage(conn: Conn, meter: str, rsv: Reservation, allocation: Allocation, at: int) -> None:
    """Open one allocation's usage window at `at` (closed by close_usage)."""
    conn.execute(
        "INSERT INTO usage(meter, tenant_id, reservation_id, allocation_id, gpus, start)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (meter, rsv.tenant_id, rsv.id, allocation.id, len(allocation.atoms), at),
    )


def close_usage(conn: Conn, rsv_id: str, at: int) -> None:
    """Close every open window of a reservation at `at` (never before the window opened)."""
    conn.execute(
        'UPDATE usage SET "end" = CASE WHEN start > ? THEN start ELSE ? END'
        ' WHERE reservation_id = ? AND "end" IS NULL',
        (at, at, rsv_id),
    )


def usage_rows(
    conn: Conn,
    *,
    dead_letter: bool,
    tenants: Sequence[str] | None,
    start: int | None,
    end: int | None,
) -> list[Row]:
    """Usage windows overlapping [start, end), with their reservation's during_end and node_id,
    by start then id; `dead_letter`: only windows whose meter does not exist, else only those
    whose meter does; `tenants` (when given) limits them to those tenants'."""
    sql = "SELECT u.*, r.during_end, a.node_id FROM usage u"
    sql += " JOIN reservations r ON r.id = u.reservation_id"
    sql += " JOIN allocations a ON a.id = u.allocation_id"
    sql += " WHERE "
    sql += "NOT EXISTS" if dead_letter else "EXISTS"
    sql += " (SELECT 1 FROM meters m WHERE m.name = u.meter)"
    args: list[object] = []
    if tenants is not None:
        sql += f" AND {among('u.tenant_id', len(tenants))}"
        args.extend(tenants)
    if end is not None:
        sql += " AND u.start < ?"
        args.append(end)
    if start is not None:
        sql += ' AND (u."end" IS NULL OR u."end" > ?)'
        args.append(start)
    rows = conn.execute(sql + " ORDER BY u.start, u.id", args).fetchall()
    for r in rows:  # the caller computes with these values: a damaged one is damage, not a bug
        decoded(conn, f"usage window {r['id']}", partial(_check_usage_row, r))
    return rows


def _check_usage_row(r: Row) -> None:
    for text in ("meter", "tenant_id", "reservation_id", "allocation_id"):
        _str(r[text])
    for number in ("gpus", "start"):
        _int(r[number])
    for maybe in ("end", "during_end"):
        _opt_int(r[maybe])
