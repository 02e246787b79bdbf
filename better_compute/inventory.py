"""The inventory file (PRODUCT.md §9): parse and validate it, and write it back for export. Pure.

Every problem raises InvalidInput naming the JSON path, e.g.
`pools[0].nodes[2].gpus.count: must be an integer from 1 to 64, got "8"`. A parsed Inventory is
canonical: pools, nodes, tenants and labels sorted by name, so export → import round-trips.
An optional key given as null counts as absent.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from better_compute.errors import InvalidInput, is_utf8
from better_compute.model import FABRIC_DOMAIN
from better_compute.model import NAME_RE as NAME_RE  # re-exported: setup and workload use it

MODEL_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
MAX_GPUS = 64
MAX_INT = 2**31 - 1  # cap on cliques and quotas: far above any fleet, far below SQLite's limit

#: Label limits, as Kubernetes sets them for a key's name and a whole prefixed key: enough for any
#: rack or zone name, small enough that a label can't grow a row or an event without bound.
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 253

_NAME_WHAT = "a name of 1 to 63 letters, digits, '.', '_' or '-' starting with a letter or digit"
_MODEL_WHAT = "a model name of letters, digits, '.', '_' or '-' (like h100)"
_SIMPLE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Labels = tuple[tuple[str, str], ...]


#: What a file may leave out of a pool or a node that exists, to keep it as it is: an absent
#: key keeps, as in a JSON merge patch, while `null` or `{}` says "none" (service/setup.py).
KEEP_POOL = frozenset({"labels"})
KEEP_NODE = frozenset({"labels", "fabric", "nvlinkGroups"})


@dataclass(frozen=True)
class InventoryNode:
    name: str
    labels: Labels
    gpus: int
    model: str
    nvlink_groups: int = 1
    fabric_cluster: str | None = None
    fabric_clique: int | None = None
    #: The KEEP_NODE keys the file left out (their fields above hold the defaults).
    omitted: frozenset[str] = field(default=frozenset(), compare=False)
    #: Its JSON path in the file (`pools[0].nodes[2]`), for errors found against the ledger
    #: after parsing sorted the nodes; "" when it came from no JSON file.
    at: str = field(default="", compare=False)


@dataclass(frozen=True)
class InventoryPool:
    name: str
    labels: Labels
    nodes: tuple[InventoryNode, ...]
    omitted: frozenset[str] = field(default=frozenset(), compare=False)


@dataclass(frozen=True)
class InventoryTenant:
    id: str
    quota_gpus: int | None = None
    #: The path of a quota the file gave as none (null, {} or {"gpus": null}), else "": an
    #: import cannot remove a tenant's cap, so it refuses that, where it used to keep the cap.
    no_cap_at: str = field(default="", compare=False)


@dataclass(frozen=True)
class Inventory:
    pools: tuple[InventoryPool, ...]
    tenants: tuple[InventoryTenant, ...] = ()


def normal_model(text: str) -> str:
    """Model names compare without regard to case: they are stored and compared lowercased
    (openb writes `V100M16`; `--model v100m16` and `--model V100M16` mean the same GPUs)."""
    return text.lower()


def nvlink_group_of(index: int, count: int, groups: int) -> int:
    """The NVLink group of GPU `index` on a node of `count` GPUs split evenly into `groups`."""
    return index // (count // groups)


def check_label(key: str, value: str, where: str) -> None:
    """The one rule for labels, shared by --label, `node label` and the inventory file: what
    `key=value` on the command line can write (no '=' in the key, a value), within lengths."""
    if not key or "=" in key or not value:
        raise InvalidInput(
            f"{where}: label {_got(key)}: {_got(value)} must have a key without '=' and a value,"
            " as key=value on the command line, such as rack=r1"
        )
    if not (key + value).isprintable():
        raise InvalidInput(
            f"{where}: label {_got(key)}: {_got(value)} must be printable text, without newlines,"
            " tabs or other control characters"
        )
    for what, text, most in (("key", key, MAX_LABEL_KEY), ("value", value, MAX_LABEL_VALUE)):
        if len(text) > most:
            raise InvalidInput(
                f"{where}: label {what} {_got(text)} has {len(text)} characters; label keys have"
                f" at most {MAX_LABEL_KEY} and values at most {MAX_LABEL_VALUE}"
            )


def label_pairs(pairs: Sequence[str], flag: str, example: str) -> Labels:
    """`k=v` pairs from the command line, each key once (a key given twice with two values is a
    mistake, not a choice: which one was meant?)."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InvalidInput(f"{flag} {pair[:60]!r} must look like key=value, such as {example}")
        check_label(key, value, flag)
        if key in labels and labels[key] != value:
            raise InvalidInput(f"{flag} gives {key!r} twice ({labels[key]!r} and {value!r})")
        labels[key] = value
    return tuple(sorted(labels.items()))


# --- parsing -------------------------------------------------------------------------------------


def _at(path: str, key: str) -> str:
    """`path.key`, or `path["odd key"]` when the key would make the path ambiguous."""
    if _SIMPLE_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _got(value: object) -> str:
    """`value` as JSON for a message, with what a terminal would act on rather than show (a
    right-to-left override, a zero-width space) escaped as JSON escapes it: json.dumps leaves
    such format characters raw (a review)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # only from Python callers: not JSON at all
        text = type(value).__name__
    text = "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in text)
    return text if len(text) <= 40 else text[:39] + "…"


def _bad(path: str, what: str, value: object) -> InvalidInput:
    if value is None:
        return InvalidInput(f"{path}: required, must be {what}")
    return InvalidInput(f"{path}: must be {what}, got {_got(value)}")


def _object(value: object, path: str, allowed: tuple[str, ...]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _bad(path or "inventory", "an object", value)
    for key in value:
        if key not in allowed:
            raise InvalidInput(
                f"{_at(path, str(key))}: unknown key (allowed: {', '.join(allowed)})"
            )
    return value


def _list(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        raise _bad(path, "a list", value)
    return value


def _name(value: object, path: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise _bad(path, _NAME_WHAT, value)
    return value


def _int(value: object, path: str, lo: int, hi: int, extra: str = "") -> int:
    # bool is an int in Python but never in the file: `true` is not a GPU count.
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise _bad(path, f"an integer from {lo} to {hi}{extra}", value)
    return value


def _labels(value: object, path: str, *, node: bool = False) -> Labels:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _bad(path, "an object of string labels", value)
    for key, val in value.items():
        if not isinstance(key, str) or not key:
            raise InvalidInput(f"{path}: label keys must be non-empty strings, got {_got(key)}")
        if node and key == FABRIC_DOMAIN:
            # Derived from the GPUs' fabric (model.fabric_domain): an operator value is ignored.
            raise InvalidInput(f"{_at(path, key)}: is derived; set gpus.fabric instead")
        if not isinstance(val, str):  # null too: a label has a value or is left out
            raise InvalidInput(f"{_at(path, key)}: must be a string, got {_got(val)}")
        check_label(key, val, path)
    return tuple(sorted(value.items()))


def _node(value: object, path: str) -> InventoryNode:
    d = _object(value, path, ("name", "labels", "gpus"))
    name = _name(d.get("name"), _at(path, "name"))
    labels = _labels(d.get("labels"), _at(path, "labels"), node=True)
    gpath = _at(path, "gpus")
    g = _object(d.get("gpus"), gpath, ("count", "model", "nvlinkGroups", "fabric"))
    count = _int(g.get("count"), _at(gpath, "count"), 1, MAX_GPUS)
    raw_model = g.get("model")
    model = normal_model(raw_model) if isinstance(raw_model, str) else ""
    if not MODEL_RE.fullmatch(model):
        raise _bad(_at(gpath, "model"), _MODEL_WHAT, raw_model)
    raw_groups, groups_path = g.get("nvlinkGroups"), _at(gpath, "nvlinkGroups")
    divides = f" that divides {count} evenly"
    groups = 1 if raw_groups is None else _int(raw_groups, groups_path, 1, count, divides)
    if count % groups:
        raise _bad(groups_path, f"an integer from 1 to {count}{divides}", groups)
    cluster: str | None = None
    clique: int | None = None
    if g.get("fabric") is not None:
        fpath = _at(gpath, "fabric")
        f = _object(g["fabric"], fpath, ("cluster", "clique"))
        cluster = _name(f.get("cluster"), _at(fpath, "cluster"))
        clique = _int(f.get("clique"), _at(fpath, "clique"), 0, MAX_INT)
    omitted = ({"labels"} - d.keys()) | ({"fabric", "nvlinkGroups"} - g.keys())
    return InventoryNode(
        name, labels, count, model, groups, cluster, clique, frozenset(omitted), path
    )


def _unique(seen: dict[str, str], kind: str, name: str, path: str) -> None:
    if name in seen:
        raise InvalidInput(f"{path}: duplicate {kind} {json.dumps(name)} (also {seen[name]})")
    seen[name] = path


def parse_inventory(doc: object) -> Inventory:
    """Validate a decoded inventory document (json.loads output) into a canonical Inventory."""
    top = _object(doc, "", ("pools", "tenants"))
    pools: list[InventoryPool] = []
    pool_names: dict[str, str] = {}
    node_names: dict[str, str] = {}  # node names are unique across the whole file
    for i, p in enumerate(_list(top.get("pools"), "pools")):
        path = f"pools[{i}]"
        d = _object(p, path, ("name", "labels", "nodes"))
        name = _name(d.get("name"), _at(path, "name"))
        if name.startswith("pool_"):
            raise InvalidInput(
                f"{_at(path, 'name')}: pool name {json.dumps(name)} may not start with pool_"
                " (that is how ids look)"
            )
        _unique(pool_names, "pool name", name, _at(path, "name"))
        labels = _labels(d.get("labels"), _at(path, "labels"))
        nodes: list[InventoryNode] = []
        raw_nodes = d.get("nodes")
        for j, n in enumerate([] if raw_nodes is None else _list(raw_nodes, _at(path, "nodes"))):
            node = _node(n, f"{path}.nodes[{j}]")
            _unique(node_names, "node name", node.name, f"{path}.nodes[{j}].name")
            nodes.append(node)
        omitted = KEEP_POOL - d.keys()
        ordered = tuple(sorted(nodes, key=lambda n: n.name))
        pools.append(InventoryPool(name, labels, ordered, frozenset(omitted)))
    tenants: list[InventoryTenant] = []
    tenant_ids: dict[str, str] = {}
    raw_tenants = top.get("tenants")
    for i, t in enumerate([] if raw_tenants is None else _list(raw_tenants, "tenants")):
        path = f"tenants[{i}]"
        d = _object(t, path, ("id", "quota"))
        tid = _name(d.get("id"), _at(path, "id"))
        _unique(tenant_ids, "tenant id", tid, _at(path, "id"))
        gpus: int | None = None
        if d.get("quota") is not None:
            q = _object(d["quota"], _at(path, "quota"), ("gpus",))
            if q.get("gpus") is not None:
                gpus = _int(q["gpus"], f"{path}.quota.gpus", 0, MAX_INT)
        said_none = "quota" in d and gpus is None  # null, {} or {"gpus": null}
        tenants.append(InventoryTenant(tid, gpus, _at(path, "quota") if said_none else ""))
    return Inventory(
        tuple(sorted(pools, key=lambda p: p.name)), tuple(sorted(tenants, key=lambda t: t.id))
    )


class Twice(dict[str, object]):
    """An object read with a key given twice (keys_once with `marked`): `key` is the first."""

    key = ""


def keys_once(
    what: str, *, marked: list[Twice] | None = None
) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    """json.loads' object_pairs_hook refusing a key given twice in one object: json.loads would
    silently keep the last of the two, and a file with both is a mistake (`what` names it).
    With `marked`, such an object is returned as a Twice instead, and added to it, for the
    caller to name it by its path in the document (the hook cannot know where it is)."""

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        d: dict[str, object] = {}
        twice: str | None = None
        for k, v in pairs:
            if k in d and twice is None:
                if marked is None:
                    raise InvalidInput(f"{what} has the key {json.dumps(k)} twice in one object")
                twice = k
            texts = v if isinstance(v, list) else [v]
            if not all(is_utf8(t) for t in (k, *texts) if isinstance(t, str)):
                raise InvalidInput(
                    f"{what} has text that is not UTF-8 (a lone surrogate such as \\ud800) at"
                    f" the key {json.dumps(k)}"
                )
            d[k] = v
        if twice is None or marked is None:  # (`twice` is set only with `marked`)
            return d
        found = Twice(d)
        found.key = twice
        marked.append(found)
        return found

    return hook


def _twice_in(value: object, path: str) -> tuple[str, str] | None:
    """The path of the first object, in document order, that has a key twice, and that key."""
    if isinstance(value, Twice):
        return path, value.key
    if isinstance(value, dict):
        inside: Iterable[tuple[str, object]] = ((_at(path, k), v) for k, v in value.items())
    elif isinstance(value, list):
        inside = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, v in inside:
        found = _twice_in(v, where)
        if found is not None:
            return found
    return None


def load_inventory_text(text: str) -> Inventory:
    """Parse inventory JSON text; bad JSON names the line and column."""
    try:
        marked: list[Twice] = []
        doc = json.loads(text, object_pairs_hook=keys_once("inventory", marked=marked))
        twice = _twice_in(doc, "") if marked else None  # the walk only for a file that has one
    except json.JSONDecodeError as e:
        first = text.lstrip("\ufeff \t\r\n").split("\n", 1)[0].split(",")
        looks = (  # openb's node list, read without its --format
            "; its first line is a CSV header naming openb's columns: add --format openb-nodes"
            if all(c in (h.strip() for h in first) for c in OPENB_NODE_COLUMNS)
            else ""
        )
        raise InvalidInput(
            f"inventory is not valid JSON: line {e.lineno} column {e.colno}: {e.msg}{looks}"
        ) from None
    except ValueError:  # an integer of thousands of digits: Python refuses to read it
        raise InvalidInput(
            "inventory is not valid JSON: a number has thousands of digits"
        ) from None
    except RecursionError:
        raise InvalidInput("inventory is not valid JSON: it is nested too deeply") from None
    if twice is not None:
        where, key = twice
        raise InvalidInput(
            f"{where or 'inventory'}: the key {json.dumps(key)} is given twice in one object"
        )
    return parse_inventory(doc)


# --- openb node lists (CSV) ---------------------------------------------------------------------

#: The columns read from an openb node list (others, such as cpu_milli, are ignored).
OPENB_NODE_COLUMNS = ("sn", "gpu", "model")


@dataclass(frozen=True)
class OpenbNodes:
    """An openb node list as one pool, how many rows were skipped (nodes without GPUs), and the
    line of each node's row (a refusal names the line, not a JSON path the file never had)."""

    inventory: Inventory
    skipped: int
    lines: Mapping[str, int] = field(default_factory=dict)

    def in_file_terms(self, exc: InvalidInput) -> InvalidInput:
        """A refusal of the import, naming a node's row by its line: `pools[p].nodes[n1].gpus.
        count: …` becomes `line 3 (n1): …`."""
        found = _NODE_PATH.match(exc.message)
        line = None if found is None else self.lines.get(found.group(1).lower())
        if found is None or line is None:
            return exc
        return InvalidInput(f"line {line} ({found.group(1)}): {found.group(2)}")


#: A refusal's JSON path to one node of a pool, and what follows it.
_NODE_PATH = re.compile(r"pools\[[^\]]*\]\.nodes\[([^\]]+)\][^:]*: (.*)", re.DOTALL)


def csv_rows(text: str, needed: tuple[str, ...], what: str) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV text with a header naming at least `needed`; every row must
    have as many fields as the header. Errors name the line."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise InvalidInput(f"{what} is empty: expected a CSV header ({','.join(needed)}, …)")
        header = [h.strip() for h in header]
        repeated = sorted({h for h in header if header.count(h) > 1})
        if repeated:
            raise InvalidInput(
                f"line 1: {what} names column {', '.join(repeated)} more than once"
                " (each column once)"
            )
        missing = [c for c in needed if c not in header]
        if missing:
            looks = (
                "; the file starts with '{': is it JSON? check --format"
                if text.lstrip("\ufeff \t\r\n").startswith("{")
                else ""
            )
            raise InvalidInput(
                f"line 1: {what} has no column {', '.join(missing)} (a CSV header with"
                f" {','.join(needed)}, … is expected){looks}"
            )
        rows: list[tuple[int, dict[str, str]]] = []
        for fields in reader:
            line = reader.line_num
            if not fields:
                continue  # a blank line
            if len(fields) != len(header):
                raise InvalidInput(
                    f"line {line}: expected {len(header)} fields as in the header,"
                    f" got {len(fields)}"
                )
            rows.append((line, dict(zip(header, (f.strip() for f in fields), strict=True))))
        return rows
    except csv.Error as exc:
        raise InvalidInput(f"line {reader.line_num}: {what} is not valid CSV: {exc}") from None


def csv_int(row: dict[str, str], column: str, line: int, lo: int, hi: int) -> int:
    text = row[column]
    if not (text.isascii() and text.isdigit() and len(text) <= 18) or not lo <= int(text) <= hi:
        raise InvalidInput(
            f"line {line}: {column} must be an integer from {lo} to {hi}, got {_got(text)}"
        )
    return int(text)


def parse_openb_nodes(text: str, pool: str = "openb") -> OpenbNodes:
    """The openb node list (`sn, cpu_milli, memory_mib, gpu, model`) as ONE pool: a node named by
    `sn` with `gpu` whole GPUs of `model` (lowercased). Rows with 0 GPUs are skipped and counted."""
    if not NAME_RE.fullmatch(pool):
        raise InvalidInput(f"--pool {_got(pool)} must be {_NAME_WHAT}")
    nodes: list[InventoryNode] = []
    seen: dict[str, tuple[int, str]] = {}  # every row's name, folded: skipped rows' too
    skipped = 0
    for line, row in csv_rows(text, OPENB_NODE_COLUMNS, "the openb node list"):
        name = row["sn"]
        if not NAME_RE.fullmatch(name):
            raise InvalidInput(f"line {line}: sn must be {_NAME_WHAT}, got {_got(name)}")
        first = seen.setdefault(name.lower(), (line, name))
        if first[0] != line:  # a row without GPUs may not contradict another either
            same = "" if first[1] == name else f" (as {json.dumps(first[1])}: case does not count)"
            raise InvalidInput(
                f"line {line}: duplicate node name {json.dumps(name)} (also line {first[0]}){same}"
            )
        gpus = csv_int(row, "gpu", line, 0, MAX_GPUS)
        model = normal_model(row["model"])
        if gpus == 0:
            skipped += 1
            continue
        if not MODEL_RE.fullmatch(model):
            raise InvalidInput(
                f"line {line}: model must be {_MODEL_WHAT}, got {_got(row['model'])}"
            )
        nodes.append(InventoryNode(name, (), gpus, model, omitted=KEEP_NODE))
    if not nodes:  # a header alone, or only CPU nodes: the wrong file, not an empty pool to make
        what = "no nodes" if not skipped else f"no node with GPUs (all {skipped} rows have 0)"
        raise InvalidInput(f"the node list has {what}; nothing was imported")
    nodes.sort(key=lambda n: n.name)
    lines = {folded: line for folded, (line, _) in seen.items()}  # names compare without case
    return OpenbNodes(
        Inventory((InventoryPool(pool, (), tuple(nodes), KEEP_POOL),)), skipped, lines
    )


# --- export --------------------------------------------------------------------------------------


def _node_json(n: InventoryNode) -> dict[str, object]:
    gpus: dict[str, object] = {"count": n.gpus, "model": n.model, "nvlinkGroups": n.nvlink_groups}
    if n.fabric_cluster is not None and n.fabric_clique is not None:
        gpus["fabric"] = {"cluster": n.fabric_cluster, "clique": n.fabric_clique}
    return {"name": n.name, "labels": dict(sorted(n.labels)), "gpus": gpus}


def _tenant_json(t: InventoryTenant) -> dict[str, object]:
    out: dict[str, object] = {"id": t.id}
    if t.quota_gpus is not None:
        out["quota"] = {"gpus": t.quota_gpus}
    return out


def inventory_to_json(inv: Inventory) -> dict[str, object]:
    """The §9 document for `inv`, sorted by name, which `parse_inventory` reads back unchanged."""
    pools = [
        {
            "name": p.name,
            "labels": dict(sorted(p.labels)),
            "nodes": [_node_json(n) for n in sorted(p.nodes, key=lambda n: n.name)],
        }
        for p in sorted(inv.pools, key=lambda p: p.name)
    ]
    tenants = [_tenant_json(t) for t in sorted(inv.tenants, key=lambda t: t.id)]
    return {"pools": pools, "tenants": tenants}
