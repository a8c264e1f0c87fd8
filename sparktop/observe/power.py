"""A node's power draw, read on demand for a benchmark's energy figures.

`nvidia-smi --query-gpu=power.draw` on each node, summed: on a GB10 that is
the GPU's share of the superchip (see `observe.energy` for what it leaves
out). The sweep samples it while a level runs; the monitor reads the same
field from its regular node poll instead.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING

from sparktop.remote import Transport, TransportError, transport_for

if TYPE_CHECKING:
    from sparktop.settings import Inventory

POWER_QUERY = ["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits"]


def parse_power(text: str) -> float | None:
    """Watts summed over the GPUs listed; None when any is unreadable ([N/A])."""
    total, seen = 0.0, False
    for line in text.splitlines():
        line = line.strip().removesuffix("W").strip()
        if not line:
            continue
        try:
            value = float(line)
        except ValueError:
            return None
        if math.isnan(value):
            return None
        total += value
        seen = True
    return total if seen else None


async def gpu_power(transport: Transport, timeout: float = 5.0) -> float | None:
    try:
        result = await transport.run(POWER_QUERY, timeout=timeout)
    except (TimeoutError, TransportError, OSError):
        return None
    return parse_power(result.stdout) if result.ok else None


class NodesPower:
    """`await power()`: the summed GPU power of these nodes now, or None
    when one of them cannot say (a partial sum would flatter the energy)."""

    def __init__(self, transports: dict[str, Transport]):
        self.transports = transports

    @property
    def nodes(self) -> list[str]:
        return list(self.transports)

    async def __call__(self) -> float | None:
        if not self.transports:
            return None
        readings = await asyncio.gather(*(gpu_power(t) for t in self.transports.values()))
        if any(r is None for r in readings):
            return None
        return sum(r for r in readings if r is not None)


def power_source(spec: str | None, endpoint: str, inventory: Inventory | None = None) -> NodesPower | None:
    """Whose power the sweep reads: `--power A,B` (inventory names, ssh
    hosts, 'local'), else the inventory nodes whose address or host is the
    endpoint's host (a local endpoint: this node); 'none' for nothing."""
    from urllib.parse import urlsplit

    from sparktop.settings import LOCAL_HOSTS, inventory_from_hosts, load_inventory

    if spec is not None and spec.strip().lower() == "none":
        return None
    inventory = inventory or load_inventory()
    if spec:
        names = [h.strip() for h in spec.split(",") if h.strip()]
        known = {n.name: n for n in inventory.nodes} | {n.host: n for n in inventory.nodes}
        nodes = [known[h] if h in known else inventory_from_hosts([h]).nodes[0] for h in names]
    else:
        host = urlsplit(endpoint).hostname or ""
        nodes = [n for n in inventory.nodes if host in (n.address, n.host, n.name)]
        if not nodes and (host in LOCAL_HOSTS or host.startswith("127.0.0.1") or host == "::1"):
            nodes = [n for n in inventory.nodes if n.is_local][:1]
        if not nodes:
            return None
    return NodesPower({n.name: transport_for(n) for n in nodes})
