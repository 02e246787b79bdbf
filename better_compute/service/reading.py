"""Reading one reservation: `get`, and the visibility rule every command that names one applies.

Apart from service/booking.py so that `get` loads no placement code (issue 8: start-up).
"""

from __future__ import annotations

from better_compute.model import Reservation
from better_compute.service import authz
from better_compute.service.context import Ctx
from better_compute.storage import repo


def get(ctx: Ctx, rsv_id: str) -> Reservation:
    with ctx.db.read():
        return mine(ctx, rsv_id)


def mine(ctx: Ctx, rsv_id: str) -> Reservation:
    """A reservation of a tenant this principal acts for; any other is NOT_FOUND (§6)."""
    rsv = repo.get_reservation(ctx.db.conn, rsv_id)
    authz.require_visible(ctx.db.conn, ctx.who, rsv.id, rsv.tenant_id)
    return rsv
