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
    v = LinkView(
        node=node.name, ports=up,
        rdma_rx_gbps=_sum(p.rdma_rx_gbps for p in up), rdma_tx_gbps=_sum(p.rdma_tx_gbps for p in up),
        kernel_rx_gbps=_sum(p.kernel_rx_gbps for p in up), kernel_tx_gbps=_sum(p.kernel_tx_gbps for p in up),
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
        return (f"NCCL is on TCP sockets, not RoCE: RDMA stands still while the kernel moves {kernel:.2f} Gb/s "
                "(NCCL_IB_DISABLE set? NCCL_IB_HCA naming no port that is up?)")
    if len(v.ports) >= 2 and rdma > BUSY_GBPS:
        shares = {p.rdma_device: ((p.rdma_rx_gbps or 0.0) + (p.rdma_tx_gbps or 0.0)) / rdma for p in v.ports}
        device, share = max(shares.items(), key=lambda kv: kv[1])
        if share > ONE_HALF_SHARE:
            return (f"only {device} carries NCCL's traffic: half the cable ({share:.0%} on one half; "
                    "name both HCAs in NCCL_IB_HCA, or set NCCL_IB_MERGE_NICS)")
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
