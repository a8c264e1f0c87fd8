"""`sparktop status` prints a whole picture when a node is slow to answer
(a busy host, a slow link): each engine with the container it runs in and
its layout, not only what answered within the window. The node here is a
twin node whose every command takes a second more, against a 0.2-second
window."""

from __future__ import annotations

import asyncio

from sparktop.observe.poller import NodeTarget, Poller
from sparktop.status import collect
from sparktop.twin.cluster import TwinCluster, wait_ready

DELAY_S = 1.0  # past the window, well within the node probe's timeout (3 s): slow, not silent


class SlowTransport:
    """A node's transport whose every command answers DELAY_S late."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def run(self, *args, **kwargs):
        await asyncio.sleep(DELAY_S)
        return await self.inner.run(*args, **kwargs)


async def test_a_slow_node_still_says_where_its_engine_runs(tmp_path):
    cluster = TwinCluster(tmp_path / "lab", names=("spark-a",), speed=20.0).setup()
    [node] = cluster.nodes
    [url] = await cluster.run_solo(startup_speed=1000.0)
    try:
        await wait_ready([url])
        poller = Poller([NodeTarget(node.name, SlowTransport(node.transport()), node.address)], interval=1.0,
                        default_port=8000, rate_window=0.2, latency_window=0.2, histogram_every=0.0)
        state = await collect(poller, 0.2)  # the engine answers within the window; its node does not
        engine = state.engines[url]
        assert (engine.state, engine.node, engine.container, engine.topology) == \
            ("ready", "spark-a", "sparktop-vllm", "solo")
        assert state.nodes["spark-a"].state == "ok"
    finally:
        await cluster.stop_all()
