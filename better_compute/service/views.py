"""Read-only answers: pool rollups, node desired state, the timeline, the event log."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial

from better_compute.errors import InvalidInput
from better_compute.model import Event, Window
from better_compute.service import authz
from better_compute.service.context import Ctx
from better_compute.storage import buckets, fleet, repo
from better_compute.storage.conn import Conn, Row
from better_compute.timeparse import MAX_MS, iso

HOUR_MS = 3_600_000
MINUTE_MS = 60_000
MAX_SPAN_MS = 7 * 24 * HOUR_MS


@dataclass(frozen=True)
class Rollup:
    pool_id: str
    name: str
    labels: tuple[tuple[str, str], ...]
    nodes: int
    gpus: int
    allocatable: int
    in_use: int
    reserved: int
    free: int


def rollup(conn: Conn, row: Row, now: int) -> Rollup:
    """Counted in SQL: no node or booking becomes a Python object (issue 8)."""
    pool_id = row["id"]
    nodes, gpus, usable = repo.pool_inventory_counts(conn, pool_id, now)
    busy, reserved = fleet.pool_use(conn, pool_id, now)
    # Free counts allocatable GPUs with no booking now: a GPU in use that is not allocatable
    # (quarantined, or on a node cordoned, unreachable or in maintenance since it was booked)
    # takes none of them (a review: free read one short of what reserve then placed).
    idle = 0
    if usable != gpus:
        idle = fleet.in_use_among(conn, pool_id, now, fleet.unallocatable(conn, pool_id, now))
    return Rollup(
        pool_id=pool_id,
        name=row["name"],
        labels=repo.pool_labels(conn, row),
        nodes=nodes,
        gpus=gpus,
        allocatable=usable,
        in_use=busy,
        reserved=int(reserved),
        free=max(0, usable - (busy - idle)),  # §4's allocatable − inUse, of allocatable GPUs
    )


def pools(ctx: Ctx) -> list[Rollup]:
    with ctx.db.read() as conn:
        return [rollup(conn, row, ctx.now) for row in repo.pool_rows(conn)]


def pool(ctx: Ctx, ref: str) -> Rollup:
    with ctx.db.read() as conn:
        return rollup(conn, repo.find_pool(conn, ref), ctx.now)


@dataclass(frozen=True)
class Assignment:
    """One line of a node's desired state: what it should be running."""

    reservation_id: str
    tenant_id: str
    allocation_id: str
    atoms: tuple[int, ...]
    state: str
    start: int
    end: int
    bound: bool


def desired_state(conn: Conn, node: str, now: int) -> list[Assignment]:
    """Derived from binding and active reservations, so it can never drift from the bookings;
    as of `now`: one whose end has come is left out though no tick has released it yet (its
    GPUs are free to pool show and preview, so a node agent must not keep running it), and so
    is one asked about before its start."""
    rows = [
        r
        for r in repo.node_assignment_rows(conn, node)
        if r["during_start"] <= now < r["during_end"]
    ]
    return [
        Assignment(
            r["id"],
            r["tenant_id"],
            r["alloc"],
            repo.decoded(conn, f"allocation {r['alloc']}", partial(repo.atom_list, r["atoms"])),
            r["state"],
            r["during_start"],
            r["during_end"],
            bool(r["bound"]),
        )
        for r in rows
    ]


@dataclass(frozen=True)
class Bucket:
    """`booked` and `free` are the pool's; `tenant_booked` is one tenant's share of `booked`, set
    only when the timeline was asked for a tenant."""

    start: int
    end: int
    booked: int
    free: int
    tenant_booked: int | None = None


@dataclass(frozen=True)
class Timeline:
    pool_id: str
    pool_name: str
    allocatable: int
    step_minutes: int
    buckets: tuple[Bucket, ...]
    tenant: str | None = None


def timeline(
    ctx: Ctx,
    pool_ref: str | None,
    tenant: str | None,
    start: int | None,
    end: int | None,
    step_minutes: int,
) -> Timeline:
    """Booked GPUs over time: distinct atoms with any booking overlapping each bucket (§5.7)."""
    if not 5 <= step_minutes <= 1440:
        raise InvalidInput(f"--step must be from 5 to 1440 minutes, got {step_minutes}")
    first = start if start is not None else ctx.now - ctx.now % HOUR_MS
    last = end if end is not None else first + 24 * HOUR_MS
    if last <= first:
        raise InvalidInput("--to must be after --from")
    if last > MAX_MS:
        raise InvalidInput(f"a timeline ends by {iso(MAX_MS)}; give an earlier --from or --to")
    if last - first > MAX_SPAN_MS:
        raise InvalidInput("a timeline spans at most 7 days; narrow --from/--to")
    step = step_minutes * MINUTE_MS
    count = -(-(last - first) // step)
    limit = ctx.settings.timeline_max_buckets
    if count > limit:
        raise InvalidInput(
            f"that is {count} buckets; at most {limit}: widen --step or narrow the range"
        )
    with ctx.db.read() as conn:
        row = repo.find_pool(conn, pool_ref)
        if tenant is not None:
            repo.require_tenant(conn, tenant)
            authz.require_tenant(conn, ctx.who, tenant)
        # Only the allocatable count: a full rollup would also count every future booking.
        _, gpus, allocatable = repo.pool_inventory_counts(conn, row["id"], ctx.now)
        # Free is always the pool's: another tenant's booking is just as taken (issue 7).
        window = Window(first, last)
        booked = buckets.booked_per_bucket(conn, row["id"], window, step)
        # ... of allocatable GPUs: booked ones that are not (as in rollup) take none of them.
        idle = [0] * count
        if allocatable != gpus:
            gone = fleet.unallocatable(conn, row["id"], ctx.now)
            idle = buckets.booked_among(conn, row["id"], window, step, gone)
        own = (
            None
            if tenant is None
            else buckets.fold(repo.booking_buckets(conn, row["id"], window, step, tenant), count)
        )
    made = []
    for i in range(count):
        b = Window(first + i * step, min(first + (i + 1) * step, last))
        mine = None if own is None else own[i]
        free = max(0, allocatable - (booked[i] - idle[i]))
        made.append(Bucket(b.start, b.end, booked[i], free, mine))
    return Timeline(row["id"], row["name"], allocatable, step_minutes, tuple(made), tenant)


def follow_events(
    ctx: Ctx,
    tenant: str | None,
    reservation: str | None,
    since: int | None,
    on_event: Callable[[Event], None],
    poll_seconds: float = 0.5,
) -> None:
    """Hand over each matching event as it is committed, until interrupted (`events --follow`).

    A page at a time, each read in a read transaction of its own that ends before any of it
    is handed over: a consumer that stops reading (a full pipe) holds no snapshot open, which
    would keep `init --force` or a migration waiting on PostgreSQL and the WAL growing on
    SQLite. The sequence number is the cursor; a short page means the log is read to its end,
    and the next look waits `poll_seconds`.
    """
    cursor = since
    while True:
        page = _one_page(ctx, tenant, reservation, cursor)
        for event in page:
            on_event(event)
            cursor = event.seq
        if len(page) < repo.EVENT_PAGE:
            time.sleep(poll_seconds)


def _one_page(
    ctx: Ctx, tenant: str | None, reservation: str | None, since: int | None
) -> list[Event]:
    """event_pages' first page, its read transaction ended."""
    pages = event_pages(ctx, tenant, reservation, since, first_page=True)
    try:
        return next(pages, [])
    finally:
        pages.close()


def event_pages(
    ctx: Ctx,
    tenant: str | None,
    reservation: str | None,
    since: int | None,
    *,
    first_page: bool = False,
) -> Generator[list[Event], None, None]:
    """`events`, a page at a time, in one read transaction; bad input is raised by the first
    `next()`, before any page. `first_page`: that page only."""
    with ctx.db.read() as conn:
        who = ctx.principal_now(conn)  # each page of a follow: rights as they stand
        if tenant is not None:
            repo.require_tenant(conn, tenant)
            authz.require_tenant(conn, who, tenant)
        if reservation is not None:
            rsv = repo.get_reservation(conn, reservation)
            authz.require_visible(conn, who, rsv.id, rsv.tenant_id)
        if since is not None:  # seqs are positive SQLite integers: clamp so any --since works
            since = max(0, min(since, 2**63 - 1))
        seen = authz.visible_tenants(conn, who)
        yield from repo.event_pages(conn, tenant, reservation, since, seen, first_page=first_page)
