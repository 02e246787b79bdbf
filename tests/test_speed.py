"""Issue 8 "Speed": what keeps commands fast, as tests (the timings are benchmarks/run.py's).

- `get --json` and `--version` load neither rich nor dateutil nor the placement engine.
- Opening a ledger compares its schema with SCHEMA_DIGEST: the constant must match the migrations.
- Every hot query searches an index: EXPLAIN QUERY PLAN shows no full scan of bookings, nodes,
  atoms or reservations, and the overlap ranges are bounded by the longest booking.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DAY, HOUR, NOW_MS

from better_compute.demo import DEMO_INVENTORY
from better_compute.identity import os_user
from better_compute.service import booking, listing, setup, views
from better_compute.service.booking import ReserveArgs
from better_compute.service.context import Ctx
from better_compute.service.finding import Filters
from better_compute.storage import repo
from better_compute.storage.db import Database, expected_schema, schema_digest
from better_compute.storage.schema import SCHEMA_DIGEST

HEAVY = ("rich", "dateutil", "pydantic", "better_compute.engine", "better_compute.service.setup")
#: What no read of the six fleet-scale commands with --json loads: rich (only people's views),
#: dateutil (only unusual TIME forms) and pydantic (Typer's coercion, for values that are not
#: plain: cli/plain_params.py).
NOT_FOR_JSON = ("rich", "dateutil", "pydantic")


def _loaded_after(argv: list[str], tmp_path: Path) -> set[str]:
    """The modules a fresh interpreter holds after running the CLI with `argv`."""
    script = (
        "import sys\n"
        f"sys.argv = ['better-compute', *{argv!r}]\n"
        "from better_compute.cli import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "import json\n"
        # Lazy modules sit in sys.modules before they run: count only the ones that ran.
        "ran = [n for n, m in sys.modules.items()\n"
        "       if m is not None and type(m).__name__ != '_LazyModule']\n"
        "sys.stderr.write('MODULES ' + json.dumps(ran) + '\\n')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


@pytest.fixture()
def small_ledger(tmp_path: Path) -> Path:
    """The demo inventory on a manual clock, owned by whoever runs the tests (an admin)."""
    path = tmp_path / "ledger.db"
    db, _ = setup.init(
        str(path), NOW_MS, False, manual=True, admin=os_user(), group=None, fill=DEMO_INVENTORY
    )
    db.close()
    return path


def _first_rsv(path: Path) -> str:
    db = Database(path, 5000)
    try:
        ctx = Ctx(db, NOW_MS)
        args = ReserveArgs(tenant=_a_tenant(db), pool=None, gpus=1, duration_ms=HOUR)
        return booking.reserve(ctx, args).id
    finally:
        db.close()


def _a_tenant(db: Database) -> str:
    return repo.tenant_ids(db.conn)[0]


def test_get_json_loads_no_rich_no_dateutil_no_engine(small_ledger: Path, tmp_path: Path) -> None:
    rsv = _first_rsv(small_ledger)
    argv = ["--db", str(small_ledger), "--now", "2026-09-28T08:00:00Z", "get", rsv, "--json"]
    loaded = _loaded_after(argv, tmp_path)
    heavy = sorted(m for m in loaded if m.startswith(HEAVY))
    assert heavy == [], f"`get --json` loaded {heavy}: import them where they are needed"


@pytest.mark.parametrize(
    "argv, also",
    [
        (["list", "--state", "active", "--json"], ("better_compute.engine",)),
        (["list", "--json"], ("better_compute.engine", "better_compute.service.booking")),
        (["timeline", "--step", "30", "--json"], ("better_compute.engine",)),
        (["pool", "show", "west", "--json"], ("better_compute.engine",)),
        (["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--json"], ()),
        (["preview", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--json"], ()),
    ],
)
def test_json_reads_load_no_rich_no_dateutil_no_pydantic(
    small_ledger: Path, tmp_path: Path, argv: list[str], also: tuple[str, ...]
) -> None:
    """Issue 8 item 2: the fleet-scale commands pay for none of these on their --json path (and
    `list`, `timeline`, `pool show` for no placement code)."""
    _first_rsv(small_ledger)
    loaded = _loaded_after(
        ["--db", str(small_ledger), "--now", "2026-09-28T08:00:00Z", *argv], tmp_path
    )
    heavy = sorted(m for m in loaded if m.startswith((*NOT_FOR_JSON, *also)))
    assert heavy == [], f"`{' '.join(argv)}` loaded {heavy}"


def test_the_hot_path_never_imports_sqlite_utils(small_ledger: Path, tmp_path: Path) -> None:
    """sqlite-utils (about 70 ms to import) runs migrations and bulk writes only: opening an
    up-to-date ledger, `get`, `reserve` and `tick` never load it."""
    db = ["--db", str(small_ledger), "--now", "2026-09-28T08:00:00Z", "--json"]
    rsv = _first_rsv(small_ledger)
    reserve = ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h"]
    for argv in (["get", rsv], reserve, ["tick"], ["pool", "list"]):
        loaded = _loaded_after([*db, *argv], tmp_path)
        assert "sqlite_utils" not in loaded, f"`{argv[0]}` imported sqlite_utils"
        assert "better_compute.storage.db" in loaded  # it did open the ledger


def test_inventory_import_writes_through_sqlite_utils(small_ledger: Path, tmp_path: Path) -> None:
    """The other side of the check above: the import's bulk inserts are sqlite-utils'."""
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn-1,1,1,2,T4\n")
    argv = ["--db", str(small_ledger), "--json", "inventory", "import", "--format"]
    loaded = _loaded_after([*argv, "openb-nodes", str(tmp_path / "nodes.csv")], tmp_path)
    assert "sqlite_utils" in loaded


def test_version_loads_no_rich_and_no_ledger_code(tmp_path: Path) -> None:
    loaded = _loaded_after(["--version"], tmp_path)
    heavy = sorted(m for m in loaded if m.startswith((*HEAVY, "better_compute.service.")))
    assert heavy == [], f"`--version` loaded {heavy}"


def test_schema_digest_matches_the_migrations() -> None:
    digest = schema_digest(expected_schema())
    assert digest == SCHEMA_DIGEST, (
        f"a migration changed the schema: set SCHEMA_DIGEST = {digest!r} in storage/schema.py"
    )


# ---------------------------------------------------------------- query plans

FULL_SCAN = re.compile(r"\bSCAN (bookings|nodes|atoms|reservations|b|c|r|n|a|d)\b")
#: Queries that may walk a whole table: the answer is the whole table (or a setup step).
WHOLE_TABLE_OK = ("FROM config", "FROM meta", "FROM pools", "FROM tenants", "FROM admins")


def _hot_statements(path: Path) -> list[str]:
    """Every SQL statement the hot commands run on a ledger with bookings, traced."""
    db = Database(path, 5000)
    statements: list[str] = []
    try:
        ctx = Ctx(db, NOW_MS)
        tenant = _a_tenant(db)
        for k in range(6):  # some bookings now and later, so every branch has rows to read
            start = None if k % 2 else NOW_MS + k * DAY
            booking.reserve(
                ctx,
                ReserveArgs(tenant=tenant, pool=None, gpus=2, duration_ms=8 * HOUR, start=start),
            )
        db.conn.set_trace_callback(statements.append)
        rsv = booking.reserve(ctx, ReserveArgs(tenant=tenant, pool=None, gpus=4, duration_ms=HOUR))
        booking.preview(ctx, ReserveArgs(tenant=tenant, pool=None, gpus=4, duration_ms=HOUR))
        booking.preview(
            ctx, ReserveArgs(tenant=tenant, pool=None, gpus=2, duration_ms=HOUR, gang=2)
        )
        booking.get(ctx, rsv.id)
        booking.list_reservations(ctx, None, None, ["active"])
        list(listing.listed_pages(ctx, Filters(states=["active"])))  # list --json
        pool_id = repo.pool_rows(db.conn)[0]["name"]
        views.pool(ctx, pool_id)
        views.timeline(ctx, None, None, NOW_MS, NOW_MS + 7 * DAY, 30)
        views.timeline(ctx, None, tenant, NOW_MS, NOW_MS + DAY, 60)
    finally:
        db.conn.set_trace_callback(None)
    selects = sorted({s for s in statements if s.lstrip().upper().startswith(("SELECT", "WITH"))})
    db.close()
    return selects


def test_every_hot_query_searches_an_index(small_ledger: Path) -> None:
    db = Database(small_ledger, 5000)
    plans = {}
    try:
        for sql in _hot_statements(small_ledger):
            if any(marker in sql for marker in WHOLE_TABLE_OK):
                continue
            rows = db.conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
            plans[sql] = [str(r[3]) for r in rows]
    finally:
        db.close()
    assert plans
    scans = {sql: p for sql, p in plans.items() if any(FULL_SCAN.search(x) for x in p)}
    assert scans == {}, json.dumps(scans, indent=1)
    # Every overlap range on a pool's bookings is bounded on both sides of `end` (the longest
    # booking), or starts after the window (pool show's "reserved later").
    for sql, plan in plans.items():
        for line in plan:
            if "bookings_window" in line:
                assert "end<" in line or "start >" in sql, (sql, plan)


def test_the_hot_queries_use_the_intended_indexes(small_ledger: Path) -> None:
    db = Database(small_ledger, 5000)
    try:
        pool_id = str(repo.pool_rows(db.conn)[0]["id"])
        checks = {
            "shortlist": (
                "EXPLAIN QUERY PLAN " + repo.FIT_CANDIDATES_SQL,
                {
                    "pool": pool_id,
                    "from": NOW_MS,
                    "to": NOW_MS + HOUR,
                    "bound": NOW_MS + 2 * HOUR,
                    "ignore": None,
                    "need": 1,
                    "whole": 0,
                    "least": 1,
                },
                "bookings_window (pool_id=? AND end>? AND end<?)",
            ),
        }
        for name, (sql, args, wanted) in checks.items():
            plan = [str(r[3]) for r in db.conn.execute(sql, args)]
            assert any(wanted in line for line in plan), (name, plan)
    finally:
        db.close()


def _registered_by(modules: tuple[str, ...]) -> list[str]:
    """Top-level command and group names an interpreter has after loading only `modules`."""
    script = (
        "import json, sys\n"
        "import better_compute.cli as cli\n"
        f"cli.load({modules!r})\n"
        "a = cli._app_module.app\n"
        "names = [c.name or c.callback.__name__.replace('_', '-') for c in a.registered_commands]\n"
        "names += [g.name for g in a.registered_groups]\n"
        "print(json.dumps(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def test_each_mapped_command_lives_wholly_in_its_module() -> None:
    """main() loads only COMMANDS[word]: that module must register the word, and no other module
    may add to it (a group extended elsewhere would lose commands)."""
    import better_compute.cli as cli

    everything = _registered_by(cli.MODULES)
    for module in sorted(set(cli.COMMANDS.values())):
        alone = _registered_by((module,))
        for word, owner in cli.COMMANDS.items():
            if owner == module:
                assert word in alone, (word, module)
                assert everything.count(word) == 1, word
        # Loading the module alone registers nothing it would not register with the others.
        assert set(alone) <= set(everything)


def test_main_builds_only_the_command_word_asked_for() -> None:
    """cli/app.py `only`: a mapped word builds its own command or group, and `app` stays whole."""
    import better_compute.cli as cli

    app_module = cli._app_module

    whole = cli.app
    before = (list(whole.registered_commands), list(whole.registered_groups))
    pool = app_module.only("pool")
    assert [g.name for g in pool.registered_groups] == ["pool"] and pool.registered_commands == []
    listing = app_module.only("list")
    assert [app_module._word_of(c) for c in listing.registered_commands] == ["list"]
    assert listing.registered_groups == []
    assert app_module.only("no-such-word") is whole
    assert (whole.registered_commands, whole.registered_groups) == before


@pytest.mark.parametrize(
    "argv, words",
    [
        (["list", "--bogus"], "No such option: --bogus (see `better-compute list --help`)"),
        (["pool", "bogus"], "No such command 'bogus'. (see `better-compute pool --help`)"),
        (["timeline", "--step", "x"], "Invalid value for '--step'"),
    ],
)
def test_usage_errors_of_a_command_built_alone(tmp_path: Path, argv: list[str], words: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "from better_compute.cli import main; main()", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.startswith("error: INVALID_INPUT: ") and words in proc.stderr, proc.stderr
