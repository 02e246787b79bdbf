"""What `migrate` prints: each table copied, its rows and its checksum."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.table import Table

from better_compute.model import JsonValue


def _where(db: str) -> str:
    """A URL without a password, should one have been written into it."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", db)


#: (table, rows, sha256) of each table copied (storage/copy.TableCopy).
Copied = Sequence[tuple[str, int, str]]


def doc(source: str, target: str, report: Copied, added: str | None) -> JsonValue:
    return {
        "from": _where(source),
        "to": _where(target),
        "tables": [{"table": t, "rows": n, "sha256": digest} for t, n, digest in report],
        "adminAdded": added,
    }


def table(source: str, target: str, report: Copied, added: str | None) -> Table:
    title = f"copied {_where(source)} to {_where(target)}: every table checked"
    if added is not None:
        title += f"; {added} was added as an admin there"
    view = Table(title=title, title_justify="left")
    view.add_column("table")
    view.add_column("rows", justify="right")
    view.add_column("sha256")
    for name, rows, digest in report:
        view.add_row(name, str(rows), digest[:16])
    return view
