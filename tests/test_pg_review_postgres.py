"""Review of the PostgreSQL backend, items 2 to 8: what the server refuses is a documented error on
one line, never INTERNAL "a bug".

2. The connection lost while queued for the write lock (the clock row): UNAVAILABLE.
3. A role that may read but not write: FORBIDDEN on every write.
4. `init` / `migrate --to` a URL whose search_path names no schema: INVALID_INPUT naming it.
5. The losers of concurrent `migrate` into one PostgreSQL target are not told to add --force.
6. A malformed URL is INVALID_INPUT on one line, however libpq reports it.
7. A libpq key/value string is not a ledger name (and its password is never printed).
8. An admin who does not own the tables is told so by `init --force`, not to ask for GRANTs.
"""

from __future__ import annotations

import gc
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pgtest
import pytest
from conftest import NOW, Cli, init_db, invoke

from better_compute.errors import InvalidInput
from better_compute.storage import copy
from better_compute.storage.db import ledger_exists, open_ledger

postgres = pytest.mark.postgres_only


def _ledger() -> str:
    return pgtest.url_for(f"/pg-review/{uuid.uuid4().hex}.db")


def _grant(url: str, role: str, privileges: str, *, sequences: bool = False) -> None:
    """Give `role` these privileges on every table of the ledger's schema (and its sequences)."""
    schema = url.rsplit("%3D", 1)[1]
    grants = [
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT {privileges} ON ALL TABLES IN SCHEMA {schema} TO {role}",
    ]
    if sequences:
        grants.append(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
    pgtest.sql(url, *grants)


def _error(result: Any, code: int) -> dict[str, str]:
    """The one-line JSON error of a run with --json that must exit `code`."""
    assert result.exit_code == code, result.stderr + result.stdout
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    doc = json.loads(result.stderr)["error"]
    assert "\n" not in doc["message"] and "a bug" not in doc["message"], doc
    return doc  # type: ignore[no-any-return]


def _init(url: str) -> None:
    result = invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"])
    assert result.exit_code == 0, result.stderr


@pytest.fixture
def role() -> Iterator[str]:
    with pgtest.login_role("bc_review") as name:
        yield name


@postgres
def test_2_connection_lost_while_queued_for_the_write_lock_is_unavailable() -> None:
    import psycopg

    url = _ledger()
    _init(url)
    holder = psycopg.connect(url)  # holds the clock row, as a long write would
    holder.execute("SELECT * FROM meta WHERE key = 'last_at' FOR UPDATE")
    holder_pid = holder.info.backend_pid
    killed: list[int] = []

    def kill_the_queued_writer() -> None:
        deadline = time.monotonic() + 20
        while not killed and time.monotonic() < deadline:
            rows = pgtest.sql(
                url,
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                f" AND pid <> {holder_pid}",
            )
            killed.extend(pid for pid, _ in rows)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_queued_writer)
    killer.start()
    try:
        result = invoke(
            ["--db", url, "--json", "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"]
        )
    finally:
        killer.join()
        holder.rollback()
        holder.close()
    assert killed, "the writer never queued for the clock row"
    assert _error(result, 7)["code"] == "UNAVAILABLE"


@postgres
def test_3_a_role_that_may_only_read_is_forbidden_on_every_write(role: str) -> None:
    url = _ledger()
    _init(url)
    _grant(url, role, "SELECT")
    viewer = pgtest.as_role(url, role)
    assert invoke(["--db", viewer, "--json", "list"]).exit_code == 0
    for command in (
        ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "k"],
        ["tick"],
        ["cancel", "rsv_x"],
    ):
        error = _error(invoke(["--db", viewer, "--json", *command]), 6)
        assert error["code"] == "FORBIDDEN" and "permission denied" in error["message"]


@postgres
def test_4_a_search_path_naming_no_schema_is_invalid_input(db_dir: Path) -> None:
    missing = f"nope_{uuid.uuid4().hex[:8]}"
    base = _ledger().split("?", 1)[0]
    url = f"{base}?options=-csearch_path%3D{missing}"
    error = _error(invoke(["--db", url, "--now", NOW, "--json", "init"]), 2)
    assert error["code"] == "INVALID_INPUT" and missing in error["message"]
    source = Cli(init_db(db_dir / "source.db"))
    error = _error(invoke(["--db", str(source.db), "--json", "migrate", "--to", url]), 2)
    assert missing in error["message"]


@postgres
def test_5_a_migrate_that_loses_the_race_for_its_target_is_not_told_to_add_force(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _ledger()
    _init(target)  # the other `migrate` got there between our check and our copy
    monkeypatch.setattr(copy, "ledger_exists", lambda _target: False)
    source = init_db(db_dir / "source.db")
    error = _error(invoke(["--db", str(source), "--json", "migrate", "--to", target]), 4)
    assert "migrate` copies into a new, empty ledger only" in error["message"]
    assert "add --force" not in error["message"]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://someone@127.0.0.1:1/ledger?foo=bar",
        "postgresql://someone@127.0.0.1:notaport/ledger",
        "postgresql://someone@127.0.0.1:1/ledger?sslmode=bogus",
        "postgresql://someone@127.0.0.1:1/ledger?target_session_attrs=zz",
    ],
)
def test_6_a_malformed_url_is_invalid_input_on_one_line(url: str) -> None:
    pytest.importorskip("psycopg")
    error = _error(invoke(["--db", url, "--json", "list"]), 2)
    assert error["code"] == "INVALID_INPUT" and "not a usable PostgreSQL URL" in error["message"]
    text = invoke(["--db", url, "list"])
    assert text.exit_code == 2 and text.stderr.count("\n") == 1, text.stderr


DSN = "host=127.0.0.1 port=5432 dbname=gpus user=ops password=goodpw"


def test_7_a_key_value_string_is_refused_by_the_storage_layer(
    db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(db_dir)
    for call in (lambda: open_ledger(DSN), lambda: ledger_exists(DSN)):
        with pytest.raises(InvalidInput) as refused:
            call()
        assert "goodpw" not in str(refused.value) and "key/value" in str(refused.value)
    assert list(db_dir.iterdir()) == []


@pytest.mark.sqlite_only(reason="on the PostgreSQL run every --db path becomes a URL")
def test_7_a_key_value_string_is_not_made_an_sqlite_file(
    run: Cli, db_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(db_dir)
    gc.collect()  # close the fixture's connections: SQLite removes -wal and -shm at the last
    before = sorted(p.name for p in db_dir.iterdir())
    for argv in (
        ["--db", DSN, "--now", NOW, "--json", "init"],
        ["--db", DSN, "--json", "list"],
        ["--db", str(run.db), "--json", "migrate", "--to", DSN],
    ):
        error = _error(invoke(argv), 2)
        assert error["code"] == "INVALID_INPUT" and "key/value" in error["message"]
        assert "goodpw" not in error["message"]
    gc.collect()  # as above: what is left is what the commands made
    assert sorted(p.name for p in db_dir.iterdir()) == before


@postgres
def test_8_an_admin_who_does_not_own_the_tables_is_told_so_by_init_force(role: str) -> None:
    url = _ledger()
    _init(url)
    _grant(url, role, "SELECT, INSERT, UPDATE, DELETE", sequences=True)
    assert invoke(["--db", url, "admin", "add", role]).exit_code == 0
    error = _error(invoke(["--db", pgtest.as_role(url, role), "--json", "init", "--force"]), 6)
    assert "must be owner" in error["message"] and "owns the ledger's tables" in error["message"]
    assert "an admin grants" not in error["message"]


@postgres
def test_9_a_database_that_sorts_by_a_language_is_refused(db_dir: Path) -> None:
    """Node names order placement: in an en-US database 'a-01' sorts before 'B-01', where SQLite
    (and a C database) puts 'B-01' first, so the same requests would land elsewhere."""
    icu = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
    with pgtest.database(icu) as url:
        error = _error(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]), 2)
        assert error["code"] == "INVALID_INPUT" and "code point" in error["message"]
        assert "--locale=C.UTF-8" in error["message"]
        source = Cli(init_db(db_dir / "source.db"))
        error = _error(invoke(["--db", str(source.db), "--json", "migrate", "--to", url]), 2)
        assert "code point" in error["message"]
        assert pgtest.sql(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [
            (0,)
        ]
