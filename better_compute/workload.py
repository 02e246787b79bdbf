"""Workload files for `simulate`: the openb task list (CSV) and JSON Lines. Pure parsing.

Both become requests in arrival order, with instants in epoch ms. Trace times are offsets from the
ledger's instant `base` (openb's second 0 is `base`); `--compress K` divides every arrival's offset
from `base` by K, each request keeping its own duration (and its lead time to a `start`). The whole
file is read before anything is written: a bad line is INVALID_INPUT naming its line number.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction

from better_compute.errors import BetterComputeError, InvalidInput
from better_compute.inventory import (
    MAX_GPUS,
    MODEL_RE,
    NAME_RE,
    csv_int,
    csv_rows,
    keys_once,
    normal_model,
)
from better_compute.timeparse import (
    MAX_DURATION_MS,
    MAX_MS,
    is_relative,
    parse_duration,
    parse_time,
)

#: The one tenant of an openb replay: the trace names no users or teams.
OPENB_TENANT = "openb"
#: openb's qos for best-effort work, replayed as spot.
OPENB_SPOT_QOS = "BE"
OPENB_COLUMNS = ("num_gpu", "gpu_spec", "qos", "creation_time", "deletion_time")
JSONL_KEYS = (
    "at",
    "tenant",
    "gpus",
    "duration",
    "start",
    "gang",
    "topologyKey",
    "spot",
    "model",
    "key",
    "pool",
)
FORMATS = ("openb", "jsonl")


@dataclass(frozen=True)
class Request:
    """One request of a workload: what `reserve` is asked at instant `at`."""

    line: int
    at: int
    tenant: str
    gpus: int
    duration_ms: int
    start: int | None = None
    gang: int | None = None
    topology_key: str | None = None
    spot: bool = False
    models: tuple[str, ...] = ()
    key: str | None = None
    pool: str | None = None
    #: `start` as written when it is relative (`+2h`): the replay's start moves on every run, so
    #: a key's reuse compares this text, as `reserve --start +2h` run again does (README).
    start_text: str | None = None


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order (ties in file order), and the rows skipped as no request."""

    requests: tuple[Request, ...]
    #: When each row skipped as no request would have arrived (compressed as arrivals are): a
    #: replay that stops at --until counts those before it, as it counts its requests.
    skipped_at: tuple[int, ...] = ()

    @property
    def skipped(self) -> int:
        return len(self.skipped_at)

    def skipped_before(self, until: int | None) -> int:
        """The rows skipped as no request that arrive before `until` (all of them for None)."""
        if until is None:
            return self.skipped
        return sum(1 for at in self.skipped_at if at < until)


#: `--compress K`: a plain decimal number (no exponent, no fraction), read exactly.
_COMPRESS = re.compile(r"[0-9]{1,10}(?:\.[0-9]{1,9})?")
#: The largest K: a year of arrivals then falls within 32 ms. A larger one only piles every
#: arrival onto one instant, and an exponent such as 1e99999999 took minutes to read exactly.
MAX_COMPRESS = 1_000_000_000


def parse_compress(text: str) -> Fraction:
    """`--compress K`: a decimal number from 1 to MAX_COMPRESS (`100`, `2.5`)."""
    plain = text.strip()
    k = Fraction(plain) if _COMPRESS.fullmatch(plain) else None
    if k is None or not 1 <= k <= MAX_COMPRESS:
        raise InvalidInput(
            f"--compress must be a decimal number from 1 to {MAX_COMPRESS:,} (such as 100 or"
            f" 2.5), got {text!r}"
        )
    return k


def _arrive(base: int, at: int, compress: Fraction) -> int:
    """`at`, its offset from `base` divided by `compress` (floored to the millisecond)."""
    return base + (at - base) * compress.denominator // compress.numerator


def parse_workload(text: str, fmt: str, base: int, compress: Fraction = Fraction(1)) -> Workload:
    if fmt == "openb":
        return parse_openb(text, base, compress)
    if fmt == "jsonl":
        return parse_jsonl(text, base, compress)
    raise InvalidInput(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


# ---------------------------------------------------------------- openb


def parse_openb(text: str, base: int, compress: Fraction = Fraction(1)) -> Workload:
    """The openb task list (data README): a task with `num_gpu >= 1` is a reservation of
    `num_gpu` whole GPUs (a GPU-sharing task, `gpu_milli < 1000`, takes one whole GPU) from
    `creation_time` to `deletion_time` (seconds from the trace's start); `qos = BE` is spot;
    `gpu_spec` (`V100M16|V100M32`) lists the accepted models. Tasks without GPUs, and tasks whose
    deletion is not after their creation, are skipped and counted."""
    requests: list[Request] = []
    skipped: list[int] = []
    for line, row in csv_rows(text, OPENB_COLUMNS, "the openb task list"):
        gpus = csv_int(row, "num_gpu", line, 0, MAX_GPUS)
        created = csv_int(row, "creation_time", line, 0, MAX_MS // 1000)
        deleted = csv_int(row, "deletion_time", line, 0, MAX_MS // 1000)
        if "gpu_milli" in row:  # not needed (a shared GPU is taken whole), but checked: a bad
            csv_int(row, "gpu_milli", line, 0, 1000)  # one is a damaged file, not a task
        if gpus == 0 or deleted <= created:
            skipped.append(_arrive(base, base + created * 1000, compress))
            continue
        models = tuple(normal_model(m.strip()) for m in row["gpu_spec"].split("|") if m.strip())
        for model in models:
            if not MODEL_RE.fullmatch(model):
                raise InvalidInput(
                    f"line {line}: gpu_spec {row['gpu_spec'][:40]!r} is not a list"
                    " of models such as V100M16|V100M32"
                )
        at = base + created * 1000
        if at > MAX_MS:
            raise InvalidInput(f"line {line}: creation_time {created} is too far ahead")
        requests.append(
            Request(
                line=line,
                at=_arrive(base, at, compress),
                tenant=OPENB_TENANT,
                gpus=gpus,
                duration_ms=(deleted - created) * 1000,
                spot=row["qos"] == OPENB_SPOT_QOS,
                models=models,
            )
        )
    requests.sort(key=lambda r: (r.at, r.line))
    return Workload(tuple(requests), tuple(skipped))


# ---------------------------------------------------------------- JSON Lines


def _what(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _whole(value: object) -> object:
    """A JSON number with nothing after the point (`3600000.0`, as a writer of floats emits a
    whole number) as the integer it is; anything else as it is, to be checked and refused.
    Beyond 2**53 a float holds no exact whole number, but no field takes one that large (epoch
    ms there is the year 285,000): the range check that follows refuses it for what it is, too
    large ("too long"), not as a fraction."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _int(d: dict[str, object], key: str, lo: int, hi: int) -> int | None:
    value = _whole(d.get(key))
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidInput(f"{key} must be an integer from {lo} to {hi}, got {_what(value)}")
    return value


def _instant(d: dict[str, object], key: str, base: int) -> int | None:
    """Epoch ms, or the CLI's TIME forms (`+2h` counts from the ledger's instant)."""
    value = _whole(d.get(key))
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise InvalidInput(f"{key} must be epoch ms (0 or more) or a TIME, got {value}")
        value = str(value)
    if not isinstance(value, str):
        raise InvalidInput(f"{key} must be epoch ms or a TIME such as +2h, got {_what(value)}")
    try:
        return parse_time(value, base)
    except InvalidInput as exc:
        raise InvalidInput(f"{key}: {exc.message}") from None


def _relative_text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and is_relative(value) else None


def _duration(d: dict[str, object]) -> int:
    value = _whole(d.get("duration"))
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise InvalidInput(f"duration must be more than 0 ms, got {value}")
        # Any count past the longest duration reads as one past it: too long, whatever its
        # digits (a DURATION's number has a bounded length).
        text, shown = f"{min(value, MAX_DURATION_MS + 1)}ms", f"{_what(value)} ms"
    elif value is None:
        raise InvalidInput("duration is required: milliseconds or a DURATION such as 3h")
    elif not isinstance(value, str):
        whole = "whole " if isinstance(value, float) else ""
        raise InvalidInput(
            f"duration must be {whole}milliseconds or a DURATION such as 3h, got {_what(value)}"
        )
    else:
        text, shown = value, _what(value)
    try:
        return parse_duration(text)
    except InvalidInput as exc:  # its reason (more than 0, too long)
        raise InvalidInput(f"duration {shown}: {_reason(exc.message)}") from None


def _reason(message: str) -> str:
    """parse_duration's reason, without its echo of the text (`bad DURATION '…': reason`)."""
    return message.split("': ", 1)[-1]


def _text(d: dict[str, object], key: str) -> str | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{key} must be a non-empty string, got {_what(value)}")
    return value


def _models(d: dict[str, object]) -> tuple[str, ...]:
    value = d.get("model")
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(m, str) for m in items):
        raise InvalidInput(
            f"model must be a model, a comma-separated list or a list of models, got {_what(value)}"
        )
    models = tuple(normal_model(m.strip()) for m in items if m.strip())
    if not models or not all(MODEL_RE.fullmatch(m) for m in models):
        raise InvalidInput(f"model must name models such as h100 or v100m16, got {_what(value)}")
    return models


#: A line's object, each key once (the object_pairs_hook raises InvalidInput, not ValueError).
_REQUEST_KEYS_ONCE = keys_once("the request")


def _request(line: int, raw: str, base: int, compress: Fraction) -> Request:
    try:
        d = json.loads(raw, object_pairs_hook=_REQUEST_KEYS_ONCE)
    except (ValueError, RecursionError) as exc:
        if "digits" in str(exc):  # Python's limit on an integer's digits, not bad JSON
            raise InvalidInput("a number has too many digits") from None
        raise InvalidInput("not a JSON object (one request per line)") from None
    if not isinstance(d, dict):
        raise InvalidInput(f"must be a JSON object, got {_what(d)}")
    for key in d:
        if key not in JSONL_KEYS:
            raise InvalidInput(f"unknown key {_what(key)} (allowed: {', '.join(JSONL_KEYS)})")
    at = _instant(d, "at", base)
    if at is None:
        raise InvalidInput("at is required: epoch ms or a TIME such as +2h")
    if at < base:
        raise InvalidInput(
            f"at {at} is before the replay's start {base} (the ledger's instant, or --now when"
            " later); a replay only moves forward"
        )
    tenant = d.get("tenant")
    if not isinstance(tenant, str) or not NAME_RE.fullmatch(tenant):
        raise InvalidInput(f"tenant must be a tenant id such as acme, got {_what(tenant)}")
    gpus = _int(d, "gpus", 1, MAX_GPUS)
    if gpus is None:
        raise InvalidInput(f"gpus is required: an integer from 1 to {MAX_GPUS}")
    spot = d.get("spot")
    if spot is None:  # null is absent, as for every optional key
        spot = False
    if not isinstance(spot, bool):
        raise InvalidInput(f"spot must be true or false, got {_what(spot)}")
    arrival = _arrive(base, at, compress)
    start = _instant(d, "start", base)
    return Request(
        line=line,
        at=arrival,
        tenant=tenant,
        gpus=gpus,
        duration_ms=_duration(d),
        # The lead time to a calendar start is kept, as each request keeps its duration.
        start=None if start is None else min(MAX_MS, max(0, arrival + start - at)),
        gang=_int(d, "gang", 2, 64),
        topology_key=_text(d, "topologyKey"),
        spot=spot,
        models=_models(d),
        key=_text(d, "key"),
        pool=_text(d, "pool"),
        start_text=_relative_text(d.get("start")),
    )


_LINE_END = re.compile(r"\r\n|\r|\n")


def parse_jsonl(text: str, base: int, compress: Fraction = Fraction(1)) -> Workload:
    """One request per line: `{at, tenant, gpus, duration, start?, gang?, topologyKey?, spot?,
    model?, key?, pool?}`; blank lines are ignored. Lines end at `\n`, `\r\n` or `\r` (which
    JSON never allows unescaped in a string); str.splitlines would also break inside a string
    holding U+2028 or U+0085, which JSON allows unescaped."""
    requests = []
    for line, raw in enumerate(_LINE_END.split(text), start=1):
        if not raw.strip():
            continue
        try:
            requests.append(_request(line, raw, base, compress))
        except BetterComputeError as exc:
            raise InvalidInput(f"line {line}: {exc.message}") from None
    requests.sort(key=lambda r: (r.at, r.line))
    return Workload(tuple(requests))
