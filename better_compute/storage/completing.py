"""SQL for shell completion (issue 12): names only, cheap, newest reservations first."""

from __future__ import annotations

from collections.abc import Sequence

from better_compute.storage.repo import Conn, among

#: At most this many reservation ids are offered (a shell shows the first screenful anyway).
MAX_IDS = 200


def node_names(conn: Conn) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT name FROM nodes ORDER BY name")]


def pool_names(conn: Conn) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT name FROM pools ORDER BY name")]


def own_reservation_ids(conn: Conn, principal: str, tenants: Sequence[str] | None) -> list[str]:
    """The principal's own reservations that are not released, newest first, of `tenants` only
    (None: of any tenant): one made for a tenant it may no longer see is NOT_FOUND to it now."""
    sql = "SELECT id FROM reservations WHERE principal = ? AND state != 'released'"
    args: list[object] = [principal]
    if tenants is not None:
        sql += f" AND {among('tenant_id', len(tenants))}"
        args.extend(tenants)
    rows = conn.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, MAX_IDS))
    return [str(r[0]) for r in rows]
