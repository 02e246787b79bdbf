"""The Typer app, its global options, and the one place errors become messages and exit codes."""

from __future__ import annotations

import codecs
import contextlib
import errno
import fcntl
import functools
import io
import json as jsonlib
import os
import sqlite3
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer

from better_compute import identity
from better_compute.cli import plain_params
from better_compute.cli.argv import repeated_option
from better_compute.errors import (
    BetterComputeError,
    Forbidden,
    InvalidInput,
    Terminated,
    Unavailable,
    is_utf8,
)
from better_compute.lazy import lazy
from better_compute.model import JsonValue, Window
from better_compute.storage.conn import Commits
from better_compute.timeparse import parse_time

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from better_compute.render import json as js
    from better_compute.service import context
    from better_compute.service.context import Ctx
    from better_compute.storage import db as storage_db

    HumanView = RenderableType | str | Callable[[], RenderableType | str] | None
else:
    js = lazy("better_compute.render.json")
    context = lazy("better_compute.service.context")
    storage_db = lazy("better_compute.storage.db")

plain_params.install()  # plain values need no pydantic (issue 8: start-up)

app = typer.Typer(
    name="better-compute",
    help=(
        "Book GPU capacity for teams sharing a fleet: now, later, as gangs, or as spot.\n\n"
        "TIME: 2026-09-28T08:00:00Z (UTC when no offset is given), epoch ms, now, or +2h / -30m"
        " from the ledger's time. DURATION: 90m, 2h, 1d12h, or 500ms."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@dataclass
class Globals:
    db: str = "better-compute.db"
    now_text: str | None = None
    principal: str | None = None  # --as: None acts as the operating-system user
    json: bool = False


G = Globals()


class _LazyConsole:
    """A rich Console made on first use: a command that prints JSON never imports rich."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Any = None

    def real(self) -> Console:
        """The Console itself, for rich APIs that use it as more than attributes (Progress)."""
        if self._console is None:
            from rich.console import Console

            from better_compute.render.console import PipeWideConsole

            _quiet_when_reader_goes(Console)
            self._console = PipeWideConsole(**self._options)
        return cast("Console", self._console)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)


#: markup=False: what people name (labels, reasons, reservation names) is printed as written.
#: With markup on, `[spare]` vanished from a table and `[/x]` crashed each command showing it.
_err = _LazyConsole(stderr=True, highlight=False, markup=False)
out = cast("Console", _LazyConsole(soft_wrap=False, highlight=False, markup=False))
err = cast("Console", _err)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
TenantOpt = Annotated[str, typer.Option("--tenant", help="The tenant (its id).")]
TenantFilter = Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")]
F = TypeVar("F", bound=Callable[..., Any])


def _report(code: str, message: str, as_json: bool) -> None:
    """The error on stderr. With stderr closed (`2>&-`) or full, the exit code alone tells it:
    failing to write it would make every error INTERNAL."""
    message = _one_line(message)
    if as_json:
        line = jsonlib.dumps({"error": {"code": code, "message": message}}) + "\n"
    else:
        line = f"error: {code}: {message}\n"
    if sys.stderr is None:
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line)
        sys.stderr.flush()


def _one_line(message: str) -> str:
    """An error is one line (PRODUCT.md §3), whatever it quotes: SQLite's integrity_check or a
    server's message may hold line breaks."""
    if "\n" not in message and "\r" not in message:
        return message
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def _fail(exc: BetterComputeError, as_json: bool) -> None:
    _report(exc.code, exc.message, as_json)
    raise typer.Exit(exc.exit_code)


def _refused_by_the_system(exc: Exception, *, committed: bool) -> BetterComputeError | None:
    """What the system refused that is no bug of ours: a path too long for it, bad input
    wherever it was typed (Path.exists() raises it before anything is opened); a full disk,
    which a retry may meet again (the output, or a file it writes). `committed`: the command
    changed the ledger before that, which a blind retry would do twice."""
    if not isinstance(exc, OSError):
        return None
    name = "" if exc.filename is None else str(exc.filename)
    shown = name if len(name) <= 60 else name[:57] + "..."
    if exc.errno == errno.ENAMETOOLONG:
        return InvalidInput(
            f"the path {shown!r} is too long for this system (most file systems allow 255"
            " bytes a name); give a shorter one"
        )
    if name and exc.errno in (errno.EACCES, errno.EPERM):  # who you are, not a bug of ours
        return Forbidden(
            f"cannot use {shown!r}: {exc.strerror} (its permissions, or its folders', leave"
            " you out: ask its owner)"
        )
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not full and (name or not _terminal_gone(exc)):
        return None
    where = f" {shown!r}" if name else " the output"
    then = "free some space" if full else "give it an output it can write to"
    if committed:
        return Unavailable(
            f"could not write{where}: {exc.strerror}, after the command's changes to the ledger"
            f" were committed: see them (`better-compute events`) before running it again, and"
            f" {then}"
        )
    return Unavailable(f"could not write{where}: {exc.strerror}; {then} first")


def _terminal_gone(exc: OSError) -> bool:
    """Output to a terminal that hung up (an ssh session dropped): EIO on a stdout that is a
    character device (a hung-up terminal no longer answers isatty). Any other I/O error is no
    refusal of the system's but a bug of ours."""
    if exc.errno != errno.EIO:
        return False
    try:
        return stat.S_ISCHR(os.fstat(sys.stdout.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):
        return False


def handled(fn: F) -> F:
    """Turn BetterComputeError into `error: CODE: message` and its exit code; bugs into INTERNAL."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json")) or G.json
        commits = Commits.made
        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # what is still buffered is written here, where failing is told
            return result
        except BetterComputeError as exc:
            _fail(exc, as_json)
        except (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError) as exc:
            _fail(
                BetterComputeError(f"{type(exc).__name__}: {exc} (a bug; please report it)"),
                as_json,
            )
        except sqlite3.DatabaseError as exc:  # a damaged or unreadable file, not a bug of ours
            if "readonly" in str(exc).lower():
                _fail(storage_db.read_only_refusal(G.db), as_json)
            then = ""
            if Commits.made > commits:  # a full disk midway through a replay, say
                then = (
                    ", after some of the command's changes were committed: see them"
                    " (`better-compute events`) before running it again"
                )
            _fail(Unavailable(f"database {G.db!r} cannot be used: {exc}{then}"), as_json)
        except KeyboardInterrupt as exc:  # Ctrl-C; a use case may say what stands (simulate)
            for note in getattr(exc, "__notes__", ()):
                sys.stderr.write(f"interrupted: {note}\n")
            raise
        except Terminated as exc:  # SIGTERM, taken by a replay between its transactions
            notes = getattr(exc, "__notes__", ())
            sys.stderr.write("".join(f"terminated: {note}\n" for note in notes) or "terminated\n")
            raise SystemExit(exc.exit_code) from None
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:  # the reader went away (`| head`): not a bug, and no message
            _reader_gone()
        except Exception as exc:  # the one place a bug becomes a message instead of a traceback
            refused = _refused_by_the_system(exc, committed=Commits.made > commits)
            if refused is not None:
                if isinstance(refused, Unavailable):
                    _drop_output()  # what stays buffered can never be written either
                _fail(refused, as_json)
            if os.environ.get("BETTER_COMPUTE_DEBUG"):
                raise
            _fail(
                BetterComputeError(f"{type(exc).__name__}: {exc} (a bug; please report it)"),
                as_json,
            )

    return wrapper  # type: ignore[return-value]


def me() -> str:
    """Who runs this process, and who `--as` claims to be (checked against the admins)."""
    if G.principal is not None and not G.principal.strip():
        raise InvalidInput(
            "--as (or BETTER_COMPUTE_PRINCIPAL) is empty: name the principal to act as, or leave"
            " it out to act as yourself"
        )
    return identity.os_user()


def ctx() -> Ctx:
    """The ledger, the instant reads see, and the principal acting: resolved once per command."""
    return context.open_ctx(G.db, G.now_text, me(), G.principal)


def emit(as_json: bool, doc: JsonValue, human_view: HumanView = None) -> None:
    """One JSON document on stdout, or the view for people (built only when it is shown)."""
    if as_json or G.json:
        sys.stdout.write(js.dumps(doc) + "\n")
    elif human_view is not None:
        view = human_view() if callable(human_view) else human_view
        if isinstance(view, str):  # plain lines (events, messages): written as they are, since
            sys.stdout.write(view + "\n")  # rich took 15 min and 3 GB for a million events
        else:
            out.print(view)


@contextmanager
def progress_bar(as_json: bool, what: str) -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar on stderr, only for people at a terminal; yields `advance`.
    Hidden (--json, a pipe), it is a no-op that a replay of thousands of requests calls for
    nothing; with --json, rich is not even imported."""
    if as_json or G.json or not err.is_terminal:
        yield _no_progress
        return
    from rich.progress import Progress

    with Progress(console=_err.real(), transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _no_progress(done: int, total: int) -> None:
    """What a hidden progress bar does with each step: nothing."""


def _print_version(value: bool) -> None:
    if value:
        from better_compute import __version__

        # An eager option: --json is not read yet when it runs.
        _say_version(f"better-compute {__version__}\n", as_json="--json" in sys.argv[1:])
        raise typer.Exit(0)


@handled
def _say_version(line: str, as_json: bool) -> None:
    """The line, written and flushed as every command's output is (handled): a reader gone is
    141 and a full disk UNAVAILABLE, not Python's "Exception ignored" at exit."""
    sys.stdout.write(line)


@app.callback()
def main_options(
    db: Annotated[
        str, typer.Option("--db", envvar="BETTER_COMPUTE_DB", help="The database file.")
    ] = "better-compute.db",
    now_: Annotated[
        str | None,
        typer.Option(
            "--now",
            envvar="BETTER_COMPUTE_NOW",
            help="The instant to act at (TIME); default: the clock.",
        ),
    ] = None,
    as_: Annotated[
        str | None,
        typer.Option(
            "--as",
            envvar="BETTER_COMPUTE_PRINCIPAL",
            help="Act as this principal (admins only); default: the operating-system user.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output for every command.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """better-compute: reserve GPUs now or later, as gangs or spot; tick moves the lifecycle."""
    G.db, G.now_text, G.principal, G.json = db, now_, as_, as_json


PoolOpt = Annotated[
    str | None, typer.Option("--pool", help="Pool id or name (optional with one pool).")
]


def models_of(model: str | None) -> tuple[str, ...]:
    """`--model`: one model or a comma-separated list, compared without case; given but naming
    none (`--model ,`) is refused rather than read as "any model"."""
    models = tuple(sorted({m.strip().lower() for m in (model or "").split(",") if m.strip()}))
    if model is not None and not models:
        raise InvalidInput("--model needs a model or a comma-separated list, such as h100,a100")
    return models


def window_of(start: str, until: str, at: int) -> Window:
    return Window(parse_time(start, at), parse_time(until, at))


def only(word: str) -> typer.Typer:
    """The app with just the command or group named `word` (issue 8: start-up).

    Typer builds every registered command's parameters from its signature before it parses
    anything: `pool show` would first build setup's 25 commands. The copy shares everything
    else with `app`, which stays whole."""
    import copy

    sub = copy.copy(app)
    sub.registered_commands = [c for c in app.registered_commands if _word_of(c) == word]
    sub.registered_groups = [g for g in app.registered_groups if g.name == word]
    return sub if sub.registered_commands or sub.registered_groups else app


def _word_of(command: Any) -> str:
    """The word a registered command answers to (Typer's rule for an unnamed one)."""
    return str(command.name or command.callback.__name__.lower().replace("_", "-"))


def _quiet_when_reader_goes(console_class: type[Console]) -> None:
    """rich ends a write to a closed pipe with SystemExit(1), which §3 keeps for bugs: every
    rich console, ours and Typer's help, ends as SIGPIPE would instead (_reader_gone), as JSON
    output does when its reader went away (`| head`)."""
    console_class.on_broken_pipe = lambda self: _reader_gone()  # type: ignore[method-assign]


def _reader_gone() -> None:
    """End as a process killed by SIGPIPE would (status 128 + 13), without a message: the
    output was cut where the reader stopped reading. Standard output goes to /dev/null first,
    so that flushing it at exit raises no second BrokenPipeError."""
    _drop_output()
    sys.exit(141)


def _drop_output() -> None:
    """Standard output goes to /dev/null from here on: what is still buffered is dropped
    there, so flushing it at exit raises nothing more. (A stream without a file, as tests
    capture it, is left as it is.)"""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)


def _nowhere_to_write(as_json: bool) -> None:
    """A command whose standard output is closed, or open for reading only, would do its work
    and then fail to say what it did (after a `reserve` had committed): refused before anything
    is done."""
    _report(
        "INVALID_INPUT",
        "standard output is closed or not open for writing; give the command somewhere to"
        " write (>/dev/null)",
        as_json,
    )
    sys.exit(InvalidInput.exit_code)


def _writable(stream: Any) -> bool:
    """Whether the stream's file is open for writing (what else it is, its writes will tell)."""
    try:
        flags = fcntl.fcntl(stream.fileno(), fcntl.F_GETFL)
    except (AttributeError, OSError, ValueError):  # no file of its own (a test's capture)
        return True
    return flags & os.O_ACCMODE != os.O_RDONLY


def _sane_columns() -> None:
    """rich takes COLUMNS as the width, whatever it says: at 0 every table, and Typer's help,
    printed nothing. Below MIN_COLUMNS it is taken as 80, for our consoles and Typer's alike."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) < MIN_COLUMNS:
        os.environ["COLUMNS"] = "80"


MIN_COLUMNS = 20


def _any_encoding() -> None:
    """Output in whatever encoding stdout and stderr have (PYTHONIOENCODING=latin-1, an old
    locale): what it cannot encode is written as a JSON escape (`\\u2013`), so JSON stays valid
    and loses nothing, and a dash in a table no longer fails (INTERNAL; `--help`: a traceback)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and not _utf(stream.encoding):
            codecs.register_error(_ESCAPE, _json_escape)
            stream.reconfigure(errors=_ESCAPE)


_ESCAPE = "better-compute-json-escape"


def _utf(encoding: str) -> bool:
    try:
        return codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return False


def _json_escape(exc: UnicodeError) -> tuple[str, int]:
    """The unencodable characters as JSON writes them with ensure_ascii (a pair of `\\u`
    escapes beyond the first 65,536 code points)."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    escaped = []
    for char in exc.object[exc.start : exc.end]:
        code = ord(char)
        if code > 0xFFFF:
            code -= 0x10000
            escaped.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            escaped.append(f"\\u{code:04x}")
    return "".join(escaped), exc.end


def _whole_writes() -> None:
    """Standard output written whole, or not at all. Unbuffered (PYTHONUNBUFFERED, `python -u`),
    its text layer hands each write to the file once and drops what a partial write left: a
    listing cut short by its reader (`| head`) ended with status 0, the rest lost. A buffered
    layer writes until all is out or the pipe is gone (BrokenPipeError: status 141)."""
    stdout = sys.stdout
    raw = getattr(stdout, "buffer", None)
    if isinstance(stdout, io.TextIOWrapper) and isinstance(raw, io.RawIOBase):
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(raw),
            encoding=stdout.encoding,
            errors=stdout.errors,
            line_buffering=stdout.line_buffering,
            write_through=True,  # each write reaches the buffer at once, as unbuffered asked
        )


#: The coercion's words for a value of the wrong form, in the words the rest of the CLI uses.
_PLAIN = {
    "Input should be a valid integer, unable to parse string as an integer": (
        "expected a whole number (digits only)"
    ),
    "Input should be a valid number, unable to parse string as a number": "expected a number",
}


def _plain_words(text: str) -> str:
    for jargon, plain in _PLAIN.items():
        text = text.replace(jargon, plain)
    return text


def _global_envvar(command: Any, option: str | None) -> str | None:
    """The environment variable of `option` when it is a global option that has one (--db,
    --now, --as: the app's callback declares both), else None. Global options come before the
    command (PRODUCT.md §3), and a newcomer often writes them after it."""
    for param in command.params:
        if option in getattr(param, "opts", ()) and isinstance(param.envvar, str):
            return param.envvar
    return None


def main(prepare: Callable[[Any], None] | None = None, word: str | None = None) -> None:
    """Entry point: Typer's own usage errors are reported in our format too (exit 2).
    `prepare` adjusts the built command first (shell completion's value lookups); with `word`,
    only that command or group is built (see `only`)."""
    argv = sys.argv[1:]
    if sys.stdout is None or not _writable(sys.stdout):  # `>&-`, or `1</dev/null`
        _nowhere_to_write("--json" in argv)
    _any_encoding()
    _whole_writes()
    _sane_columns()
    for i, arg in enumerate(argv, 1):
        if not is_utf8(arg):  # bytes the locale could not decode, kept as surrogates by Python
            _report(
                "INVALID_INPUT",
                f"argument {i} is not valid UTF-8 text; give names, labels and reasons in UTF-8",
                "--json" in argv,
            )
            sys.exit(InvalidInput.exit_code)
    command = typer.main.get_command(app if word is None else only(word))
    if prepare is not None:
        prepare(command)
    if "--help" in argv or not argv:  # Typer prints help with a rich Console of its own
        from rich.console import Console

        _quiet_when_reader_goes(Console)
    twice = None if "--help" in argv else repeated_option(command, argv)
    if twice is not None:
        _report("INVALID_INPUT", twice, "--json" in argv)
        sys.exit(InvalidInput.exit_code)
    try:
        code = command.main(args=argv, prog_name="better-compute", standalone_mode=False)
    except typer.Exit as exc:  # Typer turns Ctrl-C into Exit(130); a write in progress rolls back
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("aborted\n")
        sys.exit(130)
    except Exception as exc:
        # The parser's usage errors (unknown option, missing or malformed value) carry these two.
        message = getattr(exc, "format_message", None)
        if message is None or not hasattr(exc, "exit_code"):
            raise
        text = _plain_words(str(message()).strip())
        option = getattr(exc, "option_name", None)
        envvar = _global_envvar(command, option)
        # `list --db x.db`: a global option after the command, which does not know it (not
        # `--db` with its value left out, which is said as it is)
        if envvar is not None and type(exc).__name__ == "NoSuchOption":
            text = (
                f"{option} is a global option: give it before the command"
                f" (better-compute {option} VALUE COMMAND …), or as {envvar}"
            )
        if text:  # empty when a bare group printed its help (no_args_is_help)
            where = getattr(getattr(exc, "ctx", None), "command_path", None) or "better-compute"
            _report("INVALID_INPUT", f"{text} (see `{where} --help`)", "--json" in argv)
        sys.exit(InvalidInput.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
