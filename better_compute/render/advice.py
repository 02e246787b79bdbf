"""`advice` and `pool policy` output: the JSON documents and, for people, a table and a small
picture of the windows on the timeline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from better_compute.model import CalendarPolicy, JsonValue
from better_compute.timeparse import human_duration, iso

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType, RenderResult

    from better_compute.service.advice import Advice, Recommendation

#: Columns of the picture's time axis, at most, and at least (its two labels and a space).
PICTURE_WIDTH = 48
MIN_PICTURE_WIDTH = 24


def recommendation(r: Recommendation) -> dict[str, JsonValue]:
    doc: dict[str, JsonValue] = {
        "startTime": r.window.start,
        "endTime": r.window.end,
        "durationMs": r.window.duration,
        "location": r.pool,
        "poolId": r.pool_id,
        "gpus": r.gpus,
        "otherLocations": {o.pool: {"status": o.status, "details": o.details} for o in r.others},
        "nearMiss": (
            {"kind": r.near_miss, "details": r.details} if r.near_miss is not None else None
        ),
    }
    return doc


def advice_json(a: Advice) -> dict[str, JsonValue]:
    return {"recommendations": [recommendation(r) for r in a.recommendations]}


def policy_json(p: CalendarPolicy | None, pool: str) -> dict[str, JsonValue]:
    if p is None:
        return {"pool": pool, "policy": None}
    return {"pool": pool, "policy": p.limits()}


def picture(a: Advice, width: int = PICTURE_WIDTH) -> list[str]:
    """One line per window: `█` where it lies on an axis from the range's start to the last end.
    Lines and labels are plain text, so they read the same with colours off."""
    if not a.recommendations:
        return []
    lo = min(a.searched.start, *(r.window.start for r in a.recommendations))
    hi = max(a.searched.end, *(r.window.end for r in a.recommendations))
    scale = max(1, hi - lo)

    def col(t: int) -> int:
        return min(width - 1, (t - lo) * width // scale)

    from better_compute.render.human import short

    year = iso(lo)[:4] != iso(hi)[:4]  # an axis across new year names both years
    left, right = short(lo, year), short(hi, year)
    lines = [f"     {left}{' ' * max(1, width - len(left) - len(right))}{right}"]
    for i, r in enumerate(a.recommendations, 1):
        first, last = col(r.window.start), col(max(r.window.start, r.window.end - 1))
        row = ["·"] * width
        for c in range(first, last + 1):
            row[c] = "█"
        lines.append(f"  {i:>2} {''.join(row)}")
    return lines


def advice_human(a: Advice) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    from better_compute.render.human import counted, fitted, span, window_column

    if not a.recommendations:
        return Text("no window fits: nothing in that range, nor a near miss")
    header, year = window_column(
        t for r in a.recommendations for t in (r.window.start, r.window.end)
    )
    every = ("#", header, "for", "pool", "gpus", "other pools", "note")
    rows = [
        (
            str(i),
            span(r.window.start, r.window.end, year),
            human_duration(r.window.duration),
            r.pool,
            str(r.gpus),
            ", ".join(f"{o.pool}: {o.status}" for o in r.others) or "-",
            f"near miss: {r.details}" if r.near_miss else "",
        )
        for i, r in enumerate(a.recommendations, 1)
    ]
    # Columns with nothing to say (no other pool, no near miss) are left out, and windows and
    # pools stay whole, as `list` keeps its windows (render/human.Fitted): rich cut a long pool
    # name at 80 columns and a window at 53 (a review).
    empty = {i for i in (5, 6) if all(row[i] in ("", "-") for row in rows)}
    columns = [c for i, c in enumerate(every) if i not in empty]
    cells = [[v for i, v in enumerate(row) if i not in empty] for row in rows]
    table = fitted(counted(len(cells), "window"), columns, cells, whole=("#", header, "pool"))
    return Group(table, Text(""), _Picture(a))


class _Picture:
    """The picture, its axis as wide as the terminal allows up to PICTURE_WIDTH: 53 columns
    wrapped its axis and its bars over two lines on a narrower terminal."""

    def __init__(self, a: Advice) -> None:
        self.advice = a

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.text import Text

        width = min(PICTURE_WIDTH, options.max_width - 5)
        if width >= MIN_PICTURE_WIDTH:  # narrower, its labels would wrap: the table says it all
            yield Text("\n".join(picture(self.advice, width)))


def policy_human(p: CalendarPolicy | None, pool: str) -> RenderableType:
    from rich.text import Text

    from better_compute.engine.calendar import describe
    from better_compute.render.human import table_of

    if p is None:
        return Text(f"pool {pool}: no calendar policy")
    title = f"calendar policy of pool {pool}"
    table = table_of("limit", "value", title=title, min_width=len(title))  # title on one line
    for name, value in describe(p):
        table.add_row(name, value)
    return table
