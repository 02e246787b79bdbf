"""An option that takes one value, given twice, is refused before the command runs.

Click keeps the last value: `reserve --tenant acme … --tenant globex` booked for globex, and a
script that builds its arguments by appending could charge the wrong tenant without a word.
Which value was meant cannot be known, so it is INVALID_INPUT naming the option (a hostile
review, 2026-12-01). Flags (`--json` twice) and options meant to repeat (`--label`) are fine.

The command line is walked as Click parses it: a known option that takes a value consumes the
next word (or its `=value`), a word that names a subcommand descends into it, `--` ends options.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def repeated_option(command: Any, argv: Sequence[str]) -> str | None:
    """The message for the first single-value option given twice, or None."""
    seen: dict[str, str] = {}  # the option's parameter name -> the first value given
    i = 0
    options = _options(command)
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return None
        name, eq, value = word.partition("=")
        option = options.get(name) if name.startswith("--") else None
        if option is None:
            sub = getattr(command, "commands", {}).get(word) if not word.startswith("-") else None
            if sub is not None:  # a subcommand: its own options from here on
                command, options = sub, _options(sub)
            i += 1
            continue
        if _is_flag(option):
            i += 1
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        i += 1
        if option.multiple:
            continue
        key = f"{id(command)}:{option.name}"
        if key in seen:
            return (
                f"{name} is given twice ({seen[key]!r} and {value!r}); give it once: which one"
                " was meant cannot be known"
            )
        seen[key] = value
    return None


def _options(command: Any) -> dict[str, Any]:
    """Every spelling of every option of `command` (its long names, and `--no-x` of a flag)."""
    found: dict[str, Any] = {}
    for param in getattr(command, "params", ()):
        if getattr(param, "param_type_name", "") != "option":
            continue
        for spelling in (*param.opts, *param.secondary_opts):
            found[spelling] = param
    return found


def _is_flag(option: Any) -> bool:
    return bool(getattr(option, "is_flag", False) or getattr(option, "count", False))
