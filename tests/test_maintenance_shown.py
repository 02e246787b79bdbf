"""A node inside a maintenance window is shown as the scheduler treats it: not schedulable (a
window is a cordon with a start and an end, PRODUCT.md §4). A review found it listed `ok` and
`schedulable: true` while `pool show` left its GPUs out and `preview` refused it."""

from __future__ import annotations

from conftest import Cli, at

HOUR = 3_600_000


def _west_03(nodes: list[dict]) -> dict:
    return next(n for n in nodes if n["name"] == "west-03")


def test_a_node_in_maintenance_is_shown_unschedulable_while_the_window_lasts(run: Cli) -> None:
    export = run.ok("inventory", "export")
    run.ok("node", "cordon", "west-03", "--from", "+1h", "--until", "+3h", "--reason", "bios")
    before = _west_03(run.ok("node", "list"))
    assert before["schedulable"] is True  # the window has not begun
    for now in (at(HOUR), at(2 * HOUR)):
        listed = _west_03(run.ok("node", "list", now=now))
        shown = run.ok("node", "show", "west-03", now=now)
        for doc in (listed, shown):
            assert (doc["schedulable"], doc["cordonReason"]) == (False, "bios"), doc
        assert "cordoned" in run("node", "list", now=now, json=False)[1].split("west-03")[1]
    assert _west_03(run.ok("node", "list", now=at(3 * HOUR)))["schedulable"] is True
    # only what is shown: the stored flag, and so the inventory, are unchanged
    assert run.ok("inventory", "export", now=at(2 * HOUR)) == export
    assert run.ok("pool", "show", "west", now=at(2 * HOUR))["allocatable"] == 48


def test_a_cordon_keeps_its_own_reason_through_a_window(run: Cli) -> None:
    run.ok("node", "cordon", "west-03", "--from", "-1h", "--until", "+1h", "--reason", "bios")
    run.ok("node", "cordon", "west-03", "--reason", "rma")
    assert run.ok("node", "show", "west-03")["cordonReason"] == "rma"


def test_overlapping_windows_name_one_reason_in_list_and_show(run: Cli) -> None:
    """Of overlapping windows, the one ending last (a review: list and show named two)."""
    run.ok("node", "cordon", "west-05", "--from", "+1h", "--until", "+6h", "--reason", "long")
    run.ok("node", "cordon", "west-05", "--from", "+2h", "--until", "+3h", "--reason", "short")
    now = at(2 * HOUR + HOUR // 2)
    listed = next(n for n in run.ok("node", "list", now=now) if n["name"] == "west-05")
    assert listed["cordonReason"] == run.ok("node", "show", "west-05", now=now)["cordonReason"]
    assert listed["cordonReason"] == "long"
