"""What to watch: nodes from the inventory (or this node alone) and the
engines given on the command line."""

from __future__ import annotations

from sparktop.observe.poller import EngineTarget, NodeTarget
from sparktop.remote import transport_for
from sparktop.settings import Inventory


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url.removesuffix("/v1")


def node_targets(inventory: Inventory) -> list[NodeTarget]:
    return [NodeTarget(node.name, transport_for(node), node.address) for node in inventory.nodes]


def engine_targets(urls: list[str]) -> list[EngineTarget]:
    return [EngineTarget(normalize_url(url), origin="given") for url in urls]
