"""Running: tick, repair, timeline, events, usage, meters, policies."""

from __future__ import annotations

import contextlib
import sys
from functools import partial
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
    progress_bar,
)
from better_compute.errors import InvalidInput
from better_compute.lazy import lazy
from better_compute.model import Event, JsonValue
from better_compute.timeparse import is_relative, parse_duration, parse_time

if TYPE_CHECKING:
    from collections.abc import Callable

    from better_compute.render import chart, human
    from better_compute.render import json as js
    from better_compute.render import webhooks as hooks_view
    from better_compute.service import accounting, delivery, ticking, views
    from better_compute.service.context import Ctx
else:
    hooks_view = lazy("better_compute.render.webhooks")
    delivery = lazy("better_compute.service.delivery")
    human = lazy("better_compute.render.human")
    js = lazy("better_compute.render.json")
    chart = lazy("better_compute.render.chart")
    accounting = lazy("better_compute.service.accounting")
    ticking = lazy("better_compute.service.ticking")
    views = lazy("better_compute.service.views")


@app.command()
@handled
def tick(
    until: Annotated[
        str | None, typer.Option("--until", help="Tick at every step up to TIME.")
    ] = None,
    step: Annotated[
        str | None, typer.Option("--step", help="DURATION between ticks (with --until; 30s).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Advance the lifecycle at now (or at every step to --until); prints what changed."""
    if step is not None and until is None:  # §4: tick [--until TIME [--step DURATION]]
        raise InvalidInput("--step needs --until TIME: without it, tick runs once, at now")
    step_ms = parse_duration("30s" if step is None else step)
    c = ctx()
    if until is None:
        changes = ticking.tick(c)
    else:
        end: int | Callable[[int], int] = parse_time(until, c.now)  # a bad TIME: refused here
        if c.asked is None and is_relative(until):  # `+10m` counts from the first tick's instant
            end = partial(parse_time, until)
        with progress_bar(as_json, "ticking") as advance:
            changes = ticking.tick_until(c, end, step_ms, advance)
    now = c.now
    ticking.sweep(c)
    sent = delivery.deliver(c, hooks_view.body)  # after the lifecycle committed
    doc: dict[str, JsonValue] = {"now": now, "changes": [js.event(e) for e in changes]}
    lines = [human.event_line(e) for e in changes] or [_nothing_seen(c, "nothing to do")]
    if sent is not None:  # only a ledger with webhooks says anything of deliveries
        doc["deliveries"] = hooks_view.report(sent)
        lines.append(hooks_view.report_line(sent))
    emit(as_json, doc, "\n".join(lines))


@app.command()
@handled
def repair(
    rsv: Annotated[
        str | None, typer.Argument(help="One reservation; default: every placed one.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run the BookingRepair check now."""
    c = ctx()
    changes = ticking.repair(c, rsv)
    emit(
        as_json,
        {"changes": [js.event(e) for e in changes]},
        "\n".join(human.event_line(e) for e in changes)
        or _nothing_seen(c, "every booking checked is still good", mine=rsv is not None),
    )


def _nothing_seen(c: Ctx, said: str, *, mine: bool = False) -> str:
    """What tick or repair of the fleet says of no change shown: `said` to an admin, who is
    shown every change; to anyone else, what is true without telling of other tenants (it may
    have moved their reservations). `repair RSV` checked one the principal may see."""
    return said if c.who.admin or mine else "no change to reservations you may see"


@app.command()
@handled
def timeline(
    pool: PoolOpt = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Also count this tenant's own bookings.")
    ] = None,
    from_: Annotated[
        str | None, typer.Option("--from", help="TIME; default the start of this hour.")
    ] = None,
    to: Annotated[str | None, typer.Option("--to", help="TIME; default --from + 24h.")] = None,
    step: Annotated[int, typer.Option("--step", help="Bucket width in minutes, 5 to 1440.")] = 60,
    as_json: JsonFlag = False,
) -> None:
    """Booked GPUs over time: a chart, or the JSON buckets."""
    c = ctx()
    start = parse_time(from_, c.now) if from_ is not None else None
    end = parse_time(to, c.now) if to is not None else None
    t = views.timeline(c, pool, tenant, start, end, step)
    emit(as_json, js.timeline(t), lambda: chart.timeline_chart(t, width=min(out.width, 100)))


@app.command()
@handled
def events(
    tenant: TenantFilter = None,
    reservation: Annotated[
        str | None, typer.Option("--reservation", help="One reservation.")
    ] = None,
    since: Annotated[
        int | None, typer.Option("--since", help="Only events after this seq.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep printing new events (JSON Lines with --json).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """The append-only event log; --follow watches it."""
    c = ctx()
    if follow:
        lines = as_json or G.json

        def show(event: Event) -> None:
            text = js.dumps(js.event(event)) if lines else human.event_line(event)
            sys.stdout.write(text + "\n")
            sys.stdout.flush()  # each event is out as soon as it is committed

        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends a watch, it is not an error
            views.follow_events(c, tenant, reservation, since, show)
        return
    # Page by page (a fleet's log is a million events): JSON, one document, is written once
    # every page is read; lines for people as each page is.
    pages = views.event_pages(c, tenant, reservation, since)
    if as_json or G.json:
        sys.stdout.writelines([*js.pieces(map(js.event, page) for page in pages), "\n"])
        return
    sys.stdout.writelines(human.events(pages))


# ---------------------------------------------------------------- usage, meters, policies

meter_app = typer.Typer(
    no_args_is_help=False, help="Billing meters; usage for a missing meter is dead-lettered."
)
app.add_typer(meter_app, name="meter")


@meter_app.command("create")
@handled
def meter_create(name: str, as_json: JsonFlag = False) -> None:
    """Create a meter such as gpu.h100.hours or gpu.h100.spot.hours (taken in lower case)."""
    name = accounting.meter_create(ctx(), name)
    emit(as_json, {"name": name}, f"created meter {name}")


@meter_app.command("list")
@handled
def meter_list(as_json: JsonFlag = False) -> None:
    """Every meter."""
    names = accounting.meter_list(ctx())
    emit(as_json, [{"name": n} for n in names], "\n".join(names) or "no meters")


@app.command()
@handled
def usage(
    tenant: TenantFilter = None,
    from_: Annotated[str | None, typer.Option("--from", help="TIME")] = None,
    to: Annotated[str | None, typer.Option("--to", help="TIME")] = None,
    dead_letter: Annotated[
        bool, typer.Option("--dead-letter", help="Windows whose meter is missing.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Metered usage windows (GPU-hours) and totals per tenant and meter."""
    c = ctx()
    start = parse_time(from_, c.now) if from_ is not None else None
    end = parse_time(to, c.now) if to is not None else None
    rows = accounting.usage(c, tenant, start, end, dead_letter)
    emit(as_json, [js.usage(u) for u in rows], lambda: human.usage(rows, dead_letter))


policy_app = typer.Typer(no_args_is_help=False, help="What a principal may reserve for a tenant.")
app.add_typer(policy_app, name="policy")


@policy_app.command("set")
@handled
def policy_set(
    tenant: TenantOpt,
    principal: Annotated[str, typer.Option("--principal", help="Who the rule is for (--as).")],
    max_gpus: Annotated[
        int | None, typer.Option("--max-gpus", help="At most this many GPUs a request.")
    ] = None,
    spot_only: Annotated[bool, typer.Option("--spot-only", help="Only spot requests.")] = False,
    deny: Annotated[bool, typer.Option("--deny", help="Refuse every request.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Set (replace) a principal's policy in a tenant."""
    pol = accounting.policy_set(ctx(), tenant, principal, max_gpus, spot_only, deny)
    emit(as_json, js.policy(pol), lambda: human.policies([pol]))


@policy_app.command("list")
@handled
def policy_list(
    tenant: TenantFilter = None,
    as_json: JsonFlag = False,
) -> None:
    """Policies, by tenant and principal."""
    rows = accounting.policy_list(ctx(), tenant)
    emit(as_json, [js.policy(p) for p in rows], lambda: human.policies(rows))


@policy_app.command("delete")
@handled
def policy_delete(
    tenant: TenantOpt,
    principal: Annotated[str, typer.Option("--principal", help="Who the rule is for.")],
    as_json: JsonFlag = False,
) -> None:
    """Remove a principal's policy."""
    accounting.policy_delete(ctx(), tenant, principal)
    emit(as_json, {"tenantId": tenant, "principal": principal, "deleted": True}, "deleted")
