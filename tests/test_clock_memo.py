"""The ledger clock read once per write transaction (storage/ledger.clock_in_write, issue 8).

A replay's request and the ticks inside its transaction act at their instants without reading
the clock row each time. The memo must equal the row whenever it is used: emptied when the
transaction ends (another process may write next) and when a savepoint rolls back (what it
advanced is undone)."""

from __future__ import annotations

from pathlib import Path

import pgtest
import pytest

from better_compute.service import setup
from better_compute.service.context import Ctx
from better_compute.storage import ledger, simulation
from better_compute.storage.db import open_ledger

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _last_at(db: object) -> int:
    with db.read() as conn:  # type: ignore[attr-defined]
        return ledger.clock_state(conn).last_at


def test_the_clock_memo_follows_commits_rollbacks_and_other_writers(db_dir: Path) -> None:
    where = pgtest.ledger(str(db_dir / "clock.db"))
    mine = setup.init(where, T0, force=True, manual=True, admin="admin", group=None)[0]
    other = open_ledger(where)
    try:
        with mine.write():
            assert Ctx(mine, T0, asked=T0 + 10)._acting_instant(mine.conn) == T0 + 10
            with pytest.raises(RuntimeError), mine.write():  # a savepoint, rolled back
                assert Ctx(mine, T0, asked=T0 + 50)._acting_instant(mine.conn) == T0 + 50
                raise RuntimeError("refused")
            assert mine.memo == {}  # the rollback undid the advance to +50: read again
            # an instant before the clock acts at the clock, as ever
            assert Ctx(mine, T0, asked=T0 + 5)._acting_instant(mine.conn) == T0 + 10
            assert Ctx(mine, T0, asked=T0 + 20)._acting_instant(mine.conn) == T0 + 20
        assert mine.memo == {}
        assert _last_at(mine) == T0 + 20
        with other.write():  # another connection moves the clock between two writes
            Ctx(other, T0, asked=T0 + 99)._acting_instant(other.conn)
        with mine.write():
            assert Ctx(mine, T0, asked=T0 + 30)._acting_instant(mine.conn) == T0 + 99
        with pytest.raises(RuntimeError), mine.write():  # a whole transaction rolled back
            Ctx(mine, T0, asked=T0 + 500)._acting_instant(mine.conn)
            raise RuntimeError("failed")
        assert mine.memo == {}
        assert _last_at(mine) == T0 + 99
    finally:
        other.close()
        mine.close()


def test_the_data_version_is_read_once_per_write_and_sees_other_writers(db_dir: Path) -> None:
    where = pgtest.ledger(str(db_dir / "version.db"))
    mine = setup.init(where, T0, force=True, manual=True, admin="admin", group=None)[0]
    other = open_ledger(where)
    try:
        seen = simulation.data_version_of(mine)  # outside a write: read, not kept
        assert mine.memo == {}
        with mine.write():
            assert simulation.data_version_of(mine) == seen
            assert list(mine.memo.values()) == [seen]  # kept for the rest of the transaction
        assert mine.memo == {}
        with other.write():
            Ctx(other, T0, asked=T0 + 1)._acting_instant(other.conn)
        changed = simulation.data_version_of(mine)
        assert changed != seen  # another connection committed: seen outside a write
        with other.write():
            Ctx(other, T0, asked=T0 + 2)._acting_instant(other.conn)
        with mine.write():  # and at the start of the next write, never an earlier answer
            assert simulation.data_version_of(mine) != changed
    finally:
        other.close()
        mine.close()
