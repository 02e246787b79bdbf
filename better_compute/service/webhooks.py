"""`webhook add|list|delete|test|deliveries|redeliver` (issue 11).

Who may manage a webhook follows PRODUCT.md §6: a principal who may act for a tenant manages that
tenant's webhooks; a webhook for `--tenant '*'` receives every event, so only an admin may add,
see or touch one. Another tenant's webhook (or delivery) is NOT_FOUND, never FORBIDDEN.
"""

from __future__ import annotations

import re
import secrets
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace

from better_compute.errors import Conflict, InvalidInput, NotFound
from better_compute.model import EVENT_TYPES, Delivery, Event, JsonValue, Webhook
from better_compute.service import authz, delivery, fanout
from better_compute.service.authz import require_admin
from better_compute.service.context import Ctx
from better_compute.storage import ledger, repo, webhooks
from better_compute.storage.repo import Conn

ALL_TENANTS = "*"
#: The kinds of event a webhook may ask for: `--events reservation.preempting,node.*`.
NAMESPACES = (
    "admin",
    "config",
    "device",
    "inventory",
    "meter",
    "node",
    "policy",
    "pool",
    "quota",
    "reservation",
    "tenant",
    "webhook",
)
#: The namespaces whose events carry a tenant: the only ones a tenant's webhook can receive.
TENANT_NAMESPACES = ("policy", "quota", "reservation", "webhook")
#: A type is dotted words after its namespace (`pool.policy.set`); a pattern ends in `.*`.
_TYPE = re.compile(r"^([a-z]+)(?:\.[a-zA-Z]+)*\.(?:[a-zA-Z]+|\*)$")
MIN_SECRET, MAX_SECRET = 16, 256


def check_url(url: str) -> str:
    """http or https with a host; no credentials (the signature authenticates the sender)."""
    if not url or len(url) > 2048 or any(c.isspace() or not c.isprintable() for c in url):
        raise InvalidInput(
            "--url must be an http:// or https:// URL of at most 2048 characters, without spaces"
        )
    if not url.isascii():  # an HTTP request line is ASCII: such a URL could never be sent
        raise InvalidInput(
            f"--url {url!r} has characters that are not ASCII; percent-encode them (%C3%BC),"
            " and write a host in its xn-- form"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError as exc:
        raise InvalidInput(f"--url {url!r} is not a valid URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise InvalidInput(f"--url must use http or https, not {parts.scheme or 'no scheme'!r}")
    if "@" in parts.netloc:
        raise InvalidInput(
            "--url must not carry credentials (user:password@): receivers check the"
            " X-Better-Compute-Signature header instead"
        )
    if not parts.hostname:
        raise InvalidInput(f"--url {url!r} names no host")
    if parts.port == 0:
        raise InvalidInput(f"--url {url!r}: port 0 is no port; give one from 1 to 65535")
    return url


def check_events(text: str | None, tenant: str) -> tuple[str, ...]:
    """`TYPE,…`: event types (`reservation.preempting`) or patterns (`reservation.*`); none: all.
    A tenant's webhook may not ask for fleet events (`node.*`, …), which it would never get."""
    if text is None:
        return ()
    types = sorted({t.strip() for t in text.split(",") if t.strip()})
    if not types:
        raise InvalidInput("--events is empty; give event types such as reservation.preempting")
    for t in types:
        m = _TYPE.match(t)
        if t == "*":  # every event; the others are still checked: `*` excuses no misspelling
            continue
        if m is None or m.group(1) not in NAMESPACES:
            raise InvalidInput(
                f"--events: {t[:60]!r} is not an event type; give TYPE,… such as"
                f" reservation.preempting or reservation.*, of {', '.join(NAMESPACES)}"
            )
        if not _names_events(t):
            near = sorted(e for e in EVENT_TYPES if e.startswith(m.group(1) + "."))
            raise InvalidInput(
                f"--events: no event is of type {t!r}; {m.group(1)} events are"
                f" {', '.join(near)} (or {m.group(1)}.*)"
            )
        if tenant != ALL_TENANTS and m.group(1) not in TENANT_NAMESPACES:
            raise InvalidInput(
                f"--events: {t} events belong to the fleet, not to tenant {tenant}; a tenant's"
                f" webhook receives {', '.join(n + '.*' for n in TENANT_NAMESPACES)}; an admin's"
                " --tenant '*' webhook receives every event"
            )
    return () if "*" in types else tuple(types)


def _names_events(pattern: str) -> bool:
    """Whether a type (`reservation.preempting`) or pattern (`pool.policy.*`) names an event the
    log can hold: a misspelt one would make a webhook that never fires."""
    if pattern.endswith(".*"):
        return any(e.startswith(pattern[:-1]) for e in EVENT_TYPES)
    return pattern in EVENT_TYPES


def check_secret(secret: str | None) -> str:
    """A given secret, checked; otherwise a new random one (the one value replay cannot repeat)."""
    if secret is None:
        return "whsec_" + secrets.token_hex(32)
    if not (MIN_SECRET <= len(secret) <= MAX_SECRET) or not all(
        c.isascii() and c.isprintable() and not c.isspace() for c in secret
    ):
        raise InvalidInput(
            f"--secret must be {MIN_SECRET} to {MAX_SECRET} printable ASCII characters without"
            " spaces; leave it out to have one generated"
        )
    return secret


def add(
    ctx: Ctx, tenant: str, url: str, events: str | None, secret: str | None
) -> tuple[Webhook, str]:
    """Register a webhook; returns it and its secret (shown this once)."""
    url, types, key = check_url(url), check_events(events, tenant), check_secret(secret)
    with ctx.write() as conn:
        if tenant == ALL_TENANTS:
            require_admin(ctx.who, "add a webhook for every tenant")
        else:
            repo.require_tenant(conn, tenant)
            authz.require_tenant(conn, ctx.who, tenant)
        hook = Webhook(
            id=repo.next_id(conn, "whk"),
            tenant_id=tenant,
            url=url,
            events=types,
            secret=key,
            created_at=ctx.now,
            created_by=ctx.principal,
            cursor=0,
        )
        webhooks.insert_webhook(conn, hook)
        ctx.event("webhook.added", _tenant(hook), None, _about(hook, ctx))
        webhooks.set_cursor(conn, hook.id, repo.last_event_seq(conn))  # from the next event on
    return hook, key


def _tenant(hook: Webhook) -> str | None:
    return None if hook.tenant_id == ALL_TENANTS else hook.tenant_id


def _about(hook: Webhook, ctx: Ctx) -> dict[str, JsonValue]:
    """The log names the receiving host, never the whole URL: a `*` webhook's events are fleet
    events every principal reads, and URLs often carry a token in their path or query."""
    return {
        "webhookId": hook.id,
        "host": urllib.parse.urlsplit(hook.url).hostname,
        "events": list(hook.events),
        "by": ctx.principal,
    }


def _visible(conn: Conn, ctx: Ctx) -> list[Webhook]:
    seen = authz.visible_tenants(conn, ctx.who)
    return webhooks.webhooks(conn, seen)


def _mine(conn: Conn, ctx: Ctx, hook_id: str) -> Webhook:
    """A webhook this principal may manage; any other is NOT_FOUND."""
    hook = webhooks.get_webhook(conn, hook_id)
    if ctx.who.admin or (
        hook.tenant_id != ALL_TENANTS and authz.may_act_for(conn, ctx.who, hook.tenant_id)
    ):
        return hook
    raise NotFound(f"no webhook {hook_id!r}; `webhook list` shows them")


def list_(ctx: Ctx) -> list[Webhook]:
    """The webhooks this principal manages, each marked suspended when its creator may no
    longer see its events (fanout.receiving): deleting it, or restoring the creator's
    policy, is the manager's call."""
    with ctx.db.read() as conn:
        return [replace(h, suspended=not fanout.receiving(conn, h)) for h in _visible(conn, ctx)]


def delete(ctx: Ctx, hook_id: str) -> Webhook:
    """The webhook and its queue: nothing more is sent to it."""
    with ctx.write() as conn:
        hook = _mine(conn, ctx, hook_id)
        webhooks.delete_webhook(conn, hook.id)
        ctx.event("webhook.deleted", _tenant(hook), None, _about(hook, ctx))
        return hook


@dataclass(frozen=True)
class TestResult:
    webhook_id: str
    url: str
    status: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def test(ctx: Ctx, hook_id: str, body_of: Callable[[Event], str]) -> TestResult:
    """Send a `webhook.test` event now (not logged, seq 0) and report the receiver's answer."""
    with ctx.db.read() as conn:
        hook = _mine(conn, ctx, hook_id)
    event = Event(
        seq=0,
        type="webhook.test",
        at=ctx.now,
        tenant_id=_tenant(hook),
        reservation_id=None,
        data={"webhookId": hook.id},
        actor=ctx.principal,
        acting_admin=ctx.who.acting_admin,
    )
    timeout = ctx.settings.webhook_timeout_ms / 1000
    outcome = delivery.post_within(hook, body_of(event), timeout)
    return TestResult(hook.id, hook.url, outcome.status, outcome.error)


def deliveries(ctx: Ctx, failed: bool, hook_id: str | None) -> list[Delivery]:
    """Deliveries of the webhooks this principal manages, each with every attempt."""
    with ctx.db.read() as conn:
        hooks = [_mine(conn, ctx, hook_id)] if hook_id is not None else _visible(conn, ctx)
        state = webhooks.DEAD if failed else None
        return webhooks.deliveries(conn, [h.id for h in hooks], state=state)


def _not_suspended(
    conn: Conn, hooks: list[Webhook], targets: list[Delivery], named: str | None
) -> list[Delivery]:
    """The deliveries whose webhook still sends. A suspended webhook's (service/fanout.py,
    `receiving`) would be dead-lettered again by the next tick, each time with one more attempt
    lengthening its back-off for when it sends again (a review): one named (a delivery, or a
    webhook) is a CONFLICT, and `--failed` over every webhook leaves them dead."""
    admins = ledger.admins(conn)
    suspended = {h.id for h in hooks if not fanout.receiving(conn, h, admins)}
    hook = next((d.webhook_id for d in targets if d.webhook_id in suspended), None)
    if named is not None and hook is not None:
        raise Conflict(
            f"webhook {hook} is {fanout.SUSPENDED}; redeliver once they may see them again"
            " (an admin, or a policy for its tenant, gives that back)"
        )
    return [d for d in targets if d.webhook_id not in suspended]


def redeliver(
    ctx: Ctx, delivery_id: str | None, failed: bool, hook_id: str | None
) -> list[Delivery]:
    """Queue one delivery (or every dead-lettered one) again, with a fresh retry period."""
    if (delivery_id is None) == (not failed):
        raise InvalidInput("give one DELIVERY id or --failed (every dead-lettered delivery)")
    with ctx.write() as conn:
        hooks = [_mine(conn, ctx, hook_id)] if hook_id is not None else _visible(conn, ctx)
        ids = [h.id for h in hooks]
        if delivery_id is None:
            targets = webhooks.deliveries(conn, ids, state=webhooks.DEAD)
        else:
            targets = webhooks.deliveries(conn, ids, delivery_id=delivery_id)
            if not targets:
                raise NotFound(f"no delivery {delivery_id!r}; `webhook deliveries` lists them")
            if targets[0].state == webhooks.QUEUED:
                raise Conflict(f"delivery {delivery_id} is already queued; `tick` sends it")
        targets = _not_suspended(conn, hooks, targets, named=hook_id or delivery_id)
        for d in targets:
            webhooks.requeue(conn, d.id, ctx.now)
        # read back: one requeued behind an earlier queued event waits for it (Delivery.behind)
        return [webhooks.deliveries(conn, ids, delivery_id=d.id)[0] for d in targets]
