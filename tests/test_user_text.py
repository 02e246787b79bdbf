"""What people write (labels, reasons, names) is printed as written, in every table for people.

rich reads square brackets in a string as its markup: `[spare]` vanished from a table, and a
closing tag such as `[/x]` made every command that showed it fail with INTERNAL, after the
command that stored it had committed (a hostile review, 2026-12-01).
"""

from __future__ import annotations

from conftest import Cli


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
