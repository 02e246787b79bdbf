"""Setting up: init, demo, inventory, pools, nodes, tenants, quotas, settings."""

from __future__ import annotations

import json as jsonlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from better_compute import clock
from better_compute.cli import pool_policy
from better_compute.cli.app import (
    G,
    JsonFlag,
    TenantOpt,
    app,
    ctx,
    emit,
    handled,
    me,
    out,
    progress_bar,
)
from better_compute.errors import InvalidInput
from better_compute.lazy import lazy
from better_compute.model import JsonValue
from better_compute.timeparse import human_duration, iso, parse_duration

if TYPE_CHECKING:
    from better_compute import inventory
    from better_compute.render import human
    from better_compute.render import json as js
    from better_compute.service import admins, budgets, setup, ticking, views
else:
    budgets = lazy("better_compute.service.budgets")
    human = lazy("better_compute.render.human")
    js = lazy("better_compute.render.json")
    inventory = lazy("better_compute.inventory")
    admins = lazy("better_compute.service.admins")
    setup = lazy("better_compute.service.setup")
    ticking = lazy("better_compute.service.ticking")
    views = lazy("better_compute.service.views")


@app.command()
@handled
def init(
    demo: Annotated[bool, typer.Option("--demo", help="Load the demo inventory too.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing database.")] = False,
    group: Annotated[
        str | None,
        typer.Option("--group", help="Share the file read-write with this group (default 0600)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create the database (and with --demo, a small inventory to try every command on).

    Under --now (or BETTER_COMPUTE_NOW) the ledger runs on that manual clock; without, on the
    real clock. You become its first admin."""
    from better_compute.demo import DEMO_INVENTORY

    manual = G.now_text is not None
    admin = setup.init_admin(G.db, me(), G.principal, force, manual)
    at = clock.now_ms(G.now_text)
    fill = DEMO_INVENTORY if demo else None
    db, counts = setup.init(G.db, at, force, manual=manual, admin=admin, group=group, fill=fill)
    db.close()
    clock_doc = "manual" if manual else "real"
    emit(
        as_json,
        {"db": G.db, "demo": demo, "clock": clock_doc, "admin": admin, **counts},
        lambda: human.created(G.db, demo, counts, manual, at, admin),
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
    if G.json:
        raise InvalidInput(
            "demo is a tour for people and prints no JSON; for a ledger to script against, run"
            " `better-compute --db demo.db --now 2026-01-01T00:00:00Z init --demo`"
        )
    from better_compute.cli.tour import run_tour

    run_tour(out, keep)


inventory_app = typer.Typer(
    no_args_is_help=False, help="The inventory as JSON: import (upsert) and export."
)
app.add_typer(inventory_app, name="inventory")


@inventory_app.command("import")
@handled
def inventory_import(
    file: Annotated[
        Path, typer.Argument(help="An inventory file (JSON, see README; or CSV), or - for stdin.")
    ],
    fmt: Annotated[
        str,
        typer.Option("--format", help="json (the default) or openb-nodes (an openb node list)."),
    ] = "json",
    pool: Annotated[
        str | None,
        typer.Option(
            "--pool", help="openb-nodes: the pool to create or fill, by name or id (default openb)."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Upsert pools, nodes and tenants from a file: all of it, or nothing when any part is bad."""
    if fmt not in ("json", "openb-nodes"):
        raise InvalidInput(f"--format must be json or openb-nodes, got {fmt!r}")
    if pool is not None and fmt == "json":
        raise InvalidInput("--pool applies to --format openb-nodes; a JSON inventory names pools")
    c = ctx()
    skipped = None
    if fmt == "json":
        inv, nodes = setup.read_inventory(c, str(file)), None
    else:
        nodes = setup.read_openb_nodes(c, str(file), pool)
        inv, skipped = nodes.inventory, nodes.skipped
    with progress_bar(as_json, "importing nodes") as advance:
        if nodes is None:
            counts = setup.inventory_import(c, inv, advance)
        else:  # a refusal names the row's line
            counts = setup.import_openb_nodes(c, nodes, advance)
    doc: dict[str, JsonValue] = dict(counts) if skipped is None else {**counts, "skipped": skipped}
    emit(as_json, doc, lambda: human.imported(counts, skipped))


@inventory_app.command("export")
@handled
def inventory_export(as_json: JsonFlag = False) -> None:
    """Print the inventory in the import format."""
    doc = inventory.inventory_to_json(setup.inventory_export(ctx()))
    sys.stdout.write(jsonlib.dumps(doc, indent=None if (as_json or G.json) else 2) + "\n")


pool_app = typer.Typer(no_args_is_help=False, help="Pools of nodes.")
app.add_typer(pool_app, name="pool")
pool_app.add_typer(pool_policy.policy_app, name="policy")  # issue 10: calendar policies


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
    emit(as_json, [js.pool(r) for r in rows], lambda: human.pools(rows))


@pool_app.command("show")
@handled
def pool_show(pool: str, as_json: JsonFlag = False) -> None:
    """One pool's rollup now: allocatable, inUse, reserved, free."""
    r = views.pool(ctx(), pool)
    emit(as_json, js.pool(r), lambda: human.pools([r]))


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
    no_args_is_help=False, help="Nodes: add, inspect, label, cordon, reachability, agents."
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
    emit(as_json, js.node(shown.node), f"added {node} ({gpus} × {spec.model}) to {shown.pool_name}")


@node_app.command("list")
@handled
def node_list(
    pool: Annotated[str | None, typer.Option("--pool", help="Only this pool.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Nodes, with labels (fabric.domain derived) and state."""
    rows = setup.node_list(ctx(), pool)
    emit(as_json, [js.node(n) for n in rows], lambda: human.nodes(rows))


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
    emit(as_json, doc, lambda: human.nodes([d.node]))
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
    done = setup.node_label(ctx(), node, labels)
    emit(as_json, js.node(done.node), lambda: human.nodes([done.node]))


@node_app.command("report-bound")
@handled
def node_report_bound(node: str, rsv: str, as_json: JsonFlag = False) -> None:
    """What a node agent calls once it has bound its devices for a reservation."""
    r = ticking.report_bound(ctx(), node, rsv)
    emit(as_json, js.reservation(r), lambda: human.reservation(r))


admin_app = typer.Typer(
    no_args_is_help=False, help="Admins: who may change the fleet and the rules, and use --as."
)
app.add_typer(admin_app, name="admin")
PrincipalArg = Annotated[str, typer.Argument(help="A user name (the OS user who runs commands).")]


def _show_admins(as_json: bool, names: list[str]) -> None:
    emit(as_json, list[JsonValue](names), "\n".join(names))


@admin_app.command("add")
@handled
def admin_add(principal: PrincipalArg, as_json: JsonFlag = False) -> None:
    """Make a principal an admin (admins only)."""
    _show_admins(as_json, admins.add(ctx(), principal))


@admin_app.command("remove")
@handled
def admin_remove(principal: PrincipalArg, as_json: JsonFlag = False) -> None:
    """Take admin away from a principal; the last admin stays (admins only)."""
    _show_admins(as_json, admins.remove(ctx(), principal))


@admin_app.command("list")
@handled
def admin_list(as_json: JsonFlag = False) -> None:
    """Every admin: who may change the fleet and the rules."""
    _show_admins(as_json, admins.list_(ctx()))


tenant_app = typer.Typer(no_args_is_help=False, help="Tenants: who reservations belong to.")
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


quota_app = typer.Typer(
    no_args_is_help=False, help="Quotas: GPUs held at once, and GPU-hour budgets over a period."
)
app.add_typer(quota_app, name="quota")


@quota_app.command("set")
@handled
def quota_set(
    tenant: TenantOpt,
    gpus: Annotated[
        int | None, typer.Option("--gpus", help="The cap in GPUs held at once.")
    ] = None,
    gpu_hours: Annotated[
        float | None,
        typer.Option("--gpu-hours", help="A budget in GPU-hours per --period.", metavar="H"),
    ] = None,
    period: Annotated[
        str | None,
        typer.Option(
            "--period", help="The budget's rolling period (default 30d).", metavar="DURATION"
        ),
    ] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="Only in this pool (default: everywhere).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Cap the GPUs a tenant holds at once, and/or its GPU-hours over a rolling period.

    Example: better-compute quota set --tenant acme --gpus 64 --gpu-hours 20000 --period 30d
    """
    if period is not None and gpu_hours is None:
        raise InvalidInput("--period applies to a budget; add --gpu-hours H")
    if gpus is None and gpu_hours is None:
        raise InvalidInput("give --gpus N, --gpu-hours H, or both")
    period_ms = parse_duration(period or "30d")
    if gpu_hours is not None:
        budgets.validate(gpu_hours, period_ms)  # before anything is written
    c = ctx()
    if gpus is not None:
        setup.quota_set(c, tenant, pool, gpus)
    if gpu_hours is not None:
        budgets.set_budget(c, tenant, pool, gpu_hours, period_ms)
    emit(
        as_json,
        _quota_doc(tenant, setup.quota_show(c, tenant), budgets.show(c, tenant)),
        f"quota for {tenant} set",
    )


def _quota_doc(
    tenant: str, lines: list[setup.QuotaLine], spend: list[budgets.BudgetLine]
) -> JsonValue:
    return {
        "tenantId": tenant,
        "quotas": [
            {
                "poolId": q.pool_id,
                "pool": q.pool_name,
                "gpus": q.gpus,
                "held": q.held,
                "remaining": max(0, q.gpus - q.held),
            }
            for q in lines
        ],
        "budgets": [
            {
                "poolId": b.pool_id,
                "pool": b.pool_name,
                "gpuHours": b.gpu_hours,
                "periodMs": b.period_ms,
                "used": b.used,
                "remaining": b.remaining,
                "bookedAhead": b.ahead,
            }
            for b in spend
        ],
    }


@quota_app.command("show")
@handled
def quota_show(tenant: TenantOpt, as_json: JsonFlag = False) -> None:
    """A tenant's caps and budgets: what it holds and has used against them, and what remains.

    Example: better-compute quota show --tenant acme
    """
    c = ctx()
    lines, spend = setup.quota_show(c, tenant), budgets.show(c, tenant)
    text = [
        f"{q.pool_name or 'all pools'}: {q.held} of {q.gpus} GPUs held, {max(0, q.gpus - q.held)}"
        " remaining"
        for q in lines
    ]
    text += [
        f"{b.pool_name or 'all pools'}: {b.used:g} of {b.gpu_hours:g} GPU-hours used in the last"
        f" {human_duration(b.period_ms)} ({b.remaining:g} not used), {b.ahead:g} booked in the"
        f" next {human_duration(b.period_ms)}; a request is refused if any rolling"
        f" {human_duration(b.period_ms)} period it reaches would pass {b.gpu_hours:g}"
        for b in spend
    ]
    emit(
        as_json,
        _quota_doc(tenant, lines, spend),
        "\n".join(text) or f"{tenant} has no quota (unlimited)",
    )


config_app = typer.Typer(no_args_is_help=False, help="Engine settings.")
app.add_typer(config_app, name="config")


@config_app.command("get")
@handled
def config_get(
    key: Annotated[str | None, typer.Argument()] = None, as_json: JsonFlag = False
) -> None:
    """Show one setting or all of them."""
    values = setup.config_get(ctx(), key)
    emit(as_json, values, "\n".join(f"{k} = {jsonlib.dumps(v)}" for k, v in values.items()))


#: A negative VALUE (`-1`) reaches the command, which says what is allowed, instead of Typer's
#: "No such option: -1".
@config_app.command("set", context_settings={"ignore_unknown_options": True})
@handled
def config_set(key: str, value: str, as_json: JsonFlag = False) -> None:
    """Change one setting; `config get` lists them all with their values (times in ms)."""
    values = setup.config_set(ctx(), key, value)
    emit(as_json, values, "\n".join(f"{k} = {jsonlib.dumps(v)}" for k, v in values.items()))
