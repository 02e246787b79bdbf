"""The timeline as a terminal chart (PRODUCT.md §5.7): one bar per bucket, for people, not scripts.

Colour comes from rich styles only; a console without a terminal drops them by itself.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.constrain import Constrain
from rich.table import Table
from rich.text import Text

from better_compute.service.views import Bucket, Timeline

if TYPE_CHECKING:
    from better_compute.service.simulate import Utilisation

SOLID = "█"
SHADE = "░"
LABEL_WIDTH = len("MM-DD HH:MM")
MIN_BAR = 10

_HOT = 0.9
_WARM = 0.6


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms // 1000, UTC)


def _when(ms: int) -> str:
    return _utc(ms).strftime("%m-%d %H:%M")


def _labels(buckets: tuple[Bucket, ...]) -> list[str]:
    """`MM-DD HH:MM` on a bucket whose day differs from the row above, else just `HH:MM`."""
    out: list[str] = []
    previous: tuple[int, int, int] | None = None
    for b in buckets:
        at = _utc(b.start)
        day = (at.year, at.month, at.day)
        text = at.strftime("%m-%d %H:%M") if day != previous else at.strftime("%H:%M")
        out.append(text.rjust(LABEL_WIDTH))
        previous = day
    return out


def _step(minutes: int) -> str:
    if minutes % 1440 == 0:
        return f"{minutes // 1440} d"
    if minutes % 60 == 0:
        return f"{minutes // 60} h"
    return f"{minutes} min"


def _colour(booked: float, allocatable: int) -> str:
    if allocatable <= 0:
        return "red"
    share = booked / allocatable
    if share >= _HOT:
        return "red"
    if share >= _WARM:
        return "yellow"
    return "green"


def _cells(booked: float, allocatable: int, width: int) -> int:
    """Solid cells of a bar `width` wide that stands for `allocatable` GPUs; capped at full.

    Any booking shows at least one cell and a bucket that is not full never looks full.
    """
    if allocatable <= 0 or booked <= 0:
        return 0
    if booked >= allocatable:
        return width
    cells = round(booked * width / allocatable)
    return min(max(cells, 1), width - 1)


def _bar(booked: float, allocatable: int, width: int) -> Text:
    if allocatable <= 0:
        return Text(" " * width)
    solid = _cells(booked, allocatable, width)
    bar = Text()
    bar.append(SOLID * solid, style=_colour(booked, allocatable))
    bar.append(SHADE * (width - solid), style="dim")
    return bar


def _header(t: Timeline, width: int) -> Text:
    title = Text()
    title.append(t.pool_name, style="bold")
    gpus = "GPU" if t.allocatable == 1 else "GPUs"
    title.append(f" · {t.allocatable} allocatable {gpus} · step {_step(t.step_minutes)} · UTC")
    legend = Text()
    legend.append(SOLID, style="green")
    legend.append(" booked  ")
    legend.append(SHADE, style="dim")
    legend.append(" free")
    gap = width - title.cell_len - legend.cell_len
    if gap >= 2:
        return Text.assemble(title, " " * gap, legend)
    return Text.assemble(title, "\n", legend)


def _footer(t: Timeline) -> Text:
    footer = Text()
    if not t.buckets:
        footer.append("no buckets")
        return footer
    peak = max(b.booked for b in t.buckets)
    at_peak = [b for b in t.buckets if b.booked == peak]
    if peak == 0:
        footer.append("nothing booked")
    else:
        footer.append("peak ")
        footer.append(f"{peak}/{t.allocatable}", style="bold")
        footer.append(f" GPUs at {_when(at_peak[0].start)}")
        if len(at_peak) > 1:
            footer.append(f" (+{len(at_peak) - 1} more)")
    footer.append(" · ")
    if t.allocatable <= 0:
        footer.append("no allocatable GPUs", style="bold red")
    else:
        footer.append("average ")
        footer.append(f"{average_utilisation(t):.0f}%", style="bold")
        footer.append(" utilised")
    return footer


def average_utilisation(t: Timeline) -> float:
    """Booked GPU-time over allocatable GPU-time, in percent; buckets weighted by their length.

    The last bucket may be shorter than the step. Returns 0 when there is nothing to divide by.
    """
    span = sum(b.end - b.start for b in t.buckets)
    if t.allocatable <= 0 or span <= 0:
        return 0.0
    used = sum(b.booked * (b.end - b.start) for b in t.buckets)
    return 100.0 * used / (t.allocatable * span)


def _number(t: Timeline, b: Bucket) -> str:
    """`booked/allocatable` for the pool, then the tenant's own share when one was asked for."""
    text = f"{b.booked}/{t.allocatable}"
    return text if b.tenant_booked is None else f"{text} ({t.tenant} {b.tenant_booked})"


def _rows(bar_width: int, number_width: int) -> Table:
    """The chart's grid: a time label, a bar, and a right-aligned number per row."""
    rows = Table.grid(padding=(0, 1))
    rows.add_column(width=LABEL_WIDTH, no_wrap=True, overflow="crop")
    rows.add_column(width=bar_width, no_wrap=True, overflow="crop")
    rows.add_column(width=number_width, no_wrap=True, justify="right")
    return rows


def timeline_chart(t: Timeline, width: int = 80) -> RenderableType:
    """Header, one row per bucket (start, bar, booked/allocatable), and a peak/average footer."""
    numbers = [_number(t, b) for b in t.buckets]
    number_width = max((len(n) for n in numbers), default=1)
    bar_width = max(MIN_BAR, width - LABEL_WIDTH - number_width - 2)

    rows = _rows(bar_width, number_width)
    for label, b, number in zip(_labels(t.buckets), t.buckets, numbers, strict=True):
        over = b.booked > t.allocatable
        rows.add_row(
            Text(label, style="cyan"),
            _bar(b.booked, t.allocatable, bar_width),
            Text(number, style="bold red" if over else ""),
        )
    return Constrain(Group(_header(t, width), rows, _footer(t)), width=width)


def utilisation_chart(buckets: tuple[Utilisation, ...], width: int = 80) -> RenderableType:
    """`simulate`'s utilisation: one row per bucket (start, bar, GPUs booked on average of the
    allocatable ones)."""
    numbers = [f"{b.booked:g}/{b.allocatable}" for b in buckets]
    number_width = max((len(n) for n in numbers), default=1)
    bar_width = max(MIN_BAR, width - LABEL_WIDTH - number_width - 2)
    rows = _rows(bar_width, number_width)
    previous: tuple[int, int, int] | None = None
    for b, number in zip(buckets, numbers, strict=True):
        at = _utc(b.start)
        day = (at.year, at.month, at.day)
        label = at.strftime("%m-%d %H:%M") if day != previous else at.strftime("%H:%M")
        previous = day
        rows.add_row(
            Text(label.rjust(LABEL_WIDTH), style="cyan"),
            _bar(b.booked, b.allocatable, bar_width),
            Text(number),
        )
    return Constrain(rows, width=width)
