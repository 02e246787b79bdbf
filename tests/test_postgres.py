"""PostgreSQL ledgers (issue 9): what `--db postgresql://…` does."""

from __future__ import annotations

import pytest
from conftest import invoke


@pytest.mark.parametrize("command", [["init"], ["get", "rsv_x"], ["list"], ["backup", "x.db"]])
def test_a_postgres_url_is_not_supported_yet_and_says_so(command: list[str]) -> None:
    result = invoke(["--db", "postgresql://someone@db.example/ledger", *command])
    assert result.exit_code == 2, result.stderr
    assert "SQLite ledger file" in result.stderr or "not supported" in result.stderr
    assert "init" not in result.stderr.split("INVALID_INPUT:", 1)[1]
