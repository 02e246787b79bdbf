"""The one error hierarchy. Each subclass carries its exit code and code name (PRODUCT.md §3)."""

from __future__ import annotations


class BetterComputeError(Exception):
    """Root of every error a user can cause. The CLI turns it into `error: CODE: message`."""

    code = "INTERNAL"
    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Internal(BetterComputeError):
    code = "INTERNAL"
    exit_code = 1


class InvalidInput(BetterComputeError):
    code = "INVALID_INPUT"
    exit_code = 2


class NotFound(BetterComputeError):
    code = "NOT_FOUND"
    exit_code = 3


class Conflict(BetterComputeError):
    code = "CONFLICT"
    exit_code = 4


class QuotaExceeded(BetterComputeError):
    code = "QUOTA_EXCEEDED"
    exit_code = 5


class Forbidden(BetterComputeError):
    code = "FORBIDDEN"
    exit_code = 6


class Unavailable(BetterComputeError):
    code = "UNAVAILABLE"
    exit_code = 7


class Replaced(Unavailable):
    """The ledger's file was replaced under the command (`restore`, `init --force`): still
    UNAVAILABLE. A replay says its requests went with the file it replaced (`path`)."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class Terminated(BaseException):
    """SIGTERM (`timeout`, systemd, a CI runner's cancel), taken by a long replay only once its
    transaction has committed (service/simulate.py). Like Ctrl-C, not an error of the command:
    what is committed stays, the CLI prints its notes (how far it got) and exits with the
    default action's status, 128 + SIGTERM."""

    exit_code = 143


class Damaged(Unavailable):
    """A ledger file of ours that cannot be opened: malformed, or a schema better-compute did not
    make. Still UNAVAILABLE; `init --force` and `restore` say how to replace it."""


def is_utf8(text: str) -> bool:
    """Whether the text can be written as UTF-8. Python keeps command-line bytes that are not
    UTF-8 as lone surrogates, and JSON's \\ud800 escape decodes to one: neither can be printed,
    put in a JSON document or stored on PostgreSQL, so input carrying one is refused."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
