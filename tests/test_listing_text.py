"""Issue 8 item 2: `list --json` writes each reservation straight from its row
(storage/listing.py, render.json.listed). The reference is the model path: every reservation as
a Reservation, render.json.reservation, json.dumps. Both must give the same bytes, on both
backends."""

from __future__ import annotations

import io
import sqlite3
from typing import Any

import pgtest
import pytest
from conftest import ME, NOW, NOW_MS, Cli, at, invoke
from hypothesis import given
from hypothesis import strategies as st

from better_compute.model import (
    Allocation,
    Binding,
    Condition,
    ReleaseReason,
    Reservation,
    State,
    Window,
)
from better_compute.render import json as js
from better_compute.service import listing
from better_compute.service.context import open_ctx
from better_compute.service.finding import Filters
from better_compute.storage import listing as storage_listing
from better_compute.storage.listing import ListedReservation


def _busy_ledger(run: Cli) -> None:
    """Reservations of every shape a listing meets: names and labels with quotes, backslashes and
    other scripts, gangs, spot, a model, node leases, a series, later windows, a pending one
    with its conditions, released ones with their reasons, an extended one."""
    run.ok(
        "reserve", "--tenant", "acme", "--gpus", 2, "--for", "2h", "--name", 'run "7" \\ é 中',
        "--label", "team=vision", "--label", "note=ü\\\"x",
    )  # fmt: skip
    run.ok("reserve", "--tenant", "acme", "--gpus", 8, "--gang", 2, "--for", "1h")
    run.ok("reserve", "--tenant", "globex", "--gpus", 1, "--for", "3h", "--spot")
    run.ok("reserve", "--tenant", "acme", "--gpus", 4, "--for", "1h", "--model", "h100")
    run.ok(
        "reserve", "--tenant", "acme", "--node-lease", "--for", "1h", "--start", at(5 * 3600_000)
    )
    run.ok(
        "reserve", "--tenant", "globex", "--gpus", 1, "--for", "1h", "--every", "1d", "--count", 3
    )
    later = run.ok(
        "reserve", "--tenant", "acme", "--gpus", 2, "--for", "1h", "--start", at(86_400_000)
    )
    run.ok("cancel", later["id"])
    gone = run.ok("reserve", "--tenant", "acme", "--gpus", 1, "--for", "1h", "--key", "k1")
    run.ok("release", gone["id"])
    long = run.ok("reserve", "--tenant", "globex", "--gpus", 1, "--for", "1h")
    run.ok("extend", long["id"], "--by", "2h")
    run.ok("quota", "set", "--tenant", "globex", "--gpus", 200)
    waits = run.ok("reserve", "--tenant", "globex", "--gpus", 8, "--gang", 7, "--for", "1h")
    assert waits["state"] == "pending" and waits["conditions"], waits


def _raw_stdout(run: Cli, *args: str) -> str:
    result = invoke(["--db", str(run.db), "--now", NOW, *args])
    assert result.exit_code == 0, result.stderr
    return result.stdout


def _reference(run: Cli, states: list[str]) -> str:
    """The model path: every reservation a Reservation, encoded by json.dumps."""
    ctx = open_ctx(pgtest.ledger(str(run.db)), NOW, ME, None)
    try:
        rows = listing.reservations(ctx, None, None, states)
        return js.dumps([js.reservation(r) for r in rows]) + "\n"
    finally:
        ctx.db.close()


@pytest.mark.parametrize("states", [[], ["placed", "active"], ["pending", "released"]])
def test_list_json_is_the_model_paths_bytes(run: Cli, states: list[str]) -> None:
    _busy_ledger(run)
    flags = [f for s in states for f in ("--state", s)]
    text = _raw_stdout(run, "list", *flags, "--json")
    assert text == _reference(run, states)
    assert len(run.ok("list", *flags)) >= (12 if not states else 1)


def test_list_json_pages_join_into_one_document(run: Cli) -> None:
    """More reservations than one page: the pieces still make exactly one array."""
    for _ in range(3):
        run.ok("reserve", "--tenant", "acme", "--gpus", 1, "--for", "1h")
    ctx = open_ctx(pgtest.ledger(str(run.db)), NOW, ME, None)
    try:
        pieces = js.reservations(page for page in listing.listed_pages(ctx, Filters()))
        small = js.reservations(
            [[row] for page in listing.listed_pages(ctx, Filters()) for row in page]
        )
    finally:
        ctx.db.close()
    assert "".join(pieces) == "".join(small) == _reference(run, []).rstrip("\n")
    assert js.reservations([]) == ["[", "]"] and "".join(js.reservations([[], []])) == "[]"


@pytest.mark.sqlite_only(reason="damages the SQLite file by hand")
@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE reservations SET state = 'gone'",
        "UPDATE reservations SET binding = 'glue'",
        "UPDATE reservations SET release_reason = 'bored'",
        "UPDATE reservations SET models = '{\"a\": 1}'",
        "UPDATE reservations SET models = '[1]'",
        "UPDATE reservations SET conditions = 'oops'",
        "UPDATE reservations SET labels = '[]'",
        "UPDATE reservations SET during_end = 'later'",
        "UPDATE reservations SET tenant_id = X'41'",
        "UPDATE reservations SET name = X'41'",
        "UPDATE allocations SET atoms = '[0, \"x\"]'",
        "UPDATE allocations SET atoms = 'zero'",
        "UPDATE allocations SET node_id = X'41'",
    ],
)
def test_a_damaged_row_is_unavailable_and_nothing_is_written(run: Cli, damage: str) -> None:
    run.ok("reserve", "--tenant", "acme", "--gpus", 2, "--for", "2h")
    conn = sqlite3.connect(run.db)
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute(damage)
    conn.commit()
    conn.close()
    error = run.fails(7, "list")
    assert error["code"] == "UNAVAILABLE" and "damaged" in error["message"], error


@pytest.mark.sqlite_only(reason="edits the SQLite file by hand")
def test_atoms_in_another_json_form_are_written_as_the_model_writes_them(run: Cli) -> None:
    run.ok("reserve", "--tenant", "acme", "--gpus", 2, "--for", "2h")
    conn = sqlite3.connect(run.db)
    conn.execute("UPDATE allocations SET atoms = '[ 0,1 ]'")
    conn.commit()
    conn.close()
    text = _raw_stdout(run, "list", "--json")
    assert text == _reference(run, []) and '"atoms": [0, 1]' in text


_texts = st.text(max_size=12)
_opt_texts = st.none() | _texts
_opt_ints = st.none() | st.integers(min_value=0, max_value=2**53)


@st.composite
def _reservations(draw: Any) -> Reservation:
    during = draw(st.none() | st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)))
    allocations = tuple(
        Allocation(draw(_texts), "r", draw(_texts), tuple(atoms), draw(st.booleans()))
        for atoms in draw(st.lists(st.lists(st.integers(0, 15), max_size=4), max_size=3))
    )
    return Reservation(
        id=draw(_texts),
        seq=1,
        tenant_id=draw(_texts),
        pool_id=draw(_texts),
        state=draw(st.sampled_from(State)),
        gpus=draw(_opt_ints),
        models=tuple(draw(st.lists(_texts, max_size=3))),
        topology=draw(_opt_texts),
        gang_size=draw(st.none() | st.integers(0, 64)),
        topology_key=draw(_opt_texts),
        spot=draw(st.booleans()),
        binding=draw(st.sampled_from(Binding)),
        duration_ms=draw(st.integers(0, 2**53)),
        start=draw(_opt_ints),
        during=None if during is None else Window(*during),
        conditions=tuple(
            Condition(*c) for c in draw(st.lists(st.tuples(_texts, _texts, _texts), max_size=2))
        ),
        quota_charge=draw(st.integers(0, 2**20)),
        idempotency_key=draw(_opt_texts),
        release_reason=draw(st.none() | st.sampled_from(ReleaseReason)),
        created_at=draw(st.integers(0, 2**53)),
        next_attempt_at=draw(_opt_ints),
        series_id=draw(_opt_texts),
        allocations=allocations,
        name=draw(_opt_texts),
        labels=tuple(sorted(draw(st.dictionaries(_texts, _texts, max_size=3)).items())),
    )


@given(_reservations())
def test_listed_text_is_dumps_of_the_reservation_document(rsv: Reservation) -> None:
    """Any text (quotes, backslashes, control characters, any script) is escaped exactly as
    json.dumps(..., ensure_ascii=False) escapes it."""
    row = ListedReservation(
        rsv.id,
        rsv.tenant_id,
        rsv.pool_id,
        rsv.state.value,
        rsv.gpus,
        rsv.models,
        rsv.topology,
        rsv.gang_size,
        rsv.topology_key,
        rsv.spot,
        rsv.binding.value,
        rsv.duration_ms,
        rsv.start,
        None if rsv.during is None else rsv.during.start,
        None if rsv.during is None else rsv.during.end,
        rsv.conditions,
        tuple((a.id, a.node_id, js.dumps(list(a.atoms)), a.bound) for a in rsv.allocations),
        rsv.quota_charge,
        rsv.idempotency_key,
        None if rsv.release_reason is None else rsv.release_reason.value,
        rsv.created_at,
        rsv.next_attempt_at,
        rsv.name,
        rsv.labels,
        rsv.series_id,
    )
    assert js.listed(row) == js.dumps(js.reservation(rsv))
    assert "".join(js.reservations([[row], [rsv]])) == js.dumps([js.reservation(rsv)] * 2)


@pytest.mark.parametrize("size", [1, 2, 3, 500])
def test_gangs_allocations_stay_whole_across_pages(run: Cli, size: int) -> None:
    """A gang's allocations are several joined rows: however the pages fall, each reservation
    is whole, once, in order."""
    _busy_ledger(run)
    ctx = open_ctx(pgtest.ledger(str(run.db)), NOW, ME, None)
    try:
        with ctx.db.read() as conn:
            pages = list(
                storage_listing.reservation_pages(conn, storage_listing.Query(), NOW_MS, size)
            )
    finally:
        ctx.db.close()
    assert all(0 < len(page) <= size for page in pages)
    assert "".join(js.reservations(pages)) + "\n" == _reference(run, [])
    assert any(len(row.allocations) > 1 for page in pages for row in page)


def test_a_long_list_for_people_is_plain_aligned_text(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above PLAIN_ROWS rows rich's layout took minutes on a fleet: a plain table instead, one
    reservation a line, every column where its header is (PLAIN_ROWS lowered to 3 here)."""
    from better_compute.render import human

    monkeypatch.setattr(human, "PLAIN_ROWS", 3)
    for i in range(4):
        run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1m", "--start",
               f"+{i + 1}h", "--key", f"k{i}")  # fmt: skip
    lines = run.ok("list", json=False).splitlines()
    assert lines[0] == "4 reservations"
    header = lines[1]
    words = header.split()
    assert words[:5] == ["id", "tenant", "state", "asks", "window"] and words[-1] == "nodes"
    rows = lines[2:]
    assert len(rows) == 4
    at = header.index("state")
    assert all(row[at:].startswith("placed") for row in rows)
    monkeypatch.setattr(human, "PLAIN_ROWS", 500)
    assert "4 reservations" in run.ok("list", json=False)  # the rich table, as before


def test_a_long_usage_for_people_is_plain_aligned_text(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from better_compute.render import human

    monkeypatch.setattr(human, "PLAIN_ROWS", 1)
    run.ok("meter", "create", "gpu.h100.hours")
    for key in ("a", "b"):
        run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h", "--key", key)
    run.ok("tick")
    lines = run.ok("usage", now="2026-09-28T09:30:00Z", json=False).splitlines()
    assert lines[0] == "usage"
    words = lines[1].split()
    assert words[:5] == ["meter", "tenant", "reservation", "node", "gpus"] and words[-1] == "gpu-h"
    assert [line.split()[-1] for line in lines[2:4]] == ["1.00", "1.00"]
    assert lines[5] == "totals" and lines[-1].split() == ["acme", "gpu.h100.hours", "2.00"]


def test_a_long_node_list_for_people_is_plain_aligned_text(
    run: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from better_compute.render import human

    monkeypatch.setattr(human, "PLAIN_ROWS", 1)
    run.ok("node", "cordon", "west-02")
    lines = run.ok("node", "list", json=False).splitlines()
    assert lines[0] == "7 nodes" and lines[1].split() == [
        "node",
        "gpus",
        "model",
        "labels",
        "state",
    ]
    assert [line.split()[0] for line in lines[2:]] == [f"west-0{i}" for i in range(1, 8)]
    assert lines[3].endswith("cordoned") and lines[2].endswith("ok")


@pytest.mark.parametrize("plain_rows", [3, 500])
def test_list_for_people_from_checked_rows_is_the_model_paths_table(
    run: Cli, monkeypatch: pytest.MonkeyPatch, plain_rows: int
) -> None:
    """`list` for people reads the checked rows, as `--json` does (a fleet's 200,000 were 720 MB
    as reservations): its table, plain or rich, is the one the reservations themselves make."""
    from rich.console import Console

    from better_compute.render import human

    monkeypatch.setattr(human, "PLAIN_ROWS", plain_rows)
    _busy_ledger(run)
    ctx = open_ctx(pgtest.ledger(str(run.db)), NOW, ME, None)
    try:
        models = listing.reservations(ctx, None, None, [])
        checked = [row for page in listing.listed_pages(ctx, Filters()) for row in page]
    finally:
        ctx.db.close()
    assert [r.id for r in models] == [r.id for r in checked]

    def shown(view: Any) -> str:
        if isinstance(view, str):
            return view
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(view)
        return console.export_text()

    assert shown(human.reservations(checked)) == shown(human.reservations(models))
    assert isinstance(human.reservations(checked), str) == (plain_rows == 3)
    assert shown(human.reservations(iter(checked))) == shown(human.reservations(checked))
    assert _raw_stdout(run, "list") == _raw_stdout(run, "list", "--sort", "created")
