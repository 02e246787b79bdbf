"""Modules imported on first use, so a command loads only what it runs (issue 8: start-up).

`get --json` must not pay for rich, dateutil or the placement engine just because `reserve`,
`timeline` or `demo` live in the same program. A command module names its dependencies with
`lazy("better_compute.service.booking")`; the import runs when an attribute is first read.
Type checkers see the real module (the callers import it under TYPE_CHECKING).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy(name: str) -> ModuleType:
    """The module `name`, executed on first attribute access (importlib.util.LazyLoader)."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module
