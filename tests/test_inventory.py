from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from better_compute.errors import InvalidInput
from better_compute.inventory import (
    MAX_INT,
    Inventory,
    InventoryNode,
    InventoryPool,
    InventoryTenant,
    inventory_to_json,
    load_inventory_text,
    nvlink_group_of,
    parse_inventory,
)

SPEC_EXAMPLE = """
{"pools": [{"name": "west", "labels": {"region": "us-west"},
  "nodes": [{"name": "node-01", "labels": {"rack": "r1"},
             "gpus": {"count": 8, "model": "h100", "nvlinkGroups": 1,
                      "fabric": {"cluster": "c1", "clique": 3}}}]}],
 "tenants": [{"id": "acme", "quota": {"gpus": 64}}]}
"""


def _node(name: str, **gpus: Any) -> dict[str, Any]:
    return {"name": name, "gpus": {"count": 8, "model": "h100", **gpus}}


BASE: dict[str, Any] = {
    "pools": [
        {
            "name": "west",
            "labels": {"region": "us-west"},
            "nodes": [
                _node("node-01", fabric={"cluster": "c1", "clique": 3}),
                _node("node-02"),
                _node("node-03", nvlinkGroups=2),
            ],
        },
        {"name": "east", "nodes": [_node("node-04")]},
    ],
    "tenants": [{"id": "acme", "quota": {"gpus": 64}}, {"id": "beta"}],
}
DELETE = object()


def _with(path: str, value: object) -> dict[str, Any]:
    """BASE with the value at a dotted path (`pools.0.nodes.2.gpus.count`) replaced or deleted."""
    doc = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    target: Any = doc
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    key: Any = int(last) if isinstance(target, list) else last
    if value is DELETE:
        del target[key]
    else:
        target[key] = value
    return doc


def test_spec_example() -> None:
    assert load_inventory_text(SPEC_EXAMPLE) == Inventory(
        pools=(
            InventoryPool(
                "west",
                (("region", "us-west"),),
                (InventoryNode("node-01", (("rack", "r1"),), 8, "h100", 1, "c1", 3),),
            ),
        ),
        tenants=(InventoryTenant("acme", 64),),
    )


def test_base_is_canonical() -> None:
    inv = parse_inventory(BASE)
    assert [p.name for p in inv.pools] == ["east", "west"]
    west = inv.pools[1]
    assert [n.name for n in west.nodes] == ["node-01", "node-02", "node-03"]
    assert west.nodes[1] == InventoryNode("node-02", (), 8, "h100", 1, None, None)
    assert west.nodes[2].nvlink_groups == 2
    assert inv.tenants == (InventoryTenant("acme", 64), InventoryTenant("beta", None))


def _west(inv: Inventory) -> InventoryPool:
    return inv.pools[1]  # pools sort by name: east, west


def _n2(inv: Inventory) -> InventoryNode:
    return inv.pools[1].nodes[1]  # west's node-02


@pytest.mark.parametrize(
    ("path", "value", "check"),
    [
        ("tenants", DELETE, lambda inv: inv.tenants == ()),
        ("tenants", None, lambda inv: inv.tenants == ()),
        ("pools", [], lambda inv: inv.pools == ()),
        ("pools.1.nodes", DELETE, lambda inv: inv.pools[0].nodes == ()),
        ("pools.1.nodes", None, lambda inv: inv.pools[0].nodes == ()),
        ("pools.0.labels", None, lambda inv: _west(inv).labels == ()),
        (
            "pools.0.labels",
            {"z": "1", "a": "b"},
            lambda i: _west(i).labels == (("a", "b"), ("z", "1")),
        ),
        ("pools.0.nodes.1.labels", {"fabric": "x"}, lambda i: _n2(i).labels == (("fabric", "x"),)),
        ("pools.0.nodes.1.gpus.nvlinkGroups", None, lambda inv: _n2(inv).nvlink_groups == 1),
        ("pools.0.nodes.1.gpus.nvlinkGroups", 8, lambda inv: _n2(inv).nvlink_groups == 8),
        ("pools.0.nodes.1.gpus.count", 64, lambda inv: _n2(inv).gpus == 64),
        ("pools.0.nodes.1.gpus.count", 1, lambda inv: _n2(inv).gpus == 1),
        (
            "pools.0.nodes.1.gpus.model",
            "gb200.v2_x-1",
            lambda inv: _n2(inv).model == "gb200.v2_x-1",
        ),
        ("pools.0.nodes.1.gpus.fabric", None, lambda inv: _n2(inv).fabric_cluster is None),
        (
            "pools.0.nodes.1.gpus.fabric",
            {"cluster": "C.1_x", "clique": 0},
            lambda inv: (_n2(inv).fabric_cluster, _n2(inv).fabric_clique) == ("C.1_x", 0),
        ),
        ("pools.0.name", "A" * 63, lambda inv: inv.pools[0].name == "A" * 63),
        ("pools.0.name", "9.a_b-c", lambda inv: inv.pools[0].name == "9.a_b-c"),
        ("tenants.0.quota", {}, lambda inv: inv.tenants[0].quota_gpus is None),
        ("tenants.0.quota", None, lambda inv: inv.tenants[0].quota_gpus is None),
        ("tenants.0.quota.gpus", None, lambda inv: inv.tenants[0].quota_gpus is None),
        ("tenants.0.quota.gpus", 0, lambda inv: inv.tenants[0].quota_gpus == 0),
        ("tenants.0.quota.gpus", MAX_INT, lambda inv: inv.tenants[0].quota_gpus == MAX_INT),
        ("tenants.1.id", "Acme", lambda inv: inv.tenants[0].id == "Acme"),  # case matters
        # node names differing only in case parse; the import refuses a new such pair
        ("pools.1.nodes.0.name", "Node-01", lambda inv: inv.pools[0].nodes[0].name == "Node-01"),
    ],
)
def test_accepts(path: str, value: object, check: Any) -> None:
    assert check(parse_inventory(_with(path, value)))


NAME = "a name of 1 to 63 letters, digits, '.', '_' or '-' starting with a letter or digit"
MODEL = "a model name of letters, digits, '.', '_' or '-' (like h100)"
GPUS = "an integer from 1 to 64"
GROUPS = "an integer from 1 to 8 that divides 8 evenly"
BIG = "an integer from 0 to 2147483647"
NODE = "pools.0.nodes.2"
GPU = "pools.0.nodes.2.gpus"
FABRIC = "pools.0.nodes.0.gpus.fabric"


@pytest.mark.parametrize(
    ("path", "value", "tail"),
    [
        # structure and unknown keys
        ("pools", DELETE, "required, must be a list"),
        ("pools", {}, "must be a list, got {}"),
        ("nodes", [], "unknown key (allowed: pools, tenants)"),
        ("pools.0", 3, "must be an object, got 3"),
        ("pools.0.region", "x", "unknown key (allowed: name, labels, nodes)"),
        ("pools.0.nodes", {}, "must be a list, got {}"),
        (NODE, [], "must be an object, got []"),
        (f"{NODE}.gpu", {}, "unknown key (allowed: name, labels, gpus)"),
        (f"{GPU}.nvlink", 1, "unknown key (allowed: count, model, nvlinkGroups, fabric)"),
        (f"{GPU}.a b", 1, "unknown key (allowed: count, model, nvlinkGroups, fabric)"),
        (f"{FABRIC}.x", 1, "unknown key (allowed: cluster, clique)"),
        ("tenants", {}, "must be a list, got {}"),
        ("tenants.0", "acme", 'must be an object, got "acme"'),
        ("tenants.0.name", "x", "unknown key (allowed: id, quota)"),
        ("tenants.0.quota.cpus", 1, "unknown key (allowed: gpus)"),
        # names
        ("pools.0.name", DELETE, f"required, must be {NAME}"),
        ("pools.0.name", None, f"required, must be {NAME}"),
        ("pools.0.name", "", f'must be {NAME}, got ""'),
        ("pools.0.name", "-west", f'must be {NAME}, got "-west"'),
        ("pools.0.name", "we st", f'must be {NAME}, got "we st"'),
        ("pools.0.name", "a:b", f'must be {NAME}, got "a:b"'),
        ("pools.0.name", "A" * 64, f'must be {NAME}, got "{"A" * 38}…'),
        ("pools.0.name", 7, f"must be {NAME}, got 7"),
        (f"{NODE}.name", DELETE, f"required, must be {NAME}"),
        (f"{NODE}.name", "node/3", f'must be {NAME}, got "node/3"'),
        ("tenants.1.id", DELETE, f"required, must be {NAME}"),
        ("tenants.1.id", "bé", f'must be {NAME}, got "bé"'),
        (f"{FABRIC}.cluster", "c 1", f'must be {NAME}, got "c 1"'),
        # duplicates
        ("pools.1.name", "west", 'duplicate pool name "west" (also pools[0].name)'),
        (
            "pools.1.nodes.0.name",
            "node-02",
            'duplicate node name "node-02" (also pools[0].nodes[1].name)',
        ),
        (f"{NODE}.name", "node-01", 'duplicate node name "node-01" (also pools[0].nodes[0].name)'),
        ("tenants.1.id", "acme", 'duplicate tenant id "acme" (also tenants[0].id)'),
        # labels
        ("pools.0.labels", ["a"], 'must be an object of string labels, got ["a"]'),
        ("pools.0.labels.region", 1, "must be a string, got 1"),
        ("pools.0.labels.region", None, "must be a string, got null"),
        ("pools.0.nodes.1.labels", "rack=r1", 'must be an object of string labels, got "rack=r1"'),
        # gpus
        (GPU, DELETE, "required, must be an object"),
        (GPU, 8, "must be an object, got 8"),
        (f"{GPU}.count", "8", f'must be {GPUS}, got "8"'),
        (f"{GPU}.count", DELETE, f"required, must be {GPUS}"),
        (f"{GPU}.count", True, f"must be {GPUS}, got true"),
        (f"{GPU}.count", 8.0, f"must be {GPUS}, got 8.0"),
        (f"{GPU}.count", 0, f"must be {GPUS}, got 0"),
        (f"{GPU}.count", 65, f"must be {GPUS}, got 65"),
        (f"{GPU}.count", -8, f"must be {GPUS}, got -8"),
        (f"{GPU}.model", DELETE, f"required, must be {MODEL}"),
        (f"{GPU}.model", "H100 SXM", f'must be {MODEL}, got "H100 SXM"'),
        (f"{GPU}.model", "", f'must be {MODEL}, got ""'),
        (f"{GPU}.model", "-h100", f'must be {MODEL}, got "-h100"'),
        (f"{GPU}.model", 100, f"must be {MODEL}, got 100"),
        (f"{GPU}.nvlinkGroups", 3, f"must be {GROUPS}, got 3"),
        (f"{GPU}.nvlinkGroups", 0, f"must be {GROUPS}, got 0"),
        (f"{GPU}.nvlinkGroups", 16, f"must be {GROUPS}, got 16"),
        (f"{GPU}.nvlinkGroups", True, f"must be {GROUPS}, got true"),
        (f"{GPU}.nvlinkGroups", "2", f'must be {GROUPS}, got "2"'),
        (FABRIC, "c1.3", 'must be an object, got "c1.3"'),
        (f"{FABRIC}.cluster", DELETE, f"required, must be {NAME}"),
        (f"{FABRIC}.clique", DELETE, f"required, must be {BIG}"),
        (f"{FABRIC}.clique", -1, f"must be {BIG}, got -1"),
        (f"{FABRIC}.clique", False, f"must be {BIG}, got false"),
        (f"{FABRIC}.clique", "3", f'must be {BIG}, got "3"'),
        (f"{FABRIC}.clique", MAX_INT + 1, f"must be {BIG}, got 2147483648"),
        # quota
        ("tenants.0.quota", 64, "must be an object, got 64"),
        ("tenants.0.quota.gpus", -1, f"must be {BIG}, got -1"),
        ("tenants.0.quota.gpus", "64", f'must be {BIG}, got "64"'),
        ("tenants.0.quota.gpus", True, f"must be {BIG}, got true"),
        ("tenants.0.quota.gpus", 1.5, f"must be {BIG}, got 1.5"),
    ],
)
def test_rejects(path: str, value: object, tail: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_inventory(_with(path, value))
    assert e.value.message == f"{_json_path(path)}: {tail}"


def _json_path(dotted: str) -> str:
    """`pools.0.a b` → `pools[0]["a b"]`, the path form error messages use."""
    out = ""
    for part in dotted.split("."):
        if part.isdigit():
            out += f"[{part}]"
        elif " " in part:
            out += f"[{json.dumps(part)}]"
        else:
            out += f".{part}" if out else part
    return out


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "inventory: must be an object, got []"),
        (None, "inventory: required, must be an object"),
        ("x", 'inventory: must be an object, got "x"'),
        ({}, "pools: required, must be a list"),
        ({1: []}, '["1"]: unknown key (allowed: pools, tenants)'),
        (
            {"pools": [{"name": "a", "labels": {"a.b": 1}}]},
            'pools[0].labels["a.b"]: must be a string',
        ),
        ({"pools": [{"name": "a", "labels": {"": "x"}}]}, "pools[0].labels: label keys must be"),
        (
            {"pools": [{"name": "a", "labels": {"a": ""}}]},
            'pools[0].labels: label "a": "" must have a key',
        ),
        (
            {"pools": [{"name": "a", "labels": {"a=b": "c"}}]},
            'pools[0].labels: label "a=b": "c" must',
        ),
        ({"pools": [{"name": "a", "labels": {1: "x"}}]}, "pools[0].labels: label keys must be"),
        (
            {"pools": [{"name": "a", "nodes": [{"name": "n", "labels": {"fabric.domain": "c"}}]}]},
            'pools[0].nodes[0].labels["fabric.domain"]: is derived; set gpus.fabric instead',
        ),
        (
            {"pools": [], "tenants": [{"id": "a", "quota": {"gpus": object()}}]},
            f"tenants[0].quota.gpus: must be {BIG}, got object",
        ),
    ],
)
def test_rejects_documents(doc: object, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_inventory(doc)
    assert e.value.message.startswith(message)


def _one_node(gpus: str) -> str:
    return '{"pools": [{"name": "a", "nodes": [{"name": "n", "gpus": ' + gpus + "}]}]}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"pools": [\n  {"name": "a",,}]}', "inventory is not valid JSON: line 2 column 16: "),
        ("", "inventory is not valid JSON: line 1 column 1: Expecting value"),
        ('{"pools": []} x', "inventory is not valid JSON: line 1 column 15: Extra data"),
        ('{"pools": [], "pools": []}', 'inventory: the key "pools" is given twice in one object'),
        (
            '{"pools": [{"name": "a", "labels": {"r": "1", "r": "2"}}]}',
            'pools[0].labels: the key "r" is given twice',
        ),
        (_one_node('{"count": 4, "model": "h100", "count": 8}'), "pools[0].nodes[0].gpus: the key"),
        ('{"pools": [' + "9" * 5000 + "]}", "inventory is not valid JSON: "),
        ("[" * 100_000 + "]" * 100_000, "inventory is not valid JSON: "),
        (_one_node('{"count": NaN}'), f"pools[0].nodes[0].gpus.count: must be {GPUS}, got NaN"),
        (_one_node('{"count": 1e3}'), f"pools[0].nodes[0].gpus.count: must be {GPUS}, got 1000.0"),
    ],
)
def test_load_inventory_text_rejects(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        load_inventory_text(text)
    assert e.value.message.startswith(message)


def test_export_shape_and_order() -> None:
    out = inventory_to_json(load_inventory_text(SPEC_EXAMPLE))
    assert json.dumps(out) == json.dumps(json.loads(SPEC_EXAMPLE))  # same keys in the same order
    out = inventory_to_json(parse_inventory(BASE))
    assert [p["name"] for p in out["pools"]] == ["east", "west"]  # type: ignore[attr-defined]
    assert out["tenants"] == [{"id": "acme", "quota": {"gpus": 64}}, {"id": "beta"}]
    east = out["pools"][0]  # type: ignore[index]
    assert east == {
        "name": "east",
        "labels": {},
        "nodes": [
            {
                "name": "node-04",
                "labels": {},
                "gpus": {"count": 8, "model": "h100", "nvlinkGroups": 1},
            }
        ],
    }


def test_export_sorts_an_unsorted_inventory() -> None:
    b, a = (
        InventoryNode("b", (("z", "1"), ("a", "2")), 1, "a100"),
        InventoryNode("a", (), 2, "a100"),
    )
    inv = Inventory((InventoryPool("p", (), (b, a)),), (InventoryTenant("y"), InventoryTenant("x")))
    out = inventory_to_json(inv)
    assert parse_inventory(out) == Inventory(
        (InventoryPool("p", (), (a, InventoryNode("b", (("a", "2"), ("z", "1")), 1, "a100"))),),
        (InventoryTenant("x"), InventoryTenant("y")),
    )


@pytest.mark.parametrize(
    ("count", "groups", "want"),
    [
        (8, 1, [0] * 8),
        (8, 2, [0, 0, 0, 0, 1, 1, 1, 1]),
        (8, 4, [0, 0, 1, 1, 2, 2, 3, 3]),
        (8, 8, list(range(8))),
        (6, 3, [0, 0, 1, 1, 2, 2]),
        (1, 1, [0]),
    ],
)
def test_nvlink_group_of(count: int, groups: int, want: list[int]) -> None:
    assert [nvlink_group_of(i, count, groups) for i in range(count)] == want


# --- round trip ----------------------------------------------------------------------------------

_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,10}", fullmatch=True)
#: Labels are printable text: str.isprintable refuses exactly these categories (and spaces but ' ').
_printable = st.text(
    st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
    | st.just(" "),
    min_size=1,
    max_size=8,
)
_labels = st.dictionaries(
    _printable.filter(lambda k: k != "fabric.domain" and "=" not in k),
    _printable,
).map(lambda d: tuple(sorted(d.items())))


@st.composite
def _nodes(draw: st.DrawFn, name: str) -> InventoryNode:
    gpus = draw(st.integers(1, 64))
    groups = draw(st.sampled_from([g for g in range(1, gpus + 1) if gpus % g == 0]))
    fabric = draw(st.none() | st.tuples(_names, st.integers(0, MAX_INT)))
    return InventoryNode(
        name,
        draw(_labels),
        gpus,
        draw(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,8}", fullmatch=True)),
        groups,
        fabric[0] if fabric else None,
        fabric[1] if fabric else None,
    )


@st.composite
def _inventories(draw: st.DrawFn) -> Inventory:
    node_names = draw(st.lists(_names, unique=True, max_size=8))
    pool_names = sorted(draw(st.lists(_names, unique=True, min_size=1, max_size=3)))
    owner = [draw(st.sampled_from(pool_names)) for _ in node_names]
    pools = tuple(
        InventoryPool(
            p,
            draw(_labels),
            tuple(
                draw(_nodes(n)) for n, o in sorted(zip(node_names, owner, strict=True)) if o == p
            ),
        )
        for p in pool_names
    )
    tenant_ids = sorted(draw(st.lists(_names, unique=True, max_size=4)))
    quotas = st.none() | st.integers(0, MAX_INT)
    return Inventory(pools, tuple(InventoryTenant(t, draw(quotas)) for t in tenant_ids))


@given(_inventories())
def test_export_import_round_trip(inv: Inventory) -> None:
    doc = inventory_to_json(inv)
    assert parse_inventory(doc) == inv
    assert load_inventory_text(json.dumps(doc)) == inv
    assert inventory_to_json(parse_inventory(doc)) == doc
