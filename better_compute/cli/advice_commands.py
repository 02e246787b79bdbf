"""Availability search: `advice` (PRODUCT.md §5.6). Books nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from better_compute.cli.app import JsonFlag, app, ctx, emit, handled, models_of
from better_compute.lazy import lazy
from better_compute.timeparse import parse_duration

if TYPE_CHECKING:
    from better_compute.render import advice as view
    from better_compute.service import advice
else:
    view = lazy("better_compute.render.advice")
    advice = lazy("better_compute.service.advice")


@app.command("advice")
@handled
def advice_(
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs (per node with --gang).")],
    start_range: Annotated[
        str, typer.Option("--start-range", help="FROM..TO: the earliest and latest start.")
    ],
    duration: Annotated[
        str | None, typer.Option("--duration", help="DURATION of the window, e.g. 3d.")
    ] = None,
    duration_range: Annotated[
        str | None,
        typer.Option("--duration-range", help="MIN..MAX: the longest that fits at each start."),
    ] = None,
    end_range: Annotated[
        str | None, typer.Option("--end-range", help="FROM..TO: the earliest and latest end.")
    ] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="Only this pool (id or name); default: every pool.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="A model or a comma-separated list.")
    ] = None,
    topology: Annotated[
        str | None, typer.Option("--topology", help="nvlink-all: one NVLink group.")
    ] = None,
    gang: Annotated[int | None, typer.Option("--gang", help="Whole nodes, 2 to 64.")] = None,
    topology_key: Annotated[
        str | None, typer.Option("--topology-key", help="Label all gang members share.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many windows (1-100).")] = 5,
    as_json: JsonFlag = False,
) -> None:
    """When and where would it fit? Books nothing.

    Windows that fit now, earliest first; every pool when --pool is left out.
    """
    models = models_of(model)
    args = advice.AdviceArgs(
        gpus=gpus,
        start_range=start_range,
        pool=pool,
        models=models,
        topology=topology,
        gang=gang,
        topology_key=topology_key,
        duration_ms=parse_duration(duration) if duration is not None else None,
        duration_range=duration_range,
        end_range=end_range,
        limit=limit,
    )
    a = advice.advise(ctx(), args)
    emit(as_json, view.advice_json(a), lambda: view.advice_human(a))
