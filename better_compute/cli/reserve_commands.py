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
    out,
)
from better_compute.errors import InvalidInput
from better_compute.lazy import lazy
from better_compute.timeparse import is_relative, parse_duration, parse_time

if TYPE_CHECKING:
    from better_compute.render import human
    from better_compute.render import json as js
    from better_compute.service import booking, listing, reading
    from better_compute.service.booking import ReserveArgs
else:
    human = lazy("better_compute.render.human")
    js = lazy("better_compute.render.json")
    booking = lazy("better_compute.service.booking")
    reading = lazy("better_compute.service.reading")
    listing = lazy("better_compute.service.listing")


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
        parse_time(start, 0)  # its form is checked before the ledger is opened
    names = model.split(",") if model else []
    models = tuple(sorted({m.strip().lower() for m in names if m.strip()}))
    if model is not None and not models:
        raise InvalidInput("--model needs a model or a comma-separated list, such as h100,a100")
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


@app.command()
@handled
def reserve(
    tenant: TenantOpt,
    duration: ForOpt,
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
    as_json: JsonFlag = False,
) -> None:
    """Reserve GPUs now or for a window later. A request that does not fit yet is pending."""
    args = _reserve_args(
        tenant,
        pool,
        gpus,
        model,
        topology,
        duration,
        start,
        spot,
        gang,
        topology_key,
        node_lease,
        key,
    )
    c = ctx()
    r = booking.reserve(c, _with_start(args, start, c.now))
    emit(as_json, js.reservation(r), lambda: human.reservation(r))


@app.command()
@handled
def preview(
    tenant: TenantOpt,
    duration: ForOpt,
    pool: PoolOpt = None,
    gpus: GpusOpt = None,
    model: ModelOpt = None,
    topology: TopologyOpt = None,
    start: StartOpt = None,
    spot: SpotOpt = False,
    gang: GangOpt = None,
    topology_key: KeyOpt = None,
    node_lease: LeaseOpt = False,
    explain: Annotated[
        bool, typer.Option("--explain", help="Say why each node or group was taken or refused.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Would it fit, where, and if not, why? Books nothing."""
    args = _reserve_args(
        tenant,
        pool,
        gpus,
        model,
        topology,
        duration,
        start,
        spot,
        gang,
        topology_key,
        node_lease,
        None,
    )
    c = ctx()
    args = _with_start(args, start, c.now)
    p = booking.preview(c, args)
    doc = js.preview(p)
    lines = booking.explain(c, args) if explain else []
    if explain:
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
    state: Annotated[list[str] | None, typer.Option("--state", help="Repeatable.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this idempotency key.")] = None,
    ids: Annotated[bool, typer.Option("--ids", help="Print only ids, one per line.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Reservations, oldest first."""
    if as_json or G.json:  # encoded page by page (issue 8), written once every page is read
        pages = listing.pages(ctx(), tenant, pool, state or [], key)
        sys.stdout.write(js.array(js.reservation(r) for page in pages for r in page) + "\n")
        return
    rows = listing.reservations(ctx(), tenant, pool, state or [], key)
    if ids:
        sys.stdout.write("".join(f"{r.id}\n" for r in rows))
        return
    emit(False, None, lambda: human.reservations(rows))


@app.command()
@handled
def cancel(rsv: RsvArg, as_json: JsonFlag = False) -> None:
    """Withdraw a pending or placed reservation; its quota is refunded."""
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
