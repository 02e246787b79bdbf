"""`list`: reservations a principal may see, narrowed by tenant, pool, key and states.

Apart from service/booking.py so that `list` loads no placement code (issue 8: start-up), and
read page by page so that a listing of thousands never holds them all as objects at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from better_compute.errors import InvalidInput
from better_compute.model import Reservation, State
from better_compute.service import authz
from better_compute.service.context import Ctx
from better_compute.storage import fleet, listing, repo
from better_compute.storage.listing import ListedReservation

T = TypeVar("T")


def pages(
    ctx: Ctx,
    tenant: str | None,
    pool: str | None,
    state_names: list[str],
    key: str | None = None,
) -> Iterator[list[Reservation]]:
    """The reservations, oldest first, a page at a time, all read in one read transaction.

    Bad input (an unknown state, tenant or pool, a tenant not this principal's) is raised by
    the first `next()`, before any page: a caller that writes pages as they come writes none."""
    yield from _pages(ctx, tenant, pool, state_names, key, fleet.reservation_pages)


def listed_pages(
    ctx: Ctx,
    tenant: str | None,
    pool: str | None,
    state_names: list[str],
    key: str | None = None,
) -> Iterator[list[ListedReservation]]:
    """`pages`, as the checked rows `list --json` prints (storage/listing.py): no model objects."""
    yield from _pages(ctx, tenant, pool, state_names, key, listing.reservation_pages)


def _pages(
    ctx: Ctx,
    tenant: str | None,
    pool: str | None,
    state_names: list[str],
    key: str | None,
    read: Callable[..., Iterator[list[T]]],
) -> Iterator[list[T]]:
    allowed = {s.value for s in State}
    for name in state_names:
        if name not in allowed:
            names = ", ".join(s.value for s in State)
            raise InvalidInput(f"--state {name!r} is not a state; use one of {names}")
    with ctx.db.read() as conn:
        tenants: list[str] | None = None
        if tenant is not None:
            repo.require_tenant(conn, tenant)
            authz.require_tenant(conn, ctx.who, tenant)
            tenants = [tenant]
        elif (seen := authz.visible_tenants(conn, ctx.who)) is not None:
            tenants = list(seen)
        pool_id = repo.find_pool(conn, pool)["id"] if pool is not None else None
        yield from read(conn, tenants=tenants, pool_id=pool_id, key=key, states=state_names)


def reservations(
    ctx: Ctx,
    tenant: str | None,
    pool: str | None,
    state_names: list[str],
    key: str | None = None,
) -> list[Reservation]:
    """Every page of `pages`, as one list."""
    return [rsv for page in pages(ctx, tenant, pool, state_names, key) for rsv in page]
