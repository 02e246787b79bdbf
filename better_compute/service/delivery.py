"""Delivering events to webhooks, after a tick's lifecycle transaction has committed (issue 11).

The lifecycle never waits for a receiver: `tick` commits its transitions first, then calls
`deliver`, which spends at most `webhook.tickBudgetMs` of real time and reports what it left.

1. Fan out: each webhook's new events (seq above its cursor, its tenant's only, of its types) are
   queued, one delivery row each, in one short write transaction.
2. Per webhook only the head of its queue (lowest seq) is sent, so events arrive in seq order: a
   later event waits while an earlier one is retried.
3. A head is claimed in a write transaction before it is sent (a token and a lapse time on the
   real clock, which is what separates processes); a second tick skips a claimed head.
4. Sends run in daemon threads, several webhooks at once; the main thread waits for answers only
   until the budget ends. A receiver that hangs, trickles, answers 10 MB, redirects or resets costs
   one thread and at most `webhook.timeoutMs`; an answer still missing at the budget's end is
   recorded as a failed attempt, and the process may exit with the thread still blocked.
5. Each outcome is recorded in its own write transaction: 2xx is delivered; otherwise the next
   attempt waits an exponential backoff with jitter, on the ledger's clock, until
   `webhook.retryForMs` after it was queued has passed; then it is dead-lettered.

Clocks: the retry schedule is the ledger's (on a manual-clock ledger, its acting instant, so tests
and what-ifs move it with `--now`); the signature's `t` and the claim's lapse are the real wall
clock, because receivers compare `t` with their own clock to refuse replays.
"""

from __future__ import annotations

import hashlib
import hmac
import queue
import secrets
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from better_compute import clock
from better_compute.errors import Unavailable
from better_compute.model import Event, Webhook
from better_compute.service import authz, fanout
from better_compute.service.context import Ctx
from better_compute.storage import ledger, webhooks

SIGNATURE_HEADER = "X-Better-Compute-Signature"
#: The first retry waits about this long; each next one twice as long, up to the cap.
BACKOFF_BASE_MS = 10_000
BACKOFF_CAP_MS = 3_600_000
#: Webhooks sent to at once: one hanging receiver must not hold up the others.
MAX_IN_FLIGHT = 16
#: A claim outlives the send it covers by this much before another tick may take it over.
CLAIM_SLACK_MS = 60_000
USER_AGENT = "better-compute-webhooks/1"
#: How long recording the budget's unanswered sends may wait for the lock (claims lapse anyway).
GIVE_UP_LOCK_MS = 1_000


@dataclass(frozen=True)
class Outcome:
    """A receiver's answer: its HTTP status, or why there was none; `error` is None on a 2xx."""

    status: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Report:
    """What one tick's delivery did, and how many deliveries it left queued for the next."""

    sent: int
    failed: int
    dead_lettered: int
    left: int | None


def retry_delay(attempt: int, delivery_id: str) -> int:
    """Backoff after failed attempt `attempt` (1, 2, …): base × 2^(attempt-1), capped, times a
    jitter in [0.5, 1) drawn from the delivery's id and the attempt, so receivers that failed
    together do not all come back together, and a replay of the same ledger waits the same."""
    base = min(BACKOFF_BASE_MS * 2 ** min(attempt - 1, 30), BACKOFF_CAP_MS)
    digest = hashlib.sha256(f"{delivery_id}:{attempt}".encode()).digest()
    jitter = int.from_bytes(digest[:4]) / 2**32
    return int(base * (0.5 + 0.5 * jitter))


def sign(secret: str, t: int, body: bytes) -> str:
    """The header value: `t=<epoch ms>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`."""
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a new address: following it could send tenant events
    somewhere the webhook's owner never named."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(
    _NoRedirects, urllib.request.HTTPSHandler(context=ssl.create_default_context())
)


def post(hook: Webhook, body: str, timeout_s: float) -> Outcome:
    """POST one signed event; never raises. Only the status line and headers are read."""
    data = body.encode()
    try:
        request = urllib.request.Request(
            hook.url,
            data=data,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                SIGNATURE_HEADER: sign(hook.secret, clock.real_ms(), data),
            },
        )
        with _OPENER.open(request, timeout=max(timeout_s, 0.001)) as answer:
            status = int(answer.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        where = exc.headers.get("Location") if 300 <= exc.code < 400 else None
        note = f" to {where[:200]} (redirects are not followed)" if where else ""
        return Outcome(exc.code, f"HTTP {exc.code}{note}")
    except urllib.error.URLError as exc:
        return Outcome(None, _reason(exc.reason))
    except Exception as exc:  # a reset, a timeout, TLS, a bad reply: whatever a receiver sends
        return Outcome(None, _reason(exc))
    if 200 <= status < 300:
        return Outcome(status, None)
    return Outcome(status, f"HTTP {status}")


def post_within(hook: Webhook, body: str, timeout_s: float) -> Outcome:
    """post, waiting no longer than `timeout_s` for the whole exchange: urllib's timeout is per
    socket operation, and a receiver that trickles a byte at a time never trips it. The send
    goes on in a daemon thread that the process does not wait for (as a tick's do)."""
    answers: queue.Queue[Outcome] = queue.Queue()

    def send() -> None:
        answers.put(post(hook, body, timeout_s))

    threading.Thread(target=send, name=f"webhook test {hook.id}", daemon=True).start()
    try:
        return answers.get(timeout=timeout_s)
    except queue.Empty:
        return Outcome(None, TIMED_OUT)


TIMED_OUT = "timed out waiting for the receiver"
OUT_OF_BUDGET = Outcome(None, "no answer within the tick's delivery budget (webhook.tickBudgetMs)")


def _reason(exc: object) -> str:
    if isinstance(exc, TimeoutError):
        return TIMED_OUT
    text = f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else str(exc)
    return text[:300]


@dataclass(frozen=True)
class _Claimed:
    delivery_id: str
    hook: Webhook
    event: Event


def deliver(ctx: Ctx, body_of: Callable[[Event], str]) -> Report | None:
    """Fan out, then send queue heads until nothing is due or the budget is spent.

    None when the ledger has no webhooks, or none its principal may see (the tick's answer then
    says nothing of deliveries).
    The ledger's lock is waited for only as long as the budget lasts: a ledger locked by another
    command ends delivery for this tick (UNAVAILABLE is not the tick's failure: its lifecycle has
    committed), and `left` is then None when even the count cannot be read."""
    with ctx.db.read() as conn:
        if not webhooks.has_webhooks(conn):
            return None
    run = _Run(ctx, body_of)
    try:
        run.fan_out()
        run.send_until_done()
    except Unavailable:
        pass
    finally:
        run.give_up_the_rest()
        ctx.db.set_busy_timeout(ctx.settings.busy_timeout_ms)
    if run.sees_none:
        return None  # as a ledger without webhooks: others' are not its to know of
    try:
        with ctx.db.read() as conn:
            left: int | None = webhooks.queued_count(conn, run.seen)
    except Unavailable:
        left = None
    return Report(run.sent, run.failed, run.dead, left)


class _Run:
    """One tick's delivery: the budget, this tick's claim token, the sends in flight, the tally.
    A tick sends every webhook's events, whoever runs it, but tallies only the webhooks of the
    tenants its principal sees (`seen`; None: an admin, every webhook, fleet-wide ones included):
    another tenant's deliveries are NOT_FOUND to it, and so are their counts."""

    def __init__(self, ctx: Ctx, body_of: Callable[[Event], str]) -> None:
        self.ctx, self.body_of = ctx, body_of
        with ctx.db.read() as conn:
            self.seen = authz.visible_tenants(conn, ctx.who)
            self.sees_none = self.seen is not None and not webhooks.has_webhooks(conn, self.seen)
        self.deadline = clock.elapsed_s() + ctx.settings.webhook_budget_ms / 1000
        self.token = secrets.token_hex(8)
        self.answers: queue.Queue[tuple[_Claimed, Outcome]] = queue.Queue()
        self.in_flight: dict[str, _Claimed] = {}
        self.sent = self.failed = self.dead = 0

    def remaining(self) -> float:
        """Seconds of budget left; the ledger's lock is waited for no longer than that."""
        left = self.deadline - clock.elapsed_s()
        self.ctx.db.set_busy_timeout(max(100, int(left * 1000)))
        return left

    def shown(self, hook: Webhook) -> bool:
        return self.seen is None or hook.tenant_id in self.seen

    def fan_out(self) -> None:
        self.remaining()
        self.dead += sum(self.shown(hook) for hook in _fan_out(self.ctx))

    def send_until_done(self) -> None:
        timeout_s = self.ctx.settings.webhook_timeout_ms / 1000
        while (remaining := self.remaining()) > 0:
            room = MAX_IN_FLIGHT - len(self.in_flight)
            claimed = _claim_heads(self.ctx, self.token, set(self.in_flight), room) if room else []
            for job in claimed:
                self.in_flight[job.hook.id] = job
                _start(job, self.body_of(job.event), timeout_s, remaining, self.answers)
            if not self.in_flight:
                return  # nothing due, or every due head is another tick's
            try:
                job, outcome = self.answers.get(timeout=remaining)
            except queue.Empty:
                return
            del self.in_flight[job.hook.id]
            self.tally(job.hook, _record(self.ctx, job, outcome, self.token))

    def give_up_the_rest(self) -> None:
        """Sends still unanswered when the budget ran out are failed attempts, retried later."""
        gone = OUT_OF_BUDGET
        self.ctx.db.set_busy_timeout(GIVE_UP_LOCK_MS)
        for job in self.in_flight.values():
            try:
                self.tally(job.hook, _record(self.ctx, job, gone, self.token))
            except Unavailable:
                return  # its claim lapses on its own; the event is sent again then
        self.in_flight.clear()

    def tally(self, hook: Webhook, result: str) -> None:
        if not self.shown(hook):
            return
        self.sent += result == "sent"
        self.failed += result in (webhooks.QUEUED, webhooks.DEAD)
        self.dead += result == webhooks.DEAD


def _start(
    job: _Claimed,
    body: str,
    timeout: float,
    budget: float,
    answers: queue.Queue[tuple[_Claimed, Outcome]],
) -> None:
    """Send in a thread, waiting no longer than the receiver's timeout or the budget left. A
    wait the budget cut short is reported as the budget's, however the thread and the tick's
    own wait for the budget's end race each other."""

    def send() -> None:
        outcome = post(job.hook, body, min(timeout, budget))
        if budget < timeout and outcome.status is None and outcome.error == TIMED_OUT:
            outcome = OUT_OF_BUDGET
        answers.put((job, outcome))

    threading.Thread(target=send, name=f"webhook {job.hook.id}", daemon=True).start()


def _fan_out(ctx: Ctx) -> list[Webhook]:
    """The tick's fan-out (service/fanout.py) in a write transaction of its own."""
    with ctx.write() as conn:
        return fanout.fan_out_in(ctx, conn)


def _claim_heads(ctx: Ctx, token: str, busy: set[str], room: int) -> list[_Claimed]:
    """Claim the due head of each webhook not already being sent to, in one write transaction,
    in sending order (sending_order)."""
    claimed: list[_Claimed] = []
    with ctx.write() as conn:
        real_now = clock.real_ms()
        until = real_now + ctx.settings.webhook_timeout_ms + CLAIM_SLACK_MS
        due = [h for h in webhooks.heads(conn) if h.webhook_id not in busy and h.next_at <= ctx.now]
        admins = ledger.admins(conn)
        for head in sending_order(due):
            if len(claimed) >= room:
                break
            hook = webhooks.get_webhook(conn, head.webhook_id)
            if not fanout.receiving(conn, hook, admins):
                continue  # suspended: what it queued before waits, unsent
            if webhooks.claim(conn, head.delivery_id, token, until, real_now):
                event = webhooks.event_of(conn, head.event_seq)
                claimed.append(_Claimed(head.delivery_id, hook, event))
    return claimed


def sending_order(heads: Sequence[webhooks.Head]) -> list[webhooks.Head]:
    """Tenants take turns (`*` counts as one): each tenant's first head, then each one's second,
    and so on; within a tenant, heads never tried before go ahead of retries, then by webhook.
    Receivers that hang hold a send slot for up to the timeout each; in this order, however many
    of them one tenant has, they cannot keep another tenant's webhooks waiting behind them."""
    by_tenant: dict[str, list[webhooks.Head]] = {}
    for head in sorted(heads, key=lambda h: (h.attempts > 0, h.webhook_id)):
        by_tenant.setdefault(head.tenant_id, []).append(head)
    ranked = [
        (turn, head.webhook_id, head) for own in by_tenant.values() for turn, head in enumerate(own)
    ]
    return [head for _turn, _id, head in sorted(ranked, key=lambda r: r[:2])]


def _record(ctx: Ctx, job: _Claimed, outcome: Outcome, token: str) -> str:
    """Write one attempt's outcome: 'sent', 'queued' (retry later), 'dead', or 'lost' when the
    claim is no longer ours (the webhook was deleted, or the claim lapsed and was taken)."""
    with ctx.write() as conn:
        if not webhooks.holds_claim(conn, job.delivery_id, token):
            return "lost"
        attempts, queued_at = webhooks.progress(conn, job.delivery_id)
        now = ctx.now
        if outcome.ok:
            state, next_at = webhooks.DELIVERED, now
        else:
            next_at = now + retry_delay(attempts + 1, job.delivery_id)
            late = next_at > queued_at + ctx.settings.webhook_retry_for_ms
            state = webhooks.DEAD if late else webhooks.QUEUED
        webhooks.record_attempt(
            conn, job.delivery_id, now, outcome.status, outcome.error, state, next_at
        )
    return "sent" if outcome.ok else state
