"""From a booking to a running job (issue 12): launch on a reservation, change it before it
starts."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from better_compute.cli.app import G, JsonFlag, app, ctx, emit, handled
from better_compute.lazy import lazy
from better_compute.timeparse import parse_duration

if TYPE_CHECKING:
    from better_compute.render import human
    from better_compute.render import json as js
    from better_compute.render import launch as rl
    from better_compute.service import launching, updating
else:
    human = lazy("better_compute.render.human")
    js = lazy("better_compute.render.json")
    rl = lazy("better_compute.render.launch")
    launching = lazy("better_compute.service.launching")
    updating = lazy("better_compute.service.updating")

RsvArg = Annotated[str, typer.Argument(help="The reservation id (rsv_…).")]


@app.command()
@handled
def launch(
    rsv: RsvArg,
    fmt: Annotated[
        str, typer.Option("--format", help="env, hostfile, torchrun or json.", metavar="FORMAT")
    ] = "env",
    node: Annotated[
        str | None,
        typer.Option(
            "--node", help="This node's NODE_RANK, GPUs and torchrun line.", metavar="NODE"
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Print what a job launcher needs to run on a reservation (binding or active; placed warns).

    On each node: eval "$(better-compute launch RSV --node $(hostname))", then torchrun.
    """
    launching.check_format(fmt)
    got = launching.launch(ctx(), rsv, node)
    if got.warning:
        sys.stderr.write(f"warning: {got.warning}\n")
    if as_json or G.json or fmt == "json":
        emit(True, rl.as_json(got))
    elif fmt == "hostfile":
        sys.stdout.write(rl.hostfile(got))
    elif fmt == "torchrun":
        sys.stdout.write(rl.torchrun(got, launching.MASTER_PORT))
    else:
        sys.stdout.write(rl.env(got, launching.MASTER_PORT))


@app.command()
@handled
def update(
    rsv: RsvArg,
    start: Annotated[
        str | None, typer.Option("--start", help="The new start (TIME).", metavar="TIME")
    ] = None,
    duration: Annotated[
        str | None, typer.Option("--for", help="The new DURATION.", metavar="DURATION")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", help="GPUs per node (per member of a gang).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Change a pending reservation, or a placed one before its window begins.

    It keeps its nodes and GPUs when the GPUs it holds are all free in the new window, else it
    is placed afresh like a new request (CONFLICT, nothing changed, when it cannot fit).

    Example: better-compute update rsv_… --start 2026-10-02T08:00:00Z --for 12h
    """
    change = updating.Change(start, None if duration is None else parse_duration(duration), gpus)
    r = updating.update(ctx(), rsv, change)
    emit(as_json, js.reservation(r), lambda: human.reservation(r))
