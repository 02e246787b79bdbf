"""The last step of a tick: `reservation.starting` and `reservation.expiring`, once per reservation
(lifecycle/notices.py decides; the notices table remembers what was given)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from better_compute.lifecycle.notices import EXPIRING, RUNNING, STARTING, due_expiring, due_starting
from better_compute.model import JsonValue, Reservation
from better_compute.service.context import Ctx
from better_compute.service.fleet import Looked
from better_compute.storage import repo, tickwork, webhooks
from better_compute.storage import simulation as store


def give_due(
    ctx: Ctx,
    placed: Sequence[Reservation] | None = None,
    held: Mapping[str, Reservation] | None = None,
) -> Looked | None:
    """Inside the tick's transaction, after BookingRepair and binding (PRODUCT.md §5.4).

    `placed`: the placed reservations that start by now + repair.leadMs, as they stand (the tick
    has them already); None reads them. `held`: other reservations the tick holds as stored
    (those it made active), not read again. Returns what a replay's next tick may skip looking
    at again (None without a fleet): the caller keeps it once the transaction has committed."""
    conn = ctx.db.conn
    lead = ctx.settings.repair_lead_ms
    if placed is None:
        placed = repo.placed_starting_by(conn, ctx.now + lead)
    for rsv in placed:
        if due_starting(rsv, ctx.now, lead):
            _once(ctx, rsv, STARTING, {"start": _start(rsv), "nodeIds": _nodes(rsv)})
    notice = ctx.settings.notice_expiring_ms
    by = ctx.now + notice
    version = store.data_version_of(ctx.db) if ctx.fleet is not None else 0
    ending, seen = _ending(ctx, by, version)
    for rsv in _held_or_read(ctx, ending, held or {}):
        if due_expiring(rsv, ctx.now, notice):  # read as not noticed yet: no probe again
            _give(ctx, rsv, EXPIRING, {"end": _end(rsv), "nodeIds": _nodes(rsv)})
    if ctx.fleet is None:
        return None
    # The version read inside this write transaction is the one after its commit: only other
    # connections' commits change it. Events this step wrote after `seen` are read again by
    # the next look, which finds them noticed.
    return Looked(version, notice, by, repo.last_event_seq(conn) if seen is None else seen)


def _ending(ctx: Ctx, by: int, version: int) -> tuple[list[str], int | None]:
    """Running reservations ending in (now, by] with no expiring notice yet, oldest first; and
    the newest event the look read (None when it looked everywhere).

    A replay's ticks (a fleet in memory) look again only at what can have changed since their
    last look: ends past what it covered, and reservations named by an event since. Every
    change to a reservation's state or window is written with an event on it, and a notice is
    never taken back; another process's commit voids the last look (PRAGMA data_version,
    `version`)."""
    conn = ctx.db.conn
    running = [s.value for s in RUNNING]
    last = ctx.fleet.looked if ctx.fleet is not None else None
    if (
        last is not None
        and last.notice_ms == ctx.settings.notice_expiring_ms
        and last.version == version
    ):
        return tickwork.expiring_since(conn, ctx.now, by, last.through, last.seen, running)
    return webhooks.ending_between(conn, ctx.now, by, running), None


def _held_or_read(
    ctx: Ctx, ids: Sequence[str], held: Mapping[str, Reservation]
) -> list[Reservation]:
    """These reservations as stored, oldest first: those held as they are, the others read."""
    found = {i: held[i] for i in ids if i in held}
    found.update(
        (r.id, r)
        for r in tickwork.reservations_named(ctx.db.conn, [i for i in ids if i not in held])
    )
    return sorted(found.values(), key=lambda r: r.seq)


def _once(ctx: Ctx, rsv: Reservation, type_: str, data: dict[str, JsonValue]) -> None:
    if not webhooks.noticed(ctx.db.conn, rsv.id, type_):
        _give(ctx, rsv, type_, data)


def _give(ctx: Ctx, rsv: Reservation, type_: str, data: dict[str, JsonValue]) -> None:
    webhooks.mark_noticed(ctx.db.conn, rsv.id, type_)
    ctx.event(type_, rsv.tenant_id, rsv.id, data)


def _start(rsv: Reservation) -> int | None:
    return rsv.during.start if rsv.during else None


def _end(rsv: Reservation) -> int | None:
    return rsv.during.end if rsv.during else None


def _nodes(rsv: Reservation) -> list[JsonValue]:
    return [a.node_id for a in rsv.allocations]
