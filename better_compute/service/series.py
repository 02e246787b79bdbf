"""Recurring windows (issue 10): `reserve --every D (--count N | --until TIME)` and
`cancel RSV --series`.

A series is N ordinary calendar reservations sharing a `seriesId`, booked in one write
transaction: every occurrence is placed, or nothing is written (a pending occurrence would leave
a night of the nightly batch unheld without anyone noticing). Once booked, each occurrence lives
its own lifecycle (tick, BookingRepair, extend, release) like any reservation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from better_compute.errors import Conflict, InvalidInput, QuotaExceeded
from better_compute.lifecycle import states
from better_compute.model import ReleaseReason, Reservation, State
from better_compute.service import booking, calendar
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.storage import calendar as cal
from better_compute.storage import repo
from better_compute.storage.repo import Conn
from better_compute.timeparse import MAX_MS, human_duration, iso, parse_time

#: The most occurrences one series may have.
MAX_OCCURRENCES = 366
#: Why `preview` refuses --every (docs/advice.md): each occurrence's own preview would not count
#: what the earlier ones hold (quota, GPU-hour budgets), and `reserve --every` books nothing
#: unless every occurrence fits, naming the first that does not.
NO_PREVIEW = (
    "preview takes no --every, --count or --until: a series is judged whole (quota and budgets"
    " count every occurrence), so preview one occurrence with --start, or run reserve --every:"
    " it books nothing unless every occurrence fits, and names the first that does not"
)


@dataclass(frozen=True)
class Repeat:
    every_ms: int
    count: int | None = None
    until: int | None = None
    #: --until as written when it was relative to now (`+30d`): a retry of the same command
    #: line later is the same series, as with --start. Without an `until`, the write reads it
    #: at the instant it acts at (at).
    until_text: str | None = None

    def at(self, now: int) -> Repeat:
        """A relative --until left unread, read against `now`: the instant the series' write
        acts at, as its --start is (booking.at_acting_instant)."""
        if self.until is not None or self.until_text is None:
            return self
        return replace(self, until=parse_time(self.until_text, now))

    def written(self) -> tuple[tuple[str, object], ...]:
        """The series as a key compares it (booking.ReserveArgs.series): --until as an instant
        and, when relative, as written, as --start is."""
        if self.count is not None:
            return (("everyMs", self.every_ms), ("count", self.count))
        return (("everyMs", self.every_ms), ("until", self.until), ("untilText", self.until_text))


def starts(first: int, repeat: Repeat, duration_ms: int) -> list[int]:
    """The occurrences' starts: `count` of them, or every one that starts before `until`."""
    if repeat.every_ms < duration_ms:
        raise InvalidInput(
            f"--every {human_duration(repeat.every_ms)} is shorter than --for"
            f" {human_duration(duration_ms)}: occurrences would overlap"
        )
    if (repeat.count is None) == (repeat.until is None):
        raise InvalidInput("--every needs exactly one of --count N or --until TIME")
    if repeat.count is not None:
        if not 1 <= repeat.count <= MAX_OCCURRENCES:
            raise InvalidInput(f"--count must be from 1 to {MAX_OCCURRENCES}, got {repeat.count}")
        count = repeat.count
    else:
        assert repeat.until is not None
        if repeat.until <= first:
            raise InvalidInput(f"--until {iso(repeat.until)} is not after the first start")
        count = (repeat.until - first - 1) // repeat.every_ms + 1
        if count > MAX_OCCURRENCES:
            raise InvalidInput(
                f"--until {iso(repeat.until)} makes {count} occurrences; at most {MAX_OCCURRENCES}"
            )
    result = [first + i * repeat.every_ms for i in range(count)]
    if result[-1] + duration_ms > MAX_MS:
        raise InvalidInput(f"the last occurrence would end after {iso(MAX_MS)}")
    return result


def _require_one_begun(occurrences: list[int], now: int) -> None:
    """An occurrence already begun is booked from now, as any request for a time past is (a CI
    job's clock behind the ledger's, or an instant written out that a wait for the lock passed).
    Two or more begun (a --start days ago) would all be booked at once, on top of each other."""
    if len(occurrences) > 1 and occurrences[1] <= now:
        raise InvalidInput(
            f"--start {iso(occurrences[0])} is before the ledger's time {iso(now)}, and the next"
            f" occurrence's, {iso(occurrences[1])}, is not after it: booked from now, they would"
            " run into each other; give a later --start, or none to begin now"
        )


def _kept(occurrences: list[int], i: int, now: int, duration_ms: int) -> int:
    """How long occurrence i (from 1) is booked for: its --for; one begun is booked from now, as
    any request for a time past is, but ends by the next one's start. Booked whole from now, a
    --start 30 minutes past ran into the next occurrence: the series held its GPUs twice over
    meanwhile, and a gang that needs the whole pool refused itself (a review)."""
    start = occurrences[i - 1]
    if start >= now or i == len(occurrences):
        return duration_ms
    return min(duration_ms, occurrences[i] - now)  # > 0: _require_one_begun


def reserve_series(ctx: Ctx, args: ReserveArgs, repeat: Repeat) -> list[Reservation]:
    """Book every occurrence or none. Occurrence i (from 1) has the key `KEY#i`, and each is
    compared on a key's reuse as the whole command (its --every, --count or --until included):
    the same command again returns the series as it is now, whatever its occurrences did since;
    any other is a CONFLICT, and a key that names one reservation does not name a series."""
    if args.start_range is not None:
        raise InvalidInput("--every takes --start, not --start-range")
    booking.validate(args)
    booking.read_at(ctx, args)  # as the command opened the ledger: bad input is refused
    repeat.at(ctx.now)  # before the lock (a relative --until out of range)
    with ctx.write() as conn:
        args, repeat = booking.read_at(ctx, args), repeat.at(ctx.now)
        whole = replace(args, series=repeat.written())
        if args.key is not None:
            again = _replayed_series(ctx, whole, args.key)
            if again is not None:
                return _series_of(conn, again, args.key)
            if booking.replayed(ctx, args) is not None:
                raise Conflict(
                    f"key {args.key!r} was used by a single reservation; use a new --key for a"
                    " series"
                )
        first = ctx.now if args.start is None else args.start
        occurrences = starts(first, repeat, args.duration_ms)
        _require_one_begun(occurrences, ctx.now)
        booked: list[Reservation] = []
        with ctx.db.savepoint("series"):
            series_id: str | None = None
            for i, start in enumerate(occurrences, 1):
                key = None if args.key is None else booking.occurrence_key(args.key, i)
                if key is not None and repo.reservation_by_key(conn, args.tenant, key):
                    raise Conflict(f"key {key!r} is already used; use a new --key for a new series")
                asked = replace(
                    whole,
                    start=start,
                    key=key,
                    duration_ms=_kept(occurrences, i, ctx.now, args.duration_ms),
                )
                try:
                    rsv = booking.reserve_in(ctx, asked, same_as=replace(whole, key=key))
                except QuotaExceeded as exc:  # its figures count the occurrences before it
                    plural = "s" if i > 2 else ""
                    before = (
                        "" if i == 1 else f" (counting the {i - 1} occurrence{plural} before it)"
                    )
                    raise QuotaExceeded(
                        f"occurrence {i} ({iso(start)}): {exc.message}{before}; nothing of the"
                        " series was booked"
                    ) from None
                except calendar.PolicyRefusal as exc:  # a limit, at this occurrence
                    raise calendar.PolicyRefusal(
                        f"occurrence {i} ({iso(start)}): {exc.message}; nothing of the series"
                        " was booked"
                    ) from None
                if rsv.state != State.PLACED:
                    why = rsv.conditions[0].message if rsv.conditions else rsv.state.value
                    raise Conflict(
                        f"occurrence {i} ({iso(start)}) does not fit: {why}; nothing of the"
                        " series was booked"
                    )
                if series_id is None:
                    series_id = rsv.series_id or repo.next_id(conn, "ser")
                if rsv.series_id is None:
                    cal.set_series(conn, rsv.id, series_id)
                booked.append(rsv)
        return cal.ids_in(conn, [r.id for r in booked])


def _replayed_series(ctx: Ctx, whole: ReserveArgs, key: str) -> Reservation | None:
    """The first occurrence of the series this key booked with the same command, if it did; a
    CONFLICT naming the key as typed (not its first occurrence's `KEY#1`) if another command
    used it."""
    first_key = booking.occurrence_key(key, 1)
    try:
        return booking.replayed(ctx, replace(whole, key=first_key))
    except Conflict:
        first = repo.reservation_by_key(ctx.db.conn, whole.tenant, first_key)
        named = "" if first is None else f" {first[0].series_id or first[0].id}"
        raise Conflict(
            f"key {key!r} was used by the series{named} with other parameters (the request,"
            " --every, --count or --until); use a new --key for a new series"
        ) from None


def _series_of(conn: Conn, first: Reservation, key: str) -> list[Reservation]:
    """The series whose first occurrence a retry found, as it is now."""
    if first.series_id is None:  # `KEY#1` was a single reservation's key (from before '#' was kept)
        raise Conflict(f"key {key!r} does not name a series; use a new --key")
    return cal.series_members(conn, first.series_id)


def cancel_series(ctx: Ctx, rsv_id: str) -> list[Reservation]:
    """Cancel every occurrence of RSV's series that has not started: pending, or placed for a
    window that begins after now. Those binding, active or over are left as they are, and so is
    one placed whose window has begun (no tick since to bind it): what is cancelled must not
    depend on whether cron ran just before (a review found it cancelled). All or nothing."""
    with ctx.write() as conn:
        rsv = booking.mine(ctx, rsv_id)
        if rsv.series_id is None:
            raise InvalidInput(f"{rsv.id} is not part of a series; cancel it without --series")
        members = cal.series_members(conn, rsv.series_id)
        rest = [
            m
            for m in members
            if m.state in states.CANCELLABLE and (m.during is None or m.during.start > ctx.now)
        ]
        if not rest:
            raise Conflict(f"nothing of series {rsv.series_id} is left to cancel")
        for member in rest:
            calendar.require_changeable(ctx, member, "cancel")
        for member in rest:
            booking.finish(ctx, member, ReleaseReason.CANCELLED, ctx.now)
        return cal.series_members(conn, rsv.series_id)
