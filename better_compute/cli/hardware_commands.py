"""Hardware state for BookingRepair: cordon, reachability, GPU quarantine."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer

from better_compute.cli.app import (
    JsonFlag,
    app,
    ctx,
    emit,
    handled,
    window_of,
)
from better_compute.cli.setup_commands import node_app
from better_compute.errors import InvalidInput
from better_compute.lazy import lazy
from better_compute.model import JsonValue
from better_compute.timeparse import iso

if TYPE_CHECKING:
    from better_compute.render import human
    from better_compute.render import json as js
    from better_compute.service import setup
    from better_compute.service.setup import Changed
else:
    human = lazy("better_compute.render.human")
    js = lazy("better_compute.render.json")
    setup = lazy("better_compute.service.setup")


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
        window = window_of(from_, until, c.now)  # a bad TIME: refused before the write
        # Without --now, `--from +1h` counts from the instant the write acts at, read with its
        # lock held (PRODUCT.md §2), as `tick --until +10m` does.
        at_lock = partial(window_of, from_, until) if c.asked is None else window
        added = setup.node_maintenance(c, node, at_lock, reason)
        m = added.maintenance
        doc: JsonValue = {
            "nodeId": node,
            "maintenance": {"from": m.window.start, "until": m.window.end, "reason": reason},
            "moved": list(added.moved),
            "waiting": list(added.waiting),
            "kept": list(added.kept),
            "running": list(added.running),
        }
        emit(
            as_json,
            doc,
            f"{node}: maintenance {iso(m.window.start)} → {iso(m.window.end)};"
            f" {human.repaired(added.moved, added.waiting, added.kept, added.running)}",
        )
        return
    done = setup.node_flag(c, node, "node.cordoned", reason, schedulable=0, cordon_reason=reason)
    emit(
        as_json,
        js.node(done.node),
        _said(
            done,
            f"{node} cordoned: nothing new is placed there; run `repair` to move its future"
            " bookings now (tick checks each one before it starts)",
            f"{node} was already cordoned" + (f" ({reason})" if reason else ""),
        ),
    )


@node_app.command("uncordon")
@handled
def node_uncordon(node: str, as_json: JsonFlag = False) -> None:
    """Place on a node again (also lifts its maintenance windows)."""
    done = setup.node_uncordon(ctx(), node)
    emit(
        as_json,
        js.node(done.node),
        _said(
            done,
            f"{node} uncordoned"
            + (f"; {done.lifted} maintenance window(s) lifted" if done.lifted else ""),
            f"{node} was not cordoned and has no maintenance window",
        ),
    )


@node_app.command("mark-unreachable")
@handled
def node_mark_unreachable(
    node: str,
    reason: Annotated[str | None, typer.Option("--reason", help="Why, for the event log.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Record that a node stopped answering: no placement, no binding there."""
    done = setup.node_flag(ctx(), node, "node.unreachable", reason, reachable=0)
    unrecorded = " (the reason is not recorded)" if reason is not None else ""
    emit(
        as_json,
        js.node(done.node),
        _said(
            done,
            f"{node} marked unreachable",
            f"{node} was already marked unreachable{unrecorded}",
        ),
    )


@node_app.command("mark-reachable")
@handled
def node_mark_reachable(node: str, as_json: JsonFlag = False) -> None:
    """Record that a node answers again."""
    done = setup.node_flag(ctx(), node, "node.reachable", None, reachable=1)
    emit(
        as_json,
        js.node(done.node),
        _said(done, f"{node} marked reachable", f"{node} was already reachable"),
    )


device_app = typer.Typer(no_args_is_help=False, help="GPU health: quarantine and restore.")
app.add_typer(device_app, name="device")


@device_app.command("quarantine")
@handled
def device_quarantine(
    device: Annotated[str, typer.Argument(help="NODE:INDEX, e.g. west-01:3")],
    reason: Annotated[str, typer.Option("--reason", help="e.g. xid-79")],
    as_json: JsonFlag = False,
) -> None:
    """Take a GPU out of service; `repair` moves future bookings off it."""
    done = setup.device_health(ctx(), device, False, reason)
    emit(
        as_json,
        js.node(done.node),
        _said(
            done, f"{device} quarantined ({reason})", f"{device} was already quarantined ({reason})"
        ),
    )


@device_app.command("restore")
@handled
def device_restore(
    device: Annotated[str, typer.Argument(help="NODE:INDEX")], as_json: JsonFlag = False
) -> None:
    """Put a quarantined GPU back in service."""
    done = setup.device_health(ctx(), device, True, None)
    emit(
        as_json,
        js.node(done.node),
        _said(done, f"{device} restored", f"{device} was already healthy"),
    )


def _said(done: Changed, changed: str, unchanged: str) -> str:
    """What a change to a node or GPU tells people: what it did, or that it was already so."""
    return changed if done.changed else f"{unchanged}; nothing changed"
