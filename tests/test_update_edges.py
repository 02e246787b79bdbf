"""`update` at the edges a hostile review found (2026-12-03).

- Inside a pool's minimum lead time, a booking whose start does not change may still be made
  smaller, shorter or longer: its start was judged when it was admitted, as `extend` has it.
- A pending booking under a `--commit` policy moved to `--start now` becomes a request for now,
  which `--commit` does not make final.
- A pending reservation that has waited longer than pending.maxWaitMs is the tick's to time out:
  `update` refuses it (CONFLICT, nothing written) instead of placing it.
- A series key reused with other flags is named as typed, not as its first occurrence's KEY#1.
"""

from __future__ import annotations

import json
from typing import Any

from conftest import HOUR, MIN, Cli, at


def _reserve(cli: Cli, key: str, *args: str, tenant: str = "acme") -> Any:
    return cli.ok("reserve", "--tenant", tenant, "--key", key, *args)


def test_inside_the_minimum_lead_a_booking_keeping_its_start_may_change_its_size(
    solo: Cli,
) -> None:
    solo.ok("pool", "policy", "set", "solo", "--min-lead", "1h", "--max-duration", "1d")
    rsv = _reserve(solo, "a", "--gpus", "8", "--for", "2h", "--start", "+2h")
    inside = at(90 * MIN)  # 30 minutes before its start, inside the 1h lead
    smaller = solo.ok("update", rsv["id"], "--gpus", "4", now=inside)
    assert smaller["devices"][0]["count"] == 4 and smaller["during"] == rsv["during"]
    shorter = solo.ok("update", rsv["id"], "--for", "1h", now=inside)
    assert shorter["durationMs"] == HOUR
    longer = solo.ok("update", rsv["id"], "--for", "3h", now=inside)
    assert longer["durationMs"] == 3 * HOUR
    # The other limits still judge the new shape, and a new start meets the lead.
    error = solo.fails(2, "update", rsv["id"], "--for", "2d", now=inside)
    assert "at most 1d" in error["message"]
    error = solo.fails(2, "update", rsv["id"], "--start", "+40m", now=inside)  # 10 minutes later
    assert "minimum lead time 1h" in error["message"]
    assert solo.ok("get", rsv["id"], now=inside)["durationMs"] == 3 * HOUR


def test_a_committed_pending_booking_moved_to_now_is_not_final(solo: Cli) -> None:
    solo.ok("pool", "policy", "set", "solo", "--commit")
    full = _reserve(solo, "full", "--gpus", "8", "--for", "3h", tenant="globex")
    waiting = _reserve(solo, "p", "--gpus", "8", "--for", "1h", "--start", "+1h")
    assert waiting["state"] == "pending"
    now = solo.ok("update", waiting["id"], "--start", "now")
    assert now["start"] is None
    solo.ok("release", full["id"])
    solo.ok("tick", now=at(MIN))
    assert solo.ok("get", waiting["id"], now=at(MIN))["state"] == "active"
    released = solo.ok("release", waiting["id"], now=at(2 * MIN))
    assert released["state"] == "released" and released["releaseReason"] == "released"


def test_update_of_a_request_that_waited_too_long_is_refused_for_the_tick(solo: Cli) -> None:
    solo.ok("config", "set", "pending.maxWaitMs", "60000")
    full = _reserve(solo, "full", "--gpus", "8", "--for", "3h", tenant="globex")
    waiting = _reserve(solo, "p", "--gpus", "8", "--for", "1h")
    assert waiting["state"] == "pending"
    solo.ok("release", full["id"])
    error = solo.fails(4, "update", waiting["id"], "--for", "2h", now=at(2 * MIN))
    assert "pending.maxWaitMs" in error["message"] and "next tick" in error["message"]
    assert solo.ok("get", waiting["id"], now=at(2 * MIN)) == solo.ok("get", waiting["id"])
    solo.ok("tick", now=at(2 * MIN))
    timed_out = solo.ok("get", waiting["id"], now=at(2 * MIN))
    assert (timed_out["state"], timed_out["releaseReason"]) == ("released", "timeout")


def test_a_series_key_reused_with_other_flags_is_named_as_typed(solo: Cli) -> None:
    series = ("--gpus", "1", "--for", "1h", "--every", "1d")
    _reserve(solo, "nightly", *series, "--count", "2")
    error = solo.fails(
        4, "reserve", "--tenant", "acme", "--key", "nightly", *series, "--count", "3"
    )
    assert error["message"].startswith("key 'nightly' was used by the series ser_")
    assert "#" not in error["message"]


def test_an_import_logs_the_pools_tenants_and_caps_it_creates(solo: Cli, tmp_path: Any) -> None:
    """A new tenant's cap was set without `quota.set` (an existing tenant's change had one), and
    neither it nor a new pool had its `...created` event, as `tenant create` and `pool create` do.
    Nodes stay summed up in `inventory.imported`: an import may bring thousands."""
    since = solo.ok("events")[-1]["seq"]
    doc = {
        "pools": [
            {
                "name": "q",
                "nodes": [{"name": "m1", "gpus": {"count": 2, "model": "h100"}}],
            }
        ],
        "tenants": [{"id": "newco", "quota": {"gpus": 4}}, {"id": "acme", "quota": {"gpus": 5}}],
    }
    path = tmp_path / "inv.json"
    path.write_text(json.dumps(doc))
    solo.ok("inventory", "import", str(path))
    events = solo.ok("events", "--since", since)
    seen = [(e["type"], e["tenantId"], e["data"].get("gpus")) for e in events]
    assert seen == [  # tenants in id order
        ("pool.created", None, None),
        ("quota.set", "acme", 5),
        ("tenant.created", "newco", None),
        ("quota.set", "newco", 4),
        ("inventory.imported", None, None),
    ]
    solo.ok("inventory", "import", str(path))  # the same file again changes no cap: no quota.set
    again = solo.ok("events", "--since", events[-1]["seq"])
    assert [e["type"] for e in again] == ["inventory.imported"]
