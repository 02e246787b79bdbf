"""Placement's reads of a pool at fleet scale (issue 8 item 3): which nodes could take a share.

Both answer what repo.fit_candidates answers (the tests compare them), but size the nodes from
their own rows (nodes.gpus and nodes.healthy_gpus, kept by migration 10's triggers) instead of
every GPU row of the pool, and count the GPUs booked in the window per node straight from the
bookings index, joining a GPU row only for the rare node with an unhealthy GPU or a booking on
a GPU it no longer has. A node's GPUs are numbered 0..gpus-1 (service/setup._atoms; an inventory
update drops them from the top), so a booked GPU below `gpus` is one the node has.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from better_compute.model import FABRIC_DOMAIN, Window, fabric_domain_of, label_value
from better_compute.storage import fitlevels
from better_compute.storage.repo import Conn, _labels, _opt_int, _opt_str, decoded, window_params

#: The window's bookings of one node, as a correlated subquery on `s.name` (the node's index:
#: `|| ''` keeps SQLite off the pool's window index). `{healthy}`: only the node's healthy GPUs.
#: `{spot}`: spot bookings left out (FIT_CANDIDATES_FREEING_SPOT_SQL), or not.
_RECOUNT = """(SELECT COUNT(DISTINCT b.atom) FROM bookings b
     JOIN atoms a ON a.node_id = b.node_id AND a.idx = b.atom{healthy}
     WHERE b.node_id = s.name AND b.pool_id || '' = :pool
       AND b."end" > :from AND b."end" < :bound AND b.start < :to
       AND b.reservation_id IS DISTINCT FROM :ignore{spot})"""

_FIT_CANDIDATES = """
WITH busy AS (
  SELECT b.node_id, COUNT(DISTINCT b.atom) AS busy, MAX(b.atom) AS top FROM bookings b
  WHERE b.pool_id = :pool AND b."end" > :from AND b."end" < :bound AND b.start < :to
    AND b.reservation_id IS DISTINCT FROM :ignore{spot}
  GROUP BY b.node_id
), sized AS (
  SELECT n.name, n.gpus, n.healthy_gpus, busy.busy, busy.top
  FROM nodes n LEFT JOIN busy ON busy.node_id = n.name
  WHERE n.pool_id = :pool AND n.schedulable != 0 AND n.reachable != 0 AND n.gpus >= :least
), exact AS (
  SELECT s.name, s.gpus, s.healthy_gpus,
    CASE WHEN s.busy IS NULL THEN 0 WHEN s.top < s.gpus THEN s.busy
         ELSE {recount} END AS busy,
    CASE WHEN s.busy IS NULL THEN 0 WHEN s.top < s.gpus AND s.healthy_gpus = s.gpus THEN s.busy
         ELSE {recount_healthy} END AS busy_healthy
  FROM sized s
)
SELECT e.name, e.busy, e.gpus FROM exact e
WHERE e.healthy_gpus - e.busy_healthy >= CASE WHEN :whole != 0 THEN e.gpus ELSE :need END
  AND NOT EXISTS (SELECT 1 FROM maintenance m
                  WHERE m.node_id = e.name AND m."end" > :from AND m.start < :to)
-- engine/shortlist.best_key: the fullest a share would leave the node (scorers.fill), then name
ORDER BY 10 * ((e.busy + CASE WHEN :whole != 0 THEN e.gpus ELSE :need END) * 1000 / e.gpus) DESC,
  e.name
"""


def _candidates_sql(spot: str) -> str:
    return _FIT_CANDIDATES.format(
        spot=spot,
        recount=_RECOUNT.format(healthy="", spot=spot),
        recount_healthy=_RECOUNT.format(healthy=" AND a.healthy != 0", spot=spot),
    )


FIT_CANDIDATES_SQL = _candidates_sql("")

#: The per-node counts, all GPUs and healthy ones, for storage/fitlevels' nodes it counts.
_RECOUNTS = (
    _RECOUNT.format(healthy="", spot=""),
    _RECOUNT.format(healthy=" AND a.healthy != 0", spot=""),
)

#: The nodes that could take the share were every spot booking freed (preemption's planning,
#: engine/preempt.py, frees live ones): a superset of those it can find a plan on.
FIT_CANDIDATES_FREEING_SPOT_SQL = _candidates_sql(" AND b.spot = 0")


def fit_candidates(
    conn: Conn,
    pool_id: str,
    window: Window,
    *,
    ignore_reservation: str | None,
    need: int,
    whole_node: bool,
    limit: int | None = None,
    free_spot: bool = False,
) -> list[tuple[str, int, int]]:
    """repo.fit_candidates' rows in its order, the first `limit` of them (None: all). A limit
    lets the database keep only the best few while it sorts, and builds no row past them.
    `free_spot`: as if no spot booking were there (FIT_CANDIDATES_FREEING_SPOT_SQL)."""
    params = window_params(conn, pool_id, window, ignore_reservation)
    levelled = not free_spot and not whole_node and need >= 1 and (limit is None or limit > 0)
    if levelled and not _holds(conn, ignore_reservation):
        ranked = fitlevels.candidates(
            conn, pool_id, window, params, _RECOUNTS, need=need, limit=limit
        )
        if ranked is not None:
            return ranked
    sql = FIT_CANDIDATES_FREEING_SPOT_SQL if free_spot else FIT_CANDIDATES_SQL
    if limit is not None:
        sql += f"LIMIT {int(limit)}"
    params.update(need=need, whole=int(whole_node), least=max(need, 1))
    rows = conn.execute(sql, params)
    return [(str(n), int(b), int(g)) for n, b, g in rows]


NAME_ORDER_SQL = """
SELECT n.name, n.gpus, n.healthy_gpus,
  (SELECT COUNT(DISTINCT b.atom) FROM bookings b
   WHERE b.node_id = n.name AND b.pool_id || '' = :pool
     AND b."end" > :from AND b."end" < :bound AND b.start < :to
     AND b.reservation_id IS DISTINCT FROM :ignore AND b.atom < n.gpus) AS busy
FROM nodes n
WHERE n.pool_id = :pool AND n.name > :after AND n.schedulable = 1 AND n.reachable = 1
ORDER BY n.name LIMIT :limit
"""


def _holds(conn: Conn, reservation: str | None) -> bool:
    """Whether the reservation holds bookings, which fitting's count leaves out and the levels
    count (a reservation being placed anew holds none; one being moved does)."""
    if reservation is None:
        return False
    row = conn.execute("SELECT 1 FROM bookings WHERE reservation_id = ? LIMIT 1", (reservation,))
    return row.fetchone() is not None


def usable_after(
    conn: Conn,
    pool_id: str,
    window: Window,
    *,
    ignore_reservation: str | None,
    after: str,
    limit: int,
) -> list[tuple[str, int, int, int]]:
    """(node, GPUs, healthy GPUs, GPUs with a booking in the window) of up to `limit` of the
    pool's schedulable, reachable nodes by name after `after`: fleet.usable_nodes_after's nodes,
    with what placement's name-order reading needs to skip, unplanned, a node that cannot be a
    perfect fit."""
    params = window_params(conn, pool_id, window, ignore_reservation)
    params.update(after=after, limit=limit)
    rows = conn.execute(NAME_ORDER_SQL, params)
    return [(str(n), int(g), int(h), int(b)) for n, g, h, b in rows]


def topology_values(
    conn: Conn, pool_id: str, key: str, *, holding: tuple[Sequence[str], int] | None = None
) -> dict[str, str | None]:
    """Node.label(key) of every schedulable, reachable node of the pool, without building the
    nodes: a gang's groups (service/placing.gang_fits). fabric.domain from each node's distinct
    GPU fabrics; other keys from the labels, each distinct label set parsed once.

    With `holding` (models, share): of every node, whatever its state, with at least `share`
    GPUs of those models (of any model when none is named): the groups a gang could ever be
    made of (service/windows._beyond_groups)."""
    where, args = "n.schedulable != 0 AND n.reachable != 0", list[object]()
    if holding is not None:
        models, share = holding
        where, args = "n.gpus >= ?", [share]
        if models:
            marks = ",".join("?" * len(models))
            where = "(SELECT COUNT(*) FROM atoms h WHERE h.node_id = n.name"
            where += f" AND h.model IN ({marks})) >= ?"
            args = [*models, share]
    sql = "FROM nodes n{} WHERE n.pool_id = ? AND " + where
    if key == FABRIC_DOMAIN:
        rows = conn.execute(
            "SELECT DISTINCT n.name, a.fabric_cluster, a.fabric_clique "
            + sql.format(" JOIN atoms a ON a.node_id = n.name"),
            (pool_id, *args),
        )
        return decoded(conn, "a node or GPU row", lambda: _domains(rows))
    rows = conn.execute("SELECT n.name, n.labels " + sql.format(""), (pool_id, *args))
    return decoded(conn, "a node's labels", lambda: _values(rows, key))


def label_keys(conn: Conn, pool_id: str) -> list[str]:
    """Every label key some node of the pool has, fabric.domain included when some node's GPUs
    share a fabric, sorted: what --topology-key can name there."""
    texts = [
        str(t)
        for (t,) in conn.execute("SELECT DISTINCT labels FROM nodes WHERE pool_id = ?", (pool_id,))
    ]
    labels = decoded(conn, "a node's labels", lambda: [_labels(text) for text in texts])
    keys = {key for pairs in labels for key, _ in pairs}
    fabrics = topology_values(conn, pool_id, FABRIC_DOMAIN, holding=((), 0))
    if any(value is not None for value in fabrics.values()):
        keys.add(FABRIC_DOMAIN)
    return sorted(keys)


def _domains(rows: Iterable[Any]) -> dict[str, str | None]:
    fabrics: dict[str, set[tuple[str | None, int | None]]] = {}
    for name, cluster, clique in rows:
        fabrics.setdefault(str(name), set()).add((_opt_str(cluster), _opt_int(clique)))
    return {name: fabric_domain_of(keys) for name, keys in fabrics.items()}


def _values(rows: Iterable[Any], key: str) -> dict[str, str | None]:
    parsed: dict[str, tuple[tuple[str, str], ...]] = {}
    values: dict[str, str | None] = {}
    for name, text in rows:
        if text not in parsed:
            parsed[text] = _labels(text)
        values[str(name)] = label_value(parsed[text], key)
    return values
