"""What every use case runs with: the open database, the instant, who is acting, the settings.

Time (PRODUCT.md §2). A ledger created under `--now` runs on that manual clock; one created on the
real clock refuses `--now` for writes. Either way a write acts at an instant read *after* its write
lock is held (a wait for the lock never comes out of anyone's notice), and never earlier than the
latest instant the ledger has acted at: history only moves forward.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

from better_compute import clock
from better_compute.errors import Forbidden, InvalidInput
from better_compute.identity import owner_of
from better_compute.model import SYSTEM, JsonValue, Principal, Settings
from better_compute.service.authz import resolve, session_user
from better_compute.storage import ledger, repo
from better_compute.storage.conn import Conn, Ledger
from better_compute.storage.db import open_ledger

if TYPE_CHECKING:
    from better_compute.service.fleet import Fleet

NO_NOW_ON_REAL_CLOCK = (
    "this ledger runs on the real clock, so commands that write take no --now (nor"
    " BETTER_COMPUTE_NOW); reads such as get, list, preview and timeline may ask --now for any"
    " time. A ledger made by `init --now TIME` runs on a manual clock instead"
)

#: The principal of work no person asked for (a tick's transitions), and of internal contexts.
SYSTEM_PRINCIPAL = Principal(SYSTEM, admin=True)


@dataclass
class Ctx:
    db: Ledger
    #: Reads see the ledger as of this instant; inside `write()`, the instant the write acts at.
    now: int
    who: Principal = field(default=SYSTEM_PRINCIPAL)
    #: An instant this command asked to act at: `--now`, or a step of `tick --until`.
    asked: int | None = None
    #: True when `asked` came from `--now`: a real-clock ledger refuses it for writes.
    asked_by_flag: bool = False
    #: True for the lifecycle's own work (tick, repair): its events' actor is `system`.
    system: bool = False
    #: The ledger's clock as it was opened: manual (made under --now) or real.
    manual_clock: bool = True
    #: The fleet kept in memory by a long-running command (simulate's reserves), else None:
    #: placement then reads the pool from it instead of SQL (service/fleet.py).
    fleet: Fleet | None = None

    @property
    def principal(self) -> str:
        return self.who.name

    @cached_property
    def settings(self) -> Settings:
        if self.db.conn.in_transaction:  # first read inside a write (tick --until's per-step Ctx)
            return repo.load_settings(self.db.conn)
        with self.db.read() as conn:
            return repo.load_settings(conn)

    def forget_settings(self) -> None:
        """Read the settings again on next use: another process committed since they were read
        (a replay's transactions; service/simulate.py). Copies made before keep theirs."""
        self.__dict__.pop("settings", None)

    def at(self, instant: int, *, system: bool | None = None) -> Ctx:
        """The same command acting at another explicit instant (a step of `tick --until`)."""
        return replace(
            self,
            now=instant,
            asked=instant,
            asked_by_flag=False,
            system=self.system if system is None else system,
        )

    @contextmanager
    def write(self) -> Iterator[Conn]:
        """One write transaction, acting at the instant read once the lock is held, by a
        principal whose admin rights are checked again then."""
        with self.db.write() as conn:
            self._still_admin(conn)
            self.act()
            yield conn

    def _still_admin(self, conn: Conn) -> None:
        """The principal was resolved before the write lock, which may take seconds to come
        (db.busyTimeoutMs): an admin removed meanwhile must not act on rights it no longer has.
        Checked once per transaction (a replay's requests are savepoints of one), for both an
        admin behind --as and a principal resolved as an admin; a ledger with no admin list
        (its file's owner administers it) has nothing that could have changed. The lifecycle's
        own work (tick, repair: open to anyone, §6) needs no rights."""
        if self.system or self.who is SYSTEM_PRINCIPAL:
            return
        self.require_still_admin(conn)

    def require_still_admin(
        self,
        conn: Conn,
        written: str = "nothing was written",
        when: str = "while this command waited for the ledger",
    ) -> None:
        """_still_admin's check, also for admin-only work done as the system: each step of
        `tick --until` on a real clock is a transaction of its own, and `admin remove` may
        commit between two of them. `written`: what the refusal says the command wrote;
        `when`: when the admin was removed, as it says."""
        who = self.who
        needed = [n for n in (who.acting_admin, who.name if who.admin else None) if n]
        if not needed or who is SYSTEM_PRINCIPAL:
            return
        if self.db.memo.get(_ADMIN_MEMO):
            return
        admins = ledger.admins(conn)
        for name in needed if admins else ():
            if name not in admins:
                raise Forbidden(f"{name!r} is no longer an admin: it was removed {when}; {written}")
        self.db.memo[_ADMIN_MEMO] = True

    def latest(self, conn: Conn) -> int:
        """The later of this command's instant and the ledger's time, read in `conn`'s
        snapshot: what a read that hands out GPUs (`launch`) must judge at, since an earlier
        `--now` would show a window that has ended as still running."""
        return max(self.now, ledger_time(ledger.clock_state(conn)))

    def principal_now(self, conn: Conn) -> Principal:
        """Who this command is by the admin list in `conn`'s snapshot, not as it was when the
        command began: a read that runs on (`events --follow`) kept an admin's view of every
        tenant's events after the admin was removed (a review). An admin behind --as who was
        removed meanwhile is FORBIDDEN, as at the start."""
        who = self.who
        if who is SYSTEM_PRINCIPAL:
            return who
        me, as_name = (who.acting_admin, who.name) if who.acting_admin else (who.name, None)
        return resolve(conn, me, as_name, lambda: _file_owner(self.db.where))

    @property
    def relative_base(self) -> int:
        """The instant a relative TIME (`+1h`) counts from: --now when given, else the instant
        this command acts at (in a write, read with its lock held: PRODUCT.md §2), as `tick
        --until +10m` does. Under --now, a ledger past it does not move what `+1h` means."""
        return self.now if self.asked is None else self.asked

    def act(self) -> None:
        """Act at the instant read now, with the write lock held: what write() does on entry,
        for work that runs inside a transaction it did not open (ticking.tick_in)."""
        self.now = self._acting_instant(self.db.conn)

    def _acting_instant(self, conn: Conn) -> int:
        state = ledger.clock_in_write(conn, self.db.memo)
        if state.mode == ledger.REAL:
            if self.asked_by_flag:
                raise InvalidInput(NO_NOW_ON_REAL_CLOCK)
            wanted = clock.real_ms() if self.asked is None else self.asked
        else:
            wanted = self.now if self.asked is None else self.asked
        instant = max(wanted, state.last_at)
        ledger.advance_in_write(conn, self.db.memo, state, instant)
        return instant

    def event(
        self,
        type_: str,
        tenant: str | None,
        rsv_id: str | None,
        data: dict[str, JsonValue],
        *,
        system: bool = False,
    ) -> None:
        """Append an event at `now`. Its actor is who caused it: `system` for the lifecycle's own
        work, and for a notice to another tenant (`system=True`), which must not name it."""
        who = SYSTEM_PRINCIPAL if self.system or system else self.who
        repo.append_event(
            self.db.conn, type_, self.now, tenant, rsv_id, data, who.name, who.acting_admin
        )

    @cached_property
    def db_id(self) -> str:
        """The ledger's id, read once: it never changes (a tick's retries each read it)."""
        return repo.db_id(self.db.conn)

    def seed(self, *parts: object) -> int:
        """The topN pick's seed: from the database and the request, never the process."""
        text = ":".join([self.db_id, *map(str, parts)])
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8])


_ADMIN_MEMO = "authz.admin_checked"


def _file_owner(path: str) -> str:
    """The admin of an SQLite ledger that predates the admin list (a URL names no file)."""
    return owner_of(path) if os.path.exists(path) else ""


def ledger_time(state: ledger.ClockState) -> int:
    """The ledger's time: what `now` and `+2h` count from, as a command without --now acts at
    (a real clock's ledger is ahead of it after `tick --until`)."""
    return state.last_at if state.mode == ledger.MANUAL else max(clock.real_ms(), state.last_at)


def open_ctx(path: str, now_text: str | None, me: str, as_name: str | None) -> Ctx:
    """Open the ledger and resolve the instant reads see and the principal acting."""
    db = open_ledger(path)
    try:
        me = session_user(db.principal(me))  # on PostgreSQL, the session's role
        with db.read() as conn:
            state = ledger.clock_state(conn)
            who = resolve(conn, me, as_name, lambda: _file_owner(path))
            settings = repo.load_settings(conn)
    except BaseException:
        db.close()
        raise
    manual = state.mode == ledger.MANUAL
    base = ledger_time(state)
    asked = None if now_text is None else clock.now_ms(now_text, base)
    now = base if asked is None else asked
    ctx = Ctx(db, now, who, asked=asked, asked_by_flag=asked is not None, manual_clock=manual)
    ctx.__dict__["settings"] = settings  # seeds the cached_property: one read, not two
    db.set_busy_timeout(settings.busy_timeout_ms)
    return ctx
