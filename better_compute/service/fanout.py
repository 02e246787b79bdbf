"""A tick's fan-out of the event log to webhooks, and which webhooks are suspended because their
creator lost the rights they send with (docs/webhooks.md, "Who may do what"). A change of who may
act for whom runs the same fan-out first, so rights are judged at every such change as at every
tick. Kept apart from delivery.py, which imports the HTTP client, so those commands do not load
it."""

from __future__ import annotations

from collections.abc import Sequence

from better_compute.model import Webhook
from better_compute.service.context import Ctx
from better_compute.storage import ledger, repo, webhooks
from better_compute.storage.repo import Conn

SUSPENDED = "suspended: the principal who added this webhook may no longer see its events"


def receiving(conn: Conn, hook: Webhook, admins: Sequence[str] | None = None) -> bool:
    """Whether a webhook still sends: with the rights of the principal who added it, who must
    still be an admin (a `*` webhook) or may still act for its tenant (§6). Otherwise it is
    suspended: a principal who lost a tenant keeps no window onto its events through a URL it
    chose. A ledger from before the admin list (no admins recorded) suspends nothing."""
    admins = ledger.admins(conn) if admins is None else admins
    if not admins or hook.created_by in admins:
        return True
    return hook.tenant_id != "*" and ledger.acts_for(conn, hook.created_by, hook.tenant_id)


def fan_out_in(ctx: Ctx, conn: Conn, *, tick: bool = True) -> list[Webhook]:
    """Queue each webhook's new events, then move its cursor to the log's end, inside the
    caller's write transaction. A suspended webhook (receiving) queues nothing, since the
    events logged while it is suspended are not its, and a tick dead-letters what it had
    queued, with the reason as its attempt: nothing is left waiting on rights that may never
    come back, and `redeliver` puts it back once they have. Returns the webhook of each
    delivery it dead-lettered.

    `policy set`/`delete` and `admin add`/`remove` run it (not a `tick`) just before their
    change: each webhook takes the events logged while its creator's rights stood as they
    were, so a creator whose rights come back before a tick has run is not sent what was
    logged while they were gone (a review found it was), and what it queued while they stood
    stays queued for the next tick to judge (a second review: a rights change dead-lettered
    it, though the rights were back by the tick)."""
    dead: list[Webhook] = []
    last = repo.last_event_seq(conn)
    admins = ledger.admins(conn)
    for hook in webhooks.webhooks(conn):
        if not receiving(conn, hook, admins):
            for delivery_id in webhooks.queued_ids(conn, hook.id) if tick else ():
                webhooks.record_attempt(
                    conn, delivery_id, ctx.now, None, SUSPENDED, webhooks.DEAD, ctx.now
                )
                dead.append(hook)
            webhooks.set_cursor(conn, hook.id, last)
            continue
        if hook.cursor >= last:
            continue
        tenant = None if hook.tenant_id == "*" else hook.tenant_id
        for event in repo.events(conn, tenant=tenant, reservation=None, since=hook.cursor):
            if hook.wants(event):
                webhooks.enqueue(conn, repo.next_id(conn, "dlv"), hook.id, event.seq, ctx.now)
        webhooks.set_cursor(conn, hook.id, last)
    return dead
