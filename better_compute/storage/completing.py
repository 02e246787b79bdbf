"""SQL for shell completion (issue 12): names only, cheap, newest reservations first."""

from __future__ import annotations

from better_compute.storage.repo import Conn

#: At most this many reservation ids are offered (a shell shows the first screenful anyway).
MAX_IDS = 200


def node_names(conn: Conn) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT name FROM nodes ORDER BY name")]


def pool_names(conn: Conn) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT name FROM pools ORDER BY name")]


def own_reservation_ids(conn: Conn, principal: str) -> list[str]:
    """The principal's own reservations that are not released, newest first."""
    rows = conn.execute(
        "SELECT id FROM reservations WHERE principal = ? AND state != 'released'"
        " ORDER BY seq DESC LIMIT ?",
        (principal, MAX_IDS),
    )
    return [str(r[0]) for r in rows]
