"""The window search shared by `advice` and `reserve --start-range` (PRODUCT.md §5.6).

engine/search.py walks the instants where a pool's free capacity changes; this module feeds it
those instants (storage/calendar.py) and the real planner (service/placing.py, the one `reserve`
runs, gang planner included) as its fit test, so a window found here is a window `reserve` books.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import replace

from better_compute.engine import calendar as policy_rules
from better_compute.engine import freetime, search
from better_compute.engine.fleet import PoolIndex
from better_compute.engine.place import place
from better_compute.errors import InvalidInput
from better_compute.model import (
    FABRIC_DOMAIN,
    NVLINK_ALL,
    CalendarPolicy,
    Plan,
    Reservation,
    Window,
)
from better_compute.service import placing
from better_compute.service.context import Ctx
from better_compute.storage import calendar as cal
from better_compute.storage import fitting, repo
from better_compute.storage import fleet as fleet_store
from better_compute.timeparse import (
    MAX_DURATION_MS,
    MAX_MS,
    human_duration,
    iso,
    parse_duration,
    parse_range,
)

#: The most windows one `advice` answers.
MAX_LIMIT = 100


def _range(flag: str, text: str, now: int, *, durations: bool = False) -> tuple[int, int]:
    from better_compute.timeparse import parse_time

    try:
        if durations:
            return parse_range(text, parse_duration)
        return parse_range(text, lambda t: parse_time(t, now), allow_equal=True)
    except InvalidInput as exc:
        raise InvalidInput(f"{flag}: {exc.message}") from None


def wanted(
    now: int,
    start_range: str,
    *,
    duration_ms: int | None = None,
    duration_range: str | None = None,
    end_range: str | None = None,
    relative_to: int | None = None,
) -> search.Ask:
    """Read the ranges into the search's Ask; exactly one way of saying the length. Inverted,
    malformed or wholly past ranges are INVALID_INPUT. Relative TIMEs count from `relative_to`
    (Ctx.relative_base), `now` by default."""
    given = [x for x in (duration_ms, duration_range, end_range) if x is not None]
    if len(given) != 1:
        raise InvalidInput(
            "say how long with exactly one of --duration D, --duration-range MIN..MAX or"
            " --end-range FROM..TO"
        )
    base = now if relative_to is None else relative_to
    first, last = _range("--start-range", start_range, base)
    if last < now:
        raise InvalidInput(
            f"--start-range ends at {iso(last)}, before now ({iso(now)}): ask for a future range"
        )
    first = max(first, now)
    if duration_ms is not None:
        if duration_ms <= 0:
            raise InvalidInput("the duration must be positive, such as 90m or 3d")
        return search.Ask(first, last, duration_ms, duration_ms)
    if duration_range is not None:
        lo, hi = _range("--duration-range", duration_range, now, durations=True)
        if lo <= 0:
            raise InvalidInput("--duration-range: MIN must be a positive duration, such as 1d")
        return search.Ask(first, last, lo, hi)
    assert end_range is not None
    end_from, end_to = _range("--end-range", end_range, base)
    if end_to <= first:
        raise InvalidInput(
            f"--end-range ends at {iso(end_to)}, not after the earliest start {iso(first)}"
        )
    # No longer than a DURATION may be: a window `reserve --start S --for D` books as advised.
    return search.Ask(first, last, 1, min(end_to - first, MAX_DURATION_MS), end_from, end_to)


def bounded(
    ask: search.Ask, policy: CalendarPolicy | None, now: int, total_gpus: int
) -> search.Ask | str:
    """The ask narrowed to what the pool's calendar policy allows, or why none of it is."""
    end_to = MAX_MS if ask.end_to is None else min(ask.end_to, MAX_MS)
    if policy is None:
        return replace(ask, end_to=end_to)
    size = policy_rules.size_refusal(policy, total_gpus)
    if size is not None:
        return size
    lo = max(ask.min_ms, policy.min_duration_ms or 0)
    hi = ask.max_ms if policy.max_duration_ms is None else min(ask.max_ms, policy.max_duration_ms)
    if lo > hi:
        asked = human_duration(ask.min_ms)
        if ask.max_ms != ask.min_ms:
            asked += f" to {human_duration(ask.max_ms)}"
        return (
            f"a duration of {asked} is outside the allowed durations"
            f" ({policy_rules.allowed_durations(policy)})"
        )
    first = max(ask.first, policy_rules.earliest_start(policy, now))
    if first > ask.last:
        assert policy.min_lead_ms is not None
        return (
            f"no start up to {iso(ask.last)} respects the minimum lead time"
            f" {human_duration(policy.min_lead_ms)} (start at {iso(first)} or later)"
        )
    horizon = policy_rules.latest_end(policy, now)
    if horizon is not None:
        end_to = min(end_to, horizon)
    narrowed = replace(ask, first=first, min_ms=lo, max_ms=hi, end_to=end_to)
    if narrowed.opening() > narrowed.last or narrowed.ends(narrowed.opening()) is None:
        horizon_text = ""
        if policy.max_horizon_ms is not None:
            horizon_text = f" (the maximum horizon {human_duration(policy.max_horizon_ms)})"
        return (
            f"no window of an allowed length ({policy_rules.allowed_durations(policy)}) that"
            f" starts in range ends by {iso(end_to)}{horizon_text}"
        )
    return narrowed


def fits(ctx: Ctx, draft: Reservation, window: Window) -> bool:
    """Would `reserve` place this draft in this window right now (no preemption)?"""
    return isinstance(placing.plan(ctx, draft, window), Plan)


def fits_among(ctx: Ctx, draft: Reservation, window: Window, names: list[str]) -> bool:
    """`fits`, planning only `names`: every node that could take a share of the window (the
    counted test's superset of the planner's fitting nodes, as storage's shortlist is for
    placing.plan). The same planner over the same fitting nodes: the same yes or no, without
    the shortlist's query over the whole window."""
    if not names:
        return False
    snaps = repo.snapshots(ctx.db.conn, draft.pool_id, window, names=names)
    request = draft.request(window)
    return isinstance(place(request, snaps, seed=0, top_n=1), Plan)


def _tester(ctx: Ctx, draft: Reservation, maybe: freetime.Chunked | None) -> search.Fits:
    """The planner's yes or no for a window: over the counted candidates when they are known
    (for a gang, GANG_FIRST_TRY candidates a member first, then all of them; for a single node,
    the few with the most free time first, and placing.plan's shortlist only if none of those
    fits); before the free time is worked out, over the nodes SQL counts enough free GPUs on
    (`probe`)."""

    def test(window: Window) -> bool:
        found = None if maybe is None else maybe.candidates(window)
        if found is None:
            if maybe is None or draft.gang_size is not None:
                return fits(ctx, draft, window)
            found = probe(ctx, draft, window)
        names = found.names
        if found.complete and draft.gang_size is not None:
            first = names[: GANG_FIRST_TRY * draft.gang_size]
            if len(first) < len(names) and fits_among(ctx, draft, window, first):
                return True
            return fits_among(ctx, draft, window, names)
        if found.complete and len(names) <= FIRST_TRY:
            return fits_among(ctx, draft, window, names)
        # A node of these that fits is a plan the planner over every node finds too.
        return fits_among(ctx, draft, window, names[:FIRST_TRY]) or fits(ctx, draft, window)

    return test


def probe(ctx: Ctx, draft: Reservation, window: Window) -> freetime.Candidates:
    """The nodes with at least the draft's GPUs free for the whole window, counted in SQL (a GPU
    with any booking in the window is not free; quarantined GPUs and maintenance are left to the
    planner): a superset of the nodes a single-node plan can use, whole, in one query."""
    need = draft.gpus or 1
    names = [
        name
        for name, total, booked in cal.free_counts(ctx.db.conn, draft.pool_id, window)
        if total - booked >= need
    ]
    return freetime.Candidates(names, True)


def find(ctx: Ctx, draft: Reservation, ask: search.Ask, limit: int) -> list[Window]:
    """Up to `limit` windows of the draft's pool, earliest start first (engine/search.py)."""
    conn, pool_id = ctx.db.conn, draft.pool_id
    opening = ask.opening()
    if opening > ask.last:
        return []
    maybe = prefilter(ctx, draft, ask)
    return search.windows(
        ask,
        # Read as far as the walk goes: a window found early reads a day of the range.
        search.in_chunks(
            lambda a, b: cal.change_ends(conn, pool_id, a, b), opening, ask.last, CHUNK_MS
        ),
        # Only where a window's end is searched, between its shortest and longest end.
        lambda a, b: cal.change_starts(conn, pool_id, a - 1, b),
        _tester(ctx, draft, maybe),
        limit=limit,
        maybe=maybe,
        reach=None if maybe is None else maybe.reach,
    )


def prefilter(ctx: Ctx, draft: Reservation, ask: search.Ask) -> freetime.Chunked | None:
    """engine/freetime.py's cheap test (enough GPUs free, counted), so that the planner runs only
    at starts that could fit; worked out a chunk of the range at a time, as the search reaches
    it. Quarantined GPUs count as free here (an over-count keeps the test necessary: only the
    planner refuses). None for a node lease (whole machines: the planner alone)."""
    if draft.node_lease or draft.gpus is None:
        return None
    conn, pool_id, need = ctx.db.conn, draft.pool_id, draft.gpus
    length = max(1, ask.min_ms)
    accepted = {m.casefold() for m in draft.models}
    refused = set()
    if accepted:
        refused = {n for n, m in cal.node_models(conn, pool_id) if m.casefold() not in accepted}
    gang = draft.gang_size is not None
    eligible = [
        (name, _group(draft.topology_key, labels, domain) if gang else "", total)
        for name, labels, total, domain in cal.eligible_nodes(
            conn, pool_id, topology=draft.topology_key is not None
        )
        if name not in refused
    ]

    # Whole nodes wanted (no eligible node has more GPUs than asked): any booking is in the way.
    whole = all(total <= need for _, _, total in eligible)
    # Read far enough to bound how long a window may stretch (freetime.Chunked.reach).
    stretch = ask.max_ms if ask.end_to is None else min(ask.max_ms, ask.end_to - ask.first)
    stretch = max(length, min(stretch, MAX_STRETCH_MS))

    size = draft.gang_size or 1
    lazy = not gang  # a single node: read a batch of nodes at a time, as the search asks

    def chunk(first: int, last: int) -> freetime.Free:
        hi = last + stretch
        blocked: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for node, m_start, m_end in cal.maintenance_in(conn, pool_id, first, hi):
            blocked[node].append((m_start, m_end))

        def batches() -> Iterator[list[freetime.NodeFree]]:
            # Lazily, a batch of nodes at a time through the per-node index; eagerly (a gang),
            # the pool's span in one read.
            parts = (
                [eligible[i : i + n] for i, n in _batches(len(eligible))] if lazy else [eligible]
            )
            for part in parts:
                if lazy:
                    busy = cal.held_of(conn, [name for name, _, _ in part], first, hi, whole=whole)
                else:
                    busy = cal.held(conn, pool_id, first, hi, whole=whole)
                yield [
                    freetime.NodeFree(name, group, total, busy.get(name, ()), blocked.get(name, ()))
                    for name, group, total in part
                ]

        return freetime.Free(
            batches(), need=need, size=size, gang=gang, first=first, last=last, length=length,
            horizon=hi, lazy=lazy,
        )  # fmt: skip

    return freetime.Chunked(
        chunk,
        ask.last,
        CHUNK_MS,
        need=need,
        size=size,
        gang=gang,
        length=length,
        enough=FIRST_TRY,
        # A fixed length on one node: the first start is answered by counts in SQL (`probe`).
        plan_first=not gang and ask.min_ms == ask.max_ms and ask.end_from is None,
    )


def _batches(count: int) -> Iterator[tuple[int, int]]:
    """(offset, size) of the batches of nodes a single-node search reads: FIRST_BATCH first,
    then twice as many each time, at most 1000 (one placeholder per node in the query)."""
    offset, size = 0, FIRST_BATCH
    while offset < count:
        yield offset, size
        offset, size = offset + size, min(2 * size, 1000)


#: How many nodes a single-node search reads first (the rest only if none of these answers).
FIRST_BATCH = 250
#: The first stretch of starts the cheap test works out at once; each next one is twice as long.
CHUNK_MS = 86_400_000
#: A single-node request plans at most this many of the counted candidates itself (those with
#: the most free time: the count is exact but for NVLink groups and health, so one of them
#: nearly always fits); if none fits, placing.plan's shortlist decides.
FIRST_TRY = 8
#: A gang plans this many candidates per member first, and every candidate only if no gang fits
#: among those: a gang found among some fitting nodes is one among all of them (engine/gang.py
#: offers every group with enough fitting nodes), so the yes is the same, for a fraction of the
#: snapshots. A topology key whose groups the first ones split too thinly costs one more plan.
GANG_FIRST_TRY = 4
#: How far past a start the cheap test reads to bound a window's end (longer: the planner alone).
MAX_STRETCH_MS = 30 * 86_400_000


def _group(key: str | None, labels: str, domain: str | None) -> str | None:
    """A node's topology value, as Node.label reads it ("" without a key: any nodes)."""
    if key is None:
        return ""
    if key == FABRIC_DOMAIN:
        return domain
    value = json.loads(labels).get(key)
    return None if value is None else str(value)


def unsupported(ctx: Ctx, draft: Reservation, pool_name: str) -> str | None:
    """Why no node of the pool could ever hold the draft (model, node size, gang size, NVLink
    group, topology group)."""
    share, models = draft.gpus or 1, draft.models
    largest, holding = repo.node_capacity(ctx.db.conn, draft.pool_id, models, share)
    gpus = gpus_of(models)
    if largest == 0:
        return f"pool {pool_name} has no {gpus}"
    if share > largest:
        return f"the largest node of pool {pool_name} has {largest} {gpus}, not {share}"
    if draft.gang_size is not None and draft.gang_size > holding:
        return (
            f"pool {pool_name} has {holding} nodes with {share} or more {gpus}, not a gang of"
            f" {draft.gang_size}"
        )
    shape = (draft.topology, draft.topology_key, draft.gang_size)
    beyond = beyond_topology(ctx, (draft.pool_id, pool_name), models, share, shape)
    return None if beyond is None else beyond[1]


def beyond_topology(
    ctx: Ctx,
    pool: tuple[str, str],
    models: tuple[str, ...],
    share: int,
    shape: tuple[str | None, str | None, int | None],
    index: PoolIndex | None = None,
) -> tuple[str, str] | None:
    """Why the request's topology could never be held, as (the flags that ask for it, the
    reason): advice reports the reason, admission (reserve, preview, update) both. `pool`:
    (id, name); `shape`: (topology, topology key, gang size)."""
    (pool_id, name), (topology, key, size) = pool, shape
    if topology == NVLINK_ALL:
        why = _beyond_nvlink(ctx, pool_id, name, models, share, index)
        if why is not None:
            return f"--gpus {share} --topology {NVLINK_ALL}", why
    if key is not None and size is not None:
        why = _beyond_groups(ctx, pool_id, name, models, share, key, size, index)
        if why is not None:
            return f"--gang {size} --topology-key {key}", why
    return None


def require_topology(
    ctx: Ctx,
    pool: tuple[str, str],
    models: tuple[str, ...],
    share: int,
    shape: tuple[str | None, str | None, int | None],
    index: PoolIndex | None = None,
) -> None:
    """Admission's refusal (reserve, preview, update) of a topology no node could ever hold:
    INVALID_INPUT naming the flags and beyond_topology's reason."""
    beyond = beyond_topology(ctx, pool, models, share, shape, index)
    if beyond is not None:
        raise InvalidInput(": ".join(beyond))


def _beyond_nvlink(
    ctx: Ctx,
    pool_id: str,
    pool_name: str,
    models: tuple[str, ...],
    share: int,
    index: PoolIndex | None = None,
) -> str | None:
    """Why `--topology nvlink-all` could never take `share` GPUs on one of the pool's nodes,
    whatever their state: more than any NVLink group holds. `index`: the pool in memory (a
    replay's fleet), read instead of SQL."""
    if index is not None:
        most = index.largest_nvlink_group(models)
    else:
        most = fleet_store.largest_nvlink_group(ctx.db.conn, pool_id, models)
    if share <= most:
        return None
    return f"the largest NVLink group of pool {pool_name}'s nodes has {most} {gpus_of(models)}"


def _beyond_groups(
    ctx: Ctx,
    pool_id: str,
    pool_name: str,
    models: tuple[str, ...],
    share: int,
    key: str,
    size: int,
    index: PoolIndex | None = None,
) -> str | None:
    """Why a gang of `size` on one value of `key` could never be placed: fewer of the pool's
    nodes with the share, whatever their state, share any one value. A key no such node has is
    most likely a typo: the reason names the labels there are, and the closest."""
    conn, gpus = ctx.db.conn, gpus_of(models)
    if index is not None:
        values = index.topology_values(key, models, share)
    else:
        values = fitting.topology_values(conn, pool_id, key, holding=(models, share))
    most = max(Counter(v for v in values.values() if v is not None).values(), default=0)
    if most >= size:
        return None
    if most:
        return (
            f"at most {most} of pool {pool_name}'s nodes with {share} or more {gpus} share one"
            f" {key}, so a gang on one {key} is at most {most} nodes"
        )
    keys = fitting.label_keys(conn, pool_id)
    close = difflib.get_close_matches(key, keys, n=1)
    known = f"their labels: {', '.join(keys)}" if keys else "its nodes have no labels"
    return (
        f"no node of pool {pool_name} with {share} or more {gpus} has the label {key}"
        f" ({known})" + (f"; did you mean {close[0]}?" if close else "")
    )


def gpus_of(models: tuple[str, ...]) -> str:
    """'GPUs', or the accepted models' GPUs ('h100/a100 GPUs'), for a message."""
    return f"{'/'.join(models)} GPUs" if models else "GPUs"


def policy_of(ctx: Ctx, pool_id: str) -> CalendarPolicy | None:
    return cal.policy(ctx.db.conn, pool_id)
