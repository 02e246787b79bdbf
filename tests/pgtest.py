"""The suite on PostgreSQL: one fresh database per run, one fresh schema per ledger a test names.

A test names its ledger by a file path (`--db /tmp/…/demo.db`); on the PostgreSQL run, `redirect`
turns that path into a URL whose search_path is a schema made for that path alone, so tests stay
independent and unchanged. The run's database is dropped when pytest finishes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

URL_VARIABLE = "BETTER_COMPUTE_TEST_PG_URL"

_state: dict[str, Any] = {"base": None, "url": None, "schemas": set(), "missing": None}


def active() -> bool:
    return _state["url"] is not None


def missing() -> str | None:
    """Why the PostgreSQL run cannot run (no server), else None."""
    return _state["missing"]  # type: ignore[no-any-return]


def _with_database(url: str, database: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + database))


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def start_run() -> str:
    """Make this run's database; returns the role the tests act as (the ledger's admin)."""
    base = os.environ.get(URL_VARIABLE, "").strip()
    if not base:
        why = f"no PostgreSQL server: set {URL_VARIABLE} (e.g. .ci/postgres-server start DIR)"
        if os.environ.get("CI"):
            raise pytest.UsageError(f"--backend postgres under CI, but {why}")
        _state["missing"] = why
        return os.environ.get("USER", "")
    name = f"bc_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with _connect(base) as conn:  # names sort by code point, whatever the server's default
        conn.execute(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'")
        role = str(conn.execute("SELECT current_user").fetchone()[0])
    _state.update(base=base, url=_with_database(base, name), name=name)
    return role


def end_run() -> None:
    if not active():
        return
    with _connect(_state["base"]) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {_state['name']} WITH (FORCE)")
    _state["url"] = None


def url_for(path: str) -> str:
    """The URL of the ledger a test calls `path`: its own schema of the run's database."""
    if path.strip().lower().startswith(("postgresql://", "postgres://")) or not path.strip():
        return path
    schema = "l_" + hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:20]
    if schema not in _state["schemas"]:
        with _connect(_state["url"]) as conn:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        _state["schemas"].add(schema)
    sep = "&" if "?" in _state["url"] else "?"
    return f"{_state['url']}{sep}options=-csearch_path%3D{schema}"


def ledger(path: str) -> str:
    """What a test that opens its ledger through the library (not the CLI) should open."""
    return url_for(path) if active() else path


def redirect(
    args: Sequence[str], env: Mapping[str, str | None] | None
) -> tuple[list[str], Mapping[str, str | None] | None]:
    """On the PostgreSQL run, every `--db PATH` (and BETTER_COMPUTE_DB) names that path's schema."""
    args = list(args)
    if not active():
        return args, env
    targets = ("--db", "--to") if "migrate" in args else ("--db",)  # --to: `migrate`'s target
    for i, arg in enumerate(args[:-1]):
        if arg in targets:
            args[i + 1] = url_for(args[i + 1])
    if env and env.get("BETTER_COMPUTE_DB"):
        env = {**env, "BETTER_COMPUTE_DB": url_for(str(env["BETTER_COMPUTE_DB"]))}
    return args, env


def as_role(url: str, role: str) -> str:
    """The same ledger, connecting as another role (trust authentication on the test server)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{role}@{rest.split('@', 1)[1]}"


def sql(url: str, *statements: str) -> list[Any]:
    """Run statements on the test server, autocommitted; the rows of those that return any."""
    import psycopg

    rows: list[Any] = []
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            cur = conn.execute(statement)
            if cur.description:
                rows.extend(cur.fetchall())
    return rows


@contextlib.contextmanager
def login_role(prefix: str) -> Iterator[str]:
    """A fresh login role on the test server, dropped with what it owns afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    url = url_for(f"/roles/{name}.db")
    sql(url, f"CREATE ROLE {name} LOGIN")
    try:
        yield name
    finally:
        sql(url, f"DROP OWNED BY {name}", f"DROP ROLE {name}")


@contextlib.contextmanager
def database(options: str) -> Iterator[str]:
    """A fresh database on the test server, made with these CREATE DATABASE options and dropped
    afterwards: its URL. A server that cannot make it (say, built without ICU) skips the test."""
    import psycopg

    name = f"bc_other_{uuid.uuid4().hex[:8]}"
    try:
        with _connect(_state["base"]) as conn:
            conn.execute(f"CREATE DATABASE {name} {options}")
    except psycopg.Error as exc:
        pytest.skip(f"this server cannot make such a database: {exc}")
    try:
        yield _with_database(_state["base"], name)
    finally:
        with _connect(_state["base"]) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
