"""Finding reservations (issue 12): names and labels given at `reserve`, and `list`'s filters.

A name is free text for people (`pretrain run 7`); labels are key=value pairs for scripts
(`team=vision`). Neither is part of placement; both are in the reservation's JSON and its
`reservation.created` event.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from better_compute.errors import InvalidInput
from better_compute.inventory import label_pairs
from better_compute.model import Reservation, State
from better_compute.service import authz, listing
from better_compute.service.context import Ctx
from better_compute.storage import finding, repo
from better_compute.storage.listing import ListedReservation
from better_compute.timeparse import parse_time

MAX_NAME = 200
SORTS = ("created", "start")

Labels = tuple[tuple[str, str], ...]


def check_name(name: str | None, flag: str = "--name") -> str | None:
    """Printable text, 1 to 200 characters: it is shown in tables and matched exactly."""
    if name is None:
        return None
    if not name.strip() or len(name) > MAX_NAME or not name.isprintable():
        raise InvalidInput(
            f"{flag} must be 1 to {MAX_NAME} printable characters (no newlines or tabs),"
            f" got {name[:40]!r}"
        )
    return name


def parse_labels(pairs: Sequence[str], flag: str = "--label") -> Labels:
    """A reservation's `k=v` labels (inventory.label_pairs)."""
    return label_pairs(pairs, flag, "team=vision")


@dataclass(frozen=True)
class Filters:
    """`list`'s flags, as typed (times are read against the ledger's now)."""

    tenant: str | None = None
    pool: str | None = None
    states: Sequence[str] = ()
    key: str | None = None
    name: str | None = None
    labels: Sequence[str] = ()
    since: str | None = None
    until: str | None = None
    sort: str = "created"


def pages(ctx: Ctx, f: Filters) -> Iterator[list[Reservation]]:
    """`list`, a page at a time: without issue 12's filters, issue 8's paged read
    (service/listing.py); with them, the matching reservations as one page. Bad input is raised
    by the first `next()`, before any page."""
    plain = f.name is None and not f.labels and f.since is None and f.until is None
    if plain and f.sort == "created":
        yield from listing.pages(ctx, f.tenant, f.pool, list(f.states), f.key)
        return
    yield list_reservations(ctx, f)


def json_pages(ctx: Ctx, f: Filters) -> Iterator[Sequence[Reservation | ListedReservation]]:
    """`pages` for `list --json`: without issue 12's filters, the checked rows of issue 8's
    paged read, which render.json writes without making model objects."""
    plain = f.name is None and not f.labels and f.since is None and f.until is None
    if plain and f.sort == "created":
        yield from listing.listed_pages(ctx, f.tenant, f.pool, list(f.states), f.key)
        return
    yield list_reservations(ctx, f)


def list_reservations(ctx: Ctx, f: Filters) -> list[Reservation]:
    """The reservations this principal may see that match every filter; `--sort start` orders
    them by the start of their window (a pending one: when a retry now would start it)."""
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
        query = finding.Query(
            tenants, pool_id, f.key, tuple(f.states), f.name, labels, since, until
        )
        rows = finding.find(conn, query, ctx.now)
    if f.sort == "start":
        rows.sort(key=lambda r: (_start_of(r, ctx.now), r.seq))
    return rows


def _start_of(rsv: Reservation, now: int) -> float:
    if rsv.during is not None:
        return rsv.during.start
    if rsv.state == State.PENDING:
        return max(rsv.start or now, now)
    return float("inf")  # released before it held any time: last
