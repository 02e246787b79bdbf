"""The last step of a tick: `reservation.starting` and `reservation.expiring`, once per reservation
(lifecycle/notices.py decides; the notices table remembers what was given)."""

from __future__ import annotations

from better_compute.lifecycle.notices import EXPIRING, RUNNING, STARTING, due_expiring, due_starting
from better_compute.model import JsonValue, Reservation
from better_compute.service.context import Ctx
from better_compute.storage import repo, webhooks


def give_due(ctx: Ctx) -> None:
    """Inside the tick's transaction, after BookingRepair and binding (PRODUCT.md §5.4)."""
    conn = ctx.db.conn
    lead = ctx.settings.repair_lead_ms
    for rsv in repo.placed_starting_by(conn, ctx.now + lead):
        if due_starting(rsv, ctx.now, lead):
            _once(ctx, rsv, STARTING, {"start": _start(rsv), "nodeIds": _nodes(rsv)})
    notice = ctx.settings.notice_expiring_ms
    running = [s.value for s in RUNNING]
    for rsv_id in webhooks.ending_between(conn, ctx.now, ctx.now + notice, running):
        rsv = repo.get_reservation(conn, rsv_id)
        if due_expiring(rsv, ctx.now, notice):
            _once(ctx, rsv, EXPIRING, {"end": _end(rsv), "nodeIds": _nodes(rsv)})


def _once(ctx: Ctx, rsv: Reservation, type_: str, data: dict[str, JsonValue]) -> None:
    if webhooks.noticed(ctx.db.conn, rsv.id, type_):
        return
    webhooks.mark_noticed(ctx.db.conn, rsv.id, type_)
    ctx.event(type_, rsv.tenant_id, rsv.id, data)


def _start(rsv: Reservation) -> int | None:
    return rsv.during.start if rsv.during else None


def _end(rsv: Reservation) -> int | None:
    return rsv.during.end if rsv.during else None


def _nodes(rsv: Reservation) -> list[JsonValue]:
    return [a.node_id for a in rsv.allocations]
