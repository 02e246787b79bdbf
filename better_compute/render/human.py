"""Output for people: rich tables and short summaries. Times shown as UTC ISO."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from better_compute.model import Binding, Event, JsonValue, LedgerCopy, Node, Policy, Reservation
from better_compute.render.json import dumps
from better_compute.service.accounting import UsageWindow
from better_compute.service.booking import Preview
from better_compute.service.views import Assignment, Rollup
from better_compute.storage.listing import ListedReservation
from better_compute.timeparse import human_duration, iso

if TYPE_CHECKING:
    from better_compute.service.simulate import Report

STATE_STYLE = {
    "pending": "yellow",
    "placed": "cyan",
    "binding": "blue",
    "active": "green",
    "released": "dim",
}


def table_of(*columns: str, **options: Any) -> Table:
    """Borderless tables with a bold header: borders would cost columns at 80 wide."""
    style: dict[str, Any] = {
        "box": None,
        "pad_edge": False,
        "padding": (0, 2, 0, 0),
        "header_style": "bold underline",
        "title_justify": "left",
    }
    return Table(*columns, **{**style, **options})


def _window(rsv: Reservation) -> str:
    if rsv.during is None:
        return "—"
    return f"{iso(rsv.during.start)} → {iso(rsv.during.end)}"


def short(ms: int, year: bool = False) -> str:
    """`09-28 08:00` (UTC): for table cells, where a full ISO time would wrap; with `year`,
    `2026-09-28 08:00`."""
    text = iso(ms)
    return f"{text[0 if year else 5 : 10]} {text[11:16]}"


def window_column(instants: Iterable[int | None]) -> tuple[str, bool]:
    """A window column's header and whether its cells need the year: `window (UTC 2026)` when
    every instant shown falls in one year, else `window (UTC)` with the year in each cell, so two
    windows a year apart never read the same."""
    years = {iso(t)[:4] for t in instants if t is not None}
    if len(years) == 1:
        return f"window (UTC {years.pop()})", False
    return "window (UTC)", len(years) > 1


def span(start: int, end: int | None, year: bool = False) -> str:
    """`09-28 08:00–10:00` within a day, `09-28 08:00 → 09-29 20:00` across days (UTC); with
    `year`, each day as `2026-09-28`."""
    if end is None:
        return f"{short(start, year)} → open"
    a, b = short(start, year), short(end, year)
    day = len(a) - 6
    return f"{a}–{b[day + 1 :]}" if a[:day] == b[:day] else f"{a} → {b}"


def _shape(rsv: Reservation) -> str:
    return _asks(rsv.gpus, rsv.gang_size, rsv.models, rsv.spot, rsv.node_lease)


def _asks(
    gpus: int | None, gang_size: int | None, models: Sequence[str], spot: bool, lease: bool
) -> str:
    per_node = "whole node" if gpus is None else f"{gpus} gpu"
    text = f"{per_node} × {gang_size} nodes" if gang_size else per_node
    if models:
        text += f" ({','.join(models)})"
    if spot:
        text += ", spot"
    if lease:
        text += ", node lease"
    return text


#: A listing's row: (id, name, tenant, state, asks, window start, window end, nodes).
_Row = tuple[str, str | None, str, str, str, int | None, int | None, str]


def _row(r: Reservation | ListedReservation) -> _Row:
    """A listing's row of a reservation or of a checked row (storage/listing.py), which `list`
    reads for a fleet without building a reservation each."""
    if isinstance(r, Reservation):
        start, end = (r.during.start, r.during.end) if r.during else (None, None)
        nodes = ", ".join(a.node_id for a in r.allocations)
        return (r.id, r.name, r.tenant_id, r.state.value, _shape(r), start, end, nodes or "—")
    lease = r.binding == Binding.NODE.value
    asks = _asks(r.gpus, r.gang_size, r.models, r.spot, lease)
    nodes = ", ".join(a[1] for a in r.allocations)
    return (r.id, r.name, r.tenant_id, r.state, asks, r.during_start, r.during_end, nodes or "—")


def reservation(rsv: Reservation) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    state = Text(rsv.state.value, style=STATE_STYLE[rsv.state.value])
    if rsv.release_reason:
        state.append(f", reason: {rsv.release_reason.value}", style="dim")
    grid.add_row("reservation", rsv.id)
    if rsv.name is not None:
        grid.add_row("name", Text(rsv.name))
    if rsv.labels:
        grid.add_row("labels", Text(", ".join(f"{k}={v}" for k, v in rsv.labels)))
    grid.add_row("state", state)
    grid.add_row("tenant", rsv.tenant_id)
    grid.add_row("asks", f"{_shape(rsv)} for {human_duration(rsv.duration_ms)}")
    grid.add_row("window", _window(rsv))
    for alloc in rsv.allocations:
        bound = " (bound)" if alloc.bound else ""
        grid.add_row("on", f"{alloc.node_id} GPU indexes {','.join(map(str, alloc.atoms))}{bound}")
    for cond in rsv.conditions:
        grid.add_row(cond.type, Text(f"{cond.reason}: {cond.message}", style="yellow"))
    if rsv.next_attempt_at is not None:
        grid.add_row("next attempt", iso(rsv.next_attempt_at))
    grid.add_row("quota charge", f"{rsv.quota_charge} gpu")
    if rsv.idempotency_key:
        grid.add_row("key", rsv.idempotency_key)
    return grid


#: Above this many rows a table for people is plain aligned text: rich lays out about a thousand
#: rows a second, so a fleet's whole `list` took minutes (a fleet-scale review).
PLAIN_ROWS = 500


def plain_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A borderless table as text, columns two spaces apart, the last one not padded."""
    widths = _widths(columns, rows)

    def line(cells: Sequence[str]) -> str:
        padded = [cell.ljust(width) for cell, width in zip(cells[:-1], widths, strict=False)]
        return "  ".join([*padded, cells[-1]])

    return "\n".join([title, line(columns), *(line(row) for row in rows)])


def _widths(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(c), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]


#: The narrowest a folded column is squeezed to before a table turns to plain lines.
FOLD_MIN = 7


class Fitted:
    """A table whose values stay whole at any width: the rich table while its `whole` columns
    (ids, states, windows) fit unfolded beside the others folded no narrower than FOLD_MIN;
    else `plain_table`'s lines, wrapped between words, never inside one. Squeezed further, rich
    folded a window `08:00–08:0` over `6` and a tenant one letter a line (a review at 40 and 80
    columns)."""

    def __init__(
        self,
        table: Table,
        title: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        whole: Iterable[str],
    ) -> None:
        self.table, self.title, self.columns, self.rows = table, title, columns, rows
        keep = set(whole)
        widths = _widths(columns, rows)
        self.minimum = 2 * (len(columns) - 1) + sum(
            w if c in keep else min(w, FOLD_MIN) for c, w in zip(columns, widths, strict=True)
        )
        for column, name in zip(table.columns, columns, strict=True):
            column.no_wrap = name in keep
            column.overflow = "fold"
            column.min_width = None if name in keep else min(FOLD_MIN, len(name))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.minimum <= options.max_width:
            yield self.table
        else:
            yield Text(plain_table(self.title, self.columns, self.rows))  # wrapped at spaces


def fitted(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], whole: Iterable[str]
) -> Fitted:
    """A borderless table of plain cells, kept whole at any width as Fitted keeps it."""
    table = table_of(*columns)
    for row in rows:
        table.add_row(*row)
    return Fitted(table, title, columns, rows, whole)


def reservations(rows: Iterable[Reservation | ListedReservation]) -> RenderableType:
    """A table of reservations; `rows` may be read as they come (one `_Row` each is kept)."""
    listed = [_row(r) for r in rows]
    title = counted(len(listed), "reservation")
    named = any(r[1] is not None for r in listed)  # the name column only when some have one
    window, year = window_column(t for r in listed for t in r[5:7])
    columns = ("id", *(("name",) if named else ()), "tenant", "state", "asks", window, "nodes")
    cells = [
        (
            i,
            *((name or "—",) if named else ()),
            tenant,
            state,
            asks,
            "—" if start is None else span(start, end, year),
            nodes,
        )
        for i, name, tenant, state, asks, start, end, nodes in listed
    ]
    if len(cells) > PLAIN_ROWS:
        return plain_table(title, columns, cells)
    table = table_of(*columns, title=title)
    state = columns.index("state")
    for row in cells:  # plain strings are shown as written: the console reads no markup
        table.add_row(
            *row[:state], Text(row[state], style=STATE_STYLE[row[state]]), *row[state + 1 :]
        )
    return Fitted(table, title, columns, cells, whole=("id", "state", window))


def preview(p: Preview) -> RenderableType:
    lines: list[RenderableType] = []
    window = f"{iso(p.window.start)} → {iso(p.window.end)}"
    if p.searched is not None and p.fits:  # --start-range: the window it found, and where
        a = p.searched
        lines.append(Text(f"earliest window with a start from {iso(a.first)} to {iso(a.last)}:"))
    if p.fits:
        lines.append(Text(f"fits for {window}", style="green"))
        table = table_of("node", "score", "GPU indexes")
        for c in p.candidates:
            table.add_row(c.node_id, str(c.score), ",".join(map(str, c.atoms)))
        lines.append(table)
    else:
        what = "" if p.searched is not None else f" for {window}"  # the reason says the range
        lines.append(Text(f"does not fit{what}: {p.reason}", style="yellow"))
        if p.preemptible is not None:
            count, at = p.preemptible
            lines.append(
                Text(f"would fit from {iso(at)} by preempting {counted(count, 'spot reservation')}")
            )
    return Group(*lines)


def pools(rows: Sequence[Rollup]) -> RenderableType:
    """Names and ids stay whole at any width: an id cut to `pool_…` at 50 columns could not be
    copied (a review)."""
    columns = ("pool", "id", "nodes", "allocatable", "in use", "reserved", "free")
    cells = [
        (r.name, r.pool_id, *map(str, (r.nodes, r.allocatable, r.in_use, r.reserved, r.free)))
        for r in rows
    ]
    return fitted(counted(len(rows), "pool"), columns, cells, whole=("pool", "id"))


def nodes(rows: Sequence[Node]) -> RenderableType:
    """Names and states stay whole at any width (as pools' and reservations' tables do)."""
    columns = ("node", "gpus", "model", "labels", "state")
    cells = [_node_row(n) for n in rows]
    title = counted(len(rows), "node")
    if len(rows) > PLAIN_ROWS:
        return plain_table(title, columns, cells)
    return fitted(title, columns, cells, whole=("node", "state"))


def _node_row(n: Node) -> tuple[str, str, str, str, str]:
    healthy = sum(1 for a in n.atoms if a.healthy)
    gpus = f"{len(n.atoms)}" + (
        f" ({len(n.atoms) - healthy} quarantined)" if healthy < len(n.atoms) else ""
    )
    flags = (["cordoned"] if not n.schedulable else []) + (
        ["unreachable"] if not n.reachable else []
    )
    return (
        n.name,
        gpus,
        ",".join(sorted({a.model for a in n.atoms})),
        " ".join(f"{k}={v}" for k, v in n.all_labels()),
        ", ".join(flags) or "ok",
    )


def desired(rows: Sequence[Assignment]) -> RenderableType:
    window, year = window_column(t for a in rows for t in (a.start, a.end))
    table = table_of(
        "reservation", "tenant", "GPU indexes", "state", window, "bound", title="desired state"
    )
    for a in rows:
        table.add_row(
            a.reservation_id,
            a.tenant_id,
            ",".join(map(str, a.atoms)),
            a.state,
            span(a.start, a.end, year),
            "yes" if a.bound else "no",
        )
    return table


def events(pages: Iterable[Sequence[Event]]) -> Iterator[str]:
    """One event a line, like a log: legible at any width. A page's lines at a time, as storage
    reads them, so that the first are out before the last are read: `events | head` of a
    fleet's log waited 25 s and 440 MB for its first line."""
    shown = False
    for page in pages:
        if page:
            shown = True
            yield "".join(f"{event_line(e)}\n" for e in page)
    if not shown:
        yield "no events\n"


#: Event data keys that hold instants: shown as UTC times to people (JSON keeps epoch ms).
TIME_KEYS = frozenset({"at", "start", "end", "from", "to", "until", "nextAttemptAt"})


def _times_shown(value: JsonValue, key: str = "") -> JsonValue:
    """Event data with its instants as UTC times, at any depth (`reservation.updated` nests
    the window it had and the one it has: {"from": {"start": …}, "to": {…}})."""
    if isinstance(value, dict):
        return {k: _times_shown(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_times_shown(v, key) for v in value]
    if key in TIME_KEYS and isinstance(value, int) and not isinstance(value, bool):
        return iso(value)
    return value


def event_line(e: Event) -> str:
    who = f" {e.reservation_id}" if e.reservation_id else ""
    data = _times_shown(dict(e.data))
    actor = e.actor if e.acting_admin is None else f"{e.actor} (admin {e.acting_admin})"
    return f"{iso(e.at)}  #{e.seq} {e.type}{who} by {actor} {dumps(data)}"


def usage(rows: Sequence[UsageWindow], dead_letter: bool) -> RenderableType:
    title = "dead-lettered usage (no such meter)" if dead_letter else "usage"
    window, year = window_column(t for u in rows for t in (u.start, u.end))
    columns = ("meter", "tenant", "reservation", "node", "gpus", window, "gpu-h")
    cells = [
        (
            u.meter,
            u.tenant_id,
            u.reservation_id,
            u.node_id,
            str(u.gpus),
            span(u.start, u.end, year),
            f"{u.quantity:.2f}",
        )
        for u in rows
    ]
    totals: dict[tuple[str, str], float] = {}
    for u in rows:
        totals[(u.tenant_id, u.meter)] = totals.get((u.tenant_id, u.meter), 0.0) + u.quantity
    sums = [(tenant, meter, f"{total:.2f}") for (tenant, meter), total in sorted(totals.items())]
    summary_columns = ("tenant", "meter", "total gpu-hours")
    if len(rows) > PLAIN_ROWS:
        windows = plain_table(title, columns, cells)
        return f"{windows}\n\n{plain_table('totals', summary_columns, sums)}"
    summary = table_of(*summary_columns, title="totals")
    for total in sums:
        summary.add_row(*total)
    table = table_of(title=title, padding=(0, 1, 0, 0))  # seven columns: tighter gaps
    for col in columns:  # the meter: the exact name `meter create` needs
        nowrap = col in ("meter", "reservation", "node", window)
        table.add_column(  # a tenant folds, never `glob…`
            col, no_wrap=nowrap, justify="right" if col == "gpu-h" else "left", overflow="fold"
        )
    for row in cells:
        table.add_row(*row)
    return Group(table, summary)


def policies(rows: Sequence[Policy]) -> RenderableType:
    table = table_of("tenant", "principal", "max gpus", "spot only", "deny")
    for p in rows:
        table.add_row(
            p.tenant_id,
            p.principal,
            "—" if p.max_gpus is None else str(p.max_gpus),
            "yes" if p.spot_only else "no",
            "yes" if p.deny else "no",
        )
    return table


def ledger_copy(c: LedgerCopy) -> str:
    return (
        f"{c.bytes} bytes, schema version {c.schema_version}, db id {c.db_id},"
        f" {counted(c.reservations, 'reservation')}, {counted(c.events, 'event')}"
    )


def created(db: str, demo: bool, counts: dict[str, int], manual: bool, at: int, admin: str) -> str:
    """What `init` made: the clock it runs on is worth saying, a manual one above all."""
    what = f" with the demo inventory ({counts['nodes']} nodes)" if demo else ""
    clock_text = f"a manual clock at {iso(at)} (--now moves it)" if manual else "the real clock"
    return f"created {db}{what}; it runs on {clock_text}; {admin} is its admin"


def counted(n: int, noun: str) -> str:
    """`1 pool`, `2 pools`: every noun here makes its plural with an s."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def repaired(
    moved: Sequence[str], waiting: Sequence[str], kept: Sequence[str], running: Sequence[str]
) -> str:
    """What a maintenance window's repair did to the placed bookings it overlapped, and which
    reservations already running on the node it reaches."""
    if not moved and not waiting and not kept and not running:
        return "no booking overlapped it"
    parts = [f"moved {', '.join(moved)}"] if moved else []
    if waiting:
        parts.append(f"no node fits {', '.join(waiting)}: pending (BookingRepairFailed), retried")
    if kept:
        parts.append(
            f"left in place {', '.join(kept)} (a spot reservation under notice, or a lease that"
            " has begun)"
        )
    if running:
        parts.append(
            f"still running into it: {', '.join(running)} (begun, so not moved; release them"
            " or wait for their end)"
        )
    return "; ".join(parts)


def imported(counts: dict[str, int], skipped: int | None) -> str:
    """`inventory import` for people; `skipped`: an openb node list's rows without GPUs."""
    text = "imported " + ", ".join(
        counted(counts[key], key[:-1]) for key in ("pools", "nodes", "tenants")
    )
    if skipped is None:
        return text
    return text + f" ({counted(skipped, 'row')} without GPUs skipped)"


def simulation(r: Report) -> RenderableType:
    """`simulate` for people: the counts, the waits and GPU-hours, and a utilisation chart."""
    from better_compute.render.chart import utilisation_chart

    table = table_of("", "", title="simulate")
    rows = [
        ("requests", f"{r.requests} ({r.skipped} skipped)"),
        ("placed at once", str(r.placed_at_once)),
        ("placed after waiting", str(r.placed_after_waiting)),
        ("never placed", str(r.never_placed)),
        ("preemptions", f"{r.cut_back} cut back, {r.requeued} requeued"),
        ("wait", f"mean {human_duration(r.wait_mean_ms)}, p95 {human_duration(r.wait_p95_ms)}"),
        # as --json gives them (3 decimals), never in exponent form
        ("GPU-hours", f"{r.gpu_hours_booked:,.3f} booked, {r.gpu_hours_used:,.3f} used"),
        ("wall time", f"{r.wall_seconds:g} s ({r.requests_per_second:g} requests/s)"),
    ]
    for name, value in rows:
        table.add_row(Text(name, style="bold"), value)
    if not r.utilisation:
        return table
    title = Text("utilisation (GPUs booked on average of allocatable, UTC)", style="bold")
    return Group(table, Text(""), title, utilisation_chart(r.utilisation))
