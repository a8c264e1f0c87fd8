"""`sparktop demo`: a twin cluster on this machine (two nodes, or up to eight
with --nodes), serving a model under a light background load, watched by
the real app.

The nodes live under the state directory (`demo/`), each with its own
stand-in `docker`, `nvidia-smi`, `vllm` and `ray`; the engines start through
the twin's docker exactly as on a real node, and the monitor reaches them
the way it reaches real nodes: a shell per node, HTTP per engine.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys

from sparktop.errors import SparktopError
from sparktop.layouts import MAX_NODES
from sparktop.settings import Defaults, state_dir
from sparktop.twin.cluster import DEFAULT_IMAGE, TwinCluster, wait_ready


def demo_root():
    return state_dir() / "demo"


def node_names(count: int) -> tuple[str, ...]:
    """spark-a, spark-b, ... for a demo of `count` nodes (2 to 8)."""
    if not 1 <= count <= MAX_NODES:
        raise SparktopError(f"--nodes {count}: a demo runs 1 to {MAX_NODES} nodes")
    return tuple(f"spark-{chr(ord('a') + i)}" for i in range(count))


async def start_demo_cluster(model: str, speed: float = 1.0, startup_speed: float = 30.0,
                             wait: bool = True, nodes: int = 2) -> tuple[TwinCluster, list[str]]:
    # The images the inventory's recipes use are "pulled" too, so the launcher works in the demo.
    defaults = Defaults()
    cluster = TwinCluster(demo_root(), names=node_names(nodes), speed=speed, startup_speed=startup_speed,
                          images=[DEFAULT_IMAGE, defaults.image, defaults.router_image]).setup()
    await cluster.stop_all()
    urls = await cluster.run_solo(model=model, startup_speed=startup_speed)
    if wait:
        await wait_ready(urls, timeout=180)
    return cluster, urls


def demo_inventory(speed: float = 1.0, startup_speed: float = 30.0):
    """The demo's two twin nodes as an inventory (set up when they are not),
    for `sparktop study --demo`: the study launches on them as on Sparks."""
    defaults = Defaults()
    root = demo_root()
    cluster = TwinCluster(root, speed=speed, startup_speed=startup_speed,
                          images=[DEFAULT_IMAGE, defaults.image, defaults.router_image])
    cluster.setup(fresh=not root.exists())
    # The router topologies run the real LiteLLM proxy inside the twin's
    # "container": the one on this machine's PATH, when there is one.
    litellm = shutil.which("litellm")
    link = cluster.root / "bin" / "litellm"
    if litellm and not link.exists():
        link.symlink_to(litellm)
    return cluster.inventory()


def start_load(urls: list[str], low: int = 1, high: int = 6) -> subprocess.Popen:
    # Same process group as the app, and it exits when its parent does, so a
    # closed terminal never leaves load running against the next demo.
    return subprocess.Popen([sys.executable, "-m", "sparktop.twin.load", *urls, "--min", str(low),
                             "--max", str(high), "--parent", str(os.getpid())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def run_demo(args) -> int:
    if args.stop:
        # As many nodes as the demo left running had.
        names = tuple(sorted(p.name for p in demo_root().glob("spark-*") if p.is_dir())) or node_names(2)
        cluster = TwinCluster(demo_root(), names=names).setup(fresh=False)
        await cluster.stop_all()
        print("Stopped the demo cluster.")
        return 0
    count = getattr(args, "nodes", 2) or 2
    what = f"a {count}-node twin cluster" if count != 2 else "a two-node twin cluster"
    if args.no_wait:
        print(f"Starting {what} serving {args.model} ...", flush=True)
        cluster, urls = await start_demo_cluster(args.model, args.speed, nodes=count)
        for node, url in zip(cluster.nodes, urls, strict=False):
            print(f"  {node.name:8} {url}/v1   (metrics: {url}/metrics)")
        print(f"Left running; stop with: sparktop demo --stop  (state in {cluster.root})")
        return 0

    from sparktop.launch.state import api_key_for
    from sparktop.observe.poller import NodeTarget, Poller
    from sparktop.ui.run import run_monitor

    print(f"Starting {what} serving {args.model} ...", flush=True)
    cluster, urls = await start_demo_cluster(args.model, args.speed, wait=False, nodes=count)
    load = start_load(urls)
    poller = Poller([NodeTarget(n.name, n.transport(), n.address) for n in cluster.nodes],
                    interval=args.interval, default_port=None, router_key=api_key_for)
    try:
        await run_monitor(cluster.inventory(), [], label=f"demo: twin cluster serving {args.model}",
                          poller=poller, record=args.record)
    finally:
        load.send_signal(signal.SIGTERM)
        try:
            load.wait(5)
        except subprocess.TimeoutExpired:
            load.kill()
        await cluster.stop_all()
    return 0


def main(args) -> int:
    return asyncio.run(run_demo(args))
