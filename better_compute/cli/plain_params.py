"""Start-up (issue 8): Typer's parameters coerced without pydantic when the value is plain.

This Typer coerces every parameter through a pydantic TypeAdapter, built on first use. Importing
pydantic and building the adapters cost a command more than its own work (about 60 ms of the
`get --json` process's 170 ms, and 6 MiB), although a `--tenant t0` is already the `str` it must
become. `install` gives Typer's parameters a coercion that answers the plain cases itself:

- a `str` option or argument given a `str`: that text;
- an `int` one (no min, max or clamp) given decimal digits with an optional `-`, up to 18 digits:
  `int()` of them;
- a `bool` one given a `bool`;
- a `list[str]` one given strings: the list of them.

Anything else (another type, constraints, a parser, a value in another form, a bad value) takes
Typer's own coercion, built as Typer builds it, so every message is Typer's and pydantic's.
tests/test_plain_params.py compares both on every parameter of every command. One departure: a
whole number is ASCII digits with an optional `-` (spaces around it allowed), where pydantic
also reads `1_0` as 10, `+1`, `8.0` and other scripts' digits; a typo such as `--gpus 1_0` must
not book ten GPUs. Those are refused with Typer's own words for a bad integer.

It patches Typer's private coercion hook (`typer.core._TyperParameter.get_runtime_param`); a
Typer without that hook (older ones coerce through click, without pydantic) is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

_DIGITS = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
#: What a whole number may be at all (after its surrounding spaces): see the module's doc.
_WHOLE = re.compile(r"-?[0-9]+")
#: Typer's message for a bad integer (cli/app.py puts it in plain words).
BAD_INTEGER = "Input should be a valid integer, unable to parse string as an integer"


def install() -> bool:
    """Patch Typer's parameters (once); False when this Typer has no such hook."""
    try:
        from typer import _coercion, core
    except ImportError:  # pragma: no cover - another Typer
        return False
    param: Any = getattr(core, "_TyperParameter", None)
    base: Any = getattr(_coercion, "RuntimeParam", None)
    build: Any = getattr(_coercion, "build_runtime_param", None)
    if param is None or base is None or build is None or not hasattr(param, "get_runtime_param"):
        return False  # pragma: no cover - another Typer
    if getattr(param.get_runtime_param, "_plain", False):
        return True

    class PlainRuntimeParam(base):  # type: ignore[misc]
        """Typer's RuntimeParam for one parameter: plain values here, the rest Typer's way."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            plain = _plain(self.annotation, value)
            if plain is not _NOT_PLAIN:
                return plain
            if self.annotation is int and type(value) is str and not _whole(value):
                from typer import BadParameter

                raise BadParameter(BAD_INTEGER, ctx=ctx, param=param)
            full = self.__dict__.get("full")
            if full is None:  # Typer's own coercion (pydantic and all), built on first need
                full = build(param.type_descriptor)
                object.__setattr__(self, "full", full)
            return full._coerce_value(value, param=param, ctx=ctx)

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            desc = self.type_descriptor
            if _eligible(desc):
                self._runtime_param = PlainRuntimeParam(
                    parameter_info=desc.parameter_info, annotation=desc.annotation
                )
            else:
                self._runtime_param = build(desc)
        return self._runtime_param

    get_runtime_param._plain = True  # type: ignore[attr-defined]
    param.get_runtime_param = get_runtime_param
    return True


_NOT_PLAIN = object()


def _eligible(desc: Any) -> bool:
    """A parameter whose plain values this module may answer: str, int, bool or list[str],
    with none of the settings that change how Typer coerces them."""
    info = desc.parameter_info
    if desc.annotation not in (str, int, bool, list[str]) or desc.file_annotation is not None:
        return False
    settings = ("parser", "min", "max", "clamp", "formats")
    return not any(getattr(info, name, None) for name in settings)


def _whole(text: str) -> bool:
    return _WHOLE.fullmatch(text.strip(" \t")) is not None


def _plain(annotation: Any, value: Any) -> Any:
    """The coerced value when it is plain, else _NOT_PLAIN (Typer's coercion decides)."""
    kind = type(value)
    if annotation is str:
        return value if kind is str else _NOT_PLAIN
    if annotation is int:
        if kind is int:
            return value
        if kind is str and _DIGITS.fullmatch(value):
            return int(value)
        return _NOT_PLAIN
    if annotation is bool:
        return value if kind is bool else _NOT_PLAIN
    if kind in (list, tuple) and all(type(v) is str for v in value):  # list[str]
        return list(value)
    return _NOT_PLAIN
