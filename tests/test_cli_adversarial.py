"""A hostile user against every command: bad input gets a clear error and loses nothing.

The rule (PRODUCT.md §3): the right exit code (2 INVALID_INPUT, 3 NOT_FOUND, 4 CONFLICT,
5 QUOTA_EXCEEDED, 6 FORBIDDEN, 7 UNAVAILABLE; 1 only for bugs), one line on stderr that says what
was wrong and what is allowed, no traceback, and nothing half-written. With --json the error is
`{"error": {"code", "message"}}` on stderr and stdout is empty.

The first half pins down defects found by trying odd input (these fail until they are fixed);
the second half pins down odd input that is already handled well, so it stays that way.
Everything runs in-process through CliRunner, except what only the real entry point shows
(Typer usage errors, a --db that would hang the test process).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HOUR, NOW, Cli, init_db, invoke

from better_compute.timeparse import MAX_MS

pytestmark = pytest.mark.sqlite_only(reason="damages and inspects the SQLite ledger file by hand")

ENTRY = [sys.executable, "-c", "from better_compute.cli import main; main()"]
MAX_TIME = "9999-12-31T23:00:00Z"  # an hour before the last instant a TIME may name
ONE_NODE = '{"pools": [{"name": "p", "nodes": [{"name": "n", "gpus": {"count": COUNT, "model": "h100"}}]}]}'  # noqa: E501


def dump(db: Path) -> str:
    """A digest of every row of every table: equal digests mean nothing was written."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        digest = hashlib.sha256()
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        for (table,) in tables.fetchall():
            for row in conn.execute(f'SELECT * FROM "{table}" ORDER BY rowid'):
                digest.update(repr((table, row)).encode())
        return digest.hexdigest()
    finally:
        conn.close()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(run: Cli, code: int, *args: object, **kwargs: object) -> dict[str, str]:
    """`run.fails` plus: the database is exactly as it was."""
    before = dump(run.db)
    error = run.fails(code, *args, **kwargs)  # type: ignore[arg-type]
    assert dump(run.db) == before, f"a failing command wrote to the database: {args}"
    return error


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"stderr must be one line, got {stderr!r}"
    return lines[0]


@pytest.fixture
def rsv(run: Cli) -> dict[str, str]:
    """Reservations in every state on the demo pool: active, placed (tomorrow), pending (a gang
    that cannot fit next to the active one), released (cancelled)."""
    ids = {
        "active": run.ok("reserve", "--tenant", "acme", "--gpus", "4", "--for", "2h", "--key", "a")[
            "id"
        ],
        "placed": run.ok(
            "reserve",
            "--tenant",
            "acme",
            "--gpus",
            "8",
            "--for",
            "12h",
            "--start",
            "2026-09-29T08:00:00Z",
            "--key",
            "p",
        )["id"],
    }
    pending = run.ok(
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "8",
        "--gang",
        "4",
        "--topology-key",
        "fabric.domain",
        "--for",
        "12h",
        "--key",
        "g",
    )
    assert pending["state"] == "pending", pending
    ids["pending"] = pending["id"]
    ids["released"] = run.ok(
        "reserve",
        "--tenant",
        "globex",
        "--gpus",
        "2",
        "--for",
        "1h",
        "--start",
        "+3h",
        "--key",
        "c",
    )["id"]
    run.ok("cancel", ids["released"])
    run.ok("tick")
    assert run.ok("get", ids["active"])["state"] == "active"
    return ids


def pool_id(run: Cli) -> str:
    pools = run.ok("pool", "list")
    assert len(pools) == 1
    return str(pools[0]["id"])


# ================================================================ defects (fail until fixed)

# ---- windows that end after 9999-12-31: accepted, committed, then a crash (INTERNAL, exit 1)


@pytest.mark.parametrize(
    ("now", "start"),
    [(NOW, MAX_TIME), (MAX_TIME, None)],
    ids=["start-near-9999", "now-near-9999"],
)
def test_reserve_whose_window_ends_after_9999_is_invalid_and_the_database_stays_readable(
    run: Cli, now: str, start: str | None
) -> None:
    """Today: exit 1 INTERNAL (OverflowError while rendering the human view, which is built even
    for --json) AFTER the reservation was committed; from then on `list` and `get` fail with
    INTERNAL for good."""
    extra = ["--start", start] if start else []
    error = refused(
        run,
        2,
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "1",
        "--for",
        "2h",
        *extra,
        "--key",
        "far",
        now=now,
    )
    assert error["code"] == "INVALID_INPUT"
    assert "9999" in error["message"], error  # says what is allowed
    assert run.ok("list", now=now) == []


def test_a_window_that_ends_before_9999_is_not_refused_for_a_notice(run: Cli) -> None:
    """The horizon check added the spot notice to every request: a spot request preempts
    nothing, and a regular `--start` window that `advice` and `--start-range` book was refused
    (a review). A preemption whose window, after the notice, would end past the end of time is
    not made (preemption_window): such a request waits."""
    window = ("--gpus", "1", "--start", "9999-12-31T23:00:00Z", "--for", "59m")
    early = "9999-12-31T22:00:00Z"
    assert run.ok("preview", "--tenant", "globex", *window, now=early)["fits"] is True
    booked = run.ok("reserve", "--tenant", "globex", *window, now=early)
    assert booked["during"] == {"start": MAX_MS + 1 - HOUR, "end": MAX_MS + 1 - 60_000}, booked
    late = "9999-12-31T23:57:30Z"  # the other six nodes taken by spot work; the 7th has 7 free
    spot = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--gang", "6", "--for", "1m",
                  "--spot", now=late)  # fmt: skip
    assert spot["state"] == "placed" and spot["during"]["end"] == MAX_MS - 89_999
    waits = run.ok("reserve", "--tenant", "acme", "--gpus", "8", "--for", "1m", now=late)
    assert waits["state"] == "pending" and waits["during"] is None, waits
    assert run.ok("get", spot["id"], now=late)["state"] == "placed"  # not preempted


def test_extend_past_9999_is_refused_and_changes_nothing(run: Cli) -> None:
    """Today: the extension is committed, then printing it fails (exit 1), and every later `list`
    fails with INTERNAL."""
    rsv = run.ok(
        "reserve",
        "--tenant",
        "globex",
        "--gpus",
        "1",
        "--for",
        "2h",
        "--start",
        "9999-12-31T00:00:00Z",
        "--key",
        "late",
    )
    before = dump(run.db)
    code, out, err = run("extend", rsv["id"], "--by", "1d")
    assert code in (2, 4), f"expected INVALID_INPUT or CONFLICT, got {code}: {err}"
    assert out == ""
    assert dump(run.db) == before
    assert run.ok("get", rsv["id"])["during"]["end"] == rsv["during"]["end"]
    assert len(run.ok("list")) == 1


def test_preview_whose_window_ends_after_9999_is_invalid_input(run: Cli) -> None:
    error = run.fails(
        2, "preview", "--tenant", "acme", "--gpus", "1", "--for", "2h", "--start", MAX_TIME
    )
    assert error["code"] == "INVALID_INPUT"


@pytest.mark.parametrize(
    ("now", "args"), [(NOW, ["--from", MAX_TIME]), (MAX_TIME, [])], ids=["from", "now"]
)
def test_timeline_whose_default_end_is_after_9999_is_refused_or_clamped(
    run: Cli, now: str, args: list[str]
) -> None:
    """`--to` defaults to `--from` + 24h, which here is in year 10000, a TIME that `--to` itself
    refuses. Today the chart fails with `INTERNAL: ValueError: year 10000 is out of range` and
    `--json` answers buckets past the last representable instant."""
    code, _, err = run("timeline", *args, now=now, json=False)
    assert code in (0, 2), err
    code, doc, err = run("timeline", *args, now=now)
    if code == 2:
        assert json.loads(err)["error"]["code"] == "INVALID_INPUT"
    else:
        assert code == 0, err
        assert all(b["end"] <= MAX_MS for b in doc["buckets"]), doc["buckets"][-1]


# ---- settings: any digit string is stored, some crash now, some crash every later command


def test_config_set_with_a_superscript_digit_is_invalid_input(run: Cli) -> None:
    """'²'.isdigit() is True but int('²') raises: today exit 1 INTERNAL."""
    error = refused(run, 2, "config", "set", "placement.topN", "²")
    assert "placement.topN" in error["message"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("capacity.spotNoticeMs", "9" * 25),
        ("repair.leadMs", "9" * 25),
        ("pending.retryMs", "9" * 25),
        ("pending.retryMs", str(300_000_000_000_000)),  # fits SQLite, but lands after 9999
    ],
)
def test_config_set_never_stores_a_value_that_breaks_later_commands(
    run: Cli, key: str, value: str
) -> None:
    """Either `config set` refuses the value (INVALID_INPUT naming the range), or the engine copes
    with it. Today it is stored, then a pending reserve and tick exit 1 (OverflowError), and the
    reserve has already committed its reservation."""
    code, _, err = run("config", "set", key, value)
    if code == 2:
        assert json.loads(err)["error"]["code"] == "INVALID_INPUT"
        return
    assert code == 0, err
    code, _, err = run(
        "reserve", "--tenant", "acme", "--gpus", "8", "--gang", "8", "--for", "1h", "--key", "w"
    )
    assert code == 0, f"a pending reserve after `config set {key} {value}`: {err}"
    code, _, err = run("tick", now="2026-09-28T09:00:00Z")
    assert code == 0, f"tick after `config set {key} {value}`: {err}"
    assert run.ok("list")  # and the reservation still prints


# ---- NODE:INDEX and CLUSTER.CLIQUE use str.isdigit(): '²' crashes, other scripts slip through


@pytest.mark.parametrize("verb", ["quarantine", "restore"])
def test_device_index_with_a_superscript_digit_is_invalid_input(run: Cli, verb: str) -> None:
    extra = ["--reason", "xid-79"] if verb == "quarantine" else []
    error = refused(run, 2, "device", verb, "west-01:²", *extra)
    assert "NODE:INDEX" in error["message"]


def test_device_index_in_another_script_is_invalid_input(run: Cli) -> None:
    """'west-01:٣' (Arabic-Indic three) quarantines GPU 3 today; TIME and DURATION accept ASCII
    digits only, so NODE:INDEX should too."""
    refused(run, 2, "device", "quarantine", "west-01:٣", "--reason", "xid-79")


def test_fabric_clique_with_a_superscript_digit_is_invalid_input(run: Cli) -> None:
    error = refused(
        run, 2, "node", "add", "n9", "--gpus", "8", "--model", "h100", "--fabric", "c1.²"
    )
    assert "CLUSTER.CLIQUE" in error["message"]


def test_fabric_clique_too_large_for_sqlite_is_invalid_input(run: Cli) -> None:
    """Today: OverflowError from SQLite, exit 1 INTERNAL."""
    refused(
        run, 2, "node", "add", "n9", "--gpus", "8", "--model", "h100", "--fabric", "c1." + "9" * 30
    )


def test_a_fabric_clique_the_inventory_refuses_is_refused_by_node_add_too(
    run: Cli, db_dir: Path
) -> None:
    """§9 caps a clique at 2147483647; `node add --fabric c1.2147483648` is accepted today, and
    then `inventory export` writes a file that `inventory import` refuses."""
    code, _, err = run(
        "node", "add", "n9", "--gpus", "8", "--model", "h100", "--fabric", "c1.2147483648"
    )
    if code == 2:
        return
    assert code == 0, err
    exported = db_dir / "export.json"
    exported.write_text(json.dumps(run.ok("inventory", "export")))
    run.ok("inventory", "import", exported)


# ---- files


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({"pools": [], "tenants": [{"id": "t1"}]}).encode("utf-16"),
        b"\xff\xfe\x00\x01garbage\x80\x81",
    ],
    ids=["utf-16", "binary"],
)
def test_inventory_import_of_a_non_utf8_file_is_invalid_input(
    run: Cli, db_dir: Path, content: bytes
) -> None:
    """Today: UnicodeDecodeError, exit 1 INTERNAL (only OSError is caught around read_text)."""
    path = db_dir / "inventory.json"
    path.write_bytes(content)
    error = refused(run, 2, "inventory", "import", path)
    assert "UTF-8" in error["message"] or "utf-8" in error["message"], error


def test_init_where_the_file_cannot_be_created_is_not_a_bug(db_dir: Path) -> None:
    """A --db under a regular file: today exit 1 `INTERNAL: database error: unable to open
    database file`. A bad path is the user's input, not a bug."""
    (db_dir / "plain").write_text("x")
    db = db_dir / "plain" / "x.db"
    result = invoke(["--db", str(db), "--now", NOW, "--json", "init"])
    assert result.exit_code in (2, 7), result.stderr
    assert result.stdout == ""
    error = json.loads(result.stderr)["error"]
    assert str(db) in error["message"]


def test_a_damaged_database_is_not_reported_as_a_bug(run: Cli, db_dir: Path) -> None:
    """Our header, garbage pages: today exit 1 `INTERNAL: database error: database disk image is
    malformed`. It is a bad file (or an unavailable database), not a bug; the file is untouched."""
    damaged = db_dir / "damaged.db"
    damaged.write_bytes(run.db.read_bytes()[:100] + b"\xde\xad" * 4000)
    before = file_digest(damaged)
    result = invoke(["--db", str(damaged), "--now", NOW, "--json", "list"])
    assert result.exit_code in (2, 7), result.stderr
    assert result.stdout == ""
    assert str(damaged) in json.loads(result.stderr)["error"]["message"]
    assert file_digest(damaged) == before


def test_a_fifo_as_db_is_refused_not_waited_on(db_dir: Path) -> None:
    """Today the header read opens the FIFO and blocks forever."""
    fifo = db_dir / "pipe.db"
    os.mkfifo(fifo)
    try:
        done = subprocess.run(
            [*ENTRY, "--db", str(fifo), "--now", NOW, "--json", "list"],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("`--db FIFO list` hangs instead of refusing a file that is not a database")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""


def test_init_never_deletes_a_device_file(db_dir: Path) -> None:
    """A character device reads as an empty file, so `init` os.remove()s it and writes a database
    in its place: `better-compute --db /dev/null init` run as root deletes /dev/null."""
    device = db_dir / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        pytest.skip("mknod needs privileges")
    result = invoke(["--db", str(device), "--now", NOW, "--json", "init", "--force"])
    assert stat.S_ISCHR(os.stat(device).st_mode), "init replaced a device file"
    assert result.exit_code == 2, result.stderr


def test_init_force_waits_for_a_writer_instead_of_deleting_its_database(run: Cli) -> None:
    """Today `init --force` removes the file and its -wal/-shm while another connection holds the
    write lock, exits 0, and that writer's work goes to an unlinked file. §3: a database that
    stays locked past the busy timeout is UNAVAILABLE."""
    run.ok("config", "set", "db.busyTimeoutMs", "200")
    holder = sqlite3.connect(run.db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        code, out, err = run("init", "--force")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == 7, err
    assert out == ""
    assert len(run.ok("node", "list")) == 7  # the demo inventory is still there


def test_demo_keep_does_not_replace_an_existing_database(run: Cli, rsv: dict[str, str]) -> None:
    """`init` needs --force to replace a database; `demo --keep FILE` replaces it silently today."""
    before = dump(run.db)
    result = invoke(["--now", NOW, "demo", "--keep", str(run.db)])
    assert result.exit_code == 4, result.stderr
    assert dump(run.db) == before


def test_demo_keep_with_an_unusable_path_fails_once_cleanly(db_dir: Path) -> None:
    """Today every step of the tour fails in turn: a screen of `error:` lines (INVALID_INPUT,
    then INTERNAL), and exit 1."""
    result = invoke(["--now", NOW, "demo", "--keep", str(db_dir)])
    assert result.exit_code == 2, result.stderr
    assert one_line_error(result.stderr).startswith("error: INVALID_INPUT: ")


# ---- flag values that make no sense but are accepted (written, then pending forever)


def test_gang_with_an_empty_topology_key_is_invalid_input(run: Cli) -> None:
    """Today it is written and stays pending forever, with the reason
    `no gang of 2 nodes fits in one  (at most 0 nodes fit together)`."""
    for command in ("reserve", "preview"):
        key = ["--key", "tk"] if command == "reserve" else []
        error = refused(
            run,
            2,
            command,
            "--tenant",
            "acme",
            "--gpus",
            "8",
            "--gang",
            "2",
            "--topology-key",
            "",
            "--for",
            "1h",
            *key,
        )
        assert "--topology-key" in error["message"]


@pytest.mark.parametrize("model", ["", " ", ",,,"])
def test_reserve_with_an_empty_model_list_is_invalid_input(run: Cli, model: str) -> None:
    """`--model` takes one model or a comma-separated list; an empty list means any model today."""
    error = refused(
        run,
        2,
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "1",
        "--for",
        "1h",
        "--model",
        model,
        "--key",
        "m",
    )
    assert "--model" in error["message"]


@pytest.mark.parametrize(
    "model", ["🚀", "h100;drop", "x" * 10_000], ids=["emoji", "semicolon", "10k"]
)
def test_reserve_with_a_model_no_node_can_have_is_invalid_input(run: Cli, model: str) -> None:
    """`node add` and the inventory only take lowercase letters, digits, '.', '_' or '-'; a
    reservation for anything else is written today and can never be placed."""
    refused(
        run,
        2,
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "1",
        "--for",
        "1h",
        "--model",
        model,
        "--key",
        "m",
    )


def test_tick_step_without_until_is_refused(run: Cli) -> None:
    """`tick --step` alone used to be ignored (once even unchecked): §4's synopsis is `tick
    [--until TIME [--step DURATION]]`, so a cron line that lost its --until is told so."""
    for step in ("garbage", "0s", "1m"):
        error = refused(run, 2, "tick", "--step", step)
        assert error["message"] == "--step needs --until TIME: without it, tick runs once, at now"
    for step in ("garbage", "0s"):
        error = refused(run, 2, "tick", "--until", "+1h", "--step", step)
        assert "--step" in error["message"] or "DURATION" in error["message"]
    assert run.ok("tick", "--until", "+2m", "--step", "1m")["now"] > 0


@pytest.mark.parametrize("principal", ["", "   "])
def test_an_empty_principal_is_invalid_input(run: Cli, principal: str) -> None:
    """`policy set --principal ''` is INVALID_INPUT, but `--as ''` acts (and is recorded) today."""
    error = refused(
        run,
        2,
        "--as",
        principal,
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "1",
        "--for",
        "1h",
        "--key",
        "who",
    )
    assert "--as" in error["message"]


def test_a_pool_name_that_is_another_pools_id_is_refused(run: Cli, db_dir: Path) -> None:
    """`--pool` takes an id or a name and ids win, so such a pool could never be named again."""
    other = pool_id(run)
    code, _, err = run("pool", "create", other)
    assert code in (2, 4), err
    inventory = db_dir / "inv.json"
    inventory.write_text(json.dumps({"pools": [{"name": other}]}))
    before = dump(run.db)
    code, _, err = run("inventory", "import", inventory)
    assert code == 2, err
    assert dump(run.db) == before


def test_report_bound_on_a_pending_reservation_is_a_conflict(run: Cli, rsv: dict[str, str]) -> None:
    """§3: a state change the current state forbids is CONFLICT, as it is for a placed or a
    released reservation; a pending one says NOT_FOUND ('has no allocation') today."""
    error = refused(run, 4, "node", "report-bound", "west-01", rsv["pending"])
    assert "pending" in error["message"]


def test_node_label_removing_an_empty_key_is_invalid_input(run: Cli) -> None:
    """`node label west-01 -` succeeds today and logs a node.labelled event that changed nothing."""
    error = refused(run, 2, "node", "label", "west-01", "-")
    assert "key" in error["message"]


# ---- output shape


def test_json_group_without_a_subcommand_reports_a_json_error() -> None:
    """`better-compute --json node` exits 2 today with the help text on stdout and nothing on
    stderr; with --json stdout must be empty and the error a JSON document on stderr."""
    done = subprocess.run([*ENTRY, "--json", "node"], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert json.loads(done.stderr)["error"]["code"] == "INVALID_INPUT"


def test_an_error_naming_a_path_with_a_newline_stays_on_one_line(run: Cli) -> None:
    code, _, err = run("inventory", "import", "/nowhere/a\nb.json", json=False)
    assert code == 2
    one_line_error(err)


def test_a_huge_integer_in_the_inventory_names_the_problem_not_python_internals(
    run: Cli, db_dir: Path
) -> None:
    """Today: `... use sys.set_int_max_str_digits() to increase the limit`."""
    path = db_dir / "inv.json"
    nodes = '[{"name": "n", "gpus": {"count": ' + "9" * 5000 + ', "model": "h100"}}]'
    path.write_text('{"pools": [{"name": "p", "nodes": ' + nodes + "}]}")
    error = refused(run, 2, "inventory", "import", path)
    assert "sys." not in error["message"], error


def test_an_empty_db_path_is_named_in_the_error(db_dir: Path) -> None:
    """Today: ` is not a better-compute database; choose another --db` (the name is blank)."""
    result = invoke(["--db", "", "--now", NOW, "--json", "list"])
    assert result.exit_code == 2
    message = json.loads(result.stderr)["error"]["message"]
    assert not message.startswith(" "), message
    assert "''" in message or "empty" in message, message


# ================================================================ already well behaved


@pytest.mark.parametrize(
    "text",
    [
        "2026-13-45",
        "2026-09-28T25:00:00Z",
        "2026-09-28T08:00:00+25:00",
        "+1h1h",
        "+-1h",
        "+1.5h",
        "1e400",
        " ",
        "🚀",
        "２０２６",
        "x" * 10_000,
        "+99999999d",
        "1969-12-31T23:59:59Z",
    ],
    ids=lambda text: text if len(text) < 40 else f"{len(text)}-chars",
)
def test_bad_now_is_invalid_input_and_writes_nothing(run: Cli, text: str) -> None:
    error = refused(run, 2, "tick", now=text)
    assert "TIME" in error["message"]


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--gpus", "8", "--topology-key", "fabric.domain"], "--topology-key"),
        (["--gpus", "8", "--gang", "1"], "--gang"),
        (["--gpus", "8", "--gang", "65"], "--gang"),
        (["--gpus", "8", "--gang", str(2**63)], "--gang"),
        (["--node-lease", "--spot"], "--node-lease"),
        (["--gpus", "1", "--topology", "weird"], "--topology"),
        (["--gpus", "1", "--topology", "NVLINK-ALL"], "--topology"),
        (["--gpus", "0"], "--gpus"),
        (["--gpus", "-1"], "--gpus"),
        (["--gpus", str(2**63)], "--gpus"),
        ([], "--gpus"),
        (["--gpus", "1", "--key", "  "], "--key"),
        (["--gpus", "1", "--start", "2026-13-45"], "TIME"),
        (["--gpus", "1", "--start", "+99999999d"], "TIME"),
        (["--gpus", "1", "--start", ""], "TIME"),
    ],
)
def test_nonsense_reserve_flags_are_invalid_and_write_nothing(
    run: Cli, flags: list[str], names: str
) -> None:
    args = ["--tenant", "acme", "--for", "1h", *flags]
    if "--key" not in flags:
        args += ["--key", "k"]
    error = refused(run, 2, "reserve", *args)
    assert names in error["message"], error


@pytest.mark.parametrize(
    "duration", ["0s", "0ms", "-1h", "", "1", "1.5h", "1e400", "1H", "99999999w"]
)
def test_bad_durations_are_invalid_and_write_nothing(
    run: Cli, rsv: dict[str, str], duration: str
) -> None:
    assert (
        "DURATION"
        in refused(
            run, 2, "reserve", "--tenant", "acme", "--gpus", "1", "--for", duration, "--key", "d"
        )["message"]
    )
    assert "DURATION" in refused(run, 2, "extend", rsv["active"], "--by", duration)["message"]


@pytest.mark.parametrize("command", ["get", "cancel", "release", "repair", "events"])
def test_ids_of_the_wrong_kind_are_not_found(run: Cli, command: str) -> None:
    for wrong in (pool_id(run), "west-01", "acme", "rsv_%", "rsv_'", "", "x" * 10_000):
        args = ["--reservation", wrong] if command == "events" else [wrong]
        refused(run, 3, command, *args)


def test_extend_of_a_wrong_kind_of_id_is_not_found(run: Cli) -> None:
    refused(run, 3, "extend", pool_id(run), "--by", "1h")


@pytest.mark.parametrize(
    ("verb", "state"),
    [
        ("cancel", "active"),
        ("cancel", "released"),
        ("release", "pending"),
        ("release", "released"),
        ("repair", "active"),
        ("repair", "pending"),
    ],
)
def test_a_state_change_the_state_forbids_is_a_conflict_naming_what_is_allowed(
    run: Cli, rsv: dict[str, str], verb: str, state: str
) -> None:
    error = refused(run, 4, verb, rsv[state])
    assert f"it is {state}" in error["message"] and "allowed:" in error["message"]


@pytest.mark.parametrize("state", ["pending", "released"])
def test_extend_of_a_reservation_without_a_window_is_a_conflict(
    run: Cli, rsv: dict[str, str], state: str
) -> None:
    assert "allowed:" in refused(run, 4, "extend", rsv[state], "--by", "1h")["message"]


def test_report_bound_for_a_node_outside_the_reservation_is_not_found(
    run: Cli, rsv: dict[str, str]
) -> None:
    error = refused(run, 3, "node", "report-bound", "west-07", rsv["active"])
    assert "west-07" in error["message"]
    refused(run, 4, "node", "report-bound", "west-03", rsv["released"])


@pytest.mark.parametrize(
    "name", ["a'b", 'a"b', "a;b", "%", "_", "🚀", "a b", ".", "", "x" * 64, "x" * 10_000]
)
def test_names_with_quoting_and_like_hazards_are_refused(run: Cli, name: str) -> None:
    for command in (["pool", "create"], ["tenant", "create"], ["meter", "create"]):
        if command[0] == "meter" and name == "x" * 64:
            continue  # meter names may be up to 128 characters
        refused(run, 2, *command, name)
    refused(run, 2, "node", "add", name, "--gpus", "8", "--model", "h100")


@pytest.mark.parametrize("name", ["%", "_", "west'", "acme%", "w_st-01"])
def test_lookups_are_exact_not_like_patterns(run: Cli, rsv: dict[str, str], name: str) -> None:
    refused(run, 3, "pool", "show", name)
    refused(run, 3, "node", "show", name)
    refused(run, 3, "list", "--tenant", name)
    assert run.ok("list", "--key", name) == []


@pytest.mark.parametrize("label", ["", "=", "k=", "=v", "k", "fabric.domain=x"])
def test_label_syntax_errors_are_invalid_input(run: Cli, label: str) -> None:
    refused(run, 2, "node", "label", "west-01", label)
    refused(run, 2, "pool", "create", "p2", "--label", label)
    refused(run, 2, "node", "add", "n9", "--gpus", "8", "--model", "h100", "--label", label)


@pytest.mark.parametrize(
    ("device", "code"),
    [
        ("west-01", 2),
        ("west-01:", 2),
        ("west-01:-1", 2),
        ("west-01:1.5", 2),
        ("west-01: 3", 2),
        ("", 2),
        ("west-01:8", 3),
        ("west-01:" + "9" * 30, 3),
        ("nope:1", 3),
    ],
)
def test_malformed_or_unknown_devices(run: Cli, device: str, code: int) -> None:
    error = refused(run, code, "device", "quarantine", device, "--reason", "xid-79")
    if code == 2:
        assert "NODE:INDEX" in error["message"]
    if device == "west-01:8":
        assert "0 to 7" in error["message"]


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["--gpus", "0"], "--gpus"),
        (["--gpus", "65"], "--gpus"),
        (["--gpus", "8", "--nvlink-groups", "3"], "--nvlink-groups"),
        (["--gpus", "8", "--nvlink-groups", "0"], "--nvlink-groups"),
        (["--gpus", "8", "--model", "H100;x"], "--model"),
        (["--gpus", "8", "--fabric", "c1"], "--fabric"),
        (["--gpus", "8", "--fabric", "c1.-1"], "--fabric"),
    ],
)
def test_node_add_bad_values(run: Cli, args: list[str], what: str) -> None:
    if "--model" not in args:
        args = [*args, "--model", "h100"]
    assert what in refused(run, 2, "node", "add", "n9", *args)["message"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("hello", "not valid JSON"),
        ("", "not valid JSON"),
        ("[]", "inventory"),
        ('{"pools": [], "pools": []}', "twice"),
        ('{"pools": [], "extra": 1}', "extra"),
        (ONE_NODE.replace("COUNT", '"8"'), "pools[0].nodes[0].gpus.count"),
        (ONE_NODE.replace("COUNT", "8.0"), "pools[0].nodes[0].gpus.count"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ],
)
def test_bad_inventory_files_name_the_problem_and_apply_nothing(
    run: Cli, db_dir: Path, text: str, where: str
) -> None:
    path = db_dir / "inv.json"
    path.write_text(text)
    assert where in refused(run, 2, "inventory", "import", path)["message"]


def test_inventory_that_moves_or_shrinks_a_booked_node_applies_nothing(
    run: Cli, rsv: dict[str, str], db_dir: Path
) -> None:
    node = {"name": "west-01", "gpus": {"count": 8, "model": "h100"}}
    fresh = {"name": "new-1", "gpus": {"count": 8, "model": "h100"}}
    moved = {"pools": [{"name": "aaa", "nodes": [fresh]}, {"name": "east", "nodes": [node]}]}
    shrunk = {
        "pools": [{"name": "west", "nodes": [{**node, "gpus": {"count": 2, "model": "h100"}}]}]
    }
    for doc, what in ((moved, "cannot change pool"), (shrunk, "keep at least")):
        path = db_dir / "inv.json"
        path.write_text(json.dumps(doc))
        error = refused(run, 2, "inventory", "import", path)
        assert what in error["message"] and "west-01" in error["message"]


def test_inventory_with_a_bom_is_read_or_refused_cleanly(run: Cli, db_dir: Path) -> None:
    path = db_dir / "bom.json"
    path.write_text("\ufeff" + json.dumps({"pools": [], "tenants": [{"id": "t1"}]}), "utf-8")
    before = dump(run.db)
    code, _, err = run("inventory", "import", path)
    if code == 0:
        assert {"id": "t1"} in run.ok("tenant", "list")
    else:
        assert code == 2 and "BOM" in json.loads(err)["error"]["message"]
        assert dump(run.db) == before


def test_db_paths_that_are_not_our_databases_are_refused_untouched(db_dir: Path) -> None:
    other = db_dir / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t(x)")
    conn.commit()
    conn.close()
    text = db_dir / "text.db"
    text.write_text("hello\n" * 50)
    empty = db_dir / "empty.db"
    empty.write_bytes(b"")
    for path, code in ((db_dir, 2), (other, 2), (text, 2), (empty, 7)):
        before = None if path.is_dir() else file_digest(path)
        for command in (["list"], ["tick"], ["init"]):
            if command == ["init"] and code == 7:
                continue  # init over an empty file is allowed
            result = invoke(["--db", str(path), "--now", NOW, "--json", *command])
            assert result.exit_code == code, (path, command, result.stderr)
            assert result.stdout == ""
            assert set(json.loads(result.stderr)["error"]) == {"code", "message"}
        if before is not None:
            assert file_digest(path) == before


def test_a_database_from_a_newer_version_is_unavailable(run: Cli) -> None:
    conn = sqlite3.connect(run.db)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    assert "upgrade" in run.fails(7, "list")["message"]


def test_a_locked_database_is_unavailable_to_writers_and_readable_by_readers(
    run: Cli, rsv: dict[str, str]
) -> None:
    run.ok("config", "set", "db.busyTimeoutMs", "200")
    before = dump(run.db)
    holder = sqlite3.connect(run.db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        for args in (
            ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "lk"],
            ["tick"],
            ["cancel", rsv["placed"]],
            ["config", "set", "placement.topN", "2"],
        ):
            assert "locked" in run.fails(7, *args)["message"]
        assert len(run.ok("list")) == 4
        assert run.ok("get", rsv["active"])["state"] == "active"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert dump(run.db) == before


def test_tick_until_before_now_or_a_zero_step_is_invalid(run: Cli) -> None:
    assert "--until" in refused(run, 2, "tick", "--until", "2026-09-28T07:00:00Z")["message"]
    assert "DURATION" in refused(run, 2, "tick", "--until", "+1h", "--step", "0s")["message"]
    assert "million" in refused(run, 2, "tick", "--until", "+1h", "--step", "1ms")["message"]


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["--step", "4"], "5 to 1440"),
        (["--step", "1441"], "5 to 1440"),
        (["--step", str(2**63)], "5 to 1440"),
        (["--from", "+2h", "--to", "+1h"], "--to must be after --from"),
        (["--from", "+1h", "--to", "+1h"], "--to must be after --from"),
        (["--from", "now", "--to", "+8d"], "7 days"),
        (["--from", "now", "--to", "+7d", "--step", "5"], "at most 336"),
        (["--tenant", "nope"], "no tenant"),
    ],
)
def test_timeline_limits(run: Cli, args: list[str], what: str) -> None:
    code = 3 if "--tenant" in args else 2
    assert what in refused(run, code, "timeline", *args)["message"]


@pytest.mark.parametrize("since", ["-1", "0", str(2**63), str(2**64), "-" + str(2**70)])
def test_events_since_any_integer_answers(run: Cli, since: str) -> None:
    assert isinstance(run.ok("events", "--since", since), list)


def test_usage_from_not_before_to_is_invalid(run: Cli) -> None:
    refused(run, 2, "usage", "--from", "+2h", "--to", "+1h")
    refused(run, 2, "usage", "--from", "+1h", "--to", "+1h")


def test_numbers_out_of_range_for_quota_policy_and_settings(run: Cli) -> None:
    for value in ("-1", str(2**31), str(2**63)):
        refused(run, 2, "quota", "set", "--tenant", "acme", "--gpus", value)
    refused(
        run, 2, "policy", "set", "--tenant", "acme", "--principal", "p", "--max-gpus", str(2**63)
    )
    refused(run, 2, "policy", "set", "--tenant", "acme", "--principal", " ")
    for key, value in (
        ("placement.topN", "0"),
        ("placement.topN", "1.5"),
        ("pending.retryMs", "999"),
        ("binding.autoBind", "TRUE"),
        ("nope", "1"),
    ):
        refused(run, 2, "config", "set", key, value)


def test_key_reuse_with_other_parameters_is_a_conflict(run: Cli, rsv: dict[str, str]) -> None:
    error = refused(
        run, 4, "reserve", "--tenant", "acme", "--gpus", "2", "--for", "2h", "--key", "a"
    )
    assert rsv["active"] in error["message"]


def test_typer_usage_errors_are_json_on_stderr_with_json() -> None:
    """Only the real entry point formats Typer's own usage errors (a float for an int, an unknown
    command, a missing value); the three processes run side by side."""
    cases = (
        ["--json", "reserve", "--tenant", "acme", "--gpus", "1.5", "--for", "1h"],
        ["--json", "bogus"],
        ["--json", "list", "--state"],
    )
    procs = [
        subprocess.Popen([*ENTRY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for args in cases
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 2, err
        assert out == ""
        assert json.loads(err)["error"]["code"] == "INVALID_INPUT"


def test_init_refuses_a_missing_folder(db_dir: Path) -> None:
    result = invoke(["--db", str(db_dir / "nodir" / "x.db"), "--now", NOW, "--json", "init"])
    assert result.exit_code == 2
    assert "does not exist" in json.loads(result.stderr)["error"]["message"]
    init_db(db_dir / "ok.db")  # and a good path still works
