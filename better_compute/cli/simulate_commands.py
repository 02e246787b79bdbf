"""Simulating: replay a workload of requests through the real engine and ledger, and report."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from better_compute.cli.app import JsonFlag, PoolOpt, app, ctx, emit, handled, progress_bar
from better_compute.errors import InvalidInput
from better_compute.render import human
from better_compute.render import json as js
from better_compute.workload import FORMATS, parse_compress


@app.command()
@handled
def simulate(
    workload: Annotated[  # str, not Path: a Path would load pydantic (cli/plain_params.py)
        str, typer.Option("--workload", help="The workload file (openb CSV or JSON Lines).")
    ],
    fmt: Annotated[str, typer.Option("--format", help="openb or jsonl.")] = "openb",
    compress: Annotated[
        str, typer.Option("--compress", help="Arrivals K times faster (K ≥ 1); durations kept.")
    ] = "1",
    until: Annotated[
        str | None,
        typer.Option("--until", help="Replay arrivals before TIME, tick up to it and stop there."),
    ] = None,
    pool: PoolOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Replay requests in arrival order through reserve and tick; report waits and utilisation.

    Needs a ledger on a manual clock (`init --now`); admins only."""
    from better_compute.service import simulate as service

    if fmt not in FORMATS:
        raise InvalidInput(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    k = parse_compress(compress)
    c = ctx()
    with progress_bar(as_json, "replaying requests") as advance:
        report = service.simulate(c, workload, fmt, k, until, pool, advance)
    emit(as_json, js.simulation(report), lambda: human.simulation(report))
    if report.refused:  # counted as never placed: say why, or a typo looks like no capacity
        sys.stderr.write(
            f"warning: {report.refused} request(s) refused while replaying, counted as never"
            f" placed; the first, {report.first_refusal}\n"
        )
