"""A two-node twin cluster for tests: engines through the twin's docker,
watched by the real poller."""

from __future__ import annotations

import asyncio
import contextlib
import random

import httpx

from sparktop.launch.state import api_key_for
from sparktop.observe.poller import NodeTarget, Poller
from sparktop.twin.cluster import TwinCluster, wait_ready


async def start_cluster(root, model: str = "llama-3.1-8b", speed: float = 4.0) -> tuple[TwinCluster, list[str]]:
    cluster = TwinCluster(root, speed=speed).setup()
    urls = await cluster.run_solo(model=model, startup_speed=1000, extra=["--max-model-len", "32768"])
    await wait_ready(urls, timeout=60)
    return cluster, urls


def poller_for(cluster: TwinCluster, interval: float = 0.5, **kw) -> Poller:
    return Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes], interval=interval,
                  default_port=None, router_key=api_key_for, **kw)


@contextlib.asynccontextmanager
async def load(urls: list[str], concurrency: int = 3):
    """Keep `concurrency` streaming chats in flight on every endpoint."""
    stop = asyncio.Event()

    async def worker(url: str, seed: int):
        rng = random.Random(seed)
        async with httpx.AsyncClient(timeout=60) as client:
            while not stop.is_set():
                body = {"messages": [{"role": "user", "content": "tok " * rng.randint(200, 1200)}],
                        "max_tokens": rng.randint(30, 120), "ignore_eos": True, "stream": True}
                try:
                    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                        async for _ in r.aiter_bytes():
                            if stop.is_set():
                                break
                except httpx.HTTPError:
                    await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(worker(u, i * 10 + j)) for i, u in enumerate(urls) for j in range(concurrency)]
    try:
        yield
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
