"""Webhooks, their delivery queue, and notices given once per reservation: every SQL statement of
issue 11. Portable SQL (`?` placeholders, no SQLite-only functions) for the PostgreSQL backend.

The queue is one row per (webhook, event). Per webhook, the queued row with the lowest event seq
is its head: only the head is ever sent, so events arrive in seq order. A tick claims a head in a
write transaction (claim token, claim_until on the real clock) before sending it, so two ticks
never send the same attempt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

from better_compute.errors import NotFound
from better_compute.model import Delivery, DeliveryAttempt, Event, Webhook
from better_compute.storage.conn import Row
from better_compute.storage.repo import (
    EVENT_COLUMNS,
    Conn,
    _event,
    _int,
    _json_of,
    _opt_int,
    _opt_str,
    _str,
    among,
    damaged,
    decoded,
)

QUEUED = "queued"
DELIVERED = "delivered"
DEAD = "dead"

# ---------------------------------------------------------------- webhooks


def insert_webhook(conn: Conn, hook: Webhook) -> None:
    seq = int(conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM webhooks").fetchone()[0])
    conn.execute(
        "INSERT INTO webhooks(id, seq, tenant_id, url, events, secret, created_at, created_by,"
        " cursor) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            hook.id,
            seq,
            hook.tenant_id,
            hook.url,
            json.dumps(list(hook.events)),
            hook.secret,
            hook.created_at,
            hook.created_by,
            hook.cursor,
        ),
    )


def _webhook(r: Row) -> Webhook:
    return Webhook(
        id=_str(r["id"]),
        tenant_id=_str(r["tenant_id"]),
        url=_str(r["url"]),
        events=tuple(_str(t) for t in _json_of(r["events"], list)),
        secret=_str(r["secret"]),
        created_at=_int(r["created_at"]),
        created_by=_str(r["created_by"]),
        cursor=_int(r["cursor"]),
    )


def webhooks(conn: Conn, tenants: Sequence[str] | None = None) -> list[Webhook]:
    """Every webhook in creation order; `tenants` (when given) limits them to those tenants'."""
    sql, args = "SELECT * FROM webhooks", []  # type: tuple[str, list[object]]
    if tenants is not None:
        sql += f" WHERE tenant_id IN ({','.join('?' * len(tenants)) or 'NULL'})"
        args.extend(tenants)
    rows = conn.execute(sql + " ORDER BY seq", args).fetchall()
    return [decoded(conn, f"webhook {r['id']}", partial(_webhook, r)) for r in rows]


def get_webhook(conn: Conn, hook_id: str) -> Webhook:
    row = conn.execute("SELECT * FROM webhooks WHERE id = ?", (hook_id,)).fetchone()
    if row is None:
        raise NotFound(f"no webhook {hook_id!r}; `webhook list` shows them")
    return decoded(conn, f"webhook {hook_id}", partial(_webhook, row))


def has_webhooks(conn: Conn, tenants: Sequence[str] | None = None) -> bool:
    """Whether there is any webhook: of any tenant, or of `tenants` only."""
    if tenants is None:
        return conn.execute("SELECT 1 FROM webhooks LIMIT 1").fetchone() is not None
    sql = f"SELECT 1 FROM webhooks WHERE {among('tenant_id', len(tenants))} LIMIT 1"
    return conn.execute(sql, list(tenants)).fetchone() is not None


def delete_webhook(conn: Conn, hook_id: str) -> None:
    """The webhook, its queue and the queue's history."""
    conn.execute(
        "DELETE FROM delivery_attempts WHERE delivery_id IN"
        " (SELECT id FROM deliveries WHERE webhook_id = ?)",
        (hook_id,),
    )
    conn.execute("DELETE FROM deliveries WHERE webhook_id = ?", (hook_id,))
    conn.execute("DELETE FROM webhooks WHERE id = ?", (hook_id,))


def set_cursor(conn: Conn, hook_id: str, cursor: int) -> None:
    conn.execute("UPDATE webhooks SET cursor = ? WHERE id = ?", (cursor, hook_id))


# ---------------------------------------------------------------- the queue


def enqueue(conn: Conn, delivery_id: str, hook_id: str, event_seq: int, at: int) -> None:
    conn.execute(
        "INSERT INTO deliveries(id, webhook_id, event_seq, state, attempts, queued_at, next_at)"
        " VALUES (?, ?, ?, ?, 0, ?, ?)",
        (delivery_id, hook_id, event_seq, QUEUED, at, at),
    )


class Head(NamedTuple):
    """A webhook's head of line, with what the order of sending reads (service/delivery.py)."""

    delivery_id: str
    webhook_id: str
    tenant_id: str
    event_seq: int
    next_at: int
    attempts: int


def heads(conn: Conn) -> list[Head]:
    """Each webhook's head of line, by webhook."""
    rows = conn.execute(
        "SELECT d.id, d.webhook_id, w.tenant_id, d.event_seq, d.next_at, d.attempts"
        " FROM deliveries d"
        " JOIN (SELECT webhook_id, MIN(event_seq) AS head_seq FROM deliveries WHERE state = ?"
        "       GROUP BY webhook_id) h ON h.webhook_id = d.webhook_id AND h.head_seq = d.event_seq"
        " JOIN webhooks w ON w.id = d.webhook_id"
        " ORDER BY d.webhook_id",
        (QUEUED,),
    ).fetchall()
    return [
        Head(_str(r[0]), _str(r[1]), _str(r[2]), _int(r[3]), _int(r[4]), _int(r[5])) for r in rows
    ]


def claim(conn: Conn, delivery_id: str, token: str, until: int, real_now: int) -> bool:
    """Take a delivery for one attempt unless another tick holds an unexpired claim on it."""
    cur = conn.execute(
        "UPDATE deliveries SET claim = ?, claim_until = ? WHERE id = ? AND state = ?"
        " AND (claim IS NULL OR claim_until <= ?)",
        (token, until, delivery_id, QUEUED, real_now),
    )
    return cur.rowcount == 1


def holds_claim(conn: Conn, delivery_id: str, token: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM deliveries WHERE id = ? AND claim = ? AND state = ?",
        (delivery_id, token, QUEUED),
    ).fetchone()
    return row is not None


def record_attempt(
    conn: Conn,
    delivery_id: str,
    at: int,
    status: int | None,
    error: str | None,
    state: str,
    next_at: int,
) -> None:
    """One attempt's outcome; the claim is given back with it."""
    n = int(
        conn.execute(
            "SELECT COALESCE(MAX(n), 0) + 1 FROM delivery_attempts WHERE delivery_id = ?",
            (delivery_id,),
        ).fetchone()[0]
    )
    conn.execute(
        "INSERT INTO delivery_attempts(delivery_id, n, at, status, error) VALUES (?, ?, ?, ?, ?)",
        (delivery_id, n, at, status, error),
    )
    conn.execute(
        "UPDATE deliveries SET state = ?, attempts = attempts + 1, next_at = ?, claim = NULL,"
        " claim_until = NULL WHERE id = ?",
        (state, next_at, delivery_id),
    )


def requeue(conn: Conn, delivery_id: str, at: int) -> None:
    """Queue it again with a fresh retry period (redeliver)."""
    conn.execute(
        "UPDATE deliveries SET state = ?, queued_at = ?, next_at = ?, claim = NULL,"
        " claim_until = NULL WHERE id = ?",
        (QUEUED, at, at, delivery_id),
    )


def progress(conn: Conn, delivery_id: str) -> tuple[int, int]:
    """(attempts so far, when its retry period began)."""
    row = conn.execute(
        "SELECT attempts, queued_at FROM deliveries WHERE id = ?", (delivery_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"no delivery {delivery_id!r}")
    return _int(row[0]), _int(row[1])


def event_of(conn: Conn, seq: int) -> Event:
    """The event a delivery carries, as the log holds it."""
    row = conn.execute(f"SELECT {EVENT_COLUMNS} FROM events WHERE seq = ?", (seq,)).fetchone()
    if row is None:
        raise damaged(conn, f"event {seq}", LookupError("a delivery names an event not in the log"))
    return decoded(conn, f"event {seq}", partial(_event, row))


def queued_ids(conn: Conn, webhook_id: str) -> list[str]:
    """The deliveries still queued for this webhook."""
    rows = conn.execute(
        "SELECT id FROM deliveries WHERE webhook_id = ? AND state = ? ORDER BY event_seq",
        (webhook_id, QUEUED),
    )
    return [str(r[0]) for r in rows]


def queued_count(conn: Conn, tenants: Sequence[str] | None = None) -> int:
    """Deliveries still queued: of every webhook, or of those of `tenants` only."""
    sql, args = "SELECT COUNT(*) FROM deliveries d", [QUEUED]
    if tenants is not None:
        sql += " JOIN webhooks w ON w.id = d.webhook_id AND " + among("w.tenant_id", len(tenants))
        args = [*tenants, QUEUED]
    return int(conn.execute(sql + " WHERE d.state = ?", args).fetchone()[0])


def _delivery(r: Row, history: tuple[DeliveryAttempt, ...]) -> Delivery:
    return Delivery(
        id=_str(r["id"]),
        webhook_id=_str(r["webhook_id"]),
        event_seq=_int(r["event_seq"]),
        state=_str(r["state"]),
        attempts=_int(r["attempts"]),
        queued_at=_int(r["queued_at"]),
        next_at=_int(r["next_at"]),
        event_type=_str(r["type"]),
        history=history,
        behind=_opt_int(r["behind"]),
    )


def _attempt(r: Row) -> DeliveryAttempt:
    return DeliveryAttempt(_int(r["n"]), _int(r["at"]), _opt_int(r["status"]), _opt_str(r["error"]))


def deliveries(
    conn: Conn,
    hook_ids: Sequence[str],
    *,
    state: str | None = None,
    delivery_id: str | None = None,
) -> list[Delivery]:
    """Deliveries of these webhooks, in (webhook, seq) order, each with its attempts."""
    if not hook_ids:
        return []
    clauses = [f"d.webhook_id IN ({','.join('?' * len(hook_ids))})"]
    args: list[object] = list(hook_ids)
    if state is not None:
        clauses.append("d.state = ?")
        args.append(state)
    if delivery_id is not None:
        clauses.append("d.id = ?")
        args.append(delivery_id)
    rows = conn.execute(
        "SELECT d.*, e.type, CASE WHEN d.state = 'queued' THEN"
        " (SELECT MIN(h.event_seq) FROM deliveries h WHERE h.webhook_id = d.webhook_id"
        "  AND h.state = 'queued' AND h.event_seq < d.event_seq) END AS behind"
        " FROM deliveries d JOIN events e ON e.seq = d.event_seq"
        f" WHERE {' AND '.join(clauses)} ORDER BY d.webhook_id, d.event_seq",
        args,
    ).fetchall()
    history: dict[str, list[DeliveryAttempt]] = {}
    ids = [r["id"] for r in rows]
    for start in range(0, len(ids), 500):  # bounded IN lists
        chunk = ids[start : start + 500]
        for a in conn.execute(
            "SELECT * FROM delivery_attempts"
            f" WHERE delivery_id IN ({','.join('?' * len(chunk))}) ORDER BY delivery_id, n",
            chunk,
        ):
            history.setdefault(a["delivery_id"], []).append(
                decoded(conn, "a delivery attempt", partial(_attempt, a))
            )
    return [
        decoded(conn, f"delivery {r['id']}", partial(_delivery, r, tuple(history.get(r["id"], []))))
        for r in rows
    ]


# ---------------------------------------------------------------- notices


def noticed(conn: Conn, rsv_id: str, type_: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM notices WHERE reservation_id = ? AND type = ?", (rsv_id, type_)
    ).fetchone()
    return row is not None


def mark_noticed(conn: Conn, rsv_id: str, type_: str) -> None:
    conn.execute("INSERT INTO notices(reservation_id, type) VALUES (?, ?)", (rsv_id, type_))


def forget_start_notice(conn: Conn, rsv_id: str) -> None:
    """A booking placed anew (another start or other nodes: update, a failed repair, a requeued
    spot victim) gets its own `reservation.starting` notice; issue 11 gives each one once."""
    conn.execute(
        "DELETE FROM notices WHERE reservation_id = ? AND type = 'reservation.starting'",
        (rsv_id,),
    )


def ending_between(conn: Conn, after: int, by: int, states: Sequence[str]) -> list[str]:
    """Ids of reservations in `states` whose window ends in (after, by], with no expiring notice
    yet, oldest first."""
    rows = conn.execute(
        "SELECT r.id FROM reservations r"
        f" WHERE r.state IN ({','.join('?' * len(states))}) AND r.state <> 'released'"
        " AND r.during_end > ? AND r.during_end <= ?"
        " AND NOT EXISTS (SELECT 1 FROM notices n WHERE n.reservation_id = r.id"
        "   AND n.type = 'reservation.expiring')"
        " ORDER BY r.seq",
        (*states, after, by),
    ).fetchall()
    return [_str(r[0]) for r in rows]
