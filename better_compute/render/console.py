"""The rich Console every command prints through (cli/app.py makes it on first use)."""

from __future__ import annotations

import os

from rich.console import Console, ConsoleDimensions

#: The width of output that goes to a pipe or a file when COLUMNS does not say. rich takes 80
#: there, which cut a long tenant name short (`a-very-lo…`) in a table saved to a file or read
#: by `grep`, and broke a long message across lines; a table stays as wide as its cells need up
#: to this. A terminal keeps its own width.
PIPED_WIDTH = 240


class PipeWideConsole(Console):
    """A Console PIPED_WIDTH wide when it writes to no terminal and COLUMNS gives no width. Asked at
    each use, as rich asks its own size: one process may print to several outputs (tests)."""

    @property
    def size(self) -> ConsoleDimensions:
        found = super().size
        if self.is_terminal or os.environ.get("COLUMNS", "").isdigit():  # as rich reads it
            return found
        return ConsoleDimensions(PIPED_WIDTH, found.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self.width, self.height = new_size
