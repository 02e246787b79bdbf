"""Webhooks: add, list, delete, test, deliveries, redeliver (issue 11). `tick` delivers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from better_compute.cli.app import JsonFlag, app, ctx, emit, handled
from better_compute.lazy import lazy

if TYPE_CHECKING:
    from better_compute.render import webhooks as view
    from better_compute.service import webhooks
else:
    view = lazy("better_compute.render.webhooks")
    webhooks = lazy("better_compute.service.webhooks")

webhook_app = typer.Typer(
    no_args_is_help=False,
    help="Signed HTTP delivery of events; `tick` sends them, retries, and dead-letters.",
)
app.add_typer(webhook_app, name="webhook")

HookArg = Annotated[str, typer.Argument(help="A webhook id (whk_…).")]
HookFilter = Annotated[str | None, typer.Option("--webhook", help="Only this webhook.")]


@webhook_app.command("add")
@handled
def webhook_add(
    tenant: Annotated[
        str, typer.Option("--tenant", help="Whose events it receives; '*' for all (admins).")
    ],
    url: Annotated[str, typer.Option("--url", help="An http:// or https:// URL to POST to.")],
    events: Annotated[
        str | None,
        typer.Option(
            "--events",
            help="TYPE,… such as reservation.preempting or reservation.* (node.* and other"
            " fleet events: --tenant '*' only); default all.",
        ),
    ] = None,
    secret: Annotated[
        str | None, typer.Option("--secret", help="The signing key; default: one is generated.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Add a webhook; its secret is printed this once, only its fingerprint afterwards."""
    hook, key = webhooks.add(ctx(), tenant, url, events, secret)
    emit(as_json, view.webhook(hook, key), view.added(hook, key))


@webhook_app.command("list")
@handled
def webhook_list(as_json: JsonFlag = False) -> None:
    """The webhooks you manage, with their secrets' fingerprints."""
    rows = webhooks.list_(ctx())
    emit(as_json, [view.webhook(h) for h in rows], lambda: view.webhooks(rows))


@webhook_app.command("delete")
@handled
def webhook_delete(hook_id: HookArg, as_json: JsonFlag = False) -> None:
    """Delete a webhook and its queue."""
    hook = webhooks.delete(ctx(), hook_id)
    emit(as_json, {"id": hook.id, "deleted": True}, f"deleted webhook {hook.id}")


@webhook_app.command("test")
@handled
def webhook_test(hook_id: HookArg, as_json: JsonFlag = False) -> None:
    """Send a signed webhook.test event now and print the receiver's answer."""
    result = webhooks.test(ctx(), hook_id, view.body)
    emit(as_json, view.test_result(result), view.test_line(result))


@webhook_app.command("deliveries")
@handled
def webhook_deliveries(
    failed: Annotated[bool, typer.Option("--failed", help="Only dead-lettered ones.")] = False,
    webhook: HookFilter = None,
    as_json: JsonFlag = False,
) -> None:
    """Each delivery with every attempt's status code or error."""
    rows = webhooks.deliveries(ctx(), failed, webhook)
    emit(as_json, [view.delivery(d) for d in rows], lambda: view.deliveries(rows))


@webhook_app.command("redeliver")
@handled
def webhook_redeliver(
    delivery: Annotated[str | None, typer.Argument(help="A delivery id (dlv_…).")] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Every dead-lettered delivery.")] = False,
    webhook: HookFilter = None,
    as_json: JsonFlag = False,
) -> None:
    """Queue a delivery (or every dead-lettered one) again; the next tick sends it."""
    rows = webhooks.redeliver(ctx(), delivery, failed, webhook)
    emit(as_json, [view.delivery(d) for d in rows], lambda: view.deliveries(rows))
