"""Regression tests for the defects of issue 7 (each failed before its fix)."""

from __future__ import annotations

from typing import Any

from conftest import HOUR, MIN, NOW_MS, Cli, at


def reserve(cli: Cli, key: str, *flags: object, tenant: str = "acme", **kw: Any) -> Any:
    return cli.ok("reserve", "--tenant", tenant, "--key", key, *flags, **kw)


# ---------------------------------------------------------------- 6. durationMs after extend


def test_duration_ms_is_the_booked_windows_length_after_extend(run: Cli) -> None:
    rsv = reserve(run, "x", "--gpus", "8", "--for", "1h")
    assert rsv["durationMs"] == HOUR
    extended = run.ok("extend", rsv["id"], "--by", "30m", now=at(MIN))
    assert extended["during"] == {"start": NOW_MS, "end": NOW_MS + HOUR + 30 * MIN}
    assert extended["durationMs"] == HOUR + 30 * MIN
    assert run.ok("get", rsv["id"], now=at(MIN))["durationMs"] == HOUR + 30 * MIN
