"""Reserving through the CLI: reserve, preview, get, list, cancel, extend, release."""

from __future__ import annotations

import random
from typing import Any

from conftest import DAY, HOUR, MIN, NOW_MS, SEC, Cli, at

FULL = "no node fits (1 nodes): 1 × fits: 0 of 8 gpu free"


def reserve(cli: Cli, key: str, *flags: object, tenant: str = "acme", **kw: Any) -> Any:
    return cli.ok("reserve", "--tenant", tenant, "--key", key, *flags, **kw)


def atoms(rsv: dict[str, Any]) -> set[tuple[str, int]]:
    return {(a["nodeId"], i) for a in rsv["allocations"] for i in a["atoms"]}


# ---------------------------------------------------------------- placing


def test_reserve_now_is_placed_from_now(run: Cli) -> None:
    rsv = reserve(run, "nb", "--gpus", "4", "--for", "2h")
    assert rsv["id"].startswith("rsv_")
    assert rsv["state"] == "placed"
    assert rsv["tenantId"] == "acme"
    assert rsv["poolId"] == run.ok("pool", "show", "west")["id"]
    assert rsv["start"] is None
    assert rsv["during"] == {"start": NOW_MS, "end": NOW_MS + 2 * HOUR}
    assert rsv["durationMs"] == 2 * HOUR
    assert rsv["devices"] == [{"class": "gpu", "count": 4, "model": None, "topology": None}]
    assert rsv["gang"] is None and rsv["spot"] is False and rsv["binding"] == "device"
    assert len(rsv["allocations"]) == 1
    alloc = rsv["allocations"][0]
    assert alloc["id"].startswith("alc_") and alloc["bound"] is False
    assert len(alloc["atoms"]) == 4 == len(set(alloc["atoms"]))
    assert rsv["quotaCharge"] == 4
    assert rsv["idempotencyKey"] == "nb"
    assert rsv["releaseReason"] is None
    assert rsv["createdAt"] == NOW_MS
    assert rsv["nextAttemptAt"] is None
    assert rsv["conditions"] == []
    assert run.ok("get", rsv["id"]) == rsv
    types = [e["type"] for e in run.ok("events", "--reservation", rsv["id"])]
    assert types == ["reservation.created", "reservation.placed"]


def test_reservation_json_has_the_contract_keys_in_order(run: Cli) -> None:
    rsv = reserve(run, "k", "--gpus", "1", "--for", "1h")
    assert list(rsv) == [
        "id",
        "tenantId",
        "poolId",
        "state",
        "devices",
        "gang",
        "spot",
        "binding",
        "durationMs",
        "start",
        "during",
        "conditions",
        "allocations",
        "quotaCharge",
        "idempotencyKey",
        "releaseReason",
        "createdAt",
        "nextAttemptAt",
        "name",
        "labels",
        "seriesId",  # null unless one of a series: every document has the same keys
    ]
    assert rsv["seriesId"] is None


def test_calendar_reservation_is_placed_for_its_window(run: Cli) -> None:
    rsv = reserve(run, "cal", "--gpus", "8", "--for", "12h", "--start", "+1d")
    assert rsv["state"] == "placed"
    assert rsv["start"] == NOW_MS + DAY
    assert rsv["during"] == {"start": NOW_MS + DAY, "end": NOW_MS + DAY + 12 * HOUR}
    assert len(atoms(rsv)) == 8
    iso = reserve(run, "cal2", "--gpus", "8", "--for", "1d12h", "--start", "2026-10-01T00:00:00Z")
    start = NOW_MS + 2 * DAY + 16 * HOUR  # 2026-10-01T00:00Z
    assert iso["during"] == {"start": start, "end": start + DAY + 12 * HOUR}


def test_calendar_windows_that_do_not_overlap_reuse_the_same_gpus(solo: Cli) -> None:
    first = reserve(solo, "a", "--gpus", "8", "--for", "2h", "--start", "+1d")
    second = reserve(solo, "b", "--gpus", "8", "--for", "2h", "--start", "+1d2h")
    earlier = reserve(solo, "c", "--gpus", "8", "--for", "1d", "--start", "now")
    for rsv in (first, second, earlier):
        assert rsv["state"] == "placed", rsv
        assert atoms(rsv) == {("n1", i) for i in range(8)}
    assert earlier["during"] == {"start": NOW_MS, "end": NOW_MS + DAY}
    assert second["during"]["start"] == first["during"]["end"]


def test_an_overlapping_window_is_pending_with_the_reason(solo: Cli) -> None:
    reserve(solo, "a", "--gpus", "8", "--for", "2h", "--start", "+1d")
    rsv = reserve(solo, "b", "--gpus", "8", "--for", "2h", "--start", "+1d1h")
    assert rsv["state"] == "pending"
    assert rsv["during"] is None
    assert rsv["allocations"] == []
    assert rsv["start"] == NOW_MS + DAY + HOUR
    assert rsv["conditions"] == [{"type": "Unschedulable", "reason": "NoCapacity", "message": FULL}]
    assert rsv["nextAttemptAt"] == NOW_MS + 30 * SEC
    assert rsv["quotaCharge"] == 8  # a pending reservation holds its quota
    types = [e["type"] for e in solo.ok("events", "--reservation", rsv["id"])]
    assert types == ["reservation.created", "reservation.pending"]
    # a smaller request in the same window: the reason counts free GPUs against what it asks
    half = reserve(solo, "c", "--gpus", "4", "--for", "30m", "--start", "+1d1h30m")
    assert half["state"] == "pending"
    assert half["conditions"][0]["message"] == "no node fits (1 nodes): 1 × fits: 0 of 4 gpu free"


def test_pending_is_exit_0_and_human_output_says_so(solo: Cli) -> None:
    reserve(solo, "a", "--gpus", "8", "--for", "2h")
    code, text, err = solo(
        "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", "b", json=False
    )
    assert code == 0, err
    assert "pending" in text and "0 of 1 gpu free" in text


# ---------------------------------------------------------------- idempotency


def test_same_key_same_params_returns_the_same_reservation(run: Cli) -> None:
    first = reserve(run, "job-1", "--gpus", "4", "--for", "2h", "--start", "+1d")
    events = run.ok("events")
    # the same absolute start given another way, an hour later
    again = reserve(
        run, "job-1", "--gpus", "4", "--for", "120m", "--start", str(NOW_MS + DAY), now=at(HOUR)
    )
    assert again == first
    assert len(run.ok("list")) == 1
    assert run.ok("events") == events


def test_start_now_is_the_same_request_as_no_start(run: Cli) -> None:
    """Help says --start defaults to now: either way round, a retry is the same request."""
    first = reserve(run, "a", "--gpus", "1", "--for", "1h")
    assert reserve(run, "a", "--gpus", "1", "--for", "1h", "--start", "now") == first
    second = reserve(run, "b", "--gpus", "1", "--for", "1h", "--start", " NOW ")
    assert reserve(run, "b", "--gpus", "1", "--for", "1h") == second
    assert len(run.ok("list")) == 2


def test_a_relative_start_in_the_past_books_from_now(run: Cli) -> None:
    """README: a --start in the past books from now. `-1h` was refused as out of range, its
    form having been checked against the epoch before the ledger was opened."""
    rsv = reserve(run, "past", "--gpus", "1", "--for", "1h", "--start", "-1h")
    assert rsv["state"] == "placed" and rsv["during"]["start"] == NOW_MS


def test_same_key_other_params_is_a_conflict(run: Cli) -> None:
    first = reserve(run, "job-1", "--gpus", "4", "--for", "2h")
    before = run.ok("list")
    for flags in (
        ("--gpus", "5", "--for", "2h"),
        ("--gpus", "4", "--for", "3h"),
        ("--gpus", "4", "--for", "2h", "--spot"),
        ("--gpus", "4", "--for", "2h", "--start", "+1d"),
        ("--gpus", "4", "--for", "2h", "--model", "h100"),
    ):
        err = run.fails(4, "reserve", "--tenant", "acme", "--key", "job-1", *flags)
        assert err["code"] == "CONFLICT"
        assert first["id"] in err["message"]
    assert run.ok("list") == before


def test_the_same_key_in_another_tenant_is_another_reservation(run: Cli) -> None:
    a = reserve(run, "shared", "--gpus", "4", "--for", "2h")
    b = reserve(run, "shared", "--gpus", "4", "--for", "2h", tenant="globex")
    assert a["id"] != b["id"]
    assert b["tenantId"] == "globex"


# ---------------------------------------------------------------- quota


def test_quota_exceeded_is_exit_5_and_creates_nothing(run: Cli) -> None:
    reserve(run, "a", "--gpus", "8", "--gang", "3", "--for", "2h", tenant="globex")  # 24 of 32
    before = (run.ok("list"), run.ok("events"), run.ok("pool", "show", "west"))
    err = run.fails(
        5,
        "reserve",
        "--tenant",
        "globex",
        "--gpus",
        "8",
        "--gang",
        "2",
        "--for",
        "1h",
        "--key",
        "b",
    )
    assert err["code"] == "QUOTA_EXCEEDED"
    assert "globex" in err["message"] and "32" in err["message"]
    assert (run.ok("list"), run.ok("events"), run.ok("pool", "show", "west")) == before
    # a calendar reservation counts against the quota from admission
    reserve(run, "c", "--gpus", "8", "--for", "1h", "--start", "+2d", tenant="globex")
    run.fails(5, "reserve", "--tenant", "globex", "--gpus", "1", "--for", "1h", "--key", "d")
    # a pool cap is checked too
    run.ok("quota", "set", "--tenant", "acme", "--pool", "west", "--gpus", "2")
    assert (
        run.fails(5, "reserve", "--tenant", "acme", "--gpus", "3", "--for", "1h", "--key", "e")[
            "code"
        ]
        == "QUOTA_EXCEEDED"
    )
    code, _, stderr = run(
        "reserve", "--tenant", "acme", "--gpus", "3", "--for", "1h", "--key", "e", json=False
    )
    assert code == 5 and stderr.startswith("error: QUOTA_EXCEEDED: ")


def test_pending_reservations_hold_quota(solo: Cli) -> None:
    solo.ok("quota", "set", "--tenant", "acme", "--gpus", "12")
    reserve(solo, "a", "--gpus", "8", "--for", "2h")
    pending = reserve(solo, "b", "--gpus", "4", "--for", "2h", tenant="globex")
    assert pending["state"] == "pending"
    reserve(solo, "c", "--gpus", "4", "--for", "2h")
    assert solo.ok("quota", "show", "--tenant", "acme")["quotas"][0]["held"] == 12
    solo.fails(5, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "2h", "--key", "d")


# ---------------------------------------------------------------- preview


def test_preview_answers_without_booking(run: Cli) -> None:
    before = (run.ok("list"), run.ok("events"), run.ok("pool", "show", "west"))
    p = run.ok("preview", "--tenant", "acme", "--gpus", "4", "--for", "2h")
    assert p["fits"] is True
    assert p["reason"] is None and p["preemptible"] is None
    assert 1 <= len(p["candidates"]) <= 3  # placement.topN
    for c in p["candidates"]:
        assert set(c) == {"node", "score", "atoms"}
        assert c["node"].startswith("west-") and len(c["atoms"]) == 4
    scores = [c["score"] for c in p["candidates"]]
    assert scores == sorted(scores, reverse=True)
    gang = run.ok(
        "preview",
        "--tenant",
        "acme",
        "--gpus",
        "8",
        "--gang",
        "3",
        "--topology-key",
        "fabric.domain",
        "--for",
        "2h",
    )
    assert gang["fits"] is True and len(gang["candidates"]) == 3
    assert (run.ok("list"), run.ok("events"), run.ok("pool", "show", "west")) == before


def test_preview_says_why_it_does_not_fit(solo: Cli) -> None:
    reserve(solo, "a", "--gpus", "8", "--for", "2h", "--start", "+1d")
    p = solo.ok("preview", "--tenant", "acme", "--gpus", "8", "--for", "2h", "--start", "+1d1h")
    assert p["fits"] is False
    assert p["candidates"] == []
    assert p["reason"] == FULL
    assert p["preemptible"] is None
    ok = solo.ok("preview", "--tenant", "acme", "--gpus", "8", "--for", "2h", "--start", "+1d2h")
    assert ok["fits"] is True and ok["candidates"][0]["node"] == "n1"
    model = solo.fails(
        2, "preview", "--tenant", "acme", "--gpus", "1", "--model", "a100", "--for", "1h"
    )
    assert model["message"] == "--gpus 1 per node: the largest node of pool solo has 0 a100 GPUs"
    assert len(solo.ok("list")) == 1


def test_preview_respects_quota_and_unknown_names(run: Cli) -> None:
    assert (
        run.fails(5, "preview", "--tenant", "globex", "--gpus", "8", "--gang", "5", "--for", "1h")[
            "code"
        ]
        == "QUOTA_EXCEEDED"
    )
    assert run.fails(3, "preview", "--tenant", "ghost", "--gpus", "1", "--for", "1h")["code"] == (
        "NOT_FOUND"
    )


# ---------------------------------------------------------------- get, list


def test_get_and_list_with_filters(run: Cli) -> None:
    run.ok("pool", "create", "east")
    run.ok("node", "add", "east-01", "--pool", "east", "--gpus", "4", "--model", "a100")
    a = reserve(run, "a", "--gpus", "8", "--for", "1h", "--pool", "west")
    b = reserve(
        run, "b", "--gpus", "8", "--for", "1h", "--start", "+1d", "--pool", "west", tenant="globex"
    )
    c = reserve(run, "c", "--gpus", "4", "--for", "1h", "--pool", "east")
    d = reserve(run, "d", "--gpus", "4", "--for", "1h", "--pool", "east")  # pending: c holds all 4
    assert d["state"] == "pending"

    def ids(*flags: str) -> list[str]:
        return [r["id"] for r in run.ok("list", *flags)]

    assert ids() == [a["id"], b["id"], c["id"], d["id"]]  # oldest first
    assert ids("--tenant", "globex") == [b["id"]]
    assert ids("--tenant", "acme") == [a["id"], c["id"], d["id"]]
    assert ids("--pool", "east") == [c["id"], d["id"]]
    assert ids("--pool", c["poolId"]) == [c["id"], d["id"]]
    assert ids("--state", "pending") == [d["id"]]
    assert ids("--state", "pending", "--state", "placed") == [a["id"], b["id"], c["id"], d["id"]]
    assert ids("--tenant", "acme", "--pool", "west", "--state", "placed") == [a["id"]]
    run.ok("cancel", d["id"])
    assert ids("--state", "released") == [d["id"]]
    assert ids("--state", "pending") == []
    assert run.ok("get", b["id"])["start"] == NOW_MS + DAY
    assert run.fails(2, "list", "--state", "sleeping")["code"] == "INVALID_INPUT"
    assert run.fails(3, "list", "--tenant", "ghost")["code"] == "NOT_FOUND"
    assert run.fails(3, "list", "--pool", "nowhere")["code"] == "NOT_FOUND"
    code, text, _ = run("list", json=False)
    assert code == 0 and a["id"] in text and "4 reservations" in text


# ---------------------------------------------------------------- cancel


def test_cancel_refunds_quota_and_frees_the_gpus(solo: Cli) -> None:
    solo.ok("quota", "set", "--tenant", "acme", "--gpus", "8")
    first = reserve(solo, "a", "--gpus", "8", "--for", "2h", "--start", "+1d")
    assert solo.ok("quota", "show", "--tenant", "acme")["quotas"][0]["held"] == 8
    blocked = reserve(solo, "b", "--gpus", "8", "--for", "2h", "--start", "+1d", tenant="globex")
    assert blocked["state"] == "pending"
    done = solo.ok("cancel", first["id"])
    assert done["state"] == "released"
    assert done["releaseReason"] == "cancelled"
    assert solo.ok("quota", "show", "--tenant", "acme")["quotas"][0]["held"] == 0
    assert solo.ok("pool", "show", "solo")["reserved"] == 0
    again = reserve(solo, "c", "--gpus", "8", "--for", "2h", "--start", "+1d")
    assert again["state"] == "placed"
    assert atoms(again) == atoms(first)
    events = solo.ok("events", "--reservation", first["id"])
    assert events[-1]["type"] == "reservation.released"
    assert events[-1]["data"]["reason"] == "cancelled"
    # cancelling twice is a conflict and changes nothing
    assert solo.fails(4, "cancel", first["id"])["code"] == "CONFLICT"
    assert solo.ok("get", first["id"]) == done


def test_cancel_a_pending_reservation_refunds_it(solo: Cli) -> None:
    reserve(solo, "a", "--gpus", "8", "--for", "2h")
    pending = reserve(solo, "b", "--gpus", "8", "--for", "2h")
    assert solo.ok("quota", "set", "--tenant", "acme", "--gpus", "100")["quotas"][0]["held"] == 16
    done = solo.ok("cancel", pending["id"])
    assert (done["state"], done["releaseReason"], done["nextAttemptAt"]) == (
        "released",
        "cancelled",
        None,
    )
    assert solo.ok("quota", "show", "--tenant", "acme")["quotas"][0]["held"] == 8


def test_cancel_an_active_reservation_is_a_conflict(solo: Cli) -> None:
    rsv = reserve(solo, "a", "--gpus", "8", "--for", "2h")
    solo.ok("tick")
    err = solo.fails(4, "cancel", rsv["id"])
    assert "release" in err["message"]
    assert solo.ok("get", rsv["id"])["state"] == "active"


# ---------------------------------------------------------------- extend, release


def test_extend_moves_the_end(solo: Cli) -> None:
    rsv = reserve(solo, "a", "--gpus", "4", "--for", "2h", "--start", "+1d")
    longer = solo.ok("extend", rsv["id"], "--by", "90m")
    assert longer["during"] == {"start": NOW_MS + DAY, "end": NOW_MS + DAY + 3 * HOUR + 30 * MIN}
    assert longer["state"] == "placed"
    assert solo.ok("get", rsv["id"]) == longer
    last = solo.ok("events", "--reservation", rsv["id"])[-1]
    assert last["type"] == "reservation.extended"
    assert last["data"] == {
        "from": NOW_MS + DAY + 2 * HOUR,
        "to": NOW_MS + DAY + 3 * HOUR + 30 * MIN,
    }
    # the extra time is really booked: a full-node request in it no longer fits
    p = solo.ok("preview", "--tenant", "globex", "--gpus", "8", "--for", "1h", "--start", "+1d3h")
    assert p["fits"] is False


def test_extend_into_another_booking_is_a_conflict_and_changes_nothing(solo: Cli) -> None:
    a = reserve(solo, "a", "--gpus", "8", "--for", "2h", "--start", "+1d")
    b = reserve(solo, "b", "--gpus", "8", "--for", "2h", "--start", "+1d2h", tenant="globex")
    events = solo.ok("events")
    err = solo.fails(4, "extend", a["id"], "--by", "1h")
    assert err["code"] == "CONFLICT"
    assert "nothing was changed" in err["message"]
    assert solo.ok("get", a["id"]) == a
    assert solo.ok("get", b["id"]) == b
    assert solo.ok("events") == events
    # after the other one is cancelled, the same extend works
    solo.ok("cancel", b["id"])
    assert solo.ok("extend", a["id"], "--by", "1h")["during"]["end"] == NOW_MS + DAY + 3 * HOUR


def test_extend_refuses_bad_durations_and_states(solo: Cli) -> None:
    rsv = reserve(solo, "a", "--gpus", "8", "--for", "2h")
    assert solo.fails(2, "extend", rsv["id"], "--by", "soon")["code"] == "INVALID_INPUT"
    assert solo.fails(2, "extend", rsv["id"], "--by", "0s")["code"] == "INVALID_INPUT"
    pending = reserve(solo, "b", "--gpus", "8", "--for", "2h")
    assert solo.fails(4, "extend", pending["id"], "--by", "1h")["code"] == "CONFLICT"
    assert solo.ok("get", rsv["id"]) == rsv


def test_release_gives_the_gpus_back_now(solo: Cli) -> None:
    solo.ok("quota", "set", "--tenant", "acme", "--gpus", "8")
    rsv = reserve(solo, "a", "--gpus", "8", "--for", "2h")
    solo.ok("tick")
    done = solo.ok("release", rsv["id"], now=at(30 * MIN))
    assert done["state"] == "released"
    assert done["releaseReason"] == "released"
    assert done["during"] == {"start": NOW_MS, "end": NOW_MS + 30 * MIN}
    assert solo.ok("quota", "show", "--tenant", "acme")["quotas"][0]["held"] == 0
    p = solo.ok("pool", "show", "solo", now=at(30 * MIN))
    assert (p["inUse"], p["free"]) == (0, 8)
    after = reserve(solo, "b", "--gpus", "8", "--for", "1h", now=at(30 * MIN), tenant="globex")
    assert after["state"] == "placed"
    assert solo.fails(4, "release", rsv["id"], now=at(31 * MIN))["code"] == "CONFLICT"


def test_release_a_pending_reservation_is_a_conflict(solo: Cli) -> None:
    reserve(solo, "a", "--gpus", "8", "--for", "2h")
    pending = reserve(solo, "b", "--gpus", "8", "--for", "2h")
    err = solo.fails(4, "release", pending["id"])
    assert "cancel" in err["message"]
    assert solo.ok("get", pending["id"])["state"] == "pending"


# ---------------------------------------------------------------- shapes and models


def test_topology_nvlink_all_stays_in_one_nvlink_group(solo: Cli) -> None:
    groups = ({0, 1, 2, 3}, {4, 5, 6, 7})
    small = reserve(solo, "a", "--gpus", "2", "--for", "2h")
    assert any(set(small["allocations"][0]["atoms"]) <= g for g in groups)
    three = reserve(solo, "b", "--gpus", "3", "--topology", "nvlink-all", "--for", "2h")
    assert three["state"] == "placed"
    assert three["devices"][0]["topology"] == "nvlink-all"
    got = set(three["allocations"][0]["atoms"])
    assert any(got <= g for g in groups), got
    assert not got & set(small["allocations"][0]["atoms"])
    # 3 GPUs are left, but at most 2 of them share an NVLink group
    split = reserve(solo, "c", "--gpus", "3", "--topology", "nvlink-all", "--for", "2h")
    assert split["state"] == "pending"
    assert split["conditions"][0]["message"] == (
        "no node fits (1 nodes): 1 × nvlink-all: at most 2 of 3 gpu free in one NVLink group"
    )
    plain = reserve(solo, "d", "--gpus", "3", "--for", "2h")
    assert plain["state"] == "placed"
    assert (
        solo.fails(
            2,
            "reserve",
            "--tenant",
            "acme",
            "--gpus",
            "2",
            "--topology",
            "ring",
            "--for",
            "1h",
            "--key",
            "e",
        )["code"]
        == "INVALID_INPUT"
    )


def test_a_model_the_pool_lacks_is_refused(run: Cli) -> None:
    """No node of the pool has an a100: no wait could place it (issue 7)."""
    error = run.fails(
        2,
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "2",
        "--model",
        "a100",
        "--for",
        "1h",
        "--key",
        "a",
    )
    assert error["message"] == "--gpus 2 per node: the largest node of pool west has 0 a100 GPUs"
    assert run.ok("list") == []
    ok = reserve(run, "b", "--gpus", "2", "--model", "a100,h100", "--for", "1h")
    assert ok["state"] == "placed"
    assert ok["devices"][0]["model"] == ["a100", "h100"]


def test_a_gang_books_whole_nodes_in_one_domain(run: Cli) -> None:
    rsv = reserve(
        run, "g", "--gpus", "8", "--gang", "4", "--topology-key", "fabric.domain", "--for", "3d"
    )
    assert rsv["state"] == "placed"
    assert rsv["gang"] == {"size": 4, "topologyKey": "fabric.domain"}
    assert rsv["quotaCharge"] == 32
    nodes = sorted(a["nodeId"] for a in rsv["allocations"])
    assert nodes == ["west-01", "west-02", "west-03", "west-04"]  # the only 4-node domain
    assert len(atoms(rsv)) == 32
    big = reserve(
        run,
        "h",
        "--gpus",
        "8",
        "--gang",
        "4",
        "--topology-key",
        "fabric.domain",
        "--for",
        "1h",
        tenant="globex",
    )
    assert big["state"] == "pending"
    assert big["conditions"][0]["message"] == (
        "no gang of 4 nodes fits in one fabric.domain (at most 3 nodes fit together)"
    )


# ---------------------------------------------------------------- unknown names, bad flags


def test_unknown_tenant_pool_or_reservation_is_not_found(run: Cli) -> None:
    cases = [
        ("reserve", "--tenant", "ghost", "--gpus", "1", "--for", "1h", "--key", "k"),
        ("reserve", "--tenant", "acme", "--pool", "nowhere", "--gpus", "1", "--for", "1h"),
        ("preview", "--tenant", "acme", "--pool", "nowhere", "--gpus", "1", "--for", "1h"),
        ("get", "rsv_nope"),
        ("cancel", "rsv_nope"),
        ("release", "rsv_nope"),
        ("extend", "rsv_nope", "--by", "1h"),
        ("events", "--reservation", "rsv_nope"),
    ]
    for args in cases:
        err = run.fails(3, *args)
        assert err["code"] == "NOT_FOUND", args
    assert run.ok("list") == []


def test_bad_reserve_flags_are_invalid_and_create_nothing(run: Cli) -> None:
    base = ("reserve", "--tenant", "acme", "--key", "k")
    cases = [
        ("--gpus", "0", "--for", "1h"),
        ("--gpus", "65", "--for", "1h"),
        ("--gpus", "1", "--for", "soon"),
        ("--gpus", "1", "--for", "0s"),
        ("--gpus", "1", "--for", "1h", "--start", "tomorrow"),
        ("--gpus", "1", "--for", "1h", "--start", "2026-02-30T00:00:00Z"),
        ("--gpus", "8", "--gang", "1", "--for", "1h"),
        ("--gpus", "8", "--gang", "65", "--for", "1h"),
        ("--gpus", "1", "--topology-key", "rack", "--for", "1h"),
        ("--gpus", "1", "--spot", "--node-lease", "--for", "1h"),
        ("--for", "1h"),
    ]
    history = run.ok("events")
    for flags in cases:
        err = run.fails(2, *base, *flags)
        assert err["code"] == "INVALID_INPUT", flags
    assert run.ok("list") == []
    assert run.ok("events") == history


def test_a_retry_of_a_relative_start_later_is_the_same_request(run: Any) -> None:
    """`--start +2h --key k` retried a minute later names the same request: same reservation."""
    code, first, _ = run(
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "2",
        "--for",
        "1h",
        "--start",
        "+2h",
        "--key",
        "retry-me",
    )
    assert code == 0
    code, again, _ = run(
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "2",
        "--for",
        "1h",
        "--start",
        "+2h",
        "--key",
        "retry-me",
        now="2026-09-28T08:01:00Z",
    )
    assert code == 0 and again["id"] == first["id"]
    code, _, err = run(
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "2",
        "--for",
        "1h",
        "--start",
        "+3h",
        "--key",
        "retry-me",
        now="2026-09-28T08:01:00Z",
    )
    assert code == 4 and "CONFLICT" in err


def test_a_key_longer_than_its_index_holds_is_bad_input_on_every_backend(run: Cli) -> None:
    """A key is indexed with its tenant, and PostgreSQL refuses an index entry over 2,704 bytes
    (after compression, so the characters here are random, not one repeated): 950 such CJK
    characters (2,850 bytes) were booked on SQLite and UNAVAILABLE (7) on PostgreSQL, which a
    script retries for ever, and such a ledger could not migrate there. Both refuse it now,
    writing nothing; 666 of them (1,998 bytes) and 1,000 ASCII characters are keys."""
    draw = random.Random(9)

    def cjk(n: int) -> str:
        return "".join(chr(draw.randrange(0x4E00, 0x9FFF)) for _ in range(n))

    args = ("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key")
    before = run.ok("list")
    error = run.fails(2, *args, cjk(950))
    assert "--key must be at most 2000 bytes in UTF-8" in error["message"]
    assert "got 2850" in error["message"] and run.ok("list") == before
    for key in (cjk(666), "k" * 1000):
        assert run.ok(*args, key)["idempotencyKey"] == key
