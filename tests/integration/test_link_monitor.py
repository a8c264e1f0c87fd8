"""The monitor of a twin TP=2 pair: each node's link carries the bytes the model says NCCL sends for the
tokens the engine computed (RDMA, both halves), the machine each node is, and — with NCCL put on sockets
(`NCCL_IB_DISABLE=1` in the containers, as a user's mistake would) — the kernel's bytes instead and the
sockets warning on both nodes. The engines run in the twin's docker; the monitor reads the nodes through
its probe (the node script over the twin's /sys and its ethtool stand-in), the way it reads a Spark.

Bytes are held to tokens over the same polls: the link's counters as two of the monitor's node polls read
them, against the engine's token counters as two of its engine polls read them, both pairs taken while
the engine was idle, before and after a closed batch of requests. That is a count against a count, exact
whatever this machine's speed; how the link's Gb/s follow the engine's t/s live is a measurement, not
asserted here."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot
from sparktop.observe.state import ClusterState
from sparktop.twin.cluster import TwinCluster
from sparktop.ui.cards import perf_for
from tests.helpers.cluster import poller_for
from tests.helpers.wait import eventually
from tests.unit.test_twin_link import HALVES, run_tp2_pair, serve, sh

pytestmark = pytest.mark.slow

REQUESTS = 4
# Token and link rates over two minutes (a user's --rate-window): after the batch the engine still reads as
# working and the link as carrying its bytes for the rest of the test, so a warning has polls to hold over.
WINDOW_S = 120.0


def halves(node: NodeSnapshot, figure: str) -> int:
    """A counter summed over the cabled port's two halves, as the probe read it (bytes since the driver
    loaded)."""
    ports = {p.netdev: p for p in node.links}
    return sum(getattr(ports[n], figure) or 0 for n in HALVES)


def computed(e: EngineSnapshot) -> float:
    """The tokens the engine has put through the model, from its counters: every prompt token and every
    generated one but each finished request's last (its sample is the answer). Its prompts here share no
    prefix, so none came from the cache."""
    return (e.prompt_tokens_total or 0) + (e.gen_tokens_total or 0) - (e.requests or 0)


@pytest.mark.parametrize("ib_disable", ["0", "1"])
async def test_the_monitor_shows_the_links_traffic_as_the_model_says_and_warns_of_sockets(tmp_path, ib_disable):
    cluster = TwinCluster(tmp_path / "lab", speed=20.0).setup()
    a, b = cluster.nodes
    poller = poller_for(cluster, interval=0.5, rate_window=WINDOW_S)
    state = ClusterState()
    polls: dict[str, list[NodeSnapshot]] = {a.name: [], b.name: []}
    warnings: list[str | None] = []  # as shown: a suspicion held for HOLD_POLLS polls
    try:
        # Labelled as a launch of sparktop's: the monitor knows the worker's node is the engine's too.
        url = await run_tp2_pair(cluster, ib_disable, head="vllm-spark-a", worker="worker1-spark-a",
                                 labels=("--label", "sparktop.launch=pair", "--label", "sparktop.topology=tp=2"))
        await poller.start()

        async def consume():
            async for event in poller.events():
                state.apply(event)
                if isinstance(event, NodeSnapshot) and event.state == "ok" and event.links:
                    polls[event.name].append(event)
                    view = state.links.get(event.name)
                    warnings.append(view.warning if view else None)

        def engine() -> EngineSnapshot | None:
            e = state.engines.get(url)
            return e if e is not None and e.state == "ready" and e.requests is not None else None

        task = asyncio.create_task(consume())
        # Before: the engine idle and read, both nodes' links read.
        await eventually(lambda: engine() is not None and all(polls.values()), timeout=60,
                         what="the engine and both links read")
        e0 = engine()
        n0 = {name: p[-1] for name, p in polls.items()}
        assert e0 is not None and computed(e0) == 0
        await serve(url, requests=REQUESTS)
        # After: the engine's counters say the batch is done; the links' counters have caught up with it
        # (the twin moves them every half second).
        await eventually(lambda: (engine() or e0).requests == e0.requests + REQUESTS, timeout=60,
                         what="the batch finished, as the monitor read it")
        e1 = engine()
        assert e1 is not None and state.engine_nodes(e1) == [a.name, b.name]
        perf = perf_for(e1)  # the monitor's model of this engine, from what it read (model, tp=2)
        assert perf is not None
        want = int((computed(e1) - computed(e0)) * perf.link_bytes_per_token())
        assert want > 0
        # On sockets the kernel counts TCP/IP's headers too (some 7 % at MTU 1500), so its bytes pass the
        # payload before all of it has moved: what is waited for is the payload with 2 % of headers at least.
        carried, least = ("kernel_tx_bytes", 1.02 * want) if ib_disable == "1" else ("rdma_tx_bytes", want)
        await eventually(lambda: all(halves(p[-1], carried) - halves(n0[name], carried) >= least
                                     for name, p in polls.items()), timeout=60, what="the links' counters")
        n1 = {name: p[-1] for name, p in polls.items()}
        if ib_disable == "1":
            # Once held (a few polls in a row), the sockets warning on both nodes.
            await eventually(lambda: all((v := state.links.get(n.name)) and v.warning for n in cluster.nodes),
                             timeout=60, what="the sockets warning on both nodes")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        nodes: list[NodeSnapshot] = [state.nodes[n.name] for n in cluster.nodes]
        assert [n.machine.variant for n in nodes if n.machine] == ["DGX Spark", "ASUS Ascent GX10"]
        # What holds each node's GPU memory: the process nvidia-smi lists, in the container its cgroup names.
        for node, container in zip(nodes, ("vllm-spark-a", "worker1-spark-a"), strict=True):
            holders = {(p.name, getattr(p.container(node.containers), "name", None)) for p in node.processes}
            assert any(name == container for _, name in holders), (node.name, holders)
        for name in polls:
            sent = {f: halves(n1[name], f) - halves(n0[name], f) for f in ("rdma_tx_bytes", "rdma_rx_bytes",
                                                                         "kernel_tx_bytes", "kernel_rx_bytes")}
            print(f"NCCL_IB_DISABLE={ib_disable} {name}: {sent}; the model: {want} bytes each way")
            if ib_disable == "0":
                # Each node sends (and receives) the model's bytes for every token computed, to the byte
                # but the RDMA counters' 4-byte words on each half.
                assert abs(sent["rdma_tx_bytes"] - want) <= 8 and abs(sent["rdma_rx_bytes"] - want) <= 8, sent
                # The kernel carries NCCL's bootstrap only: its few KB/s, nothing of the payload.
                assert sent["kernel_tx_bytes"] < 0.001 * want, sent
            else:
                assert sent["rdma_tx_bytes"] == sent["rdma_rx_bytes"] == 0, sent
                # The payload and TCP/IP's headers, both ways, and nothing more.
                assert want * 1.02 <= sent["kernel_tx_bytes"] < want * 1.10, (sent, want)
                assert want * 1.02 <= sent["kernel_rx_bytes"] < want * 1.10, (sent, want)
        if ib_disable == "0":
            # RDMA on both halves: nothing to say. One poll may fall between the two halves' counters moving
            # (a suspicion); the card warns only of what holds.
            assert not any(warnings), [w for w in warnings if w]
        else:
            for n in cluster.nodes:
                warning = state.links[n.name].warning
                assert warning and "TCP sockets" in warning, n.name
    finally:
        await poller.close()
        for node in cluster.nodes:
            await sh(node, "sh", "-c", "docker ps -aq | xargs -r docker rm -f")
