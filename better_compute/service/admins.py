"""The admin list (PRODUCT.md §3, §6): who may change the fleet and the rules, and use `--as`."""

from __future__ import annotations

from better_compute.errors import Conflict, NotFound
from better_compute.service import fanout
from better_compute.service.authz import principal_name, require_admin
from better_compute.service.context import Ctx
from better_compute.storage import ledger

WHAT = "add or remove admins"


def add(ctx: Ctx, name: str) -> list[str]:
    require_admin(ctx.who, WHAT)
    principal_name(name, "admin add")
    with ctx.write() as conn:
        fanout.fan_out_in(ctx, conn, tick=False)
        if not ledger.add_admin(conn, name, ctx.now, ctx.principal):
            raise Conflict(f"{name!r} is already an admin")
        ctx.event("admin.added", None, None, {"principal": name})
        return ledger.admins(conn)


def remove(ctx: Ctx, name: str) -> list[str]:
    """The last admin stays: a ledger nobody may administer could only be replaced by hand."""
    require_admin(ctx.who, WHAT)
    with ctx.write() as conn:
        current = ledger.admins(conn)
        if name not in current:
            raise NotFound(f"{name!r} is not an admin; admins: {', '.join(current)}")
        if current == [name]:
            raise Conflict(f"{name!r} is the last admin; add another before removing it")
        fanout.fan_out_in(ctx, conn, tick=False)
        ledger.remove_admin(conn, name)
        ctx.event("admin.removed", None, None, {"principal": name})
        return ledger.admins(conn)


def list_(ctx: Ctx) -> list[str]:
    """Open to anyone: who to ask for a quota or a cordon, and what every `admin.added` event
    in the log (open to anyone, as the fleet's events are) says already. Admins-only, it hid
    nothing the log did not show (a review)."""
    with ctx.db.read() as conn:
        return ledger.admins(conn)
