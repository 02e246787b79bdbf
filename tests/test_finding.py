"""Finding a reservation (issue 12): `reserve --name --label`, `list`'s filters and sort."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import DAY, HOUR, NOW_MS, Cli, at
from test_trust import be


def reserve(cli: Cli, *flags: object, tenant: str = "acme") -> Any:
    return cli.ok("reserve", "--tenant", tenant, *flags)


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in rows]


def test_name_and_labels_are_stored_shown_and_in_events(run: Cli) -> None:
    rsv = reserve(
        run,
        "--gpus",
        "2",
        "--for",
        "1h",
        "--name",
        "pretrain run 7",
        "--label",
        "team=vision",
        "--label",
        "cost-centre=42",
    )
    assert rsv["name"] == "pretrain run 7"
    assert rsv["labels"] == {"cost-centre": "42", "team": "vision"}
    assert run.ok("get", rsv["id"]) == rsv
    created = run.ok("events", "--reservation", rsv["id"])[0]
    assert created["type"] == "reservation.created"
    assert created["data"]["name"] == "pretrain run 7"
    assert created["data"]["labels"] == {"cost-centre": "42", "team": "vision"}
    plain = reserve(run, "--gpus", "1", "--for", "1h")
    assert (plain["name"], plain["labels"]) == (None, {})
    _, text, _ = run("get", rsv["id"], json=False)
    assert "pretrain run 7" in text and "team=vision" in text
    _, table, _ = run("list", json=False)
    assert "name" in table and "pretrain" in table


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--name", ""), "--name must be"),
        (("--name", "a\nb"), "printable"),
        (("--name", "x" * 201), "1 to 200"),
        (("--label", "team"), "key=value"),
        (("--label", "=v"), "key=value"),
        (("--label", "k="), "key=value"),
        (("--label", "k=1", "--label", "k=2"), "twice"),
        (("--label", "k=" + "v" * 300), "characters"),
    ],
)
def test_bad_names_and_labels_are_refused_before_anything_is_booked(
    run: Cli, flags: tuple[str, ...], words: str
) -> None:
    err = run.fails(2, "reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", *flags)
    assert words in err["message"]
    assert run.ok("list") == []


def test_a_key_retry_compares_name_and_labels(run: Cli) -> None:
    first = reserve(run, "--gpus", "1", "--for", "1h", "--key", "k", "--name", "n")
    again = reserve(run, "--gpus", "1", "--for", "1h", "--key", "k", "--name", "n")
    assert again["id"] == first["id"]
    err = run.fails(
        4,
        "reserve",
        "--tenant",
        "acme",
        "--gpus",
        "1",
        "--for",
        "1h",
        "--key",
        "k",
        "--name",
        "other",
    )
    assert "other parameters" in err["message"]
    plain = reserve(run, "--gpus", "1", "--for", "1h", "--key", "p")
    assert reserve(run, "--gpus", "1", "--for", "1h", "--key", "p")["id"] == plain["id"]


def test_list_filters_by_name_and_labels(run: Cli) -> None:
    a = reserve(
        run, "--gpus", "1", "--for", "1h", "--name", "a", "--label", "team=x", "--label", "env=prod"
    )
    b = reserve(run, "--gpus", "1", "--for", "1h", "--name", "b", "--label", "team=x")
    c = reserve(run, "--gpus", "1", "--for", "1h", "--name", "a", "--label", "team=y")
    assert ids(run.ok("list", "--name", "a")) == [a["id"], c["id"]]
    assert ids(run.ok("list", "--label", "team=x")) == [a["id"], b["id"]]
    assert ids(run.ok("list", "--label", "team=x", "--label", "env=prod")) == [a["id"]]
    assert ids(run.ok("list", "--name", "a", "--label", "team=y")) == [c["id"]]
    assert run.ok("list", "--name", "A") == []  # exact, case and all
    assert run.ok("list", "--label", "team=z") == []
    assert run.fails(2, "list", "--label", "team")["code"] == "INVALID_INPUT"


def test_list_window_overlap_and_sort(run: Cli) -> None:
    late = reserve(run, "--gpus", "1", "--for", "2h", "--start", "+1d")  # [1d, 1d2h)
    now = reserve(run, "--gpus", "1", "--for", "1h")  # [0, 1h)
    mid = reserve(run, "--gpus", "1", "--for", "1h", "--start", "+3h")  # [3h, 4h)
    wait = reserve(run, "--gpus", "8", "--gang", "7", "--for", "1h", "--start", "+210m")
    assert wait["state"] == "pending"  # mid's GPU is in the way; it wants [3h30m, 4h30m)
    gone = reserve(run, "--gpus", "1", "--for", "1h", "--start", "+5h")
    run.ok("cancel", gone["id"])  # released before it held time: no window at all
    assert ids(run.ok("list", "--from", "+30m", "--to", "+3h")) == [now["id"]]
    assert ids(run.ok("list", "--from", "+1h", "--to", "+3h")) == []  # windows are half-open
    assert ids(run.ok("list", "--from", "+3h")) == [late["id"], mid["id"], wait["id"]]
    assert ids(run.ok("list", "--to", "+1h")) == [now["id"]]
    one_ms = ("--from", str(NOW_MS + DAY), "--to", str(NOW_MS + DAY + 1))
    assert ids(run.ok("list", *one_ms)) == [late["id"]]
    by_start = [now["id"], mid["id"], wait["id"], late["id"], gone["id"]]
    assert ids(run.ok("list", "--sort", "start")) == by_start
    by_creation = [late["id"], now["id"], mid["id"], wait["id"], gone["id"]]
    assert ids(run.ok("list")) == ids(run.ok("list", "--sort", "created")) == by_creation
    # a pending reservation whose start has passed wants the window a retry then would book
    five = ("--state", "pending", "--from", at(5 * HOUR))
    assert run.ok("list", *five) == []
    later = run.ok("list", *five, now=at(5 * HOUR))
    assert ids(later) == [wait["id"]]
    err = run.fails(2, "list", "--from", "+2h", "--to", "+1h")
    assert err["message"] == "--from must be before --to"
    assert "--sort must be one of created, start" in run.fails(2, "list", "--sort", "x")["message"]


@pytest.mark.sqlite_only(
    reason=(
        "acts as another OS user (test_trust.be); on PostgreSQL the principal is the"
        " server's role, tested with real roles in test_postgres.py"
    )
)
def test_filters_never_show_another_tenants_reservations(run: Cli, monkeypatch: Any) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "alice")
    theirs = reserve(run, "--gpus", "1", "--for", "1h", "--name", "n", "--label", "t=1")
    mine = reserve(
        run, "--gpus", "1", "--for", "1h", "--name", "n", "--label", "t=1", tenant="globex"
    )
    be(monkeypatch, "mallory")
    assert ids(run.ok("list", "--name", "n", "--label", "t=1")) == [mine["id"]]
    assert theirs["id"] not in str(run.ok("list", "--sort", "start"))


def _start_key(doc: dict[str, Any], now: int) -> float:
    """The order `list --sort start` promises, written out: the window's start; for a pending
    reservation the window a retry now would book; none (released before it held time) last."""
    if doc["during"] is not None:
        return float(doc["during"]["start"])
    if doc["state"] == "pending":
        return float(max(doc["start"] or now, now))
    return float("inf")


@pytest.mark.parametrize("size", [1, 2, 500])
def test_sort_start_is_sqls_order_read_page_by_page(
    run: Cli, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """`--sort start` is read in SQL's order a page at a time (issue 8: it used to read every
    match and sort it in Python, 980 MB on a fleet): the same order as the rule, ties oldest
    first, whatever the page size, in JSON, ids and text alike."""
    from better_compute.storage import fleet, listing

    run.ok("quota", "set", "--tenant", "globex", "--gpus", "64")
    for start, gpus, gang, tenant in [
        ("+1d", 1, None, "acme"),
        (None, 1, None, "acme"),
        ("+3h", 1, None, "acme"),
        ("+3h", 2, None, "acme"),  # the same start as the one before: created first, listed first
        ("+210m", 8, 7, "acme"),  # pending behind them, wanting [3h30m, …)
        ("+20m", 8, 7, "globex"),  # pending, and its start passes before the list below
        ("+5h", 1, None, "acme"),
    ]:
        flags = ["--gpus", gpus, "--for", "1h"]
        flags += [] if start is None else ["--start", start]
        flags += [] if gang is None else ["--gang", gang]
        rsv = reserve(run, *flags, tenant=tenant)
        if start == "+5h":
            run.ok("cancel", rsv["id"])
    for read in (fleet.reservation_pages, listing.reservation_pages):
        monkeypatch.setattr(read, "__defaults__", (size,))
    later = at(HOUR)
    created = run.ok("list", now=later)
    expected = [
        d["id"] for d in sorted(created, key=lambda d: _start_key(d, NOW_MS + HOUR))
    ]  # sorted() is stable: ties stay oldest first
    assert len(created) == 7 and created[-1]["state"] == "released"
    assert ids(run.ok("list", "--sort", "start", now=later)) == expected
    assert run.ok("list", "--sort", "start", "--ids", now=later, json=False).split() == expected
    assert run.ok("list", "--sort", "start", "--ids", now=later) == expected  # --json: an array
    text = run.ok("list", "--sort", "start", now=later, json=False)
    assert [line.split()[0] for line in text.splitlines() if line.startswith("rsv_")] == expected
    window = ids(run.ok("list", "--sort", "start", "--from", "+2h", now=later))
    assert window == [i for i in expected if i in ids(run.ok("list", "--from", "+2h", now=later))]
