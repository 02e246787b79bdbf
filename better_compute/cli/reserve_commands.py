"""Reserving: reserve, preview, get, list, cancel, extend, release."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import typer

from better_compute.cli.app import (
    G,
    JsonFlag,
    PoolOpt,
    TenantFilter,
    TenantOpt,
    app,
    ctx,
    emit,
    handled,
    models_of,
    out,
)
from better_compute.errors import InvalidInput
from better_compute.lazy import lazy
from better_compute.timeparse import (
    check_time,
    human_duration,
    is_relative,
    parse_duration,
    parse_range,
    parse_time,
)

if TYPE_CHECKING:
    from better_compute.model import JsonValue
    from better_compute.render import human
    from better_compute.render import json as js
    from better_compute.service import booking, finding, listing, reading, series
    from better_compute.service.booking import ReserveArgs
    from better_compute.service.context import Ctx
else:
    series = lazy("better_compute.service.series")
    human = lazy("better_compute.render.human")
    js = lazy("better_compute.render.json")
    booking = lazy("better_compute.service.booking")
    finding = lazy("better_compute.service.finding")
    listing = lazy("better_compute.service.listing")
    reading = lazy("better_compute.service.reading")


GpusOpt = Annotated[int | None, typer.Option("--gpus", help="GPUs (per node with --gang).")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="A model or a comma-separated list.")]
TopologyOpt = Annotated[
    str | None, typer.Option("--topology", help="nvlink-all: one NVLink group.")
]
ForOpt = Annotated[str, typer.Option("--for", help="DURATION, e.g. 90m, 12h, 3d.")]
StartOpt = Annotated[str | None, typer.Option("--start", help="TIME; default now.")]
SpotOpt = Annotated[bool, typer.Option("--spot", help="Spot: cheaper, preemptible after a notice.")]
GangOpt = Annotated[int | None, typer.Option("--gang", help="Whole nodes at once, 2 to 64.")]
KeyOpt = Annotated[str | None, typer.Option("--topology-key", help="Label all gang members share.")]
LeaseOpt = Annotated[bool, typer.Option("--node-lease", help="Lease whole machines.")]
NameOpt = Annotated[
    str | None, typer.Option("--name", help="A name to find it by.", metavar="TEXT")
]
LabelOpt = Annotated[
    list[str] | None, typer.Option("--label", help="k=v to find it by; repeatable.", metavar="K=V")
]


def _reserve_args(
    tenant: str,
    pool: str | None,
    gpus: int | None,
    model: str | None,
    topology: str | None,
    duration: str,
    start: str | None,
    spot: bool,
    gang: int | None,
    topology_key: str | None,
    node_lease: bool,
    key: str | None,
) -> ReserveArgs:
    if start is not None:
        check_time(start)  # its form is checked before the ledger is opened
    models = models_of(model)
    return booking.ReserveArgs(
        tenant=tenant,
        pool=pool,
        gpus=gpus,
        duration_ms=parse_duration(duration),
        models=models,
        topology=topology,
        gang=gang,
        topology_key=topology_key,
        start_text=start.strip() if start is not None and is_relative(start) else None,
        spot=spot,
        node_lease=node_lease,
        key=key,
    )


def _with_start(args: ReserveArgs, start: str | None, at: int) -> ReserveArgs:
    """--start, read against the ledger's now (relative times count from it)."""
    return args if start is None else replace(args, start=parse_time(start, at))


def _read_now(text: str | None, c: Ctx) -> str | None:
    """A TIME a write reads as it opens the ledger: an instant written out, or any TIME under
    --now. A relative one (`+1h`, `now`) without --now is left for the write to read at the
    instant it acts at, with its lock held (PRODUCT.md §2; booking.at_acting_instant), as
    `tick --until +10m` is."""
    return None if text is None or (c.asked is None and is_relative(text)) else text


# Calendar flags of reserve (issue 10): service/calendar.py and service/series.py do the work.
RangeOpt = Annotated[
    str | None, typer.Option("--start-range", help="FROM..TO: book the earliest window that fits.")
]
DurRangeOpt = Annotated[
    str | None,
    typer.Option("--duration-range", help="MIN..MAX with --start-range: the longest that fits."),
]
EveryOpt = Annotated[
    str | None, typer.Option("--every", help="DURATION: book a series, e.g. 1d (all or nothing).")
]
CountOpt = Annotated[int | None, typer.Option("--count", help="Occurrences of --every.")]
UntilOpt = Annotated[str | None, typer.Option("--until", help="TIME: --every until then.")]


def _for_text(duration: str | None, duration_range: str | None) -> str:
    """What --for means: itself, or the shortest of --duration-range (the search finds the rest)."""
    if duration is not None and duration_range is not None:
        raise InvalidInput("give --for or --duration-range, not both")
    if duration_range is not None:
        try:
            return human_duration(parse_range(duration_range, parse_duration)[0])
        except InvalidInput as exc:
            raise InvalidInput(f"--duration-range: {exc.message}") from None
    if duration is None:
        raise InvalidInput(
            "--for is required: a DURATION such as 90m or 3d (with --start-range, or"
            " --duration-range MIN..MAX)"
        )
    return duration


@app.command()
@handled
def reserve(
    tenant: TenantOpt,
    duration: Annotated[str | None, typer.Option("--for", help="DURATION, e.g. 3d.")] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", help="Idempotency key: a retry returns the same reservation."),
    ] = None,
    pool: PoolOpt = None,
    gpus: GpusOpt = None,
    model: ModelOpt = None,
    topology: TopologyOpt = None,
    start: StartOpt = None,
    spot: SpotOpt = False,
    gang: GangOpt = None,
    topology_key: KeyOpt = None,
    node_lease: LeaseOpt = False,
    start_range: RangeOpt = None,
    duration_range: DurRangeOpt = None,
    every: EveryOpt = None,
    count: CountOpt = None,
    until: UntilOpt = None,
    name: NameOpt = None,
    label: LabelOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Reserve GPUs now or for a window later. A request that does not fit yet is pending."""
    args = _reserve_args(
        tenant,
        pool,
        gpus,
        model,
        topology,
        _for_text(duration, duration_range),
        start,
        spot,
        gang,
        topology_key,
        node_lease,
        key,
    )
    args = replace(
        args,
        start_range=start_range,
        duration_range=duration_range,
        name=finding.check_name(name),
        labels=finding.parse_labels(label or []),
    )
    c = ctx()
    args = _with_start(args, _read_now(start, c), c.now)
    if every is not None or count is not None or until is not None:
        if every is None:
            raise InvalidInput("--count and --until need --every D, such as --every 1d")
        if until is not None:
            check_time(until)
        until_now = _read_now(until, c)
        repeat = series.Repeat(
            parse_duration(every),
            count,
            None if until_now is None else parse_time(until_now, c.now),
            until.strip() if until is not None and is_relative(until) else None,
        )
        rows = series.reserve_series(c, args, repeat)
        emit(as_json, [js.reservation(r) for r in rows], lambda: human.reservations(rows))
        return
    r = booking.reserve(c, args)
    emit(as_json, js.reservation(r), lambda: human.reservation(r))


@app.command()
@handled
def preview(
    tenant: TenantOpt,
    duration: Annotated[str | None, typer.Option("--for", help="DURATION, e.g. 3d.")] = None,
    pool: PoolOpt = None,
    gpus: GpusOpt = None,
    model: ModelOpt = None,
    topology: TopologyOpt = None,
    start: StartOpt = None,
    spot: SpotOpt = False,
    gang: GangOpt = None,
    topology_key: KeyOpt = None,
    node_lease: LeaseOpt = False,
    start_range: Annotated[
        str | None,
        typer.Option("--start-range", help="FROM..TO: preview the earliest window that fits."),
    ] = None,
    duration_range: DurRangeOpt = None,
    every: Annotated[
        str | None, typer.Option("--every", help="Refused: reserve --every is all or nothing.")
    ] = None,
    count: CountOpt = None,
    until: UntilOpt = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="Say why each node or group was taken or refused.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Would it fit, where, and if not, why? Books nothing.

    With --start-range: the earliest window that fits, the one reserve --start-range books.
    """
    if every is not None or count is not None or until is not None:
        raise InvalidInput(series.NO_PREVIEW)
    args = _reserve_args(
        tenant,
        pool,
        gpus,
        model,
        topology,
        _for_text(duration, duration_range),
        start,
        spot,
        gang,
        topology_key,
        node_lease,
        None,
    )
    args = replace(args, start_range=start_range, duration_range=duration_range)
    c = ctx()
    args = _with_start(args, start, c.now)
    p = booking.preview(c, args)
    doc = js.preview(p)
    lines: list[tuple[str, str]] = []
    if explain:  # the window previewed (for a start range, the one found)
        lines = booking.explain(c, booking.previewed(args, p))
        doc["explain"] = [{"subject": s, "verdict": v} for s, v in lines]
    emit(as_json, doc, lambda: human.preview(p))
    if explain and not (as_json or G.json):
        for subject, verdict in lines:
            out.print(f"  {subject}: {verdict}")
        out.print("  (reserve takes one of the best placement.topN, by a seed from its id)")


RsvArg = Annotated[str, typer.Argument(help="The reservation id (rsv_…).")]


@app.command()
@handled
def get(rsv: RsvArg, as_json: JsonFlag = False) -> None:
    """One reservation."""
    r = reading.get(ctx(), rsv)
    emit(as_json, js.reservation(r), lambda: human.reservation(r))


@app.command("list")
@handled
def list_(
    tenant: TenantFilter = None,
    pool: Annotated[str | None, typer.Option("--pool", help="Pool id or name.")] = None,
    state: Annotated[
        list[str] | None, typer.Option("--state", help="Repeatable.", metavar="STATE")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this idempotency key.")] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Only this exact name.", metavar="TEXT")
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label", help="Only with this k=v label; repeatable (all must match).", metavar="K=V"
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--from", help="Only windows ending after TIME.", metavar="TIME"),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--to", help="Only windows starting before TIME.", metavar="TIME"),
    ] = None,
    sort: Annotated[
        str, typer.Option("--sort", help="created (oldest first) or start.", metavar="ORDER")
    ] = "created",
    ids: Annotated[
        bool, typer.Option("--ids", help="Print only ids, one per line (--json: an array).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Reservations, oldest first; filters narrow them (a window filter: those overlapping it)."""
    filters = finding.Filters(tenant, pool, state or [], key, name, label or [], since, until, sort)
    if ids:  # page by page: a fleet's ids without holding every reservation at once
        found: list[JsonValue] = [i for page in listing.id_pages(ctx(), filters) for i in page]
        if as_json or G.json:  # a JSON array of the ids
            emit(True, found)
        else:
            sys.stdout.write("".join(f"{i}\n" for i in found))
        return
    if as_json or G.json:  # encoded page by page (issue 8), written once every page is read
        sys.stdout.writelines([*js.reservations(listing.listed_pages(ctx(), filters)), "\n"])
        return
    rows = (r for page in listing.listed_pages(ctx(), filters) for r in page)  # checked rows
    emit(False, None, lambda: human.reservations(rows))


@app.command()
@handled
def cancel(
    rsv: RsvArg,
    whole_series: Annotated[
        bool,
        typer.Option("--series", help="Also every other occurrence of its series not yet started."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Withdraw a pending or placed reservation; its quota is refunded."""
    if whole_series:
        rows = series.cancel_series(ctx(), rsv)
        emit(as_json, [js.reservation(r) for r in rows], lambda: human.reservations(rows))
        return
    r = booking.cancel(ctx(), rsv)
    emit(as_json, js.reservation(r), lambda: human.reservation(r))


@app.command()
@handled
def extend(
    rsv: RsvArg,
    by: Annotated[str, typer.Option("--by", help="DURATION to add to the end.")],
    as_json: JsonFlag = False,
) -> None:
    """Move the end later on every node, or on none (CONFLICT on a collision)."""
    r = booking.extend(ctx(), rsv, parse_duration(by))
    emit(as_json, js.reservation(r), lambda: human.reservation(r))


@app.command()
@handled
def release(rsv: RsvArg, as_json: JsonFlag = False) -> None:
    """Give the GPUs back now."""
    r = booking.release(ctx(), rsv)
    emit(as_json, js.reservation(r), lambda: human.reservation(r))
