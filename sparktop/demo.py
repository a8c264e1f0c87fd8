"""`sparktop demo`: a two-node twin cluster on this machine, serving a model.

The nodes live under the state directory (`demo/`), each with its own
stand-in `docker`, `nvidia-smi`, `vllm` and `ray`; the engines start through
the twin's docker exactly as on a real node.
"""

from __future__ import annotations

import asyncio
import signal

from sparktop.settings import state_dir
from sparktop.twin.cluster import TwinCluster, wait_ready


async def start_demo_cluster(model: str, speed: float = 1.0) -> tuple[TwinCluster, list[str]]:
    cluster = TwinCluster(state_dir() / "demo", speed=speed).setup()
    await cluster.stop_all()
    urls = await cluster.run_solo(model=model)
    await wait_ready(urls, timeout=180)
    return cluster, urls


async def run_demo(args) -> int:
    if args.stop:
        cluster = TwinCluster(state_dir() / "demo").setup(fresh=False)
        await cluster.stop_all()
        print("Stopped the demo cluster.")
        return 0
    print(f"Starting a two-node twin cluster serving {args.model} ...", flush=True)
    cluster, urls = await start_demo_cluster(args.model, args.speed)
    for node, url in zip(cluster.nodes, urls):
        print(f"  {node.name:8} {url}/v1   (metrics: {url}/metrics)")
    if args.no_wait:
        print(f"Left running; stop with: sparktop demo --stop  (state in {cluster.root})")
        return 0
    print("Press Ctrl-C to stop.", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        print("Stopping the twin cluster ...", flush=True)
        await cluster.stop_all()
    return 0
