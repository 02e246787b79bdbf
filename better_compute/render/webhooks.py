"""Webhooks and deliveries: the --json documents (key order fixed here) and the views for people."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.table import Table

from better_compute.model import Delivery, Event, JsonValue, Webhook
from better_compute.render.human import short, table_of
from better_compute.render.json import dumps, event

if TYPE_CHECKING:
    from better_compute.service.delivery import Report
    from better_compute.service.webhooks import TestResult


def body(ev: Event) -> str:
    """A delivery's body: the event's JSON exactly as `events --json` prints it (PRODUCT.md §7)."""
    return dumps(event(ev))


def webhook(hook: Webhook, secret: str | None = None) -> dict[str, JsonValue]:
    doc: dict[str, JsonValue] = {
        "id": hook.id,
        "tenantId": hook.tenant_id,
        "url": hook.url,
        "events": list(hook.events),
        "secretFingerprint": hook.fingerprint,
        "createdAt": hook.created_at,
        "createdBy": hook.created_by,
        "suspended": hook.suspended,
    }
    if secret is not None:
        doc["secret"] = secret
    return doc


def added(hook: Webhook, secret: str) -> str:
    return (
        f"added webhook {hook.id} for tenant {hook.tenant_id}: {hook.url}\n"
        "its secret, shown only now (keep it to verify signatures):\n"
        f"{secret}\n"
        f"fingerprint: {hook.fingerprint}"
    )


def webhooks(rows: Sequence[Webhook]) -> RenderableType:
    if not rows:
        return "no webhooks"
    table = table_of()
    _id_column(table, "id", max(len(h.id) for h in rows))
    table.add_column("tenant")
    table.add_column("url", overflow="fold")  # whole, over lines: rows differ at the end
    table.add_column("events", overflow="fold")
    table.add_column("secret", overflow="fold")
    for hook in rows:
        events = ",".join(hook.events) or "all"
        tenant = f"{hook.tenant_id} (suspended)" if hook.suspended else hook.tenant_id
        table.add_row(hook.id, tenant, hook.url, events, hook.fingerprint)
    return table


def _id_column(table: Table, header: str, width: int) -> None:
    """An id column never cut short, whatever the terminal's width: `webhook redeliver`,
    `delete` and `test` take the id exactly as printed."""
    table.add_column(header, no_wrap=True, min_width=max(width, len(header)))


def delivery(d: Delivery) -> dict[str, JsonValue]:
    return {
        "id": d.id,
        "webhookId": d.webhook_id,
        "eventSeq": d.event_seq,
        "eventType": d.event_type,
        "state": d.state,
        "attempts": [
            {"n": a.n, "at": a.at, "status": a.status, "error": a.error} for a in d.history
        ],
        "queuedAt": d.queued_at,
        "nextAttemptAt": d.next_at if d.state == "queued" else None,
        "behindEventSeq": d.behind,
    }


def deliveries(rows: Sequence[Delivery]) -> RenderableType:
    if not rows:
        return "no deliveries"
    table = table_of()
    _id_column(table, "delivery", max(len(d.id) for d in rows))
    _id_column(table, "webhook", max(len(d.webhook_id) for d in rows))
    for column in ("event", "state", "attempts", "last answer"):
        table.add_column(column, overflow="fold")
    for d in rows:
        last = d.history[-1] if d.history else None
        answer = "—"
        if last is not None:
            answer = f"{short(last.at)} " + (last.error or f"HTTP {last.status}")
        state = d.state
        if d.state == "queued":  # only a webhook's head is sent; the rest wait for it to end
            state += f", next {short(d.next_at)}" if d.behind is None else f" behind #{d.behind}"
        table.add_row(
            d.id, d.webhook_id, f"#{d.event_seq} {d.event_type}", state, str(len(d.history)), answer
        )
    return table


def test_result(r: TestResult) -> dict[str, JsonValue]:
    return {
        "webhookId": r.webhook_id,
        "url": r.url,
        "ok": r.ok,
        "status": r.status,
        "error": r.error,
    }


def test_line(r: TestResult) -> str:
    if r.ok:
        return f"{r.webhook_id}: {r.url} answered HTTP {r.status}"
    return f"{r.webhook_id}: {r.url} failed: {r.error}"


def report(r: Report) -> dict[str, JsonValue]:
    return {"sent": r.sent, "failed": r.failed, "deadLettered": r.dead_lettered, "left": r.left}


def report_line(r: Report) -> str:
    return (
        f"deliveries: {r.sent} sent, {r.failed} failed, {r.dead_lettered} dead-lettered,"
        f" {'?' if r.left is None else r.left} left for the next tick"
    )
