"""PostgreSQL's data_version (issue 9): the count of write transactions on the clock row.

SQLite's PRAGMA data_version changes exactly when another connection has committed since this one
last looked. On PostgreSQL every write transaction takes the clock row first and, in the same
statement, counts itself there (meta.writes): the same promise, which `simulate` keeps its fleet
in memory by (tests/test_fleet_memory.py drives that)."""

from __future__ import annotations

import uuid
from typing import Any

import pgtest
import pytest
from conftest import NOW_MS

from better_compute.errors import Unavailable
from better_compute.service import setup
from better_compute.storage.db import open_ledger
from better_compute.storage.simulation import data_version

pytestmark = pytest.mark.postgres_only


def _write(db: Any, fail: bool = False) -> None:
    """One write transaction through the ledger (as every command writes), rolled back by an
    error inside it when `fail`."""
    with db.write() as conn:
        conn.execute("UPDATE config SET value = value WHERE key = 'none'")
        if fail:
            raise RuntimeError("the body failed")


def test_only_another_connections_commits_change_it() -> None:
    url = pgtest.url_for(f"/pg-writes/{uuid.uuid4().hex}.db")
    mine = setup.init(url, NOW_MS, False, manual=True, admin="admin", group=None)[0]
    other = open_ledger(url)
    try:
        seen = data_version(mine.conn)
        _write(mine)
        assert data_version(mine.conn) == seen  # its own commit
        with mine.write() as conn:  # and inside its next write, with nothing between
            assert data_version(conn) == seen
        with pytest.raises(RuntimeError):
            _write(other, fail=True)  # rolled back: nothing was committed
        assert data_version(mine.conn) == seen
        with pytest.raises(RuntimeError):
            _write(mine, fail=True)
        assert data_version(mine.conn) == seen
        _write(other)
        with mine.write() as conn:  # noticed inside the next write, at no cost
            changed = data_version(conn)
            assert changed != seen
        assert data_version(mine.conn) == changed  # and not again for what it already saw
        _write(other)
        assert data_version(mine.conn) != changed  # noticed outside a write too
        # the count is one per committed write transaction, on the clock row
        with other.read() as conn:
            row = conn.execute("SELECT writes FROM meta WHERE key = 'last_at'").fetchone()
        assert int(row[0]) == 5  # three of mine, two of the other's (init's own counts none)
    finally:
        other.close()
        mine.close()


def test_init_force_carries_the_count_on() -> None:
    """`init --force` rebuilds the ledger in place, and its count of writes goes on from the
    old one's: were it to start again at 0, a few writes later it could equal what a
    connection of the old ledger last knew, and the change would go unseen. Such a connection
    may neither read nor write any more (it would carry on in a ledger it did not open)."""
    url = pgtest.url_for(f"/pg-writes/{uuid.uuid4().hex}.db")
    mine = setup.init(url, NOW_MS, False, manual=True, admin="admin", group=None)[0]
    try:
        for _ in range(3):
            _write(mine)
        counted = pgtest.sql(url, "SELECT writes FROM meta WHERE key = 'last_at'")[0][0]
        setup.init(url, NOW_MS, True, manual=True, admin="admin", group=None)[0].close()
        assert pgtest.sql(url, "SELECT writes FROM meta WHERE key = 'last_at'")[0][0] > counted
        other = open_ledger(url)
        try:
            _write(other)  # a connection of the new ledger works
        finally:
            other.close()
        for kind in (mine.read, mine.write):
            with pytest.raises(Unavailable, match="was replaced"), kind():
                pass
    finally:
        mine.close()
