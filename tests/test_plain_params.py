"""Issue 8 start-up: cli/plain_params.py answers plain parameter values without pydantic, and
answers them exactly as Typer's own coercion does (which still decides everything else)."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer import _coercion, core

from better_compute.cli import app, plain_params

SAMPLES: tuple[Any, ...] = (
    "0",
    "7",
    "-3",
    "+3",
    "007",
    " 7",
    "7 ",
    "1_000",
    "1e3",
    "abc",
    "",
    "x y",
    "é中",
    "-0",
    "\udcff",  # an undecodable byte of argv, as Python hands it over
    "a\x00b",
    "\u0660",  # ARABIC-INDIC DIGIT ZERO: a digit to int(), not to the plain path
    "1\n",
    "9" * 18,
    "9" * 19,
    "-" + "9" * 30,
    5,
    -2,
    True,
    False,
    None,
    b"bytes",
    ("a", "b"),
    ["a"],
    [],
    ("1", 2),
    ["\udcff"],
)


def _parameters() -> list[Any]:
    """Every Typer parameter of every command of the whole app, global options included."""
    found: list[Any] = []

    def walk(command: Any) -> None:
        found.extend(p for p in command.params if isinstance(p, core._TyperParameter))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    return found


def _outcome(runtime: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        got = runtime.coerce(value, param=param, ctx=ctx)
    except Exception as exc:  # the message the user would read, whatever raised it
        return ("error", f"{type(exc).__name__}: {exc}")
    return ("value", (type(got).__name__, got))


def _lax_integer(param: Any, value: Any) -> bool:
    """A text for an int parameter that is not ASCII digits with an optional `-`, spaces around
    it aside: `+3`, `1_000`, `1e3`, other scripts' digits, a newline."""
    if param.type_descriptor.annotation is not int or type(value) is not str:
        return False
    text = value.strip(" \t")
    body = text[1:] if text.startswith("-") else text
    return not (body.isascii() and body.isdigit())


def test_a_whole_number_is_digits_only() -> None:
    """`--gpus 1_0` read as 10 GPUs, `+1` and `8.0` as whole numbers: refused, as the message
    says ("expected a whole number (digits only)")."""
    command = typer.main.get_command(app)
    gpus = next(p for p in command.commands["reserve"].params if p.name == "gpus")
    runtime, ctx = gpus.get_runtime_param(), typer._click.Context(command)
    for text in ("1_0", "+1", "8.0", "1e1", "\u0668", "0x8", "8\n"):
        assert _outcome(runtime, text, gpus, ctx) == (
            "error",
            f"BadParameter: {plain_params.BAD_INTEGER}",
        ), text
    for text, number in (("8", 8), (" 8 ", 8), ("08", 8), ("-2", -2), ("9" * 20, int("9" * 20))):
        assert _outcome(runtime, text, gpus, ctx) == ("value", ("int", number)), text


def test_installed_on_this_typer() -> None:
    assert plain_params.install() is True
    assert getattr(core._TyperParameter.get_runtime_param, "_plain", False)


def test_every_parameter_coerces_every_sample_as_typer_does() -> None:
    params = _parameters()
    command = typer.main.get_command(app)
    ctx = typer._click.Context(command)
    plain = 0
    for param in params:
        mine = param.get_runtime_param()
        theirs = _coercion.build_runtime_param(param.type_descriptor)
        plain += type(mine).__name__ == "PlainRuntimeParam"
        for value in SAMPLES:
            expected = _outcome(theirs, value, param, ctx)
            if _lax_integer(param, value):  # pydantic reads it; a whole number is digits only
                expected = ("error", f"BadParameter: {plain_params.BAD_INTEGER}")
            assert _outcome(mine, value, param, ctx) == expected, (
                param.name,
                param.type_descriptor.annotation,
                value,
            )
    assert plain > 50, plain  # the plain path does serve most of the app's parameters


@pytest.mark.parametrize(
    "annotation, value, plain",
    [
        (str, "x", True),
        (str, b"x", False),
        (int, "12", True),
        (int, "012", False),
        (int, "1" * 19, False),
        (bool, True, True),
        (bool, "yes", False),
        (list[str], ("a", "b"), True),
        (list[str], ("a", 1), False),
    ],
)
def test_what_counts_as_plain(annotation: Any, value: Any, plain: bool) -> None:
    assert (plain_params._plain(annotation, value) is not plain_params._NOT_PLAIN) is plain
