"""A share's candidates from each node's free-GPU levels (migration 15), best first, without
counting every booking the window touches (issue 8 item 3: growth with the fleet).

fitting.fit_candidates counts, for every node the window touches, the GPUs booked in it: an
exact best fit must know each such count, and on a fleet with the same bookings per node their
number grows with the fleet. Here each node keeps, from its last refresh, the window ends for
which exactly f of its GPUs stay free (`fit_levels`, one row per level; the migration says how
they are made). A share of n GPUs fills a node best where f = n, then n + 1, …; each level's
rows are one range of an index, holding the nodes at that level when the window ends and those
whose level ends inside it (and, at the level of all a node's GPUs, a range in name order read
only as far as needed). So the rows read follow the levels the answer reaches, not every node
the window touches: on the benchmark's big pool about 75 rows, where fitting's count read
13,950 bookings. A fleet with every node at one level still reads them all, as fitting's query did.

What the levels cannot answer is counted as before, node by node from its bookings: nodes
stale since a write to their bookings or size (the triggers mark them in the writing
transaction), nodes whose next booking start or end comes before the window starts (time
passed it, or the window starts later: for a window a day ahead, most of a busy fleet), and
nodes with an unhealthy GPU (the fit asks for healthy GPUs, the ranking for booked ones). Too
many of those (so a later window is mostly fitting's count, as before), a window
before a node's refresh, a reservation's own bookings to leave out, spot bookings to free, or a
whole-node request: None, and the caller asks fitting's query. The answer is fitting's, row for
row and in its order (tests/test_fitlevels.py holds them to it).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from better_compute.model import Window
from better_compute.storage.repo import Conn

#: A GPU with no booking after the refresh instant is next busy never; below every time, the
#: busy time of the GPU after a node's last (so its all-free level starts from the beginning).
FIT_NEVER = 1 << 62
FIT_ALWAYS = -(1 << 62)

#: fit_nodes.valid_until of a node with an unhealthy GPU: always counted, never refreshed
#: until a write to its bookings or size makes it stale (0) again.
SICK = -1

#: More stale or unhealthy nodes than this in the pool, and fitting's query counts them all at
#: once instead: each costs a count of its own here.
MOST_COUNTED = 256

#: Nodes refreshed per statement.
CHUNK = 500


def refresh(conn: Conn, pool_id: str, now: int) -> int:
    """Recompute the levels of the pool's stale nodes as of `now` (placement's write path and
    tick's, in their transaction); returns how many. About 110 µs a node on the benchmark's big
    pool: with cron's tick every minute a few nodes, and all of them (0.45 s for 4,000) only
    for the first command after the upgrade or a long idle time."""
    names = [
        str(r[0])
        for r in conn.execute(
            "SELECT node_id FROM fit_nodes WHERE pool_id = ? AND valid_until <= ?"
            " AND valid_until != ?",
            (pool_id, now, SICK),
        )
    ]
    for start in range(0, len(names), CHUNK):
        _refresh_nodes(conn, pool_id, names[start : start + CHUNK], now)
    return len(names)


def refresh_pools(conn: Conn, now: int) -> None:
    """refresh for every pool: tick, which cron runs every minute, keeps the levels fresh so a
    placement seldom finds many stale nodes; simulate --until leaves a live ledger's."""
    for (pool_id,) in conn.execute("SELECT id FROM pools ORDER BY id").fetchall():
        refresh(conn, str(pool_id), now)


def _refresh_nodes(conn: Conn, pool_id: str, names: Sequence[str], now: int) -> None:
    """Levels as of `now` for these nodes of the pool, from their sizes and the bookings that
    end after `now` (one read of each for all of them), replacing what they had."""
    marks = ",".join("?" * len(names))
    sizes = {
        str(n): (int(g), int(h))
        for n, g, h in conn.execute(
            f"SELECT name, gpus, healthy_gpus FROM nodes WHERE name IN ({marks})", list(names)
        )
    }
    held: dict[str, list[tuple[int, int, int]]] = {name: [] for name in names}
    rows = conn.execute(  # the pool's own bookings, as fitting counts them
        f'SELECT node_id, atom, start, "end" FROM bookings WHERE node_id IN ({marks})'
        ' AND "end" > ? AND pool_id = ?',
        [*names, now, pool_id],
    )
    for node, atom, start, end in rows:
        held[str(node)].append((int(atom), int(start), int(end)))
    nodes: list[tuple[int, int, str]] = []
    levels: list[tuple[str, str, int, int, int, int]] = []
    for name in names:
        gpus, healthy = sizes.get(name, (0, 0))
        valid, rows_of = node_levels(gpus, held[name], now)
        if healthy != gpus:  # an unhealthy GPU: counted from the bookings (module docstring)
            valid, rows_of = SICK, []
        nodes.append((now, valid, name))
        levels.extend((name, pool_id, f, lo, hi, valid) for f, lo, hi in rows_of)
    conn.executemany("DELETE FROM fit_levels WHERE node_id = ?", [(n,) for n in names])
    conn.executemany("UPDATE fit_nodes SET t0 = ?, valid_until = ? WHERE node_id = ?", nodes)
    conn.executemany(
        "INSERT INTO fit_levels(node_id, pool_id, free, lo, hi, valid_until)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        levels,
    )


def node_levels(
    gpus: int, bookings: Iterable[tuple[int, int, int]], now: int
) -> tuple[int, list[tuple[int, int, int]]]:
    """(valid_until, [(free, lo, hi)]) of a node of `gpus` GPUs from its bookings (atom, start,
    end) that end after `now`: each GPU's next busy time, sorted from the latest, gives a level
    per distinct step (the migration's formula). Levels that end by `now` are left out: no
    window asked after the refresh can end there. A booking on a GPU the node no longer has
    (numbered past `gpus`) counts for nothing, as in fitting's count, but still bounds validity."""
    valid = FIT_NEVER
    busy = [FIT_NEVER] * gpus
    for atom, start, end in bookings:
        valid = min(valid, start if start > now else end)
        if atom < gpus:
            busy[atom] = min(busy[atom], start)
    steps = [*sorted(busy, reverse=True), FIT_ALWAYS]
    levels = [
        (f, steps[f], steps[f - 1])
        for f in range(1, gpus + 1)
        if steps[f - 1] > steps[f] and steps[f - 1] > now
    ]
    return valid, levels


#: One level's usable nodes whose level holds when the window ends: schedulable, reachable,
#: healthy, large enough and out of maintenance, as fitting's query asks. {rows}: which of the
#: level's rows; {order}: in what order.
_LEVEL_ROWS = """
SELECT l.node_id, n.gpus FROM fit_levels l JOIN nodes n ON n.name = l.node_id
WHERE l.pool_id = :pool AND l.free = :free AND {rows}
  AND l.hi >= :to AND l.valid_until > :from
  AND n.schedulable != 0 AND n.reachable != 0 AND n.healthy_gpus = n.gpus AND n.gpus >= :least
  AND NOT EXISTS (SELECT 1 FROM maintenance m
                  WHERE m.node_id = l.node_id AND m."end" > :from AND m.start < :to)
ORDER BY {order}
"""

#: The level's nodes whose step is inside the pool's time (lo above FIT_ALWAYS): those at the
#: level when the window ends. `fit_levels_scan` reads them from lo's lower end up to :to, and
#: they come best first (fill() in SQL), so a limit keeps Python from seeing the rest: a fleet
#: with every node at one level (one GPU of each in use) reads them all, as fitting's query does.
_STEP_ROWS = _LEVEL_ROWS.format(
    rows="l.lo > :always AND l.lo < :to",
    order="10 * ((n.gpus - :free + :need) * 1000 / n.gpus) DESC, l.node_id",
)

#: The nodes whose every GPU is free until their level's end (free = their GPU count): the
#: index holds them in name order, so the first `limit` cost about `limit` rows.
_ALL_FREE_ROWS = _LEVEL_ROWS.format(rows="l.lo = :always", order="l.node_id")

#: The nodes the levels do not answer for: stale, or with an unhealthy GPU (SICK).
_COUNTED_NAMES = "SELECT node_id FROM fit_nodes WHERE pool_id = :pool AND valid_until <= :from"

#: fitting's count for named nodes: each node's GPUs booked in the window, all and healthy.
_COUNTED_ROWS = """
SELECT s.name, s.gpus, s.healthy_gpus, {recount} AS busy, {recount_healthy} AS busy_healthy
FROM nodes s
WHERE s.name IN ({marks}) AND s.pool_id = :pool AND s.schedulable != 0 AND s.reachable != 0
  AND s.gpus >= :least
  AND NOT EXISTS (SELECT 1 FROM maintenance m
                  WHERE m.node_id = s.name AND m."end" > :from AND m.start < :to)
"""


def fill(busy: int, need: int, gpus: int) -> int:
    """fitting's ranking (engine/scorers.fill of the node once the share is booked)."""
    return 10 * ((busy + need) * 1000 // gpus)


def candidates(
    conn: Conn,
    pool_id: str,
    window: Window,
    params: dict[str, object],
    recount: tuple[str, str],
    *,
    need: int,
    limit: int | None,
) -> list[tuple[str, int, int]] | None:
    """fitting.fit_candidates' first `limit` rows (None: all) for a share of `need` GPUs,
    ignoring no reservation and freeing no spot booking; None when the levels cannot answer
    (module docstring). `params`: fitting's window parameters; `recount`: its per-node counts."""
    args = {**params, "least": need, "need": need, "always": FIT_ALWAYS}
    counted = _to_count(conn, pool_id, window, args)
    if counted is None:
        return None
    row = conn.execute("SELECT MAX(gpus) FROM fit_nodes WHERE pool_id = ?", (pool_id,)).fetchone()
    top = 0 if row is None or row[0] is None else int(row[0])
    # (-fill, name, busy, gpus): fitting's order first; what is waiting to be given.
    waiting = [
        (-fill(b, need, g), n, b, g) for n, b, g in _counted(conn, counted, args, recount, need)
    ]
    heapq.heapify(waiting)
    out: list[tuple[str, int, int]] = []
    for free in range(need, top + 1):
        for name, gpus in _level(conn, {**args, "free": free}, limit):
            heapq.heappush(waiting, (-fill(gpus - free, need, gpus), name, gpus - free, gpus))
        # The best any node at a higher level could rank: one GPU more free, on the largest.
        bound = -fill(top - free - 1, need, top) if free < top else None
        if _give(waiting, out, limit, bound):
            return out
    _give(waiting, out, limit, None)
    return out


def _to_count(
    conn: Conn, pool_id: str, window: Window, args: dict[str, object]
) -> list[str] | None:
    """The pool's nodes the levels do not answer for, to count from their bookings; None when
    the levels cannot answer at all: a node refreshed after the window starts (a clock set back),
    or more than MOST_COUNTED to count (read no further than one past it)."""
    row = conn.execute("SELECT MAX(t0) FROM fit_nodes WHERE pool_id = ?", (pool_id,)).fetchone()
    if row is None or row[0] is None or int(row[0]) > window.start:
        return None
    rows = conn.execute(_COUNTED_NAMES + " LIMIT :most", {**args, "most": MOST_COUNTED + 1})
    counted = [str(r[0]) for r in rows]
    return None if len(counted) > MOST_COUNTED else counted


def _level(conn: Conn, level: dict[str, object], limit: int | None) -> list[tuple[str, int]]:
    """(node, GPUs) of the level's nodes: its steps, then its nodes free whole, each read best
    first and no further than `limit`."""
    tail = "" if limit is None else f"LIMIT {int(limit)}"
    rows = list(conn.execute(_STEP_ROWS + tail, level))
    rows.extend(conn.execute(_ALL_FREE_ROWS + tail, level))
    return [(str(name), int(gpus)) for name, gpus in rows]


def _give(
    waiting: list[tuple[int, str, int, int]],
    out: list[tuple[str, int, int]],
    limit: int | None,
    bound: int | None,
) -> bool:
    """Move rows from `waiting` to `out`, best first, while they rank before `bound` (None: all
    of them); returns whether `out` holds `limit` rows."""
    while waiting and (bound is None or waiting[0][0] < bound):
        _, name, busy, gpus = heapq.heappop(waiting)
        out.append((name, busy, gpus))
        if limit is not None and len(out) >= limit:
            return True
    return False


def _counted(
    conn: Conn, names: list[str], args: dict[str, object], recount: tuple[str, str], need: int
) -> list[tuple[str, int, int]]:
    """fitting's rows for these nodes: (node, GPUs booked in the window, GPUs), those with
    `need` healthy GPUs free."""
    out = []
    for start in range(0, len(names), CHUNK):
        chunk = names[start : start + CHUNK]
        marks = ",".join(f":n{i}" for i in range(len(chunk)))
        sql = _COUNTED_ROWS.format(recount=recount[0], recount_healthy=recount[1], marks=marks)
        named = {**args, **{f"n{i}": name for i, name in enumerate(chunk)}}
        for name, gpus, healthy, busy, busy_healthy in conn.execute(sql, named):
            if int(healthy) - int(busy_healthy) >= need:
                out.append((str(name), int(busy), int(gpus)))
    return out
