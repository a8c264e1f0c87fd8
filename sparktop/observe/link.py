"""What a node's ConnectX-7 link carries, put together for the screen, and what is wrong with it.

The probe measures, per RDMA device, RDMA and kernel Gb/s each way (`linkparse.LinkRate`). Here those
become one view per node: the up ports, their totals, the link's capacity, and two warnings an engine
spread over several nodes makes worth giving:

- NCCL fell back to TCP sockets (`NCCL_IB_DISABLE=1`, an `NCCL_IB_HCA` naming no device that is up): the
  RDMA counters stand still while the kernel's bytes climb. The common reason a Spark pair is slower
  than one Spark.
- Only one half of the cable carries NCCL's traffic: a Spark's QSFP port shows as two RDMA devices of
  about 100 Gb/s each (each behind its own PCIe Gen5 x4), so the link is ~200 Gb/s only when NCCL uses
  both (`NCCL_IB_HCA` naming both, or `NCCL_IB_MERGE_NICS`).

A warning is given only once it has held for `HOLD_POLLS` polls in a row: one poll's counters can fall
between two of NCCL's bursts. What NCCL *should* send (the model's all-reduce bytes at the engine's token
rate) is the UI's to add: observe does not import the model.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

from sparktop.observe.linkparse import LinkRate
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot

# A Spark's port halves each sit behind a PCIe Gen5 x4: ~100 Gb/s each, whatever the port's speed says.
SPARK_HALF_GBPS = 100.0
HOLD_POLLS = 3
# Below this an RDMA counter "stands still" (NCCL's own keep-alives and a stray ping move it a little).
STILL_GBPS = 0.01
# Kernel bytes above this while RDMA stands still are an all-reduce, not ssh and HTTP.
CLIMBING_GBPS = 0.05
# One half carrying more than this share of a busy link's traffic: the other is unused.
ONE_HALF_SHARE = 0.95
BUSY_GBPS = 0.5


@dataclass
class LinkView:
    node: str
    ports: list[LinkRate]  # the RDMA devices that are up
    rdma_rx_gbps: float | None
    rdma_tx_gbps: float | None
    kernel_rx_gbps: float | None
    kernel_tx_gbps: float | None
    capacity_gbps: float | None  # each way, over the ports that are up
    engines: list[str] = field(default_factory=list)  # engines spread over this node and others
    warning: str | None = None  # held for HOLD_POLLS polls
    suspect: str | None = None  # this poll's, before it has held


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def totals(ports: list[LinkRate]) -> dict[str, float | None]:
    """Gb/s each way over `ports`, RDMA and kernel (None: no port read that figure)."""
    return {"rdma_rx": _sum(p.rdma_rx_gbps for p in ports), "rdma_tx": _sum(p.rdma_tx_gbps for p in ports),
            "kernel_rx": _sum(p.kernel_rx_gbps for p in ports), "kernel_tx": _sum(p.kernel_tx_gbps for p in ports)}


def _capacity(port: LinkRate, spark: bool) -> float | None:
    speed = port.speed_mbps / 1000 if port.speed_mbps else None
    if spark:
        return min(speed, SPARK_HALF_GBPS) if speed else SPARK_HALF_GBPS
    return speed


def view(node: NodeSnapshot, spread: list[EngineSnapshot]) -> LinkView | None:
    """This poll's view of `node`'s link; `spread`: the engines running on it and other nodes. None when
    the node has no RDMA device (or this is its first poll: no rates yet)."""
    if not node.links:
        return None
    up = [p for p in node.links if p.up]
    spark = node.machine is None or node.machine.gb10
    total = totals(up)
    v = LinkView(
        node=node.name, ports=up, rdma_rx_gbps=total["rdma_rx"], rdma_tx_gbps=total["rdma_tx"],
        kernel_rx_gbps=total["kernel_rx"], kernel_tx_gbps=total["kernel_tx"],
        capacity_gbps=_sum(_capacity(p, spark) for p in up),
        engines=[e.key for e in spread])
    v.suspect = _suspect(v, spread)
    return v


def _suspect(v: LinkView, spread: list[EngineSnapshot]) -> str | None:
    working = [e for e in spread if e.state == "ready" and ((e.gen_tps or 0) > 0 or (e.prompt_tps or 0) > 0)]
    if not working or not v.ports:
        return None
    rdma = (v.rdma_rx_gbps or 0.0) + (v.rdma_tx_gbps or 0.0)
    kernel = (v.kernel_rx_gbps or 0.0) + (v.kernel_tx_gbps or 0.0)
    if rdma < STILL_GBPS and kernel > CLIMBING_GBPS:
        # Two lines of a half-width card at 120 columns, three at 80: the names to check are what the user acts on.
        return f"NCCL on TCP sockets: RDMA still, kernel {kernel:.1f} Gb/s; check NCCL_IB_DISABLE, NCCL_IB_HCA"
    if len(v.ports) >= 2 and rdma > BUSY_GBPS:
        shares = {p.rdma_device: ((p.rdma_rx_gbps or 0.0) + (p.rdma_tx_gbps or 0.0)) / rdma for p in v.ports}
        device, share = max(shares.items(), key=lambda kv: kv[1])
        if share > ONE_HALF_SHARE:
            return (f"only {device} carries NCCL, half the cable ({share:.0%}): name both HCAs in NCCL_IB_HCA, "
                    "or NCCL_IB_MERGE_NICS")
    return None


@dataclass
class LinkWatch:
    """Per node, how many polls in a row the same suspicion has held: a warning once it has held."""

    held: dict[str, tuple[str, int]] = field(default_factory=dict)

    def update(self, v: LinkView) -> LinkView:
        if v.suspect is None:
            self.held.pop(v.node, None)
            return v
        kind = v.suspect.split(":", 1)[0]
        before = self.held.get(v.node)
        count = before[1] + 1 if before is not None and before[0] == kind else 1
        self.held[v.node] = (kind, count)
        if count >= HOLD_POLLS:
            v.warning = v.suspect
        return v


# -- which port reaches which node ---------------------------------------------------------------------

# A pair's counters agree when what one side sends is what the other receives, within this share (two
# nodes' polls are not taken at the same instant), once either moves more than AGREE_MIN_GBPS.
AGREE_WITHIN = 0.3
AGREE_MIN_GBPS = 0.1


@dataclass
class PortPair:
    """Two RDMA ports, on two nodes, that reach each other: inferred from their addresses, then verified
    by their traffic (what one sends, the other receives)."""

    a_node: str
    a_device: str
    b_node: str
    b_device: str
    how: str  # "169.254.0.0/16", "same port, IPv6 link-local only"
    verified: bool | None = None  # None: no traffic yet to tell
    note: str | None = None  # why the counters say it is not this pair


def _ipv4_networks(addresses: tuple[str, ...]) -> list[ipaddress.IPv4Network]:
    out = []
    for text in addresses:
        try:
            iface = ipaddress.ip_interface(text)
        except ValueError:
            continue
        if isinstance(iface, ipaddress.IPv4Interface):
            out.append(iface.network)
    return out


def pair_ports(nodes: list[NodeSnapshot]) -> tuple[list[PortPair], list[str]]:
    """The port pairs between `nodes` (each with its up RDMA ports' addresses), and what could not be
    paired: on a switch (three or more nodes with ports on one subnet) per-peer traffic cannot be
    attributed to a pair, and none is invented."""
    ports: dict[str, dict[str, LinkRate]] = {n.name: {p.netdev: p for p in n.links if p.up and p.netdev}
                                             for n in nodes}
    addresses = {n.name: n.addresses for n in nodes}
    by_net: dict[ipaddress.IPv4Network, list[tuple[str, str]]] = {}
    for node, netdevs in ports.items():
        for netdev in netdevs:
            for net in _ipv4_networks(addresses[node].get(netdev, ())):
                by_net.setdefault(net, []).append((node, netdev))
    pairs: list[PortPair] = []
    notes: list[str] = []
    paired_nodes: set[tuple[str, str]] = set()
    for net, members in sorted(by_net.items(), key=lambda kv: str(kv[0])):
        names = sorted({node for node, _ in members})
        if len(names) >= 3:
            notes.append(f"{len(names)} nodes share {net} (a switch): traffic per peer cannot be attributed")
            continue
        if len(names) < 2:
            continue
        a, b = names
        a_ports = sorted(d for n, d in members if n == a)
        b_ports = sorted(d for n, d in members if n == b)
        for x in a_ports:  # the same port cabled on both first, then what is left, in order
            y = x if x in b_ports else next(iter(b_ports), None)
            if y is None:
                continue
            b_ports.remove(y)
            pairs.append(PortPair(a, ports[a][x].rdma_device, b, ports[b][y].rdma_device, str(net)))
        paired_nodes.add((a, b))
    # The other half of a cable often has only an IPv6 link-local address (NVIDIA's netplan gives the first
    # an IPv4 one): between two nodes already paired, the same port name on both.
    taken = {(p.a_node, p.a_device) for p in pairs} | {(p.b_node, p.b_device) for p in pairs}
    for a, b in sorted(paired_nodes):
        for netdev, port in sorted(ports[a].items()):
            other = ports[b].get(netdev)
            if other is None or (a, port.rdma_device) in taken or (b, other.rdma_device) in taken:
                continue
            if not any(x.lower().startswith("fe80:") for x in addresses[a].get(netdev, ())):
                continue
            pairs.append(PortPair(a, port.rdma_device, b, other.rdma_device, "same port, IPv6 link-local only"))
    for p in pairs:
        _verify(p, ports[p.a_node], ports[p.b_node])
    return pairs, notes


def _verify(pair: PortPair, a_ports: dict[str, LinkRate], b_ports: dict[str, LinkRate]) -> None:
    a = next(p for p in a_ports.values() if p.rdma_device == pair.a_device)
    b = next(p for p in b_ports.values() if p.rdma_device == pair.b_device)
    verdicts = []
    for sender, s_name, receiver, r_name in ((a, pair.a_node, b, pair.b_node), (b, pair.b_node, a, pair.a_node)):
        sent, got = sender.rdma_tx_gbps, receiver.rdma_rx_gbps
        if sent is None or got is None or max(sent, got) < AGREE_MIN_GBPS:
            continue
        if abs(sent - got) <= AGREE_WITHIN * max(sent, got):
            verdicts.append(True)
        else:
            verdicts.append(False)
            pair.note = (f"{s_name} {sender.rdma_device} sends {sent:.2f} Gb/s, {r_name} {receiver.rdma_device} "
                         f"receives {got:.2f}: not each other's peer, or traffic from elsewhere")
    if verdicts:
        pair.verified = all(verdicts)
