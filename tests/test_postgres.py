"""PostgreSQL ledgers (issue 9): what differs from SQLite, on a real server.

The rest of the suite runs on PostgreSQL too (`--backend postgres`, see conftest.py); these tests
are about what only PostgreSQL has: the server's roles as principals, GRANTs, URLs and libpq.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pgtest
import pytest
from conftest import ME, NOW, invoke

postgres = pytest.mark.postgres_only


def test_without_psycopg_a_url_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the extra were not installed
    result = invoke(["--db", "postgresql://someone@127.0.0.1:1/ledger", "list"])
    assert result.exit_code == 2, result.stderr
    assert "pip install 'better-compute[postgres]'" in result.stderr


def test_placeholders_are_translated_once_and_quoted_text_is_left_alone() -> None:
    pytest.importorskip("psycopg")
    from better_compute.storage.postgres import translate

    sql = "SELECT 'a%b?:c', \"end\" FROM t WHERE y = ? AND z = :name AND w::text LIKE '%x'"
    assert translate(sql) == (
        "SELECT 'a%%b?:c', \"end\" FROM t WHERE y = %s AND z = %(name)s AND w::text LIKE '%%x'"
    )


def test_an_unreachable_server_is_unavailable_and_says_where() -> None:
    pytest.importorskip("psycopg")
    result = invoke(["--db", "postgresql://someone@127.0.0.1:1/ledger", "list"])
    assert result.exit_code == 7, result.stderr
    assert "cannot connect to postgresql://someone@127.0.0.1:1/ledger" in result.stderr


def test_a_server_that_does_not_answer_is_unavailable_within_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server up but frozen accepts the connection and never answers: psycopg waited 130 s
    for it, and cron ticks piled up behind. libpq's connect_timeout bounds the wait unless the
    URL (or PGCONNECT_TIMEOUT) sets its own."""
    pytest.importorskip("psycopg")
    from better_compute.storage import postgres as pg

    monkeypatch.setattr(pg, "CONNECT_TIMEOUT_S", 2)
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nothing ever answers
        url = f"postgresql://someone@127.0.0.1:{silent.getsockname()[1]}/ledger"
        started = time.monotonic()
        result = invoke(["--db", url, "list"])
        assert result.exit_code == 7, result.stderr
        assert f"cannot connect to {url}" in result.stderr and "timeout" in result.stderr
        assert time.monotonic() - started < 20
        started = time.monotonic()
        assert invoke(["--db", url + "?connect_timeout=3", "list"]).exit_code == 7
        assert time.monotonic() - started >= 2.9  # the URL's own timeout, not ours


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://someone:hunter2@127.0.0.1:1/ledger",
        "postgres://h/ledger?password=hunter2",
        "postgresql://someone@127.0.0.1:1/ledger?sslmode=disable&%70assword=hunter2",
        "postgresql://someone@127.0.0.1:1/ledger?%70assword=hunter2%zz",  # libpq quoted it
        "postgresql://someone:x@hunter2@127.0.0.1:1/ledger",  # an `@` in the password
    ],
)
def test_a_password_in_the_url_is_refused_and_never_printed(url: str) -> None:
    pytest.importorskip("psycopg")
    result = invoke(["--db", url, "list"])
    assert result.exit_code == 2, result.stderr
    assert "hunter2" not in result.stderr and ".pgpass" in result.stderr


def _ledger() -> str:
    return pgtest.url_for(f"/pg-only/{uuid.uuid4().hex}.db")


@pytest.fixture
def role(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh login role with the README's GRANTs for ordinary users."""
    with pgtest.login_role("bc_user") as name:
        yield name


@postgres
def test_a_server_that_refuses_the_role_is_forbidden_not_try_again(role: str) -> None:
    """Reached and refused who the caller is (an unknown role, a SET ROLE it may not make): not
    UNAVAILABLE, which scripts retry, but FORBIDDEN (a review). A missing database stays
    UNAVAILABLE: it may be being made."""
    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init"]))
    unknown = invoke(["--db", pgtest.as_role(url, "bc_nobody_at_all"), "list"])
    assert unknown.exit_code == 6, unknown.stderr
    assert "refused who you are" in unknown.stderr and "does not exist" in unknown.stderr
    other = pgtest.as_role(url, role) + f"&options=-crole%3D{ME}"
    if "?" not in pgtest.as_role(url, role):
        other = other.replace("&options", "?options", 1)
    refused = invoke(["--db", other, "list"])
    assert refused.exit_code == 6 and "permission denied to set role" in refused.stderr
    parts = urllib.parse.urlsplit(url)
    gone = invoke(["--db", parts._replace(path="/bc_no_such_db").geturl(), "list"])
    assert gone.exit_code == 7, gone.stderr


@postgres
def test_init_makes_the_session_role_the_first_admin() -> None:
    url = _ledger()
    doc = _json(invoke(["--db", url, "--now", NOW, "--json", "init"]))
    assert doc["admin"] == ME
    assert _json(invoke(["--db", url, "--json", "admin", "list"])) == [ME]
    assert ME != "" and pgtest.sql(url, "SELECT current_user")[0][0] == ME


def _json(result: Any) -> Any:
    import json

    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@postgres
def test_an_ordinary_role_acts_as_itself_and_may_not_claim_another(role: str) -> None:
    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    schema = url.rsplit("%3D", 1)[1]
    pgtest.sql(url, *grants(schema, role))
    mine = pgtest.as_role(url, role)
    rsv = _json(
        invoke(
            ["--db", mine, "--json", "reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h"]
        )
    )
    events = _json(invoke(["--db", url, "--json", "events", "--reservation", rsv["id"]]))
    assert events[0]["actor"] == role
    refused = invoke(["--db", mine, "--as", ME, "list"])
    assert refused.exit_code == 6 and "only an admin may act as another" in refused.stderr
    refused = invoke(["--db", mine, "admin", "add", role])
    assert refused.exit_code == 6, refused.stderr
    # The GRANTs are a second wall: the role cannot make itself an admin with psql either.
    import psycopg

    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        pgtest.sql(mine, f"INSERT INTO admins VALUES ('{role}', 0, '{role}')")


@postgres
def test_the_event_log_and_the_clock_are_out_of_reach_of_psql(role: str) -> None:
    """The documented GRANTs let a role write what its commands write, so with `psql` it may
    still insert events and move the ledger's time, but it may not change or delete an event,
    nor switch a real-clock ledger to a manual clock (a review did both as an ordinary role),
    nor change the ledger's id. The owner may not change the log either (outside `migrate`'s
    load, which turns the trigger off)."""
    import psycopg

    url = _ledger()
    _json(invoke(["--db", url, "--json", "init", "--demo"]))  # a real clock
    schema = url.rsplit("%3D", 1)[1]
    pgtest.sql(url, *grants(schema, role))
    mine = pgtest.as_role(url, role)
    _json(
        invoke(
            ["--db", mine, "--json", "reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h"]
        )
    )
    log = (
        f"UPDATE events SET actor = 'bob' WHERE actor = '{role}'",
        "DELETE FROM events WHERE tenant_id = 'acme'",
    )
    clock = (
        "UPDATE meta SET value = 'manual' WHERE key = 'clock'",
        "DELETE FROM meta WHERE key = 'clock'",
        "UPDATE meta SET value = 'x' WHERE key = 'db_id'",
    )
    time_row = (
        "UPDATE meta SET value = '0' WHERE key = 'last_at'",
        "UPDATE meta SET value = '253402300800000' WHERE key = 'last_at'",  # past 9999
        "UPDATE meta SET value = 'soon' WHERE key = 'last_at'",
        "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
        "DELETE FROM meta WHERE key = 'schema_version'",
        "UPDATE meta SET writes = 9223372036854775807 WHERE key = 'last_at'",
        "UPDATE meta SET writes = 0 WHERE key = 'last_at'",
    )
    gone = ("DELETE FROM meta WHERE key = 'last_at'",)
    for who, refused in ((mine, log + clock + time_row + gone), (url, log + gone)):
        for sql in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                pgtest.sql(who, sql)
    # The owner may repair the ledger's time (set past the end of time, every command stops).
    (now,) = pgtest.sql(url, "SELECT value FROM meta WHERE key = 'last_at'")[0]
    pgtest.sql(url, f"UPDATE meta SET value = '{int(now) - 1}' WHERE key = 'last_at'")
    refused = invoke(["--db", mine, "--now", "+30d", "tick"])
    assert refused.exit_code == 2 and "real clock" in refused.stderr
    events = _json(invoke(["--db", url, "--json", "events"]))
    assert [e["actor"] for e in events if e["type"] == "reservation.created"] == [role]


@postgres
def test_an_upgrade_an_ordinary_role_may_not_make_says_who_may(role: str) -> None:
    """A ledger one migration behind, opened first by a role with the documented GRANTs (which
    may not create triggers): FORBIDDEN saying the owner must run a command once, not the
    GRANTs' advice (a review); after the owner's command the role's work goes on."""
    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    schema = url.rsplit("%3D", 1)[1]
    pgtest.sql(
        url,
        *grants(schema, role),
        "DROP FUNCTION events_append_only() CASCADE",
        "UPDATE meta SET value = '15' WHERE key = 'schema_version'",
    )
    mine = pgtest.as_role(url, role)
    refused = invoke(["--db", mine, "list"])
    assert refused.exit_code == 6, refused.stderr
    assert "only the role that owns its tables may do that" in refused.stderr
    _json(invoke(["--db", url, "--json", "list"]))  # the owner's command upgrades it
    assert _json(invoke(["--db", mine, "--json", "list"])) == []


@postgres
def test_an_upgrade_to_schema_15_gives_roles_on_the_new_tables_what_they_hold_on_bookings(
    role: str,
) -> None:
    """Migration 15's tables are written by triggers on bookings as the writing role: a role
    granted before them keeps reading and booking after the upgrade, with no GRANT run again."""
    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    schema = url.rsplit("%3D", 1)[1]
    before = [
        g.replace(f", {schema}.fit_nodes, {schema}.fit_levels", "") for g in grants(schema, role)
    ]
    pgtest.sql(
        url,
        "DROP FUNCTION fit_bookings_keep() CASCADE",
        "DROP FUNCTION fit_nodes_keep() CASCADE",
        "DROP TABLE fit_levels, fit_nodes",
        "UPDATE meta SET value = '14' WHERE key = 'schema_version'",
        *before,
    )
    _json(invoke(["--db", url, "--json", "pool", "list"]))  # the admin's open migrates it
    mine = pgtest.as_role(url, role)
    ask = ["--tenant", "acme", "--gpus", "2", "--for", "1h"]
    assert _json(invoke(["--db", mine, "--json", "preview", *ask]))["fits"] is True
    rsv = _json(invoke(["--db", mine, "--json", "reserve", *ask]))
    assert rsv["state"] in ("placed", "active")
    _json(invoke(["--db", mine, "--json", "cancel", rsv["id"]]))


@postgres
def test_a_role_that_may_act_for_no_tenant_lists_nothing(role: str) -> None:
    """`list`, `events` and `usage` of no tenant at all read `tenant_id IN (NULL)`: `IN ()`
    is not PostgreSQL's (it was INTERNAL)."""
    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    pgtest.sql(url, *grants(url.rsplit("%3D", 1)[1], role))
    for tenant in ("acme", "globex"):
        _json(
            invoke(["--db", url, "--json", "policy", "set", "--tenant", tenant, "--principal", ME])
        )
    _json(
        invoke(["--db", url, "--json", "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"])
    )
    mine = pgtest.as_role(url, role)
    for flags in ([], ["--sort", "start"], ["--name", "x"], ["--state", "placed"]):
        assert _json(invoke(["--db", mine, "--json", "list", *flags])) == []
    result = invoke(["--db", mine, "list", "--ids"])
    assert (result.exit_code, result.stdout) == (0, ""), result.stderr
    assert all(e["tenantId"] is None for e in _json(invoke(["--db", mine, "--json", "events"])))
    assert _json(invoke(["--db", mine, "--json", "usage"])) == []


@postgres
def test_a_role_named_system_may_not_act() -> None:
    """Its events would read as the lifecycle's own work (`actor: system`): FORBIDDEN, as for
    an OS user of that name on SQLite (test_trust.py)."""
    import psycopg

    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    with contextlib.suppress(psycopg.errors.DuplicateObject):  # left by a run that was killed
        pgtest.sql(url, "CREATE ROLE system LOGIN")
    try:
        pgtest.sql(url, *grants(url.rsplit("%3D", 1)[1], "system"))
        mine = pgtest.as_role(url, "system")
        for args in (["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"], ["list"]):
            result = invoke(["--db", mine, "--json", *args])
            assert result.exit_code == 6 and "'system' may not act" in result.stderr, result.stderr
        assert pgtest.sql(url, "SELECT count(*) FROM reservations") == [(0,)]
    finally:
        pgtest.sql(url, "DROP OWNED BY system", "DROP ROLE system")


def grants(schema: str, role: str) -> list[str]:
    """The README's GRANTs for an ordinary user (docs/postgres.md)."""
    return [
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}",
        f"GRANT INSERT, UPDATE, DELETE ON {schema}.meta, {schema}.reservations,"
        f" {schema}.allocations, {schema}.bookings, {schema}.booking_bounds, {schema}.events,"
        f" {schema}.usage, {schema}.atom_bookings, {schema}.held_charges, {schema}.notices,"
        f" {schema}.webhooks, {schema}.deliveries, {schema}.delivery_attempts,"
        f" {schema}.reservation_labels, {schema}.calendar_commitments, {schema}.fit_nodes,"
        f" {schema}.fit_levels TO {role}",
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
        # `SELECT … FOR UPDATE` of a pool's row (the lock order) needs UPDATE on one column:
        f"GRANT UPDATE (seq) ON {schema}.pools TO {role}",
    ]


@postgres
def test_init_refuses_a_schema_holding_other_tables_and_replaces_only_with_force() -> None:
    url = _ledger()
    pgtest.sql(url, "CREATE TABLE payroll (id INT)")
    result = invoke(["--db", url, "--now", NOW, "init"])
    assert result.exit_code == 2 and "not a better-compute ledger" in result.stderr
    assert pgtest.sql(url, "SELECT count(*) FROM payroll") == [(0,)]
    other = _ledger()
    _json(invoke(["--db", other, "--now", NOW, "--json", "init", "--demo"]))
    again = invoke(["--db", other, "--now", NOW, "init"])
    assert again.exit_code == 4 and "--force" in again.stderr
    _json(invoke(["--db", other, "--now", NOW, "--json", "init", "--force"]))
    assert _json(invoke(["--db", other, "--json", "pool", "list"])) == []


@postgres
def test_a_role_without_the_grants_is_forbidden_not_a_bug(role: str) -> None:
    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    result = invoke(["--db", pgtest.as_role(url, role), "list"])
    assert result.exit_code == 7 and "GRANTs" in result.stderr  # the schema is out of its sight
    schema = url.rsplit("%3D", 1)[1]
    pgtest.sql(url, f"GRANT USAGE ON SCHEMA {schema} TO {role}")
    result = invoke(["--db", pgtest.as_role(url, role), "list"])
    assert result.exit_code == 6, result.stderr
    assert "the server refused your role" in result.stderr


@postgres
def test_a_role_whose_transactions_are_read_only_is_unavailable_not_a_bug(role: str) -> None:
    """default_transaction_read_only (maintenance), as on a standby after a failover: writes
    are UNAVAILABLE with nothing written, reads work (a review found INTERNAL, "a bug")."""
    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    pgtest.sql(url, *grants(url.rsplit("%3D", 1)[1], role))
    pgtest.sql(url, f"ALTER ROLE {role} SET default_transaction_read_only = on")
    mine = pgtest.as_role(url, role)
    for args in (["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"], ["tick"]):
        result = invoke(["--db", mine, "--json", *args])
        assert result.exit_code == 7, result.stderr
        assert "takes no writes now" in _json_error(result.stderr), result.stderr
    assert _json(invoke(["--db", mine, "--json", "list"])) == []
    assert pgtest.sql(url, "SELECT count(*) FROM reservations") == [(0,)]


def _json_error(stderr: str) -> str:
    return str(json.loads(stderr)["error"]["message"])


@postgres
def test_group_and_backup_say_what_to_use_on_postgres() -> None:
    url = _ledger()
    result = invoke(["--db", url, "--now", NOW, "init", "--group", "root"])
    assert result.exit_code == 2 and "GRANT" in result.stderr
    _json(invoke(["--db", url, "--now", NOW, "--json", "init"]))
    result = invoke(["--db", url, "backup", os.devnull + ".copy"])
    assert result.exit_code == 2 and "pg_dump" in result.stderr


def _prepared(db: Any) -> list[str]:
    """The statements this connection has prepared on the server."""
    rows = db.conn.raw.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    return [str(r[0]) for r in rows]


@postgres
def test_statements_run_often_are_prepared_and_planned_once() -> None:
    """Parameters are bound on the server, so psycopg prepares a statement run five times: a
    replay's few dozen statements are planned once per connection, not at every call. One that
    selects `*` never is: its columns are whatever the table has when it runs."""
    from better_compute.storage import repo
    from better_compute.storage.postgres import open_database

    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    db = open_database(url)
    try:
        assert _prepared(db) == []
        for _ in range(6):
            with db.read() as conn:
                pool_id = repo.find_pool(conn, "west")["id"]  # SELECT *
                assert repo.pool_name(conn, pool_id) == "west"
        prepared = _prepared(db)
        assert any("SELECT name FROM pools" in s for s in prepared), prepared
        assert not any("*" in s for s in prepared), prepared
    finally:
        db.close()


@postgres
def test_large_reads_come_from_a_server_side_cursor_a_page_at_a_time() -> None:
    """`list --json`, `timeline` and `migrate` read results too big to hold through plain_rows:
    inside a transaction the server keeps the cursor and hands over a page at a time (a client
    cursor took about 300 MB migrating the big benchmark pool out); every row still comes, in
    order, and other statements may run between pages."""
    from better_compute.storage import conn as storage_conn
    from better_compute.storage.postgres import STREAM_PAGE, open_database

    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    n = 2 * STREAM_PAGE + 7
    sql = "SELECT g, g * 2 FROM generate_series(1, ?) AS g ORDER BY g"
    db = open_database(url)
    try:
        with db.read() as conn:
            rows = storage_conn.plain_rows(conn, sql, (n,))
            first = next(rows)
            open_cursors = conn.execute("SELECT name FROM pg_cursors").fetchall()
            assert [str(r[0]) for r in open_cursors] == ["bc_stream_1"]
            assert first == (1, 2) and type(first) is tuple
            assert list(rows) == [(g, 2 * g) for g in range(2, n + 1)]
            assert conn.execute("SELECT name FROM pg_cursors").fetchall() == []  # closed
        assert list(storage_conn.plain_rows(db.conn, sql, (3,))) == [(1, 2), (2, 4), (3, 6)]
    finally:
        db.close()


@postgres
def test_the_event_log_is_read_from_a_server_side_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    """`events` of a whole ledger reads its pages through plain_rows: the server keeps the
    cursor while a page is handed over (it was a client cursor holding the whole log), and
    every event still comes, in order, as repo.events answers."""
    from better_compute.storage import repo
    from better_compute.storage.postgres import open_database

    monkeypatch.setattr(repo, "EVENT_PAGE", 2)
    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    for key in ("a", "b"):
        args = ["--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", key]
        _json(invoke(["--db", url, "--now", NOW, "--json", "reserve", *args]))
    db = open_database(url)
    try:
        with db.read() as conn:
            everything = repo.events(conn, tenant=None, reservation=None, since=None)
            pages = repo.event_pages(conn, None, None, None)
            first = next(pages)
            open_cursors = conn.execute("SELECT name FROM pg_cursors").fetchall()
            assert len(open_cursors) == 1, open_cursors
            assert [e.seq for e in first + [e for p in pages for e in p]] == [
                e.seq for e in everything
            ]
            assert len(everything) > 2 and len(first) == 2
            assert conn.execute("SELECT name FROM pg_cursors").fetchall() == []  # closed
    finally:
        db.close()


@postgres
def test_a_stream_left_unread_closes_with_its_transaction() -> None:
    """A caller that stops reading a stream (the first page of `events`) leaves its server-side
    cursor open: it is closed as the transaction ends, not when the generator is collected,
    which happened inside a later transaction, where the cursor was gone and CLOSE aborted it."""
    from better_compute.storage import conn as storage_conn
    from better_compute.storage.postgres import STREAM_PAGE, open_database

    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    sql = "SELECT g FROM generate_series(1, ?) AS g ORDER BY g"
    db = open_database(url)
    try:
        with db.read() as conn:
            left = storage_conn.plain_rows(conn, sql, (STREAM_PAGE + 1,))
            assert next(left) == (1,)
        with db.read() as conn:
            assert conn.execute("SELECT name FROM pg_cursors").fetchall() == []
            left.close()  # the generator goes, inside another transaction
            assert conn.execute("SELECT 1").fetchone()[0] == 1  # which is not aborted
    finally:
        db.close()


@postgres
def test_a_stream_whose_cursor_is_gone_fails_its_transaction_and_leaves_none_open() -> None:
    """A stream opened inside a savepoint that rolled back has no cursor left on the server, so
    its CLOSE fails as the transaction ends: the transaction is rolled back, not left open and
    aborted for the next command of a long-running process to inherit, and the cursor is not
    closed a second time later."""
    import psycopg

    from better_compute.storage import conn as storage_conn
    from better_compute.storage.postgres import STREAM_PAGE, open_database

    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    sql = "SELECT g FROM generate_series(1, ?) AS g ORDER BY g"
    db = open_database(url)
    try:
        with (
            pytest.raises(psycopg.Error),
            db.write() as conn,
            contextlib.suppress(LookupError),
            db.savepoint("s"),
        ):
            left = storage_conn.plain_rows(conn, sql, (STREAM_PAGE + 1,))
            assert next(left) == (1,)
            raise LookupError("the savepoint rolls back, and the cursor with it")
        assert not db.conn.in_transaction
        with db.read() as conn:
            left.close()  # nothing is sent: it was closed (or tried) as its transaction ended
            assert conn.execute("SELECT 1").fetchone()[0] == 1
    finally:
        db.close()


@postgres
def test_a_column_added_by_another_process_changes_nothing_for_a_running_command() -> None:
    """A newer version's migration adds columns while an older process runs on (a long
    `simulate`, `tick --until`, `events --follow`): its statements keep working."""
    from better_compute.storage import repo
    from better_compute.storage.postgres import open_database

    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    db = open_database(url)
    try:
        for _ in range(6):
            with db.read() as conn:
                pool_id = repo.find_pool(conn, "west")["id"]
                repo.pool_name(conn, pool_id)
                repo.pool_rows(conn)
        pgtest.sql(url, "ALTER TABLE pools ADD COLUMN added_later INTEGER")
        with db.read() as conn:
            assert repo.pool_name(conn, pool_id) == "west"
            assert repo.pool_rows(conn)[0]["added_later"] is None  # read as the table now is
    finally:
        db.close()


@postgres
def test_a_column_retyped_under_a_prepared_statement_costs_one_command_each_time() -> None:
    """A prepared statement fails once a column it reads changes type. Inside a transaction
    that command is UNAVAILABLE, and the connection forgets its prepared statements, so the
    next command works: every time, even after earlier rollbacks (psycopg notices a ROLLBACK
    statement only the first time its text runs; its rollback() always). Outside a
    transaction the statement simply runs again."""
    from better_compute.errors import Unavailable
    from better_compute.storage import repo
    from better_compute.storage.postgres import open_database

    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    db = open_database(url)
    try:
        with db.read() as conn:
            pool_id = repo.find_pool(conn, "west")["id"]
        with pytest.raises(Unavailable), db.write():  # a rollback before anything is prepared
            raise Unavailable("a command that failed")
        for kind in ("varchar(200)", "text", "varchar(300)"):
            for _ in range(6):
                with db.read() as conn:
                    repo.pool_name(conn, pool_id)
            pgtest.sql(url, f"ALTER TABLE pools ALTER COLUMN name TYPE {kind}")
            stale = pytest.raises(Unavailable, match="changed a column of the ledger's tables")
            with stale, db.read() as conn:
                repo.pool_name(conn, pool_id)
            with db.read() as conn:
                assert repo.pool_name(conn, pool_id) == "west"
        for _ in range(6):
            db.conn.execute("SELECT name FROM pools WHERE id = ?", (pool_id,)).fetchall()
        pgtest.sql(url, "ALTER TABLE pools ALTER COLUMN name TYPE text")
        rows = db.conn.execute("SELECT name FROM pools WHERE id = ?", (pool_id,)).fetchall()
        assert rows[0][0] == "west"
    finally:
        db.close()


@postgres
def test_a_url_scheme_in_capitals_names_the_same_ledger() -> None:
    """A URL's scheme is case-insensitive (RFC 3986); libpq knows only `postgresql://`."""
    url = _ledger()
    _json(invoke(["--db", url, "--now", NOW, "--json", "init", "--demo"]))
    scheme, rest = url.split("://", 1)
    shouted = f" {scheme.upper()}://{rest}"
    assert [p["name"] for p in _json(invoke(["--db", shouted, "--json", "pool", "list"]))] == [
        "west"
    ]


def test_a_replay_near_the_epoch_with_short_settings_adds_small_numbers(db_dir: Any) -> None:
    """On PostgreSQL two small parameters added in SQL (`:a + :notice`) were each sent as a
    smallint, and their sum overflowed it: INTERNAL. Every integer is a bigint now."""
    db = str(db_dir / "epoch.db")
    for args in (["init", "--demo"], ["config", "set", "notice.expiringMs", "20000"]):
        assert invoke(["--db", db, "--now", "1000", *args]).exit_code == 0
    workload = db_dir / "near-epoch.jsonl"
    workload.write_text(
        '{"at": 1000, "tenant": "acme", "gpus": 8, "duration": "20s"}\n'
        '{"at": 2000, "tenant": "acme", "gpus": 8, "duration": "20s", "start": 25000}\n'
    )
    report = _json(
        invoke(
            [
                "--db",
                db,
                "--now",
                "1000",
                "--json",
                "simulate",
                "--workload",
                str(workload),
                "--format",
                "jsonl",
            ]
        )
    )
    assert report["requests"] == 2 and report["placedAtOnce"] == 2


def test_a_ledger_replaced_under_a_running_command_stops_its_next_write(db_dir: Any) -> None:
    """`init --force` by another process while a long command runs (a `simulate`, `tick
    --until`, `events --follow`): that command's next write or read is UNAVAILABLE, on either
    backend, instead of going on in the new ledger (on PostgreSQL the URL still names a
    ledger, a new one)."""
    from better_compute.errors import Unavailable
    from better_compute.storage import repo
    from better_compute.storage.db import open_ledger

    path = str(db_dir / "replaced.db")
    assert invoke(["--db", path, "--now", NOW, "init", "--demo"]).exit_code == 0
    ledger = open_ledger(pgtest.ledger(path))
    try:
        with ledger.write() as conn:
            first = repo.db_id(conn)
        assert invoke(["--db", path, "--now", NOW, "init", "--force"]).exit_code == 0
        for kind in (ledger.write, ledger.read):  # nor reads (events --follow read on)
            with pytest.raises(Unavailable, match="replaced"), kind():
                pass
    finally:
        ledger.close()
    again = open_ledger(pgtest.ledger(path))
    try:
        with again.write() as conn:  # the new ledger (its id: init's instant, the same)
            assert repo.db_id(conn) == first
    finally:
        again.close()
