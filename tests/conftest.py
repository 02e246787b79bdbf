"""Shared fixtures for the CLI tests: fresh databases and a runner that drives the Typer app.

Every CLI call goes through Typer's CliRunner in-process. The CLI keeps its global options in a
module-level object set by the callback, so every call passes `--db` and `--now` explicitly.

Backends: the suite runs on SQLite by default. `--backend postgres` (or
BETTER_COMPUTE_TEST_BACKEND=postgres) runs it on the PostgreSQL server named by
BETTER_COMPUTE_TEST_PG_URL: every `--db FILE` an in-process command is given becomes a fresh schema
of a database made for this run, so the same tests exercise the same commands on both. Tests about
SQLite files (permissions, WAL, snapshots, kill -9 of a file swap) carry `@pytest.mark.sqlite_only`
with the reason. Without a server the PostgreSQL run skips, saying why (under CI=true it fails).
"""

from __future__ import annotations

import importlib
import json as jsonlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pgtest
import pytest
import typer
import typer.testing
from hypothesis import settings
from typer.testing import CliRunner, Result

from better_compute.cli import app
from better_compute.identity import os_user

# CI replays a fixed set of examples (derandomized) so a landing never hinges on a lucky draw;
# locally hypothesis explores new examples on every run and keeps the failures it finds.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

NOW = "2026-09-28T08:00:00Z"
NOW_MS = 1_790_582_400_000
SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
DAY = 24 * HOUR

_ENV_VARS = (
    "BETTER_COMPUTE_DB",
    "BETTER_COMPUTE_NOW",
    "BETTER_COMPUTE_PRINCIPAL",
    "BETTER_COMPUTE_DEBUG",
    "COLUMNS",
)


def at(offset_ms: int) -> str:
    """An epoch-ms --now value `offset_ms` after NOW."""
    return str(NOW_MS + offset_ms)


_BUILT: dict[int, Any] = {}


def _built_command(typer_app: typer.Typer) -> Any:
    """typer.main.get_command, built once per app: building the Click tree of every command takes
    most of an in-process invocation, and the tree is the same every time."""
    key = id(typer_app)
    if key not in _BUILT:
        _BUILT[key] = typer.main.get_command(typer_app)
    return _BUILT[key]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's BETTER_COMPUTE_* variables (or the debug traceback switch);
    CliRunner reuses one built command tree."""
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(typer.testing, "_get_command", _built_command)


def invoke(
    args: Sequence[str], env: Mapping[str, str | None] | None = None, input: str | None = None
) -> Result:
    """Run the app once; fail the test on any traceback or uncaught exception."""
    args, env = pgtest.redirect(args, env)
    # Each run as a process of its own: its consoles are made on first use, at the width its
    # COLUMNS says, not kept from an earlier run's.
    consoles = importlib.import_module("better_compute.cli.app")  # `cli.app` is the Typer app
    for console in (consoles.out, consoles.err):
        vars(console)["_console"] = None
    result = CliRunner().invoke(app, list(args), env=dict(env or {}), input=input)
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    return result


@dataclass
class Cli:
    """`run(*args, now=..., json=True)` → (exit code, parsed JSON or stdout text, stderr)."""

    db: Path

    def __call__(
        self,
        *args: object,
        now: str | None = NOW,
        json: bool = True,
        env: Mapping[str, str | None] | None = None,
        input: str | None = None,
    ) -> tuple[int, Any, str]:
        argv = ["--db", str(self.db)]
        if now is not None:
            argv += ["--now", now]
        if json:
            argv.append("--json")
        argv += [str(a) for a in args]
        result = invoke(argv, env=env, input=input)
        out = result.stdout
        if json and out.strip():
            # json.loads refuses trailing data: this also proves stdout is exactly one document.
            return result.exit_code, jsonlib.loads(out), result.stderr
        return result.exit_code, out, result.stderr

    def ok(self, *args: object, **kwargs: Any) -> Any:
        """Run and insist on exit 0; return the parsed JSON (or text)."""
        code, out, err = self(*args, **kwargs)
        assert code == 0, f"exit {code}: {err}{out}"
        return out

    def fails(self, code: int, *args: object, **kwargs: Any) -> dict[str, str]:
        """Run with --json and insist on exit `code`; return the stderr error object."""
        got, out, err = self(*args, **kwargs)
        assert got == code, f"expected exit {code}, got {got}: {err}{out}"
        assert out == "", f"stdout must be empty on an error, got {out!r}"
        doc = jsonlib.loads(err)
        assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message"}, doc
        return doc["error"]


#: Who runs the tests: `init` makes this operating-system user the ledger's first admin (on
#: PostgreSQL, the server's role; set by pytest_configure before any test module imports it).
ME = os_user()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        choices=("sqlite", "postgres"),
        default=os.environ.get("BETTER_COMPUTE_TEST_BACKEND", "sqlite"),
        help="the ledger backend the suite runs on (postgres: BETTER_COMPUTE_TEST_PG_URL)",
    )


def pytest_configure(config: pytest.Config) -> None:
    global ME
    config.addinivalue_line("markers", "sqlite_only(reason): about SQLite files; not on PostgreSQL")
    config.addinivalue_line("markers", "postgres_only: needs the PostgreSQL backend")
    if config.getoption("--backend") == "postgres":
        ME = pgtest.start_run()


def pytest_unconfigure(config: pytest.Config) -> None:
    pgtest.end_run()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    postgres = config.getoption("--backend") == "postgres"
    for item in items:
        if postgres and pgtest.missing():
            item.add_marker(pytest.mark.skip(reason=pgtest.missing()))
        marker = item.get_closest_marker("sqlite_only")
        if postgres and marker is not None:
            reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
            item.add_marker(pytest.mark.skip(reason=f"SQLite only: {reason}"))
        if not postgres and item.get_closest_marker("postgres_only") is not None:
            item.add_marker(pytest.mark.skip(reason="runs with --backend postgres"))


def init_db(path: Path, *extra: str, now: str = NOW) -> Path:
    """A ledger on a manual clock at `now`; besides its creator, the principal `admin` is an
    admin, so `--as admin` acts with an admin's rights in every test."""
    result = invoke(["--db", str(path), "--now", now, "init", *extra])
    assert result.exit_code == 0, result.stderr
    result = invoke(["--db", str(path), "admin", "add", "admin"])
    assert result.exit_code == 0, result.stderr
    return path


@pytest.fixture
def db_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh folder for databases: in RAM when /dev/shm exists (SQLite's fsyncs on disk make up
    most of these tests' time otherwise), else tmp_path."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="better-compute-test-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def demo_db(db_dir: Path) -> Path:
    """A fresh demo database: pool west of 7 × 8 h100 nodes, tenants acme (64) and globex (32)."""
    return init_db(db_dir / "demo.db", "--demo")


@pytest.fixture
def run(demo_db: Path) -> Cli:
    return Cli(demo_db)


@pytest.fixture
def solo(db_dir: Path) -> Cli:
    """One pool `solo` with one 8-GPU h100 node `n1` (two NVLink groups), tenants acme, globex."""
    cli = Cli(init_db(db_dir / "solo.db"))
    cli.ok("pool", "create", "solo")
    cli.ok(
        "node",
        "add",
        "n1",
        "--pool",
        "solo",
        "--gpus",
        "8",
        "--model",
        "h100",
        "--nvlink-groups",
        "2",
    )
    cli.ok("tenant", "create", "acme")
    cli.ok("tenant", "create", "globex")
    return cli
