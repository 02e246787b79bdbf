"""What people write (labels, reasons, names) is printed as written, in every table for people.

rich reads square brackets in a string as its markup: `[spare]` vanished from a table, and a
closing tag such as `[/x]` made every command that showed it fail with INTERNAL, after the
command that stored it had committed (a hostile review, 2026-12-01).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pgtest
import pytest
from conftest import Cli

import better_compute.cli.app  # noqa: F401  (cli.app is also the name of the Typer app)


def test_bracketed_text_is_shown_as_written_and_never_crashes(run: Cli) -> None:
    run.ok("node", "label", "west-01", "note=[spare]", "k=[/x]", json=False)
    run.ok("device", "quarantine", "west-02:1", "--reason", "[/y] bad fan", json=False)
    run.ok(
        "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--name", "[/n]", "--key", "k"
    )
    shown = {
        "node list": run.ok("node", "list", json=False),
        "node show": run.ok("node", "show", "west-01", json=False),
        "events": run.ok("events", json=False),
        "list": run.ok("list", json=False),
    }
    assert "note=[spare]" in shown["node list"] and "k=[/x]" in shown["node list"]
    assert "note=[spare]" in shown["node show"]
    assert "[/y] bad fan" in shown["events"]
    assert "[/n]" in shown["events"] and "[/n]" in shown["list"]
    rsv = run.ok("list", "--key", "k")[0]["id"]
    assert "[/n]" in run.ok("get", rsv, json=False)


def test_a_node_label_key_given_twice_is_refused(run: Cli) -> None:
    before = run.ok("node", "show", "west-01")["labels"]
    error = run.fails(2, "node", "label", "west-01", "zone=a", "zone=b")
    assert "'zone' twice" in error["message"]
    error = run.fails(2, "node", "label", "west-01", "zone=a", "zone-")
    assert "both set and removed" in error["message"]
    assert run.ok("node", "show", "west-01")["labels"] == before
    assert run.ok("node", "label", "west-01", "zone=a", "zone=a")["labels"]["zone"] == "a"


def test_labels_with_control_characters_are_refused_everywhere(run: Cli, tmp_path: Path) -> None:
    for value in ("line\nbreak", "v\x1b[31mRED", "tab\there"):
        error = run.fails(2, "node", "label", "west-01", f"k={value}")
        assert "printable" in error["message"], error
        run.fails(2, "pool", "create", "east", "--label", f"k={value}")
        run.fails(
            2, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--label", f"k={value}"
        )
        doc = {
            "pools": [
                {
                    "name": "east",
                    "nodes": [
                        {
                            "name": "e1",
                            "labels": {"k": value},
                            "gpus": {"count": 8, "model": "h100"},
                        }
                    ],
                }
            ]
        }
        path = tmp_path / "inv.json"
        path.write_text(json.dumps(doc))
        error = run.fails(2, "inventory", "import", path)
        assert "printable" in error["message"] and "labels" in error["message"], error
    assert "east" not in [p["name"] for p in run.ok("pool", "list")]


def test_a_topology_key_no_label_could_have_is_refused(run: Cli) -> None:
    for key in ("bad key=", "k\nx", "x" * 64, "  "):
        error = run.fails(
            2, "reserve", "--tenant", "acme", "--gpus", "2", "--gang", "2", "--topology-key", key,
            "--for", "1h",
        )  # fmt: skip
        assert "--topology-key" in error["message"] and "label key" in error["message"]
    assert run.ok("list") == []


def test_a_webhook_for_a_misspelt_event_type_is_refused(run: Cli) -> None:
    """Only the namespace was checked: `reservation.preemtping` made a webhook that never fired."""
    url = "http://127.0.0.1:9/hook"
    error = run.fails(
        2, "webhook", "add", "--tenant", "acme", "--url", url, "--events", "reservation.preemtping"
    )
    assert "no event is of type 'reservation.preemtping'" in error["message"]
    assert "reservation.preempting" in error["message"]
    run.fails(2, "webhook", "add", "--tenant", "*", "--url", url, "--events", "pool.polcy.*")
    for events in ("reservation.preempting,reservation.expiring", "reservation.*"):
        run.ok("webhook", "add", "--tenant", "acme", "--url", url, "--events", events)
    run.ok("webhook", "add", "--tenant", "*", "--url", url, "--events", "pool.policy.*,node.*")
    # `*` (every event) excuses no misspelling, nor a fleet type on a tenant's webhook, beside it
    for tenant, events in (("acme", "reservation.expring,*"), ("acme", "node.*,*")):
        run.fails(2, "webhook", "add", "--tenant", tenant, "--url", url, "--events", events)
    everything = run.ok("webhook", "add", "--tenant", "acme", "--url", url, "--events", "*,*")
    assert run.ok("webhook", "list")[-1]["id"] == everything["id"]


def test_every_event_type_the_code_writes_is_one_a_webhook_may_name() -> None:
    """EVENT_TYPES is the list webhook add checks --events against: a type the code writes but
    the list lacks could never be asked for, and one the code no longer writes is a dead name."""
    import ast

    import better_compute
    from better_compute.model import EVENT_TYPES
    from better_compute.service.webhooks import NAMESPACES

    shape = re.compile(rf"^(?:{'|'.join(NAMESPACES)})\.[a-z]+(?:\.[a-z]+)*$")
    not_events = {"webhook.test"}  # the type of `webhook test`'s sample body, never logged
    model = Path(better_compute.__file__).parent / "model.py"
    found = set()
    for path in Path(better_compute.__file__).parent.rglob("*.py"):
        if path == model:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and shape.match(text):
                found.add(text)
    assert found - not_events == set(EVENT_TYPES)


def test_events_for_people_are_one_line_each(run: Cli) -> None:
    """Plain lines are written as they are: rich wrapped each long event at the terminal's width
    (80 columns in a pipe), so a log of a million events took rich 15 minutes and 3 GB."""
    run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--name", "x" * 100)
    lines = run.ok("events", json=False).splitlines()
    assert len(lines) == len(run.ok("events"))
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  #\d+ ", line) for line in lines)
    assert any(len(line) > 120 for line in lines)


def test_events_read_page_by_page_say_the_same(run: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log is read EVENT_PAGE events at a time (a fleet's is a million): pages joined are
    the whole log, for JSON and for people alike."""
    from better_compute.storage import repo

    for key in ("a", "b", "c"):
        run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", key)
    whole, text = run.ok("events"), run.ok("events", json=False)
    monkeypatch.setattr(repo, "EVENT_PAGE", 2)
    assert run.ok("events") == whole and run.ok("events", json=False) == text
    assert [e["seq"] for e in whole] == list(range(1, len(whole) + 1))
    assert run.ok("events", "--since", str(len(whole))) == []


# ---------------------------------------------------------------- found by a fuzzer (2026-12-01)


@pytest.mark.parametrize(
    "args",
    [
        ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "k\x1b]0;x\x07"],
        ["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "k" * 1001],
        ["node", "cordon", "west-01", "--reason", ""],
        ["node", "cordon", "west-01", "--reason", "x\x1b[2J"],
        ["node", "mark-unreachable", "west-01", "--reason", "r" * 201],
        ["node", "cordon", "west-01", "--from", "+1h", "--until", "+2h", "--reason", "a\nb"],
        ["device", "quarantine", "west-01:1", "--reason", "x\x1b[2Jy"],
    ],
)
def test_keys_and_reasons_are_printable_text_like_names(run: Cli, args: list[str]) -> None:
    """They are printed in tables and events: an escape sequence reached the terminal as
    written. The rule of `--name`: 1 to 200 printable characters (a key: 1,000)."""
    before = run.ok("events")
    err = run.fails(2, *args)
    assert re.search("must be 1 to (200|1000) printable characters", err["message"]), err
    assert run.ok("events") == before


def test_an_unknown_tenant_that_is_no_tenant_id_is_named_on_one_line(run: Cli) -> None:
    code, out, err = run("list", "--tenant", "a\nb", json=False)
    assert (code, out) == (3, "") and err.count("\n") == 1, err
    assert "`tenant list` shows the tenants" in err
    assert (
        "create it with `tenant create ghost`"
        in run.fails(3, "list", "--tenant", "ghost")["message"]
    )


@pytest.mark.sqlite_only(reason="a ledger file's path")
@pytest.mark.parametrize("command", [["list"], ["backup", "/tmp/" + "b" * 300]])
def test_a_path_too_long_for_the_system_is_bad_input(
    run: Cli, tmp_path: Path, command: list[str]
) -> None:
    """The system refuses a name over 255 bytes before anything is opened: INVALID_INPUT, not
    INTERNAL (Path.exists() raises it)."""
    db = str(tmp_path / ("a" * 300)) if command == ["list"] else str(run.db)
    code, out, err = Cli(Path(db))(*command)
    assert (code, out) == (2, ""), err
    assert json.loads(err)["error"]["message"].endswith(
        "is too long for this system (most file systems allow 255 bytes a name); give a shorter one"
    )


def _process(run: Cli, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a real process through its entry point (cli.main, which words the parser's
    own errors), on `run`'s ledger."""
    entry = [sys.executable, "-c", "from better_compute.cli import main; main()"]
    return subprocess.run(
        [*entry, "--db", pgtest.ledger(str(run.db)), *args],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["list", "--db", "other.db"], "--db"),
        (["tick", "--now", "+1h"], "--now"),
        (["reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--as", "bob"], "--as"),
    ],
)
def test_a_global_option_after_the_command_says_where_it_goes(
    run: Cli, args: list[str], option: str
) -> None:
    """A newcomer's `list --db other.db` was told `No such option: --db (Possible options:
    --ids)`; it now says the option goes before the command, or in its environment variable.
    (The entry point words the parser's errors: a real process, not the test runner's app.)"""
    done = _process(run, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(
        f"error: INVALID_INPUT: {option} is a global option: give it before the command"
    )
    assert "BETTER_COMPUTE_" in done.stderr and done.stderr.count("\n") == 1
    assert run.ok("list") == []  # nothing was booked


@pytest.mark.parametrize("option", ["--now", "--as"])
def test_a_global_option_without_its_value_says_so(run: Cli, option: str) -> None:
    """Given where it goes but with its value left out, it was told to go before the command."""
    done = _process(run, option)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: INVALID_INPUT: Option '{option}' requires an argument")
    assert done.stderr.count("\n") == 1


_CLI = sys.modules["better_compute.cli.app"]


def test_an_error_that_quotes_several_lines_is_one(capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged backup's integrity_check lines made a six-line error (§3: one line)."""
    quoted = "*** in database main ***\nOn tree page 3 cell 5: Offset 65535\r\n\nOn tree page 3"
    _CLI._report("INVALID_INPUT", f"backup 'b.db' is damaged ({quoted})", as_json=False)
    _CLI._report("INVALID_INPUT", f"backup 'b.db' is damaged ({quoted})", as_json=True)
    human, as_json = capsys.readouterr().err.splitlines()
    said = "backup 'b.db' is damaged (*** in database main *** On tree page 3 cell 5: Offset 65535"
    assert human == f"error: INVALID_INPUT: {said} On tree page 3)"
    assert json.loads(as_json)["error"]["message"] == f"{said} On tree page 3)"


def test_fabric_domain_as_a_label_names_the_commands_that_set_it(run: Cli) -> None:
    message = run.fails(2, "node", "label", "west-01", "fabric.domain=x")["message"]
    assert "node add --fabric" in message and "inventory import" in message


def test_a_number_flag_given_words_says_what_it_expects(run: Cli) -> None:
    """`timeline --step 1h` answered in the parser's jargon ("Input should be a valid integer,
    unable to parse string as an integer")."""
    done = _process(run, "timeline", "--step", "1h")
    assert done.returncode == 2
    assert "'--step': expected a whole number (digits only)" in done.stderr
    assert "Input should" not in done.stderr


def test_a_node_named_in_other_case_is_not_found_naming_the_node_meant(run: Cli) -> None:
    """Node names are taken exactly; a node agent's `--node "$(hostname)"` in capitals was told
    only `no node 'WEST-01'`, with west-01 right there."""
    message = run.fails(3, "node", "show", "WEST-01")["message"]
    assert "did you mean 'west-01'" in message
    assert "did you mean" not in run.fails(3, "node", "show", "nowhere-01")["message"]


def test_a_placements_gpus_are_shown_as_indexes_not_a_count(run: Cli) -> None:
    """A 1-GPU request read `gpus 4` under `on` and in preview's `gpus` column, like a count
    (node list's `gpus` is one)."""
    shown = run("preview", "--tenant", "acme", "--gpus", "1", "--for", "1h", json=False)[1]
    assert "GPU indexes" in shown.splitlines()[1]
    shown = run("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", json=False)[1]
    assert re.search(r"on +west-\d+ GPU indexes \d\b", shown), shown


def test_a_narrow_terminal_folds_names_in_a_listing_and_cuts_none(run: Cli) -> None:
    """At 80 columns a long tenant read `rese…` and every node `west-…`, so nodes could not be
    told apart; now names fold onto more lines."""
    tenant = "research-computer-vision-long-team-name"
    run.ok("tenant", "create", tenant)
    name = "a fairly long reservation name for the vision team"
    run.ok("reserve", "--tenant", tenant, "--gpus", "8", "--gang", "3", "--for", "3d",
           "--start", "+1d", "--name", name)  # fmt: skip
    shown = run("list", json=False, env={"COLUMNS": "80"})[1]
    assert "…" not in shown
    assert max(len(line) for line in shown.splitlines()) <= 80
    folded = "".join(shown.split())
    assert all(f"west-0{i}" in folded for i in (1, 2, 3))


@pytest.mark.parametrize("bad", ["\u202e", "\u200b", "\x1b[31m"])
def test_a_bad_label_is_shown_escaped_never_raw(run: Cli, bad: str) -> None:
    """A label refused for a control or format character names it escaped: raw, a right-to-left
    override turned the rest of the line around on the terminal (a review)."""
    for args in (
        ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--label", f"team={bad}x"),
        ("node", "label", "west-01", f"rack={bad}"),
    ):
        code, out, err = run(*args, json=False)
        assert code == 2 and out == ""
        assert err.isprintable() or err.rstrip("\n").isprintable(), repr(err)
        assert json.dumps(bad)[1:-1] in err
