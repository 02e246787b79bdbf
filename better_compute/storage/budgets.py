"""SQL for GPU-hour budgets (issue 12): the caps, and the GPU-time a tenant has booked in a window.

Kept apart from storage/repo.py. Portable SQL: `?` placeholders, `"end"` quoted, CASE rather than
SQLite's two-argument MIN/MAX.
"""

from __future__ import annotations

from dataclasses import dataclass

from better_compute.model import Window
from better_compute.storage import settled
from better_compute.storage.repo import Conn


@dataclass(frozen=True)
class Budget:
    pool_id: str  # '' for every pool
    gpu_ms: int
    period_ms: int


def set_budget(conn: Conn, tenant: str, pool_id: str, gpu_ms: int, period_ms: int) -> None:
    conn.execute("DELETE FROM budgets WHERE tenant_id = ? AND pool_id = ?", (tenant, pool_id))
    conn.execute(
        "INSERT INTO budgets(tenant_id, pool_id, gpu_ms, period_ms) VALUES (?, ?, ?, ?)",
        (tenant, pool_id, gpu_ms, period_ms),
    )


def budgets(conn: Conn, tenant: str, pool_id: str | None = None) -> list[Budget]:
    """A tenant's budgets by pool id ('' first); with `pool_id`, those binding a request there:
    that pool's and the tenant-wide one."""

    def read() -> list[Budget]:
        sql = "SELECT pool_id, gpu_ms, period_ms FROM budgets WHERE tenant_id = ?"
        args: list[object] = [tenant]
        if pool_id is not None:
            sql += " AND pool_id IN ('', ?)"
            args.append(pool_id)
        rows = conn.execute(sql + " ORDER BY pool_id", args)
        return [Budget(str(p), int(g), int(w)) for p, g, w in rows]

    return settled.kept(conn, ("budgets", tenant, pool_id), read)


def booked_gpu_ms(conn: Conn, tenant: str, pool_id: str, window: Window, ignore: str | None) -> int:
    """GPU-milliseconds of the tenant's bookings inside `window` (in one pool, or every pool for
    ''), released reservations' past included: what was held is spent. `ignore`: a reservation
    whose bookings are being replaced (update, extend). One range of the bookings_tenant index."""
    sql = (
        'SELECT COALESCE(SUM((CASE WHEN b."end" < ? THEN b."end" ELSE ? END)'
        " - (CASE WHEN b.start > ? THEN b.start ELSE ? END)), 0)"
        ' FROM bookings b WHERE b.tenant_id = ? AND b."end" > ? AND b.start < ?'
    )
    args: list[object] = [window.end, window.end, window.start, window.start, tenant]
    args += [window.start, window.end]
    sql = _narrowed(sql, args, pool_id, ignore, pool="b.pool_id", own="b.reservation_id")
    return int(conn.execute(sql, args).fetchone()[0])


def booked_spans(
    conn: Conn, tenant: str, pool_id: str, window: Window, ignore: str | None
) -> list[tuple[int, int, int]]:
    """(start, end, GPUs) of the tenant's bookings that meet `window`, as booked_gpu_ms counts
    them, one row per distinct span (a reservation's GPUs share theirs)."""
    sql = (
        'SELECT b.start, b."end", COUNT(*) FROM bookings b'
        ' WHERE b.tenant_id = ? AND b."end" > ? AND b.start < ?'
    )
    args: list[object] = [tenant, window.start, window.end]
    sql = _narrowed(sql, args, pool_id, ignore, pool="b.pool_id", own="b.reservation_id")
    rows = conn.execute(sql + ' GROUP BY b.start, b."end"', args)
    return [(int(a), int(b), int(n)) for a, b, n in rows]


def pending_wants(
    conn: Conn, tenant: str, pool_id: str, ignore: str | None
) -> list[tuple[int | None, int, int]]:
    """(start, duration_ms, quota_charge) of the tenant's pending reservations: admitted, so they
    count against the budget for the window a retry would book."""
    sql = (
        "SELECT start, duration_ms, quota_charge FROM reservations"
        " WHERE tenant_id = ? AND state = 'pending' AND state <> 'released'"
    )
    args: list[object] = [tenant]
    sql = _narrowed(sql, args, pool_id, ignore, pool="pool_id", own="id")
    return [(None if s is None else int(s), int(d), int(c)) for s, d, c in conn.execute(sql, args)]


def _narrowed(
    sql: str, args: list[object], pool_id: str, ignore: str | None, *, pool: str, own: str
) -> str:
    """`sql` kept to one pool (every pool for '') and without the reservation `ignore` (one
    whose bookings are being replaced); the values are appended to `args`."""
    if pool_id:
        sql += f" AND {pool} = ?"
        args.append(pool_id)
    if ignore is not None:
        sql += f" AND {own} != ?"
        args.append(ignore)
    return sql
