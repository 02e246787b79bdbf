"""Principals' policies (PRODUCT.md §6) through the CLI, on the demo database
(pool west: 7 nodes × 8 h100; tenants acme and globex)."""

from __future__ import annotations

import pytest
from conftest import ME, Cli

FORBIDDEN = 6


def reserve(run: Cli, who: str | None, *flags: str, key: str = "k") -> tuple[int, object, str]:
    as_ = ["--as", who] if who is not None else []
    return run(*as_, "reserve", "--tenant", "acme", "--for", "1h", "--key", key, *flags)


def refused(run: Cli, who: str, *flags: str, tenant: str = "acme") -> str:
    err = run.fails(
        FORBIDDEN, "--as", who, "reserve", "--tenant", tenant, "--for", "1h", "--key", "x", *flags
    )
    assert err["code"] == "FORBIDDEN"
    return err["message"]


def test_max_gpus_refuses_a_gang_of_two_8_gpu_nodes(run: Cli) -> None:
    doc = run.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--max-gpus", "8")
    assert doc == {
        "tenantId": "acme",
        "principal": "bob",
        "maxGpus": 8,
        "spotOnly": False,
        "deny": False,
    }
    message = refused(run, "bob", "--gpus", "8", "--gang", "2")
    assert "max-gpus 8" in message and "16" in message
    assert run.ok("list", "--tenant", "acme") == []  # nothing booked, nothing recorded
    # preview judges the same draft
    err = run.fails(
        FORBIDDEN, "--as", "bob", "preview", "--tenant", "acme", "--gpus", "8", "--gang", "2",
        "--for", "1h",
    )  # fmt: skip
    assert "max-gpus 8" in err["message"]
    # one 8-GPU node is within the rule
    code, out, err_text = reserve(run, "bob", "--gpus", "8")
    assert code == 0, err_text
    assert isinstance(out, dict) and out["state"] == "placed"
    message = refused(run, "bob", "--gpus", "4", "--gang", "3")
    assert "max-gpus 8" in message


def test_spot_only_allows_spot_and_refuses_regular(run: Cli) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "ci-bot", "--spot-only")
    code, out, err = reserve(run, "ci-bot", "--gpus", "2", "--spot")
    assert code == 0, err
    assert isinstance(out, dict) and out["spot"] is True
    message = refused(run, "ci-bot", "--gpus", "2")
    assert "spot-only" in message and "--spot" in message


def test_extend_is_judged_as_update_is(run: Cli) -> None:
    """A spot-only principal may not lengthen a regular reservation of its tenant, with extend
    or with update: more time on regular GPUs is what its own request would be refused."""
    run.ok("policy", "set", "--tenant", "acme", "--principal", "ci-bot", "--spot-only")
    run.ok("policy", "set", "--tenant", "acme", "--principal", ME, "--max-gpus", "64")
    rsv = run.ok("reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--start", "+3h")
    for change in (["extend", rsv["id"], "--by", "2h"], ["update", rsv["id"], "--for", "3h"]):
        err = run.fails(FORBIDDEN, "--as", "ci-bot", *change)
        assert "spot-only" in err["message"], err
    assert run.ok("get", rsv["id"])["durationMs"] == 3_600_000  # nothing changed
    spot = run.ok(
        "--as", "ci-bot", "reserve", "--tenant", "acme", "--gpus", "2", "--for", "1h", "--spot"
    )
    assert run.ok("--as", "ci-bot", "extend", spot["id"], "--by", "1h")["durationMs"] == 7_200_000


def test_deny_refuses_everything(run: Cli) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "mallory", "--deny")
    assert "deny" in refused(run, "mallory", "--gpus", "1")
    assert "deny" in refused(run, "mallory", "--gpus", "1", "--spot")


def test_a_principal_without_a_policy_in_a_tenant_with_policies_is_refused(run: Cli) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--max-gpus", "64")
    message = refused(run, "eve", "--gpus", "1")
    assert "eve" in message and "no policy" in message
    # the same principal is free in a tenant without any policy
    code, _, err = run(
        "--as", "eve", "reserve", "--tenant", "globex", "--gpus", "1", "--for", "1h", "--key", "e"
    )
    assert code == 0, err
    # the environment variable names the principal just as --as does
    got, _, err = run(
        "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "env",
        env={"BETTER_COMPUTE_PRINCIPAL": "eve"},
    )  # fmt: skip
    assert got == FORBIDDEN, err


def test_admin_is_never_refused(run: Cli) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "admin", "--deny")
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--max-gpus", "1")
    code, _, err = reserve(run, "admin", "--gpus", "8", "--gang", "2", key="a1")
    assert code == 0, err
    code, _, err = reserve(run, None, "--gpus", "8", key="a2")  # no --as: admin
    assert code == 0, err


def test_policy_set_replaces_and_list_and_delete(run: Cli) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--deny")
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--max-gpus", "4")
    run.ok("policy", "set", "--tenant", "globex", "--principal", "ann", "--spot-only")
    everything = run.ok("policy", "list")
    assert everything == [
        {"tenantId": "acme", "principal": "bob", "maxGpus": 4, "spotOnly": False, "deny": False},
        {
            "tenantId": "globex",
            "principal": "ann",
            "maxGpus": None,
            "spotOnly": True,
            "deny": False,
        },
    ]
    assert run.ok("policy", "list", "--tenant", "globex") == everything[1:]
    code, _, err = reserve(run, "bob", "--gpus", "4")  # no longer denied: replaced
    assert code == 0, err

    doc = run.ok("policy", "delete", "--tenant", "acme", "--principal", "bob")
    assert doc == {"tenantId": "acme", "principal": "bob", "deleted": True}
    assert run.ok("policy", "list", "--tenant", "acme") == []
    # acme has no policies left: anyone may reserve there again
    code, _, err = reserve(run, "bob", "--gpus", "8", "--gang", "2", key="after")
    assert code == 0, err

    err_doc = run.fails(3, "policy", "delete", "--tenant", "acme", "--principal", "bob")
    assert err_doc["code"] == "NOT_FOUND" and "bob" in err_doc["message"]
    run.fails(3, "policy", "delete", "--tenant", "nobody", "--principal", "bob")
    run.fails(3, "policy", "list", "--tenant", "nobody")


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--tenant", "nobody", "--principal", "bob"], 3),
        (["--tenant", "acme", "--principal", "bob", "--max-gpus", "-1"], 2),
        (["--tenant", "acme", "--principal", " "], 2),
        (["--tenant", "acme"], 2),
        (["--principal", "bob"], 2),
    ],
)
def test_policy_set_errors(run: Cli, args: list[str], code: int) -> None:
    got, out, _ = run("policy", "set", *args)
    assert got == code and out == ""
    assert run.ok("policy", "list") == []


def test_policy_changes_are_events_with_who(run: Cli) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob", "--max-gpus", "8")
    run.fails(6, "--as", "ops", "policy", "delete", "--tenant", "acme", "--principal", "bob")
    run.ok("policy", "delete", "--tenant", "acme", "--principal", "bob")
    events = run.ok("events", "--tenant", "acme")
    types = [e["type"] for e in events]
    assert types[-2:] == ["policy.set", "policy.deleted"]
    assert events[-2]["data"]["principal"] == "bob" and events[-2]["data"]["maxGpus"] == 8
    assert events[-2]["data"]["by"] == ME and events[-1]["data"]["by"] == ME


def test_a_key_another_principal_used_is_judged_by_the_callers_own_policy(run: Cli) -> None:
    """A replayed key returns the reservation only to a principal whose own policy admits the
    request (a hostile review: a spot-only principal was told its regular request was booked);
    a retry of one's own request still returns it after a limit is lowered."""
    run.ok("policy", "set", "--tenant", "acme", "--principal", "ci-bot", "--spot-only")
    run.ok("policy", "set", "--tenant", "acme", "--principal", "zed", "--max-gpus", "8")
    code, admins, err = reserve(run, None, "--gpus", "2", key="nightly")
    assert code == 0, err
    message = refused_key(run, "ci-bot", "nightly", "--gpus", "2")
    assert "spot-only" in message
    code, mine, err = reserve(run, "zed", "--gpus", "6", key="zk")
    assert code == 0, err
    run.ok("policy", "set", "--tenant", "acme", "--principal", "zed", "--max-gpus", "2")
    code, again, err = reserve(run, "zed", "--gpus", "6", key="zk")
    assert code == 0, err
    assert isinstance(mine, dict) and isinstance(again, dict) and again["id"] == mine["id"]
    run.ok("policy", "set", "--tenant", "acme", "--principal", "ci-bot", "--max-gpus", "8")
    code, same, err = reserve(run, "ci-bot", "--gpus", "2", key="nightly")
    assert code == 0, err  # now its policy admits the request: the reservation, as it is
    assert isinstance(admins, dict) and isinstance(same, dict) and same["id"] == admins["id"]
    ids = sorted(r["id"] for r in run.ok("list", "--tenant", "acme"))
    assert ids == sorted([admins["id"], mine["id"]])  # nothing new was booked


def refused_key(run: Cli, who: str, key: str, *flags: str) -> str:
    err = run.fails(
        FORBIDDEN, "--as", who, "reserve", "--tenant", "acme", "--for", "1h", "--key", key, *flags
    )
    assert err["code"] == "FORBIDDEN"
    return err["message"]
