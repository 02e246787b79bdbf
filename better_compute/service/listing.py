"""`list`: the reservations a principal may see, narrowed by tenant, pool, key and states, and
by issue 12's name, labels and window; oldest first, or by the start of their window.

Apart from service/booking.py so that `list` loads no placement code (issue 8: start-up), and
read page by page in SQL's order, whichever it is, so that a listing of a fleet never holds
them all as objects at once (`--sort start` used to read every match and sort it in Python).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from better_compute.errors import InvalidInput
from better_compute.model import Reservation, State
from better_compute.service import authz
from better_compute.service.context import Ctx
from better_compute.service.finding import SORTS, Filters, parse_labels
from better_compute.storage import fleet, listing, repo
from better_compute.storage.listing import ListedReservation
from better_compute.timeparse import parse_time

T = TypeVar("T")


def pages(ctx: Ctx, f: Filters) -> Iterator[list[Reservation]]:
    """The reservations `f` selects, in its order, a page at a time, all read in one read
    transaction.

    Bad input (an unknown state or sort, a bad label or time, an unknown tenant or pool, a
    tenant not this principal's) is raised by the first `next()`, before any page: a caller
    that writes pages as they come writes none."""
    yield from _pages(ctx, f, fleet.reservation_pages)


def listed_pages(ctx: Ctx, f: Filters) -> Iterator[Sequence[ListedReservation]]:
    """`pages`, as the checked rows `list --json` prints (storage/listing.py): no model objects."""
    yield from _pages(ctx, f, listing.reservation_pages)


def id_pages(ctx: Ctx, f: Filters) -> Iterator[list[str]]:
    """`pages`, as the reservations' ids alone (`list --ids`)."""
    yield from _pages(ctx, f, listing.id_pages)


def reservations(
    ctx: Ctx,
    tenant: str | None,
    pool: str | None,
    state_names: list[str],
    key: str | None = None,
) -> list[Reservation]:
    """Every page of `pages` without issue 12's filters, oldest first, as one list."""
    f = Filters(tenant, pool, state_names, key)
    return [rsv for page in pages(ctx, f) for rsv in page]


def _pages(
    ctx: Ctx, f: Filters, read: Callable[[repo.Conn, listing.Query, int], Iterator[list[T]]]
) -> Iterator[list[T]]:
    allowed = {s.value for s in State}
    for name in f.states:
        if name not in allowed:
            names = ", ".join(s.value for s in State)
            raise InvalidInput(f"--state {name!r} is not a state; use one of {names}")
    if f.sort not in SORTS:
        raise InvalidInput(f"--sort must be one of {', '.join(SORTS)}, got {f.sort!r}")
    labels = parse_labels(f.labels)
    since = None if f.since is None else parse_time(f.since, ctx.now)
    until = None if f.until is None else parse_time(f.until, ctx.now)
    if since is not None and until is not None and since >= until:
        raise InvalidInput("--from must be before --to")
    with ctx.db.read() as conn:
        tenants: list[str] | None = None
        if f.tenant is not None:
            repo.require_tenant(conn, f.tenant)
            authz.require_tenant(conn, ctx.who, f.tenant)
            tenants = [f.tenant]
        elif (seen := authz.visible_tenants(conn, ctx.who)) is not None:
            tenants = list(seen)
        pool_id = repo.find_pool(conn, f.pool)["id"] if f.pool is not None else None
        query = listing.Query(
            tenants,
            pool_id,
            f.key,
            tuple(f.states),
            f.name,
            labels,
            since,
            until,
            by_start=f.sort == "start",
        )
        yield from read(conn, query, ctx.now)
