"""Opening files: migrations, foreign files left untouched, newer schemas refused, WAL and locks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from better_compute.errors import Conflict, InvalidInput, Unavailable
from better_compute.storage.create import create_database
from better_compute.storage.db import open_database
from better_compute.storage.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION


def test_a_blank_database_migrates_to_the_current_schema(tmp_path: Path) -> None:
    db = create_database(str(tmp_path / "a.db"), force=False, seed_text="1")
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == len(MIGRATIONS)
    assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    tables = {r[0] for r in db.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"reservations", "bookings", "events", "usage", "policies"} <= tables
    db.close()
    reopened = open_database(str(tmp_path / "a.db"))
    assert reopened.conn.execute("SELECT value FROM meta WHERE key='db_id'").fetchone()[0]
    reopened.close()


def test_the_database_id_depends_only_on_the_seed(tmp_path: Path) -> None:
    ids = []
    for name in ("x.db", "y.db"):
        db = create_database(str(tmp_path / name), force=False, seed_text="42")
        ids.append(db.conn.execute("SELECT value FROM meta WHERE key='db_id'").fetchone()[0])
        db.close()
    assert ids[0] == ids[1]


def test_a_missing_or_empty_file_is_unavailable_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="run `better-compute init`"):
        open_database(str(tmp_path / "nope.db"))
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(Unavailable):
        open_database(str(empty))


@pytest.mark.parametrize(
    "content",
    [b"hello, this is a text file\n" * 10, b"SQLite format 3\x00" + b"\x00" * 200],
    ids=["text", "other-sqlite-header"],
)
def test_a_foreign_file_is_refused_and_left_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "foreign.db"
    path.write_bytes(content)
    with pytest.raises(InvalidInput, match="not a better-compute database"):
        open_database(str(path))
    with pytest.raises(InvalidInput):
        create_database(str(path), force=True, seed_text="1")
    assert path.read_bytes() == content
    assert not Path(str(path) + "-wal").exists()


def test_another_programs_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(str(path))
    conn.execute("CREATE TABLE t(x)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(InvalidInput):
        open_database(str(path))
    assert path.read_bytes() == before


def test_init_over_an_existing_database_needs_force(tmp_path: Path) -> None:
    path = str(tmp_path / "a.db")
    create_database(path, force=False, seed_text="1").close()
    with pytest.raises(Conflict, match="--force"):
        create_database(path, force=False, seed_text="1")
    create_database(path, force=True, seed_text="2").close()


def test_a_database_newer_than_the_code_is_refused_not_damaged(tmp_path: Path) -> None:
    path = str(tmp_path / "a.db")
    db = create_database(path, force=False, seed_text="1")
    db.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    db.close()
    with pytest.raises(Unavailable, match="newer than this better-compute"):
        open_database(path)
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 5
    check.close()


def test_an_older_schema_with_rows_migrates_forward(tmp_path: Path) -> None:
    """Every migration runs on a database that already holds rows of the earlier schemas."""
    path = str(tmp_path / "a.db")
    db = create_database(path, force=False, seed_text="1")
    db.conn.execute("INSERT INTO tenants(id, seq) VALUES ('acme', 1)")
    db.conn.execute("PRAGMA user_version = 0")  # pretend no migration ran beyond the rows above
    db.close()
    # Re-running migration 1 on existing tables must fail loudly, never half-apply: the
    # transaction rolls back and the version stays, so the file is still usable afterwards.
    with pytest.raises(Unavailable, match="cannot be used: table meta already exists"):
        open_database(path)
    check = sqlite3.connect(path)
    assert check.execute("SELECT id FROM tenants").fetchall() == [("acme",)]
    check.close()


def test_a_write_lock_held_past_the_busy_timeout_is_unavailable(tmp_path: Path) -> None:
    path = str(tmp_path / "a.db")
    create_database(path, force=False, seed_text="1").close()
    holder = open_database(path)
    holder.conn.execute("BEGIN IMMEDIATE")
    try:
        waiter = open_database(path, busy_timeout_ms=100)
        with pytest.raises(Unavailable, match="locked"), waiter.write():
            pass
        waiter.close()
    finally:
        holder.conn.execute("ROLLBACK")
        holder.close()
