from __future__ import annotations

import io
import re
from datetime import UTC, datetime

import pytest
from rich.console import Console

from better_compute.render.chart import SHADE, SOLID, average_utilisation, timeline_chart
from better_compute.service.views import Bucket, Timeline

HOUR = 3_600_000
# 2026-05-01 22:00 UTC: a three-hour step crosses midnight on the second bucket.
T0 = int(datetime(2026, 5, 1, 22, 0, tzinfo=UTC).timestamp() * 1000)
ROW = re.compile(r"^(?P<label>.{11}) (?P<bar>[█░ ]+) +(?P<booked>\d+)/(?P<alloc>\d+)$")


def timeline(
    booked: list[int],
    allocatable: int = 8,
    step_hours: int = 3,
    start: int = T0,
    last_end: int | None = None,
    name: str = "gpu-a100",
) -> Timeline:
    step = step_hours * HOUR
    buckets = []
    for i, n in enumerate(booked):
        end = start + (i + 1) * step
        if last_end is not None and i == len(booked) - 1:
            end = last_end
        buckets.append(Bucket(start + i * step, end, n, max(0, allocatable - n)))
    return Timeline("pool_1", name, allocatable, step_hours * 60, tuple(buckets))


def render(t: Timeline, width: int = 80) -> list[str]:
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    console.print(timeline_chart(t, width=width))
    text = console.export_text()
    assert "\x1b" not in text
    return text.splitlines()


def rows(lines: list[str]) -> list[re.Match[str]]:
    return [m for line in lines if (m := ROW.match(line))]


def test_every_line_fits_80_columns() -> None:
    lines = render(timeline([0, 3, 8, 12, 5, 1, 0, 7], name="a-rather-long-pool-name-" * 3))
    assert lines
    assert all(len(line) <= 80 for line in lines), [len(line) for line in lines]
    assert len(rows(lines)) == 8


def test_header_names_pool_allocatable_step_and_legend() -> None:
    header = render(timeline([1, 2]))[0]
    assert "gpu-a100" in header
    assert "8 allocatable GPUs" in header
    assert "step 3 h" in header
    assert f"{SOLID} booked" in header
    assert f"{SHADE} free" in header


def test_bar_width_fills_the_line() -> None:
    lines = render(timeline([8, 0]))
    full, empty = rows(lines)
    # 80 columns - 11 (label) - 3 ("8/8") - 2 spaces
    assert len(full["bar"].rstrip()) == 64
    assert len(full.group(0)) == 80
    assert len(empty.group(0)) == 80


def test_full_bucket_is_all_solid_and_empty_bucket_all_shade() -> None:
    full, empty, half = rows(render(timeline([8, 0, 4])))
    assert set(full["bar"].strip()) == {SOLID}
    assert set(empty["bar"].strip()) == {SHADE}
    bar = half["bar"].strip()
    assert bar.count(SOLID) == bar.count(SHADE) == len(bar) // 2
    assert bar == SOLID * (len(bar) // 2) + SHADE * (len(bar) // 2)


def test_small_bookings_show_and_nearly_full_never_looks_full() -> None:
    one, almost = rows(render(timeline([1, 999], allocatable=1000)))
    assert one["bar"].count(SOLID) == 1
    assert SHADE in almost["bar"]


def test_numbers_are_booked_over_allocatable_right_aligned() -> None:
    lines = render(timeline([0, 12, 3], allocatable=10))
    found = rows(lines)
    assert [(m["booked"], m["alloc"]) for m in found] == [("0", "10"), ("12", "10"), ("3", "10")]
    ends = {len(m.group(0)) for m in found}
    assert ends == {80}
    assert lines[2].endswith(" 12/10")
    assert lines[1].endswith("  0/10")


def test_day_shown_only_when_it_changes() -> None:
    # 22:00 on 05-01, then 01:00 / 04:00 / ... on 05-02, then 05-03.
    labels = [m["label"] for m in rows(render(timeline([0] * 10)))]
    assert labels[0] == "05-01 22:00"
    assert labels[1] == "05-02 01:00"
    assert labels[2] == "      04:00"
    assert labels[7] == "      19:00"
    assert labels[8] == "      22:00"
    assert labels[9] == "05-03 01:00"


def test_daily_steps_label_every_row_with_its_day() -> None:
    labels = [m["label"] for m in rows(render(timeline([1, 2, 3], step_hours=24)))]
    assert labels == ["05-01 22:00", "05-02 22:00", "05-03 22:00"]


def test_footer_peak_and_average() -> None:
    t = timeline([2, 6, 4, 1])
    footer = render(t)[-1]
    assert "peak 6/8 GPUs at 05-02 01:00" in footer
    assert "(+" not in footer
    # (2 + 6 + 4 + 1) / (4 * 8) = 40.6%
    assert average_utilisation(t) == pytest.approx(100 * 13 / 32)
    assert "average 41% utilised" in footer


def test_footer_peak_repeats_and_round_average() -> None:
    footer = render(timeline([4, 8, 8, 4]))[-1]
    assert "peak 8/8 GPUs at 05-02 01:00 (+1 more)" in footer
    assert "average 75% utilised" in footer


def test_average_weights_a_short_last_bucket() -> None:
    # Two 3 h buckets fully booked, then a 1 h bucket empty: 6 of 7 hours -> 85.7%.
    t = timeline([8, 8, 0], last_end=T0 + 7 * HOUR)
    assert average_utilisation(t) == pytest.approx(600 / 7)
    assert "average 86% utilised" in render(t)[-1]


def test_nothing_booked() -> None:
    lines = render(timeline([0, 0]))
    assert "nothing booked" in lines[-1]
    assert "average 0% utilised" in lines[-1]


def test_allocatable_zero_still_draws() -> None:
    lines = render(timeline([0, 2, 0], allocatable=0))
    assert all(len(line) <= 80 for line in lines)
    found = rows(lines)
    assert len(found) == 3
    for m in found:
        assert SOLID not in m["bar"] and SHADE not in m["bar"]
    assert [m["booked"] for m in found] == ["0", "2", "0"]
    assert "0 allocatable GPUs" in lines[0]
    assert "no allocatable GPUs" in lines[-1]
    assert "peak 2/0 GPUs" in lines[-1]


def test_overbooked_bar_is_capped_number_is_true() -> None:
    lines = render(timeline([8, 11], allocatable=8))
    full, over = rows(lines)
    assert all(len(line) <= 80 for line in lines)
    assert over["bar"].strip() == full["bar"].strip()
    assert len(over.group(0)) == len(full.group(0)) == 80
    assert set(over["bar"].strip()) == {SOLID}
    assert (over["booked"], over["alloc"]) == ("11", "8")
    assert "peak 11/8 GPUs" in lines[-1]


def test_narrow_width_keeps_a_minimum_bar_and_never_crashes() -> None:
    lines = render(timeline([3, 8]), width=40)
    assert all(len(line) <= 40 for line in lines)
    found = rows(lines)
    assert len(found) == 2
    assert len(found[1]["bar"].strip()) == 40 - 11 - 3 - 2
    tiny = render(timeline([3, 8]), width=5)
    assert tiny


def test_no_buckets_does_not_crash() -> None:
    lines = render(Timeline("pool_1", "p", 4, 60, ()))
    assert "no buckets" in lines[-1]


def test_colour_only_on_a_terminal() -> None:
    t = timeline([8, 5, 1])
    out = io.StringIO()
    Console(file=out, width=80).print(timeline_chart(t))  # a file is not a terminal
    assert "\x1b[" not in out.getvalue()
    assert SOLID in out.getvalue()
    colour = Console(width=80, record=True, force_terminal=True, color_system="standard")
    colour.print(timeline_chart(t))
    styled = colour.export_text(styles=True)
    assert "\x1b[31m" in styled  # red: full
    assert "\x1b[33m" in styled  # yellow: 5/8 = 62%
    assert "\x1b[32m" in styled  # green: 1/8
