"""The demo inventory (`init --demo`) and the instant the guided tour starts at (cli/tour.py)."""

from __future__ import annotations

from better_compute.inventory import Inventory, parse_inventory

_H100 = {"count": 8, "model": "h100", "nvlinkGroups": 2}


def _node(name: str, rack: str, clique: int) -> dict[str, object]:
    return {
        "name": name,
        "labels": {"rack": rack},
        "gpus": {**_H100, "fabric": {"cluster": "c1", "clique": clique}},
    }


#: Two fabric domains (c1.1 with four nodes, c1.2 with three) of 8-GPU H100 nodes, two tenants.
DEMO_DOCUMENT: dict[str, object] = {
    "pools": [
        {
            "name": "west",
            "labels": {"region": "us-west"},
            "nodes": [_node(f"west-0{i}", "r1", 1) for i in range(1, 5)]
            + [_node(f"west-0{i}", "r2", 2) for i in range(5, 8)],
        }
    ],
    "tenants": [{"id": "acme", "quota": {"gpus": 64}}, {"id": "globex", "quota": {"gpus": 32}}],
}
DEMO_INVENTORY: Inventory = parse_inventory(DEMO_DOCUMENT)

DEMO_NOW = "2026-09-28T08:00:00Z"
