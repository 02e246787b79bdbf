"""The ledger's own facts: its clock (PRODUCT.md §2), its admins, and who may act for a tenant (§6).

Kept apart from repo.py because these rows are about the ledger as a whole, not the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from better_compute.storage import settled
from better_compute.storage.conn import Conn
from better_compute.storage.repo import decoded
from better_compute.timeparse import MAX_MS

MANUAL = "manual"
REAL = "real"


@dataclass(frozen=True)
class ClockState:
    """`mode`: 'manual' (created under --now) or 'real'; `last_at`: the latest instant acted at."""

    mode: str
    last_at: int


def clock_state(conn: Conn) -> ClockState:
    return decoded(conn, "its clock (meta clock, last_at)", lambda: clock_of(clock_rows(conn)))


def clock_rows(conn: Conn) -> dict[str, object]:
    """The meta rows of the clock, by key: 'clock' and 'last_at', when there."""
    return dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('clock', 'last_at')"))


def clock_of(rows: dict[str, object]) -> ClockState:
    """The clock these rows say (a ledger from before the clock row runs on the real clock);
    ValueError when they cannot be read."""
    mode, text = rows.get("clock", REAL), str(rows.get("last_at", "0"))
    if mode not in (MANUAL, REAL) or not (text.isascii() and text.isdigit()):
        raise ValueError(f"clock {mode!r} at {text!r}")
    last_at = int(text)
    if last_at > MAX_MS:
        raise ValueError(f"last_at {last_at} is past {MAX_MS}")
    return ClockState(str(mode), last_at)


def clock_in_write(conn: Conn, memo: dict[str, Any]) -> ClockState:
    """clock_state, read once per write transaction (`memo`: conn.Ledger.memo). Only this
    connection can move the clock while it holds the write lock, and advance_in_write keeps the
    memo equal to the row: a replay's request and the ticks inside its transaction read it once."""
    state = memo.get(_CLOCK_MEMO)
    if not isinstance(state, ClockState):
        state = memo[_CLOCK_MEMO] = clock_state(conn)
    return state


def advance_in_write(conn: Conn, memo: dict[str, Any], state: ClockState, at: int) -> None:
    """advance_clock after clock_in_write: nothing to write when the clock is at `at` already."""
    if at > state.last_at:
        advance_clock(conn, at)
        memo[_CLOCK_MEMO] = ClockState(state.mode, at)


_CLOCK_MEMO = "ledger.clock"


def advance_clock(conn: Conn, at: int) -> None:
    """Move the high-water mark forward; never back (a lagging writer acts at the mark instead)."""
    conn.execute(
        "UPDATE meta SET value = ? WHERE key = 'last_at' AND CAST(value AS BIGINT) < ?", (at, at)
    )


def start_ledger(conn: Conn, mode: str, at: int, admin: str) -> None:
    """What `init` records besides the schema: the clock, the instant, and the first admin."""
    upsert = "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = ?"
    conn.execute(upsert, ("clock", mode, mode))
    conn.execute(upsert, ("last_at", str(at), str(at)))
    add_admin(conn, admin, at, admin)


def admins(conn: Conn) -> list[str]:
    def read() -> list[str]:
        return [r[0] for r in conn.execute("SELECT principal FROM admins ORDER BY principal")]

    return settled.kept(conn, "admins", read)


def add_admin(conn: Conn, principal: str, at: int, by: str) -> bool:
    """True when the principal was not an admin yet."""
    cur = conn.execute(
        "INSERT INTO admins(principal, added_at, added_by) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        (principal, at, by),
    )
    return cur.rowcount > 0


def remove_admin(conn: Conn, principal: str) -> bool:
    return conn.execute("DELETE FROM admins WHERE principal = ?", (principal,)).rowcount > 0


#: Tenants a principal may act for: those with no policies, and those where a policy names it
#: without denying it (a denied principal does not act for the tenant at all).
_ACTS_FOR = """
SELECT id FROM tenants t
WHERE NOT EXISTS (SELECT 1 FROM policies p WHERE p.tenant_id = t.id)
   OR EXISTS (SELECT 1 FROM policies p WHERE p.tenant_id = t.id AND p.principal = ? AND p.deny = 0)
"""


def tenants_for(conn: Conn, principal: str) -> list[str]:
    return [r[0] for r in conn.execute(_ACTS_FOR + " ORDER BY t.seq", (principal,))]


def acts_for(conn: Conn, principal: str, tenant: str) -> bool:
    row = conn.execute(f"SELECT 1 FROM ({_ACTS_FOR}) AS acts WHERE id = ?", (principal, tenant))
    return row.fetchone() is not None
