"""`simulate`: replay a workload through the real use cases and the real ledger, and report.

Requests are replayed in arrival order, each as its own `reserve` transaction acting at its
arrival instant, exactly as users would; between arrivals the ledger is ticked at every instant
where something is due (storage answers the next one: ends, preemption deadlines, pending retries
and time-outs, starts and BookingRepair lead times), exactly as cron would, so a simulate gives
the same ledger as the same commands run one by one. At one instant: the tick for what was due,
then every arrival, then a tick for what they made due. The ticks are committed with the request
that follows them (see _replay). Without `until`, it ticks until nothing
is due; with it, it replays arrivals before `until`, ticks up to it and stops, leaving the ledger
live there.

The report is computed from the ledger afterwards (the reservations this run created, their
events, bookings and usage), never from counters kept along the way.
"""

from __future__ import annotations

import math
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import FrameType

from better_compute import clock
from better_compute.errors import (
    BetterComputeError,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    Replaced,
    Terminated,
)
from better_compute.model import SERIES_MARK, State, evolve
from better_compute.service import booking, setup, ticking
from better_compute.service.authz import require_admin
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.service.fleet import Fleet
from better_compute.storage import fitlevels, ledger, repo, settled
from better_compute.storage import simulation as store
from better_compute.timeparse import iso, parse_time
from better_compute.workload import Request, parse_workload

HOUR_MS = 3_600_000
#: How long one transaction of the ticks after the last arrival may hold the write lock: they
#: commit together (a commit costs as much as a tick), and another writer waits at most this.
TRAILING_HOLD_S = 0.02
#: The utilisation series has at most this many buckets, each a whole number of minutes.
MAX_BUCKETS = 24
MINUTE_MS = 60_000
REAL_CLOCK = (
    "simulate rewrites the ledger's time, so it needs a ledger on a manual clock: this one runs"
    " on the real clock. Make one with `init --now TIME` (and import the inventory) to simulate"
)
#: What a request may be refused with while the replay goes on (it is counted as never placed).
REFUSALS = (InvalidInput, QuotaExceeded, Forbidden, Conflict, NotFound)
_PLACEMENT_EVENTS = (
    "reservation.placed",
    "reservation.pending",
    "reservation.preempting",
    "reservation.preempted",
)


@dataclass(frozen=True)
class Utilisation:
    start: int
    end: int
    booked: float  # GPUs booked on average over the bucket
    allocatable: int


@dataclass(frozen=True)
class Report:
    requests: int
    placed_at_once: int
    placed_after_waiting: int
    never_placed: int
    skipped: int
    cut_back: int
    requeued: int
    wait_mean_ms: int
    wait_p95_ms: int
    gpu_hours_booked: float
    gpu_hours_used: float
    utilisation: tuple[Utilisation, ...]
    wall_seconds: float
    requests_per_second: float
    #: Requests refused while replaying (counted as never placed), and the first one's line and
    #: reason: for the warning the command prints, not in the JSON (PRODUCT.md §7's keys).
    refused: int = 0
    first_refusal: str | None = None


@dataclass
class _Run:
    """What the replay did: the reservations it made (ids and seq range), refusals, the span."""

    start: int
    first_event: int
    ids: set[str]
    lo_seq: int | None = None
    hi_seq: int | None = None
    refused: int = 0
    first_refusal: str | None = None
    #: Requests whose transaction has committed: a replay that stops says how far it got.
    done: int = 0
    #: Requests whose idempotency key returned a reservation that already existed (made earlier
    #: in this run, before it, or by another writer meanwhile): a retry, not new demand, so
    #: counted as skipped, not as requests.
    retried: int = 0
    #: When each reservation's request arrived: its wait counts from there (or from a later
    #: start it asked for), not from when it acted, which a clock another writer moved ahead
    #: makes later (a review: waits of two days were reported as placed at once, no wait).
    arrivals: dict[str, int] = field(default_factory=dict)

    def made(self, seq: int, rsv_id: str, arrival: int) -> None:
        self.ids.add(rsv_id)
        self.arrivals[rsv_id] = arrival
        self.lo_seq = seq if self.lo_seq is None else min(self.lo_seq, seq)
        self.hi_seq = seq if self.hi_seq is None else max(self.hi_seq, seq)


def simulate(
    ctx: Ctx,
    file: str,
    fmt: str,
    compress: Fraction,
    until_text: str | None = None,
    pool: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Replay `file` (openb or jsonl) on this manual-clock ledger and report what happened.

    Admin-only: it creates the tenants the workload names and moves the ledger's time."""
    require_admin(ctx.who, "simulate a workload")
    began = clock.elapsed_s()
    with ctx.db.read() as conn:
        state = ledger.clock_state(conn)
        if state.mode != ledger.MANUAL:
            raise InvalidInput(REAL_CLOCK)
        base = max(ctx.now, state.last_at)
        first_event = repo.last_event_seq(conn)
    until = None if until_text is None else parse_time(until_text, base)
    if until is not None and until < base:
        raise InvalidInput(
            f"--until {iso(until)} is before the ledger's time {iso(base)}: time only moves forward"
        )
    workload = parse_workload(setup.read_text(ctx, file, "workload"), fmt, base, compress)
    # Every line is checked, those after --until too: the same file is good or bad whatever
    # --until says, before anything is written.
    checked = [(r, _args(r, pool)) for r in workload.requests]
    pool_ids = _check_pools(ctx, checked, pool)
    _check_keys(ctx, checked)
    # Each request goes to the pool its line (or --pool, or the ledger's only pool) named when
    # the run began, by id: a pool another writer adds, renames or deletes meanwhile changes
    # nothing of where the workload goes ("several pools exist" refused every request after an
    # import added a second pool, a hostile review found).
    plan = [
        (r, replace(args, pool=pool_ids[args.pool]))
        for r, args in checked
        if until is None or r.at < until
    ]
    asked_pools = {str(args.pool) for _, args in plan}
    _create_tenants(ctx.at(base), sorted({r.tenant for r, _ in plan}))  # those sent only
    run = _Run(base, first_event, set())
    try:
        with ctx.db.replaying():  # a what-if ledger: thousands of commits, none a person waits on
            end = _replay(ctx, plan, run, until, progress)
    except BetterComputeError as exc:
        raise _stopped(exc, run, plan) from None
    except (KeyboardInterrupt, Terminated) as exc:  # what is committed stays; the CLI says how far
        if run.done:
            exc.add_note(_how_far(run, plan))
        raise
    with ctx.db.read():
        requests, skipped = len(plan) - run.retried, workload.skipped_before(until)
        wall = clock.elapsed_s() - began
        return _report(ctx, run, requests, skipped, end, wall, asked_pools)


def _stopped(
    exc: BetterComputeError, run: _Run, plan: list[tuple[Request, ReserveArgs]]
) -> BetterComputeError:
    """A replay that failed after committing some of its requests (one transaction each: a lock
    held past db.busyTimeoutMs by another writer, say): the same error, saying what the ledger
    now holds, since running the same workload again would replay those requests twice."""
    if run.done == 0:
        return exc
    if isinstance(exc, Replaced):  # its work is in the file it replaced, not in this ledger
        return Replaced(
            f"database {exc.path} was replaced while the replay ran (`restore`, or `init"
            f" --force`): the {run.done} request{'s' if run.done > 1 else ''} it had replayed,"
            " and their ticks, went with the ledger it replaced; nothing more was written",
            exc.path,
        )
    said = exc.message.removesuffix("; try again")  # as it stands, that would make them twice
    return type(exc)(f"{said}; {_how_far(run, plan)}")


def _how_far(run: _Run, plan: list[tuple[Request, ReserveArgs]]) -> str:
    """Where a replay that committed some of its requests stopped, and what to do next. The
    request is told by its place in arrival order and by its line in the file; the lines after
    it cannot simply be replayed: arrivals are replayed in time order, not file order, and
    openb's times and jsonl's relative ones count from the ledger's time, which has moved on
    (a review: "replay the lines after them" was advice that could not be followed)."""
    if run.done < len(plan):
        return (
            f"the replay stopped at request {run.done + 1} of {len(plan)} (line"
            f" {plan[run.done][0].line}, arriving at {iso(plan[run.done][0].at)}): the"
            f" {run.done} before it are in the ledger with their ticks (`better-compute list`),"
            " so the same workload again would make them twice; to replay it whole, restore a"
            " backup from before the run"
        )
    return (
        f"the replay stopped in the ticks after its last request: all {len(plan)} requests"
        " are in the ledger (`better-compute list`); `tick` moves it on from there"
    )


def _args(r: Request, pool: str | None) -> ReserveArgs:
    """The reserve a request makes, checked as `reserve` would check its flags (line N: …),
    its window included: it must end by the end of time, acting at its arrival."""
    args = ReserveArgs(
        tenant=r.tenant,
        pool=r.pool if r.pool is not None else pool,
        gpus=r.gpus,
        duration_ms=r.duration_ms,
        models=r.models,
        gang=r.gang,
        topology_key=r.topology_key,
        start=r.start,
        start_text=r.start_text,
        spot=r.spot,
        key=r.key,
    )
    try:
        booking.validate(args)
        booking.check_horizon_at(r.at, args, "an earlier arrival or start, or a shorter duration")
    except BetterComputeError as exc:
        raise InvalidInput(f"line {r.line}: {_in_line_terms(exc.message)}") from None
    return args


#: reserve's flags as a jsonl line names them.
_LINE_KEYS = {
    "topology-key": "topologyKey",
    "key": "key",
    "gang": "gang",
    "gpus": "gpus",
    "model": "model",
    "start": "start",
    "for": "duration",
    "spot": "spot",
    "pool": "pool",
    "tenant": "tenant",
}
_FLAG = re.compile(r"--(" + "|".join(sorted(_LINE_KEYS, key=len, reverse=True)) + r")\b(?!-)")


def _in_line_terms(message: str) -> str:
    """reserve's check of its flags, told in the line's keys (`topologyKey`, not
    `--topology-key`): the line is what its author wrote."""
    return _FLAG.sub(lambda m: _LINE_KEYS[m.group(1)], message)


def _check_pools(
    ctx: Ctx, plan: list[tuple[Request, ReserveArgs]], flag: str | None
) -> dict[str | None, str]:
    """Every pool the requests name exists (and a request naming none has one pool to go to),
    and so does --pool's (`flag`) even when every line names its own, before anything is
    written. A line is blamed only for a pool it names itself: the pool of the others is
    --pool's (or the ledger's only one). Returns the id of the pool each request's pool (as
    its args name it, None for none) is."""
    refs = {args.pool: r.line if r.pool is not None else 0 for r, args in reversed(plan)}
    asked = set(refs)
    if flag is not None:
        refs[flag] = 0
    pools: dict[str | None, str] = {}
    with ctx.db.read() as conn:
        for ref, line in sorted(refs.items(), key=lambda kv: kv[1]):
            try:
                row = repo.find_pool(conn, ref)
            except BetterComputeError as exc:
                if line == 0:  # --pool's, or the ledger's only pool: NOT_FOUND as for any command
                    raise
                # A line naming a pool that is not there is a bad line (issue 8: INVALID_INPUT).
                bad = InvalidInput if isinstance(exc, NotFound) else type(exc)
                raise bad(f"line {line}: {exc.message}") from None
            if ref in asked:
                pools[ref] = str(row["id"])
    return pools


def _check_keys(ctx: Ctx, checked: list[tuple[Request, ReserveArgs]]) -> None:
    """A key with the mark that numbers a series' occurrences is refused in a new key, as
    `reserve` refuses it: a line may name one only if the ledger already has it."""
    marked = [(r, args) for r, args in checked if args.key is not None and SERIES_MARK in args.key]
    if not marked:
        return
    with ctx.db.read() as conn:
        for r, args in marked:
            assert args.key is not None
            if repo.reservation_by_key(conn, args.tenant, args.key) is None:
                raise InvalidInput(
                    f"line {r.line}: key must not contain {SERIES_MARK!r}: it numbers the"
                    " occurrences of a series"
                )


def _create_tenants(ctx: Ctx, tenants: Iterable[str]) -> None:
    """The tenants the workload names, created when missing (no quota), in one transaction."""
    with ctx.write() as conn:
        for tenant in tenants:
            if not repo.tenant_exists(conn, tenant):
                repo.insert_tenant(conn, tenant)
                ctx.event("tenant.created", tenant, None, {"tenantId": tenant})


def _at(ctx: Ctx, instant: int, *, system: bool = False) -> Ctx:
    """What ctx.at gives, with the settings and the ledger's id read once for the whole replay
    (evolve copies the cached values with the other attributes; ctx.at reads them again)."""
    ctx.settings  # noqa: B018 - read once, here, before the copy
    ctx.db_id  # noqa: B018 - the same: each request's placement seeds its pick with it
    return evolve(ctx, now=instant, asked=instant, asked_by_flag=False, system=system)


def _with(ctx: Ctx, fleet: Fleet) -> Ctx:
    """This step placing from the fleet kept in memory (service/fleet.py)."""
    ctx.fleet = fleet
    return ctx


def _replay(
    ctx: Ctx,
    plan: list[tuple[Request, ReserveArgs]],
    run: _Run,
    until: int | None,
    progress: Callable[[int, int], None] | None,
) -> int:
    """Arrivals and due ticks in time order; returns the instant the replay ended at.

    One transaction per request, as users make them. The ticks due since the previous request
    run first inside it, each at its own instant, and the tick the request makes due at its own
    instant (a start now) runs after it: each tick acts on the ledger exactly as a cron tick at
    that instant would (ticking.tick_in), so the ledger written is the same, event for event;
    what is saved is a commit (some thirty pages of WAL) per tick. A refused request rolls back
    only its own savepoint. Ticks share a transaction for at most TRAILING_HOLD_S: a commit
    costs as much as a tick, and another writer waits no longer than that. So a long quiet
    stretch between two arrivals (days of retries of waiting requests) commits its ticks a
    share at a time before the request's own transaction, as the ticks after the last arrival
    do."""
    fleet = Fleet()  # the pools in memory between requests, checked in each transaction
    due = _Due(ctx, fleet, run.start - 1, until)  # what is due at or after the start is ahead
    interrupts = _Interrupts()
    with settled.holding(ctx.db.conn), interrupts.installed():
        _arrivals_and_ticks(ctx, plan, run, due, fleet, interrupts, progress)
        if until is not None and due.last < until:
            # the settings and rights as they stand now, as before each
            with interrupts.held(), _transaction(ctx):
                ticking.tick_in(_with(_at(ctx, until, system=True), fleet))
            due.last = until
    if until is not None:  # left live for the commands that follow: their levels too
        with ctx.db.write():
            fitlevels.refresh_pools(ctx.db.conn, due.last)
    return due.last


class _Interrupts:
    """Ctrl-C (SIGINT) during a `held()` block waits for its end: a request's transaction,
    which commits in well under a second (its ticks stop at TRAILING_HOLD_S), and the count of
    requests done. Else an interrupt just after COMMIT (which Python raises once the call
    returns) told one request fewer than the ledger holds, and replaying "the lines after them"
    made it twice (a review caught it 1 time in 18). Outside a block, the handler that was
    there acts. One handler for the whole replay (`installed`), not one per request: setting
    one costs two system calls. Outside the main thread, or when SIGINT has no Python handler
    (ignored, or the default), signals are not ours to handle.

    SIGTERM (`timeout`, a CI runner's cancel) stops the replay as Ctrl-C does, so that it too
    says how far it got: by its default action the process ended without a word, and the
    requests replayed were in the ledger uncounted. Its handler only notes it, whenever it
    comes; the replay stops at the next edge of a block (Terminated), so no exception is ever
    raised in the middle of a statement or a lazy import. A SIGTERM ignored, or given a handler,
    by whoever started the process is left as it is."""

    def __init__(self) -> None:
        self.holding = False
        self.said = False
        self.terminated = False
        self.before: Callable[[int, FrameType | None], object] | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.holding:
            self.said = True
        elif self.before is not None:
            self.before(signum, frame)

    def _terminate(self, _signum: int, _frame: FrameType | None) -> None:
        self.terminated = True

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before, term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        if callable(before):
            self.before = before
            signal.signal(signal.SIGINT, self._handle)
        if term is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._terminate)
        try:
            yield
        finally:
            if callable(before):
                signal.signal(signal.SIGINT, before)
                self.before = None
            if term is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, term)
        self._stop_if_terminated()

    @contextmanager
    def held(self) -> Iterator[None]:
        self._stop_if_terminated()
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.said:
            self.said = False
            raise KeyboardInterrupt
        self._stop_if_terminated()

    def _stop_if_terminated(self) -> None:
        if self.terminated:
            self.terminated = False
            raise Terminated


@contextmanager
def _transaction(ctx: Ctx) -> Iterator[None]:
    """One write transaction of the replay. The settings its requests and ticks read are those
    its previous transaction read, unless another process has committed since: the replay
    itself writes none of them (storage/settled.py)."""
    with ctx.db.write():
        if settled.seen(ctx.db.conn, store.data_version_of(ctx.db)):
            ctx.forget_settings()  # another process committed: a `config set`, maybe
        # A replay is admin-only: an admin removed meanwhile stops it (FORBIDDEN), where its
        # requests' own check would refuse them one by one, as if the fleet were full.
        ctx.require_still_admin(ctx.db.conn, "a replay is admin-only", when="while it replayed")
        yield


def _arrivals_and_ticks(
    ctx: Ctx,
    plan: list[tuple[Request, ReserveArgs]],
    run: _Run,
    due: _Due,
    fleet: Fleet,
    interrupts: _Interrupts,
    progress: Callable[[int, int], None] | None,
) -> None:
    """_replay's transactions: each request with the ticks due before it, then the ticks due
    after the last one, a few to a transaction."""
    i = 0
    while i < len(plan):
        arrival, j = plan[i][0].at, i
        while j < len(plan) and plan[j][0].at == arrival:
            j += 1
        at_arrival = plan[i:j]
        starts_now = False  # a request of this instant was placed to start at it
        for k, (request, args) in enumerate(at_arrival):
            caught_up = k > 0
            while True:
                with interrupts.held():  # Ctrl-C comes once the commit is counted
                    with _transaction(ctx):  # this request's transaction
                        if not caught_up:  # what fell due since the previous request
                            caught_up = due.tick_through(
                                arrival, first=True, within=TRAILING_HOLD_S
                            )
                        if caught_up:
                            placed = _reserve(_at(ctx, arrival), request.line, args, run, fleet)
                            starts_now = placed or starts_now
                            if k == len(at_arrival) - 1:
                                due.after = arrival - 1  # the arrivals may have made one due
                                due.tick_through(arrival, first=False, due_now=starts_now)
                    if caught_up:  # committed
                        run.done = i + 1
                ctx.db.let_writers_in()
                if caught_up:
                    break
            i += 1
            if progress is not None:
                progress(i, len(plan))
    more = True
    while more:  # after the last arrival: the ticks left, a few to a transaction
        with interrupts.held(), _transaction(ctx):
            more = due.tick_for(TRAILING_HOLD_S)
        ctx.db.let_writers_in()


@dataclass
class _Due:
    """The ticks of a replay: at each instant later than `after` where something is due (up to
    `until`), in order; `last` is the latest instant the replay has acted at."""

    ctx: Ctx
    fleet: Fleet
    after: int
    until: int | None
    last: int = 0
    #: (data version, after, the answer) of the last lookup: see next().
    known: tuple[int, int, int | None] | None = None
    #: Whether the tick at the replay's start has run (_catch_up).
    caught_up: bool = False

    def __post_init__(self) -> None:
        self.last = self.after + 1

    def _catch_up(self) -> None:
        """Once, first: a tick at the replay's start, as `tick` at that instant would run, for
        what fell due before it (ends, retries, time-outs, lead checks no cron tick ran): the
        lookup finds only instants later than the start. With nothing due it changes nothing."""
        if not self.caught_up:
            self.caught_up = True
            self._tick(self.after + 1)

    def next(self, *, reuse: bool = False) -> int | None:
        """The next instant a tick has work, read inside the transaction that will act on it.
        With `reuse`, the answer the previous request's transaction ended on is taken again when
        nothing was committed since: this process commits only that transaction in between, and
        another process's commit changes the data version (storage/simulation.data_version)."""
        settings = self.ctx.settings
        conn = self.ctx.db.conn  # always inside the replay's write transaction (no read() CM)
        version = store.data_version_of(self.ctx.db)
        if reuse and self.known is not None and self.known[:2] == (version, self.after):
            due = self.known[2]
        else:
            due = store.next_due(
                conn,
                self.after,
                settings.repair_lead_ms,
                settings.pending_max_wait_ms,
                settings.notice_expiring_ms,
            )
        self.known = (version, self.after, due)
        return None if due is None or (self.until is not None and due > self.until) else due

    def tick_through(
        self, instant: int, *, first: bool, due_now: bool = False, within: float | None = None
    ) -> bool:
        """Every tick due by `instant`, inside the open transaction; True once none is left.
        `first`: as the transaction's first step, before it has written anything. `due_now`: a
        start at `instant` is known to be due (after = instant - 1), which is what the lookup
        would answer, since nothing can be due before it. `within`: stop (False) once that many
        seconds have passed with ticks still due by `instant`, for the caller to commit."""
        self._catch_up()
        stop = None if within is None else time.perf_counter() + within
        due = instant if due_now else self.next(reuse=first)
        while due is not None and due <= instant:
            self._tick(due)
            due = self.next()
            late = stop is not None and time.perf_counter() >= stop
            if late and due is not None and due <= instant:
                return False
        self.last = max(self.last, instant)
        return True

    def tick_for(self, seconds: float) -> bool:
        """The due ticks in order, inside the open transaction, until `seconds` have
        passed (True: more may be due) or nothing is due (False). As the transaction's first
        step, before it has written anything."""
        stop = time.perf_counter() + seconds
        self._catch_up()
        due = self.next(reuse=True)
        while due is not None:
            self._tick(due)
            if time.perf_counter() >= stop:
                return True
            due = self.next()
        return False

    def _tick(self, due: int) -> None:
        self.last = max(self.last, due)
        ticking.tick_in(_with(_at(self.ctx, self.last, system=True), self.fleet))
        self.after = due


def _reserve(ctx: Ctx, line: int, args: ReserveArgs, run: _Run, fleet: Fleet) -> bool:
    """One request (the workload's line `line`); True when it was placed to start at the
    instant it asked to act at (a clock moved ahead by another process acts later, and the due
    lookup finds when)."""
    ctx.fleet = fleet
    arrival = ctx.now  # its instant; reserve acts later if the ledger's time is later
    # Inside the write transaction: a reservation not newer than this was there before the call
    # (its key's, whoever made it: another writer may use a key between two requests). Without
    # a key, reserve only ever makes a new one.
    newest = None if args.key is None else store.last_reservation_seq(ctx.db.conn)
    try:
        rsv = booking.reserve(ctx, args, read_back=False)
    except REFUSALS as exc:
        with ctx.db.read() as conn:
            fleet.after_rollback(conn)
        run.refused += 1
        if run.first_refusal is None:
            run.first_refusal = f"line {line}: {exc.code}: {_in_line_terms(exc.message)}"
        return False
    if newest is not None and rsv.seq <= newest:  # a key that was used already
        run.retried += 1
        return False
    run.made(rsv.seq, rsv.id, arrival)
    return rsv.state == State.PLACED and rsv.during is not None and rsv.during.start == ctx.asked


# ---------------------------------------------------------------- the report


def _report(
    ctx: Ctx,
    run: _Run,
    requests: int,
    skipped: int,
    end: int,
    wall: float,
    pools: set[str],
) -> Report:
    """`requests` and `skipped`: the rows replayed (those before --until) as requests and as no
    request. `pools`: those the requests went to, whether or not anything was booked in them."""
    conn = ctx.db.conn
    placed_at_once = placed_later = cut_back = requeued = 0
    waits: list[int] = []
    booked_ms = used_ms = 0
    spans: list[tuple[str, int, int]] = []
    if run.lo_seq is not None and run.hi_seq is not None:
        lo, hi = run.lo_seq, run.hi_seq
        rows = [r for r in store.reservation_starts(conn, lo, hi) if r[0] in run.ids]
        asked = {
            rid: max(run.arrivals.get(rid, created), start or 0) for rid, _p, created, start in rows
        }
        holding: dict[str, int] = {}  # placed, and not undone since: the window's start
        waited: set[str] = set()
        for type_, rid, when, data in store.placement_events(
            conn, run.first_event, _PLACEMENT_EVENTS
        ):
            if rid not in asked:
                continue
            if type_ == "reservation.placed":
                start = data.get("start")
                holding[rid] = start if isinstance(start, int) else when
            elif type_ == "reservation.pending":  # not placed yet, or a failed repair undid it
                waited.add(rid)
                holding.pop(rid, None)
            elif type_ == "reservation.preempting":
                cut_back += 1
            elif type_ == "reservation.preempted" and data.get("requeued"):
                requeued += 1
                waited.add(rid)
                holding.pop(rid, None)
        for rid, start in holding.items():
            if rid in waited:
                placed_later += 1
            else:
                placed_at_once += 1
            waits.append(max(0, start - asked[rid]))
        spans = [(p, s, e) for rid, p, s, e in store.booking_spans(conn, lo, hi) if rid in asked]
        booked_ms = sum(e - s for _p, s, e in spans)
        # Over the run's span: another writer's `tick` past `--until` opens and closes windows
        # after its end (an open one counted negative, a hostile review found).
        used_ms = sum(
            g * max(0, min(end, end if e is None else e) - s)
            for rid, g, s, e in store.usage_spans(conn, lo, hi)
            if rid in asked
        )
        pools = pools | {pool for _r, pool, _c, _s in rows}
    buckets = _utilisation(ctx, spans, pools, run.start, end)
    return Report(
        requests=requests,
        placed_at_once=placed_at_once,
        placed_after_waiting=placed_later,
        never_placed=requests - placed_at_once - placed_later,
        skipped=skipped + run.retried,
        cut_back=cut_back,
        requeued=requeued,
        wait_mean_ms=round(sum(waits) / len(waits)) if waits else 0,
        wait_p95_ms=_percentile(waits, 95),
        gpu_hours_booked=round(booked_ms / HOUR_MS, 3),
        gpu_hours_used=round(used_ms / HOUR_MS, 3),
        utilisation=buckets,
        wall_seconds=round(wall, 3),
        requests_per_second=round(requests / wall, 1) if wall > 0 else 0.0,
        refused=run.refused,
        first_refusal=run.first_refusal,
    )


def _percentile(values: list[int], pct: int) -> int:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def _utilisation(
    ctx: Ctx, spans: list[tuple[str, int, int]], pools: set[str], start: int, end: int
) -> tuple[Utilisation, ...]:
    """GPUs booked on average in each of at most MAX_BUCKETS equal buckets from the replay's
    start to its end (whole minutes each; the last one ends with the replay, and averages over
    its own length), against the allocatable GPUs (today's) of the pools the run asked for,
    booked in or not: demand that found no room is what the report is for."""
    if end <= start:
        return ()
    step = max(1, math.ceil((end - start) / MAX_BUCKETS / MINUTE_MS)) * MINUTE_MS
    count = math.ceil((end - start) / step)
    gpu_ms = [0] * count
    for _pool, s, e in spans:
        s, e = max(s, start), min(e, end)
        first = (s - start) // step
        while s < e:
            bucket_end = start + (first + 1) * step
            gpu_ms[first] += min(e, bucket_end) - s
            s, first = bucket_end, first + 1
    allocatable = 0
    conn = ctx.db.conn
    for pool_id in sorted(pools):
        allocatable += repo.pool_inventory_counts(conn, pool_id, end)[2]
    bounds = [(start + k * step, min(end, start + (k + 1) * step)) for k in range(count)]
    return tuple(
        Utilisation(lo, hi, round(gpu_ms[k] / (hi - lo), 2), allocatable)
        for k, (lo, hi) in enumerate(bounds)
    )
