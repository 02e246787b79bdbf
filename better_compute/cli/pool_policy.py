"""`pool policy set|show|clear`: a pool's calendar policy (PRODUCT.md §5.6). A group that
cli/setup_commands.py adds under `pool`, so `pool …` still loads one command module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from better_compute.cli.app import JsonFlag, emit, handled
from better_compute.cli.app import ctx as open_ctx
from better_compute.errors import InvalidInput
from better_compute.model import CalendarPolicy
from better_compute.timeparse import parse_duration

if TYPE_CHECKING:
    from better_compute.render import advice as view
    from better_compute.service import calendar
else:
    from better_compute.lazy import lazy

    view = lazy("better_compute.render.advice")
    calendar = lazy("better_compute.service.calendar")

policy_app = typer.Typer(
    no_args_is_help=False, help="Calendar policy: limits on requests with a start."
)

DurOpt = Annotated[str | None, typer.Option(help="DURATION, e.g. 1d.")]


def _ms(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except InvalidInput as exc:
        raise InvalidInput(f"{flag}: {exc.message}") from None


def _sizes(text: str | None) -> tuple[int, ...]:
    if text is None:
        return ()
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise InvalidInput(f"--sizes {text[:40]!r}: use GPU counts separated by commas, like 1,4,8")
    return tuple(int(p) for p in parts)


@policy_app.command("set")
@handled
def policy_set(
    pool: str,
    min_duration: Annotated[str | None, typer.Option("--min-duration", help="DURATION.")] = None,
    max_duration: Annotated[str | None, typer.Option("--max-duration", help="DURATION.")] = None,
    min_lead: Annotated[
        str | None, typer.Option("--min-lead", help="Start at least this long after now.")
    ] = None,
    max_horizon: Annotated[
        str | None, typer.Option("--max-horizon", help="End at most this long after now.")
    ] = None,
    sizes: Annotated[
        str | None, typer.Option("--sizes", help="Allowed total GPUs per request: 1,4,8,16.")
    ] = None,
    commit: Annotated[
        bool, typer.Option("--commit", help="Placed calendar reservations are final.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Set (replace) the pool's calendar policy. Admins only."""
    wanted = CalendarPolicy(
        pool_id="",
        min_duration_ms=_ms("--min-duration", min_duration),
        max_duration_ms=_ms("--max-duration", max_duration),
        min_lead_ms=_ms("--min-lead", min_lead),
        max_horizon_ms=_ms("--max-horizon", max_horizon),
        sizes=_sizes(sizes),
        commit=commit,
    )
    p, name = calendar.policy_set(open_ctx(), pool, wanted)
    emit(as_json, view.policy_json(p, name), lambda: view.policy_human(p, name))


@policy_app.command("show")
@handled
def policy_show(pool: str, as_json: JsonFlag = False) -> None:
    """The pool's calendar policy (null when it has none)."""
    p, name = calendar.policy_show(open_ctx(), pool)
    emit(as_json, view.policy_json(p, name), lambda: view.policy_human(p, name))


@policy_app.command("clear")
@handled
def policy_clear(pool: str, as_json: JsonFlag = False) -> None:
    """Remove the pool's calendar policy. Admins only."""
    cleared, name = calendar.policy_clear(open_ctx(), pool)
    text = f"pool {name}: calendar policy cleared" if cleared else f"pool {name}: had no policy"
    emit(as_json, {"pool": name, "cleared": cleared}, text)
