"""`migrate --to`: the whole ledger into a new one, SQLite to PostgreSQL and back (issue 9)."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pgtest
import pytest
from conftest import HOUR, NOW, Cli, at, init_db, invoke

from better_compute.storage import copy
from better_compute.storage.db import open_ledger


def _busy_ledger(cli: Cli) -> None:
    """Every kind of row: reservations of each shape, a tick, usage, a policy, a setting."""
    cli.ok("meter", "create", "h100")
    cli.ok("policy", "set", "--tenant", "acme", "--principal", "admin", "--max-gpus", "32")
    cli.ok("config", "set", "placement.topN", "3")
    cli.ok("node", "cordon", "west-07", "--from", at(HOUR), "--until", at(2 * HOUR))
    cli.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h")
    cli.ok("reserve", "--tenant", "globex", "--gpus", "8", "--gang", "2", "--for", "1h")
    cli.ok("reserve", "--tenant", "globex", "--gpus", "2", "--spot", "--for", "3h")
    cli.ok("tick", now=at(30 * 60 * 1000))


def _tables(db: str) -> dict[str, Any]:
    ledger = open_ledger(db)
    try:
        with ledger.read() as conn:  # every table's columns and rows, in the copy's order
            return {
                t: (cols, list(copy._rows(conn, t, cols)))
                for t in copy.tables(conn)
                for cols in [copy._columns(conn, t)]
            }
    finally:
        ledger.close()


@pytest.mark.sqlite_only(
    reason="copies between two SQLite files; the PostgreSQL run goes both ways"
)
def test_migrate_copies_every_table_and_leaves_the_source_untouched(run: Cli, db_dir: Path) -> None:
    _busy_ledger(run)
    before = _tables(str(run.db))
    target = db_dir / "copy.db"
    doc = run.ok("migrate", "--to", target)
    assert _tables(str(run.db)) == before  # the source is only read
    assert {t["table"] for t in doc["tables"]} >= {"reservations", "bookings", "events", "usage"}
    assert _tables(str(run.db)) == _tables(str(target))
    copied = Cli(target)
    assert copied.ok("list") == run.ok("list")
    # The copy keeps the ledger's id: the next reservation gets the same id on both.
    assert (
        copied.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")["id"]
        == run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")["id"]
    )


def test_migrate_refuses_a_target_that_is_not_empty_and_a_non_admin(run: Cli, db_dir: Path) -> None:
    other = init_db(db_dir / "other.db")
    error = run.fails(4, "migrate", "--to", other)
    assert "not empty" in error["message"]
    error = run.fails(6, "--as", "mallory", "migrate", "--to", db_dir / "x.db")
    assert "only an admin may migrate the ledger" in error["message"]


@pytest.mark.sqlite_only(reason="the suite maps a file argument, an empty one too, to a schema")
def test_migrate_names_its_own_flag_for_an_empty_or_foreign_target(run: Cli) -> None:
    """An empty --to blamed --db, and a mysql:// URL was looked for as a folder `mysql:`."""
    for empty in ("", "  "):
        error = run.fails(2, "migrate", "--to", empty)
        assert error["message"] == "--to is empty; name an SQLite file or a postgresql:// URL"
    error = run.fails(2, "migrate", "--to", "mysql://ops:secret@db/ledger")
    assert error["message"] == (
        "--to is a mysql:// URL; a ledger is an SQLite file path or a postgresql:// URL"
    )  # and the password is not repeated


@pytest.mark.sqlite_only(reason="--db of another scheme, on the SQLite side of the CLI")
def test_a_url_of_another_scheme_is_no_ledger(db_dir: Path) -> None:
    import json

    for verb in (["get", "rsv_x"], ["init"]):
        result = invoke(["--db", f"sqlite:///{db_dir / 'x.db'}", "--json", *verb])
        assert result.exit_code == 2 and result.stdout == ""
        message = json.loads(result.stderr)["error"]["message"]
        assert message.startswith("--db is a sqlite:// URL; a ledger is"), message
    assert list(db_dir.iterdir()) == []


def _raw(db: str, *args: str) -> Any:
    """The CLI in-process on exactly this --db (conftest.invoke would map a path to a schema)."""
    import json

    from typer.testing import CliRunner

    from better_compute.cli import app

    out = CliRunner().invoke(app, ["--db", db, "--json", *args])
    assert out.exit_code == 0, out.stderr
    return json.loads(out.stdout) if out.stdout.strip() else None


@pytest.mark.postgres_only
def test_sqlite_to_postgres_and_back_is_the_same_ledger(db_dir: Path) -> None:
    source = str(db_dir / "source.db")
    _raw(source, "--now", NOW, "init", "--demo")
    _raw(source, "--now", NOW, "reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h")
    _raw(
        source,
        "--now",
        NOW,
        "reserve",
        "--tenant",
        "globex",
        "--gpus",
        "8",
        "--gang",
        "2",
        "--for",
        "1h",
    )
    _raw(
        source,
        "--now",
        NOW,
        "reserve",
        "--tenant",
        "globex",
        "--gpus",
        "2",
        "--spot",
        "--for",
        "3h",
    )
    _raw(source, "--now", at(HOUR), "tick")
    here = _tables(source)
    url = pgtest.url_for(f"/pg-migrate/{uuid.uuid4().hex}.db")
    doc = _raw(source, "migrate", "--to", url)
    assert _tables(source) == here  # the source is only read
    assert doc["adminAdded"] is not None  # the server's role may administer its copy

    def same(other: dict[str, Any]) -> bool:
        return {k: v for k, v in other.items() if k != "admins"} == {
            k: v for k, v in here.items() if k != "admins"
        }

    assert same(_tables(url))
    back = str(db_dir / "back.db")
    _raw(url, "migrate", "--to", back)
    assert same(_tables(back))
    assert _raw(url, "list") == _raw(back, "list")
    ask = ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
    assert _raw(url, *ask)["id"] == _raw(back, *ask)["id"]


@pytest.mark.sqlite_only(reason="damages the SQLite target as it fills")
def test_a_copy_that_differs_from_the_source_is_not_kept(
    run: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checksums are taken as the rows stream: one row lost in the target fails the copy,
    and nothing is left at the target's name."""
    _busy_ledger(run)
    load = copy._load_sqlite

    def lossy(conn: Any, *rest: Any) -> None:
        load(conn, *rest)
        conn.execute("DELETE FROM events WHERE seq = (SELECT MAX(seq) FROM events)")

    monkeypatch.setattr(copy, "_load_sqlite", lossy)
    target = db_dir / "lossy.db"
    error = run.fails(7, "migrate", "--to", target)
    assert "the copy of table 'events' differs from the source" in error["message"]
    assert not target.exists()


@pytest.mark.sqlite_only(reason="reads the SQLite source as damaged")
def test_a_damaged_source_is_named_and_nothing_is_said_committed(
    run: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source SQLite cannot read midway through the copy: UNAVAILABLE naming the source's
    table (not "cannot write the new database … (disk full?)"), nothing at the target's name,
    and no word of committed changes: the new file's own commits went with it. A hostile review
    read "after some of the command's changes were committed" after a damaged page."""
    _busy_ledger(run)
    rows = copy.plain_rows

    def damaged(conn: Any, sql: str, parameters: Any) -> Any:
        if " FROM events " in sql:
            raise sqlite3.DatabaseError("database disk image is malformed")
        return rows(conn, sql, parameters)

    monkeypatch.setattr(copy, "plain_rows", damaged)
    target = db_dir / "from-damaged.db"
    error = run.fails(7, "migrate", "--to", target)
    assert error["message"].startswith("cannot read table 'events' of ")
    assert "database disk image is malformed; nothing was copied" in error["message"]
    assert "committed" not in error["message"]
    assert not target.exists()


@pytest.mark.postgres_only
def test_a_ledger_in_a_database_that_sorts_by_language_migrates_out(db_dir: Path) -> None:
    """`init` refuses a database that sorts text by a language's rules, but a ledger made
    before it may live in one, and `migrate` is its way out: the copy's order (and so its
    checksums) compares text by bytes on PostgreSQL too. Emulated with a column collation."""
    source = str(db_dir / "names.db")
    _raw(source, "--now", NOW, "init", "--demo")
    for name in ("ta", "tA", "t", "t.b", "t-b", "tB", "t_a", "T0"):
        _raw(source, "tenant", "create", name)
    url = pgtest.url_for(f"/pg-collate/{uuid.uuid4().hex}.db")
    _raw(source, "migrate", "--to", url)
    pgtest.sql(url, 'ALTER TABLE tenants ALTER COLUMN id TYPE text COLLATE "en-x-icu"')
    back = str(db_dir / "back.db")
    doc = _raw(url, "migrate", "--to", back)
    assert any(t["table"] == "tenants" and t["rows"] >= 9 for t in doc["tables"])
    assert _tables(back)["tenants"] == _tables(source)["tenants"]


_SLOW_LOAD = """
import pathlib, sys, time
from better_compute.storage import copy
load, marker = copy._load_sqlite, pathlib.Path(sys.argv[1])
def slow(*args):
    load(*args)
    marker.write_text("loaded")
    time.sleep(60)
copy._load_sqlite = slow
sys.argv = ["better-compute", "--db", sys.argv[2], "migrate", "--to", sys.argv[3]]
from better_compute.cli import main
main()
"""


@pytest.mark.sqlite_only(reason="a file target, built beside its name")
def test_a_migrate_stopped_by_sigterm_leaves_nothing_beside_its_target(
    run: Cli, db_dir: Path
) -> None:
    """SIGTERM (systemd, `timeout`, a CI cancel) stops a command as Ctrl-C does: the half-built
    copy beside the target goes, and the exit status is the signal's 143 (a review found the
    hidden temp file, its -wal and -shm left behind)."""
    import signal
    import subprocess
    import sys
    import time

    _busy_ledger(run)
    marker, target = db_dir / "loaded", db_dir / "copy.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_LOAD, str(marker), str(run.db), str(target)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1]
    assert [p.name for p in db_dir.iterdir() if ".bc-tmp-" in p.name]  # being built
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert not target.exists()
    assert [p.name for p in db_dir.iterdir() if ".bc-tmp-" in p.name] == []
