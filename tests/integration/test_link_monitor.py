"""The monitor of a twin TP=2 pair: each node's link shows the traffic the model says NCCL sends at the
engine's token rate (RDMA, both halves), the machine each node is, and — with NCCL put on sockets
(`NCCL_IB_DISABLE=1` in the containers, as a user's mistake would) — the kernel's bytes instead and the
sockets warning on both nodes. The engines run in the twin's docker; the monitor reads the nodes through
its probe (the node script over the twin's /sys and its ethtool stand-in), the way it reads a Spark."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot
from sparktop.observe.state import ClusterState
from sparktop.twin.cluster import TwinCluster
from sparktop.ui.cards import expected_link_gbps
from tests.helpers.cluster import load, poller_for
from tests.unit.test_twin_link import run_tp2_pair, sh

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("ib_disable", ["0", "1"])
async def test_the_monitor_shows_the_links_traffic_as_the_model_says_and_warns_of_sockets(tmp_path, ib_disable):
    cluster = TwinCluster(tmp_path / "lab", speed=20.0).setup()
    a, b = cluster.nodes
    poller = poller_for(cluster, interval=0.5)
    state = ClusterState()
    try:
        # Labelled as a launch of sparktop's: the monitor knows the worker's node is the engine's too.
        url = await run_tp2_pair(cluster, ib_disable, head="vllm-spark-a", worker="worker1-spark-a",
                                 labels=("--label", "sparktop.launch=pair", "--label", "sparktop.topology=tp=2"))
        await poller.start()

        async def consume():
            async for event in poller.events():
                state.apply(event)

        task = asyncio.create_task(consume())
        seen: list[tuple[float, float | None, float | None, str | None]] = []  # expected, rdma, kernel, warning
        async with load([url], concurrency=4):
            await asyncio.sleep(12)  # past the first window: the link's rates and the engine's over steady load
            for _ in range(80):
                await asyncio.sleep(0.25)
                engine = state.engines.get(url)
                views = [state.links.get(n.name) for n in cluster.nodes]
                if engine is None or engine.state != "ready" or None in views or not engine.gen_tps:
                    continue
                assert state.engine_nodes(engine) == [a.name, b.name]
                expected = expected_link_gbps(state.spread_engines(b.name))
                v = views[1]
                assert v is not None and expected
                seen.append((expected, v.rdma_tx_gbps, v.kernel_tx_gbps, v.warning))
                if len(seen) >= 12 and (ib_disable == "0" or all(x and x.warning for x in views)):
                    break
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        nodes: list[NodeSnapshot] = [state.nodes[n.name] for n in cluster.nodes]
        assert [n.machine.variant for n in nodes if n.machine] == ["DGX Spark", "ASUS Ascent GX10"]
        assert isinstance(state.engines[url], EngineSnapshot)
        # What holds each node's GPU memory: the process nvidia-smi lists, in the container its cgroup names.
        for node, container in zip(nodes, ("vllm-spark-a", "worker1-spark-a"), strict=True):
            holders = {(p.name, getattr(p.container(node.containers), "name", None)) for p in node.processes}
            assert any(name == container for _, name in holders), (node.name, holders)
        # The last polls, each the counters' growth over the last 10 s, beside what the model expects at
        # the token rates the engine reported over its own 10 s then.
        steady = seen[-8:]
        expected = sum(e for e, _, _, _ in steady) / len(steady)
        rdma = sum(r or 0.0 for _, r, _, _ in steady) / len(steady)
        kernel = sum(k or 0.0 for _, _, k, _ in steady) / len(steady)
        print(f"NCCL_IB_DISABLE={ib_disable}: spark-b sends RDMA {rdma:.2f}, kernel {kernel:.2f} Gb/s; "
              f"the model expects {expected:.2f} Gb/s")
        if ib_disable == "0":
            assert rdma == pytest.approx(expected, rel=0.35), (rdma, expected)
            assert kernel < 0.01 * expected + 0.001
            assert all(s[3] is None for s in seen)
        else:
            assert rdma < 0.01
            assert kernel == pytest.approx(expected, rel=0.4), (kernel, expected)
            for n in cluster.nodes:
                warning = state.links[n.name].warning
                assert warning and "TCP sockets" in warning, n.name
    finally:
        await poller.close()
        for node in cluster.nodes:
            await sh(node, "sh", "-c", "docker ps -aq | xargs -r docker rm -f")
