"""The Typer app. One function per command: parse -> service call -> render -> exit code.

This is the only place errors become exit codes and messages.
"""

from __future__ import annotations

import functools
import json as jsonlib
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, RenderableType
from rich.progress import Progress

from better_compute import clock
from better_compute.errors import BetterComputeError, InvalidInput
from better_compute.inventory import inventory_to_json, load_inventory_text
from better_compute.model import JsonValue, Window
from better_compute.render import human
from better_compute.render import json as js
from better_compute.render.chart import timeline_chart
from better_compute.service import accounting, booking, setup, ticking, views
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx, open_ctx
from better_compute.timeparse import iso, parse_duration, parse_time

app = typer.Typer(
    name="better-compute",
    help="Book GPU capacity for teams sharing a fleet: now, later, as gangs, or as spot.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@dataclass
class Globals:
    db: str = "better-compute.db"
    now_text: str | None = None
    principal: str = "admin"
    json: bool = False


G = Globals()
out = Console(soft_wrap=False)
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
TenantOpt = Annotated[str, typer.Option("--tenant", help="The tenant (its id).")]
TenantFilter = Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")]
F = TypeVar("F", bound=Callable[..., Any])


def _report(code: str, message: str, as_json: bool) -> None:
    if as_json:
        sys.stderr.write(jsonlib.dumps({"error": {"code": code, "message": message}}) + "\n")
    else:
        sys.stderr.write(f"error: {code}: {message}\n")


def _fail(exc: BetterComputeError, as_json: bool) -> None:
    _report(exc.code, exc.message, as_json)
    raise typer.Exit(exc.exit_code)


def handled(fn: F) -> F:
    """Turn BetterComputeError into `error: CODE: message` and its exit code; bugs into INTERNAL."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json")) or G.json
        try:
            return fn(*args, **kwargs)
        except BetterComputeError as exc:
            _fail(exc, as_json)
        except sqlite3.DatabaseError as exc:
            _fail(BetterComputeError(f"database error: {exc}"), as_json)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # the one place a bug becomes a message instead of a traceback
            if os.environ.get("BETTER_COMPUTE_DEBUG"):
                raise
            _fail(
                BetterComputeError(f"{type(exc).__name__}: {exc} (a bug; please report it)"),
                as_json,
            )

    return wrapper  # type: ignore[return-value]


def now() -> int:
    return clock.now_ms(G.now_text)


def ctx() -> Ctx:
    return open_ctx(G.db, now(), G.principal)


def emit(as_json: bool, doc: JsonValue, human_view: RenderableType | str | None = None) -> None:
    if as_json or G.json:
        sys.stdout.write(js.dumps(doc) + "\n")
    elif human_view is not None:
        out.print(human_view)


@contextmanager
def _progress(as_json: bool, what: str) -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar on stderr, only for people at a terminal; yields `advance`."""
    show = not (as_json or G.json) and err.is_terminal
    with Progress(console=err, transient=True, disable=not show) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@app.callback()
def main_options(
    db: Annotated[
        str, typer.Option("--db", envvar="BETTER_COMPUTE_DB", help="The database file.")
    ] = "better-compute.db",
    now_: Annotated[
        str | None,
        typer.Option(
            "--now",
            envvar="BETTER_COMPUTE_NOW",
            help="The instant to act at (TIME); default: the clock.",
        ),
    ] = None,
    as_: Annotated[
        str, typer.Option("--as", envvar="BETTER_COMPUTE_PRINCIPAL", help="Who is acting.")
    ] = "admin",
    as_json: Annotated[bool, typer.Option("--json", help="JSON output for every command.")] = False,
) -> None:
    """better-compute: reserve GPUs now or later, as gangs or spot; tick moves the lifecycle."""
    G.db, G.now_text, G.principal, G.json = db, now_, as_, as_json


# ---------------------------------------------------------------- setting up


@app.command()
@handled
def init(
    demo: Annotated[bool, typer.Option("--demo", help="Load the demo inventory too.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing database.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Create the database (and with --demo, a small inventory to try every command on)."""
    from better_compute.demo import DEMO_INVENTORY

    at = now()
    db = setup.init(G.db, at, force)
    counts: dict[str, int] = {}
    if demo:
        counts = setup.inventory_import(Ctx(db, at, G.principal), DEMO_INVENTORY)
    db.close()
    emit(
        as_json,
        {"db": G.db, "demo": demo, **counts},
        f"created {G.db}" + (f" with the demo inventory ({counts['nodes']} nodes)" if demo else ""),
    )


@app.command()
@handled
def demo(
    keep: Annotated[
        Path | None,
        typer.Option("--keep", help="Write the demo database here instead of a temp file."),
    ] = None,
) -> None:
    """A guided tour on a fresh demo database: calendar, gang, spot, repair, timeline."""
    from better_compute.demo import run_tour

    run_tour(out, keep)


inventory_app = typer.Typer(
    help="The inventory as JSON: import (upsert) and export.", no_args_is_help=True
)
app.add_typer(inventory_app, name="inventory")


@inventory_app.command("import")
@handled
def inventory_import(
    file: Annotated[
        Path, typer.Argument(help="An inventory JSON file (see README), or - for stdin.")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Upsert pools, nodes and tenants from a file: all of it, or nothing when any part is bad."""
    if str(file) == "-":
        text = sys.stdin.read()
    else:
        try:
            text = file.read_text()
        except OSError as exc:
            raise InvalidInput(f"cannot read {file}: {exc.strerror}") from None
    inv = load_inventory_text(text)
    c = ctx()
    with _progress(as_json, "importing nodes") as advance:
        counts = setup.inventory_import(c, inv, advance)
    emit(
        as_json,
        dict(counts),
        f"imported {counts['pools']} pools, {counts['nodes']} nodes, {counts['tenants']} tenants",
    )


@inventory_app.command("export")
@handled
def inventory_export(as_json: JsonFlag = False) -> None:
    """Print the inventory in the import format."""
    doc = inventory_to_json(setup.inventory_export(ctx()))
    sys.stdout.write(jsonlib.dumps(doc, indent=None if (as_json or G.json) else 2) + "\n")


pool_app = typer.Typer(help="Pools of nodes.", no_args_is_help=True)
app.add_typer(pool_app, name="pool")


@pool_app.command("create")
@handled
def pool_create(
    name: str,
    label: Annotated[list[str] | None, typer.Option("--label", help="k=v, repeatable.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a pool."""
    c = ctx()
    pool_id = setup.pool_create(c, name, setup.parse_labels(label or []))
    emit(as_json, js.pool(views.pool(c, pool_id)), f"created pool {name} ({pool_id})")


@pool_app.command("list")
@handled
def pool_list(as_json: JsonFlag = False) -> None:
    """Every pool with its rollup now."""
    rows = views.pools(ctx())
    emit(as_json, [js.pool(r) for r in rows], human.pools(rows))


@pool_app.command("show")
@handled
def pool_show(pool: str, as_json: JsonFlag = False) -> None:
    """One pool's rollup now: allocatable, inUse, reserved, free."""
    r = views.pool(ctx(), pool)
    emit(as_json, js.pool(r), human.pools([r]))


@pool_app.command("set")
@handled
def pool_set(
    pool: str,
    auto_bind: Annotated[
        str, typer.Option("--auto-bind", help="on, off, or default (follow binding.autoBind).")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Pool settings: whether tick binds this pool's nodes itself (no node agents)."""
    choices = {"on": True, "off": False, "default": None}
    if auto_bind not in choices:
        raise InvalidInput(f"--auto-bind must be on, off or default, got {auto_bind!r}")
    c = ctx()
    setup.pool_set_auto_bind(c, pool, choices[auto_bind])
    emit(
        as_json,
        {"pool": pool, "autoBind": choices[auto_bind]},
        f"pool {pool}: autoBind {auto_bind}",
    )


node_app = typer.Typer(
    help="Nodes: add, inspect, label, cordon, reachability, agents.", no_args_is_help=True
)
app.add_typer(node_app, name="node")


@node_app.command("add")
@handled
def node_add(
    node: str,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs on the node.")],
    model: Annotated[str, typer.Option("--model", help="GPU model, e.g. h100.")],
    pool: Annotated[str | None, typer.Option("--pool", help="Pool id or name.")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="k=v, repeatable.")] = None,
    nvlink_groups: Annotated[int, typer.Option("--nvlink-groups", help="NVLink groups.")] = 1,
    fabric: Annotated[str | None, typer.Option("--fabric", help="CLUSTER.CLIQUE")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Add a node with its GPUs to a pool."""
    spec = setup.node_spec(
        node, gpus, model, setup.parse_labels(label or []), nvlink_groups, fabric
    )
    c = ctx()
    setup.node_add(c, pool, spec)
    shown = setup.node_show(c, node)
    emit(as_json, js.node(shown.node), f"added {node} ({gpus} × {model}) to {shown.pool_name}")


@node_app.command("list")
@handled
def node_list(
    pool: Annotated[str | None, typer.Option("--pool", help="Only this pool.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Nodes, with labels (fabric.domain derived) and state."""
    rows = setup.node_list(ctx(), pool)
    emit(as_json, [js.node(n) for n in rows], human.nodes(rows))


@node_app.command("show")
@handled
def node_show(node: str, as_json: JsonFlag = False) -> None:
    """One node, its maintenance windows and its desired state (what it should run)."""
    d = setup.node_show(ctx(), node)
    doc = js.node(d.node)
    doc["pool"] = d.pool_name
    doc["maintenance"] = [
        {"from": m.window.start, "until": m.window.end, "reason": m.reason} for m in d.maintenance
    ]
    doc["desiredState"] = [js.assignment(a) for a in d.desired]  # type: ignore[arg-type]
    emit(as_json, doc, human.nodes([d.node]))
    if not (as_json or G.json):
        for m in d.maintenance:
            out.print(f"maintenance {iso(m.window.start)} → {iso(m.window.end)} {m.reason or ''}")
        out.print(human.desired(d.desired))  # type: ignore[arg-type]


@node_app.command("label")
@handled
def node_label(
    node: str,
    labels: Annotated[list[str], typer.Argument(help="k=v to set, k- to remove.")],
    as_json: JsonFlag = False,
) -> None:
    """Set or remove operator labels (rack, zone, …)."""
    n = setup.node_label(ctx(), node, labels)
    emit(as_json, js.node(n), human.nodes([n]))


@node_app.command("report-bound")
@handled
def node_report_bound(node: str, rsv: str, as_json: JsonFlag = False) -> None:
    """What a node agent calls once it has bound its devices for a reservation."""
    r = ticking.report_bound(ctx(), node, rsv)
    emit(as_json, js.reservation(r), human.reservation(r))


tenant_app = typer.Typer(help="Tenants: who reservations belong to.", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")


@tenant_app.command("create")
@handled
def tenant_create(tenant: str, as_json: JsonFlag = False) -> None:
    """Create a tenant."""
    setup.tenant_create(ctx(), tenant)
    emit(as_json, {"id": tenant}, f"created tenant {tenant}")


@tenant_app.command("list")
@handled
def tenant_list(as_json: JsonFlag = False) -> None:
    """Every tenant."""
    ids = setup.tenant_list(ctx())
    emit(as_json, [{"id": t} for t in ids], "\n".join(ids) or "no tenants")


quota_app = typer.Typer(help="Quotas: GPUs a tenant may hold at once.", no_args_is_help=True)
app.add_typer(quota_app, name="quota")


@quota_app.command("set")
@handled
def quota_set(
    tenant: TenantOpt,
    gpus: Annotated[int, typer.Option("--gpus", help="The cap in GPUs.")],
    pool: Annotated[
        str | None, typer.Option("--pool", help="Only in this pool (default: everywhere).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Cap the GPUs a tenant holds at once, in a pool or everywhere."""
    c = ctx()
    setup.quota_set(c, tenant, pool, gpus)
    lines = setup.quota_show(c, tenant)
    emit(as_json, _quota_doc(tenant, lines), f"quota for {tenant} set")


def _quota_doc(tenant: str, lines: list[setup.QuotaLine]) -> JsonValue:
    return {
        "tenantId": tenant,
        "quotas": [
            {"poolId": q.pool_id, "pool": q.pool_name, "gpus": q.gpus, "held": q.held}
            for q in lines
        ],
    }


@quota_app.command("show")
@handled
def quota_show(tenant: TenantOpt, as_json: JsonFlag = False) -> None:
    """A tenant's caps and what it holds against them."""
    lines = setup.quota_show(ctx(), tenant)
    text = (
        "\n".join(f"{q.pool_name or 'all pools'}: {q.held} of {q.gpus} GPUs held" for q in lines)
        or f"{tenant} has no quota (unlimited)"
    )
    emit(as_json, _quota_doc(tenant, lines), text)


config_app = typer.Typer(help="Engine settings.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("get")
@handled
def config_get(
    key: Annotated[str | None, typer.Argument()] = None, as_json: JsonFlag = False
) -> None:
    """Show one setting or all of them."""
    values = setup.config_get(ctx(), key)
    emit(as_json, values, "\n".join(f"{k} = {jsonlib.dumps(v)}" for k, v in values.items()))


@config_app.command("set")
@handled
def config_set(key: str, value: str, as_json: JsonFlag = False) -> None:
    """Change one setting."""
    values = setup.config_set(ctx(), key, value)
    emit(as_json, values, "\n".join(f"{k} = {jsonlib.dumps(v)}" for k, v in values.items()))


# ---------------------------------------------------------------- reserving

PoolOpt = Annotated[
    str | None, typer.Option("--pool", help="Pool id or name (optional with one pool).")
]
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
    at = now()
    models = tuple(sorted({m.strip() for m in model.split(",") if m.strip()})) if model else ()
    return ReserveArgs(
        tenant=tenant,
        pool=pool,
        gpus=gpus,
        duration_ms=parse_duration(duration),
        models=models,
        topology=topology,
        gang=gang,
        topology_key=topology_key,
        start=parse_time(start, at) if start is not None else None,
        spot=spot,
        node_lease=node_lease,
        key=key,
    )


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
    r = booking.reserve(ctx(), args)
    emit(as_json, js.reservation(r), human.reservation(r))


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
    p = booking.preview(c, args)
    doc = js.preview(p)
    lines = booking.explain(c, args) if explain else []
    if explain:
        doc["explain"] = [{"subject": s, "verdict": v} for s, v in lines]
    emit(as_json, doc, human.preview(p))
    if explain and not (as_json or G.json):
        for subject, verdict in lines:
            out.print(f"  {subject}: {verdict}")


RsvArg = Annotated[str, typer.Argument(help="The reservation id (rsv_…).")]


@app.command()
@handled
def get(rsv: RsvArg, as_json: JsonFlag = False) -> None:
    """One reservation."""
    r = booking.get(ctx(), rsv)
    emit(as_json, js.reservation(r), human.reservation(r))


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
    rows = booking.list_reservations(ctx(), tenant, pool, state or [], key)
    if ids and not (as_json or G.json):
        sys.stdout.write("".join(f"{r.id}\n" for r in rows))
        return
    emit(as_json, [js.reservation(r) for r in rows], human.reservations(rows))


@app.command()
@handled
def cancel(rsv: RsvArg, as_json: JsonFlag = False) -> None:
    """Withdraw a pending or placed reservation; its quota is refunded."""
    r = booking.cancel(ctx(), rsv)
    emit(as_json, js.reservation(r), human.reservation(r))


@app.command()
@handled
def extend(
    rsv: RsvArg,
    by: Annotated[str, typer.Option("--by", help="DURATION to add to the end.")],
    as_json: JsonFlag = False,
) -> None:
    """Move the end later on every node, or on none (CONFLICT on a collision)."""
    r = booking.extend(ctx(), rsv, parse_duration(by))
    emit(as_json, js.reservation(r), human.reservation(r))


@app.command()
@handled
def release(rsv: RsvArg, as_json: JsonFlag = False) -> None:
    """Give the GPUs back now."""
    r = booking.release(ctx(), rsv)
    emit(as_json, js.reservation(r), human.reservation(r))


# ---------------------------------------------------------------- running


@app.command()
@handled
def tick(
    until: Annotated[
        str | None, typer.Option("--until", help="Tick at every step up to TIME.")
    ] = None,
    step: Annotated[str, typer.Option("--step", help="DURATION between ticks.")] = "30s",
    as_json: JsonFlag = False,
) -> None:
    """Advance the lifecycle at now (or at every step to --until); prints what changed."""
    c = ctx()
    if until is None:
        changes = ticking.tick(c)
    else:
        end = parse_time(until, c.now)
        step_ms = parse_duration(step)
        if end < c.now:
            raise InvalidInput("--until must not be before --now")
        if (end - c.now) // step_ms > 1_000_000:
            raise InvalidInput("--until/--step make more than a million ticks; use a longer --step")
        with _progress(as_json, "ticking") as advance:
            changes = ticking.tick_until(c, end, step_ms, advance)
    emit(
        as_json,
        {"now": c.now, "changes": [js.event(e) for e in changes]},
        "\n".join(human.event_line(e) for e in changes) or "nothing to do",
    )


@app.command()
@handled
def repair(
    rsv: Annotated[
        str | None, typer.Argument(help="One reservation; default: every placed one.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run the BookingRepair check now."""
    changes = ticking.repair(ctx(), rsv)
    emit(
        as_json,
        {"changes": [js.event(e) for e in changes]},
        "\n".join(human.event_line(e) for e in changes) or "every booking checked is still good",
    )


@app.command()
@handled
def timeline(
    pool: PoolOpt = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only this tenant's bookings.")
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
    emit(as_json, js.timeline(t), timeline_chart(t, width=min(out.width, 100)))


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
    as_json: JsonFlag = False,
) -> None:
    """The append-only event log."""
    rows = views.events(ctx(), tenant, reservation, since)
    emit(as_json, [js.event(e) for e in rows], human.events(rows))


# ---------------------------------------------------------------- hardware state (BookingRepair)


@node_app.command("cordon")
@handled
def node_cordon(
    node: str,
    reason: Annotated[str | None, typer.Option("--reason", help="Why, for the event log.")] = None,
    from_: Annotated[
        str | None, typer.Option("--from", help="Maintenance window start (TIME).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Maintenance window end (TIME).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Stop placing on a node; with --from/--until, only for a maintenance window."""
    c = ctx()
    if (from_ is None) != (until is None):
        raise InvalidInput("a maintenance window needs both --from and --until")
    if from_ is not None and until is not None:
        m = setup.node_maintenance(c, node, _window(from_, until, c.now), reason)
        doc: JsonValue = {
            "nodeId": node,
            "maintenance": {"from": m.window.start, "until": m.window.end, "reason": reason},
        }
        emit(
            as_json,
            doc,
            f"{node}: maintenance {iso(m.window.start)} → {iso(m.window.end)};"
            " placed bookings that overlap it were repaired",
        )
        return
    n = setup.node_flag(c, node, "node.cordoned", reason, schedulable=0, cordon_reason=reason)
    emit(as_json, js.node(n), f"{node} cordoned; `repair` moves future bookings off it now")


@node_app.command("uncordon")
@handled
def node_uncordon(node: str, as_json: JsonFlag = False) -> None:
    """Place on a node again (also lifts its maintenance windows)."""
    n = setup.node_uncordon(ctx(), node)
    emit(as_json, js.node(n), f"{node} uncordoned")


@node_app.command("mark-unreachable")
@handled
def node_mark_unreachable(
    node: str,
    reason: Annotated[str | None, typer.Option("--reason", help="Why, for the event log.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Record that a node stopped answering: no placement, no binding there."""
    n = setup.node_flag(ctx(), node, "node.unreachable", reason, reachable=0)
    emit(as_json, js.node(n), f"{node} marked unreachable")


@node_app.command("mark-reachable")
@handled
def node_mark_reachable(node: str, as_json: JsonFlag = False) -> None:
    """Record that a node answers again."""
    n = setup.node_flag(ctx(), node, "node.reachable", None, reachable=1)
    emit(as_json, js.node(n), f"{node} marked reachable")


device_app = typer.Typer(help="GPU health: quarantine and restore.", no_args_is_help=True)
app.add_typer(device_app, name="device")


@device_app.command("quarantine")
@handled
def device_quarantine(
    device: Annotated[str, typer.Argument(help="NODE:INDEX, e.g. west-01:3")],
    reason: Annotated[str, typer.Option("--reason", help="e.g. xid-79")],
    as_json: JsonFlag = False,
) -> None:
    """Take a GPU out of service; `repair` moves future bookings off it."""
    n = setup.device_health(ctx(), device, False, reason)
    emit(as_json, js.node(n), f"{device} quarantined ({reason})")


@device_app.command("restore")
@handled
def device_restore(
    device: Annotated[str, typer.Argument(help="NODE:INDEX")], as_json: JsonFlag = False
) -> None:
    """Put a quarantined GPU back in service."""
    n = setup.device_health(ctx(), device, True, None)
    emit(as_json, js.node(n), f"{device} restored")


# ---------------------------------------------------------------- usage, meters, policies

meter_app = typer.Typer(
    help="Billing meters; usage for a missing meter is dead-lettered.", no_args_is_help=True
)
app.add_typer(meter_app, name="meter")


@meter_app.command("create")
@handled
def meter_create(name: str, as_json: JsonFlag = False) -> None:
    """Create a meter such as gpu.h100.hours or gpu.h100.spot.hours."""
    accounting.meter_create(ctx(), name)
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
    emit(as_json, [js.usage(u) for u in rows], human.usage(rows, dead_letter))


policy_app = typer.Typer(help="What a principal may reserve for a tenant.", no_args_is_help=True)
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
    emit(as_json, js.policy(pol), human.policies([pol]))


@policy_app.command("list")
@handled
def policy_list(
    tenant: TenantFilter = None,
    as_json: JsonFlag = False,
) -> None:
    """Policies, by tenant and principal."""
    rows = accounting.policy_list(ctx(), tenant)
    emit(as_json, [js.policy(p) for p in rows], human.policies(rows))


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


def _window(start: str, until: str, at: int) -> Window:
    return Window(parse_time(start, at), parse_time(until, at))


def main() -> None:
    """Entry point: Typer's own usage errors are reported in our format too (exit 2)."""
    argv = sys.argv[1:]
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="better-compute", standalone_mode=False)
    except typer.Abort:
        sys.stderr.write("error: INTERNAL: aborted\n")
        sys.exit(1)
    except Exception as exc:
        # The parser's usage errors (unknown option, missing or malformed value) carry these two.
        message = getattr(exc, "format_message", None)
        if message is None or not hasattr(exc, "exit_code"):
            raise
        text = str(message()).strip()
        if text:  # empty when a bare group printed its help (no_args_is_help)
            where = getattr(getattr(exc, "ctx", None), "command_path", None) or "better-compute"
            _report("INVALID_INPUT", f"{text} (see `{where} --help`)", "--json" in argv)
        sys.exit(InvalidInput.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
