"""A replay's connection writes without waiting for the disk, and leaves its ledger on disk
(storage/db.Database.replaying, issue 8: `simulate`).

Inside, commits do not sync (`synchronous = OFF`); on the way out, whatever happened inside, the
WAL is emptied into the file and the connection syncs as before. A process killed inside loses
nothing it committed: the operating system holds the pages (tests/test_simulate.py kills one)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pgtest
import pytest

from better_compute.service import setup

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _settings(conn: sqlite3.Connection) -> list[int]:
    names = ("synchronous", "wal_autocheckpoint", "temp_store", "cache_size")
    return [int(conn.execute(f"PRAGMA {name}").fetchone()[0]) for name in names]


def _wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


@pytest.mark.sqlite_only(reason="SQLite's synchronous setting and WAL file")
@pytest.mark.parametrize("fails", [False, True])
def test_replaying_writes_unsynced_and_leaves_the_ledger_checkpointed(
    tmp_path: Path, fails: bool
) -> None:
    path = tmp_path / "replay.db"
    db = setup.init(str(path), T0, force=True, manual=True, admin="admin", group=None)[0]
    other = sqlite3.connect(path)  # keeps the WAL from being removed when `db` closes
    try:
        before = _settings(db.conn)
        assert before[0] != 0
        expected = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
        with expected, db.replaying():
            assert _settings(db.conn) == [0, 10000, 2, -65536]
            for n in range(50):
                with db.write() as conn:
                    conn.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (f"test:{n}", n))
            assert _wal(path).stat().st_size > 0  # the commits are in the WAL
            if fails:
                raise RuntimeError("the replay failed")
        assert _settings(db.conn) == before
        assert _wal(path).stat().st_size == 0  # all of it checkpointed into the file
        rows = other.execute("SELECT COUNT(*) FROM meta WHERE key LIKE 'test:%'").fetchone()
        assert rows[0] == 50
    finally:
        other.close()
        db.close()


@pytest.mark.postgres_only
def test_replaying_on_postgres_restores_synchronous_commit(db_dir: Path) -> None:
    where = pgtest.ledger(str(db_dir / "replay.db"))
    db = setup.init(where, T0, force=True, manual=True, admin="admin", group=None)[0]
    try:
        show = "SHOW synchronous_commit"
        before = db.conn.raw.execute(show).fetchone()[0]  # type: ignore[attr-defined]
        with db.replaying():
            assert db.conn.raw.execute(show).fetchone()[0] == "off"  # type: ignore[attr-defined]
        assert db.conn.raw.execute(show).fetchone()[0] == before  # type: ignore[attr-defined]
    finally:
        db.close()
