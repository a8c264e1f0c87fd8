"""A cluster of simulated Spark nodes on this machine (the demo and tests).

Each node is a `TwinHost` directory plus a `bin/` with the stand-in
commands; a `LocalTransport` with that node's environment is a shell "on"
the node. Nodes listen on their own loopback addresses (127.0.0.2,
127.0.0.3, ...) when the system allows it, as two Sparks have two
addresses, or on 127.0.0.1 with distinct ports when it does not. Each
node is one of the GB10 machines (`variants`, NVIDIA's DGX Spark, ASUS's
Ascent GX10, ...: what its /sys/class/dmi/id says); by default the nodes
take the makers in turn, so the demo's two nodes are an NVIDIA and an ASUS.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import site
import socket
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sparktop import engine_ids
from sparktop.engine_ids import DEFAULT
from sparktop.remote import LocalTransport
from sparktop.settings import Defaults, Inventory, Node
from sparktop.twin.dialects import DIALECTS, dialect_for
from sparktop.twin.host import VARIANT_ORDER, TwinHost
from sparktop.twin.node import install

DEFAULT_IMAGE = "vllm/vllm-openai:v0.20.1"  # the twin's vLLM image (its entrypoint is `vllm serve`)
DEMO_MODEL = "gpt-oss-120b"
# The images the other engines' stand-ins are "pulled" as (their `engine_ids` default image); how their containers
# start them is their dialect's `demo_argv`.
RUNTIME_IMAGES = {r.id: r.default_image for r in engine_ids.ROWS if r.id in DIALECTS and r.id != DEFAULT}


def container_name(engine: str) -> str:
    """The demo's container of an engine: sparktop-vllm, sparktop-llama-cpp, ..."""
    return "sparktop-" + engine.replace(".", "-")


def loopback_aliases_work() -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return True
    except OSError:
        return False


@dataclass
class TwinNode:
    name: str
    address: str
    host: TwinHost
    bin_dir: Path

    @property
    def home(self) -> Path:
        """The node user's HOME (each Spark has its own, with its own HF cache)."""
        return self.host.home / "home"

    @property
    def env(self) -> dict[str, str]:
        self.home.mkdir(parents=True, exist_ok=True)
        # A user-site install of sparktop stays importable under the node's HOME.
        return {**self.host.env(self.bin_dir), "HOME": str(self.home), "PYTHONUSERBASE": site.getuserbase()}

    def transport(self) -> LocalTransport:
        return LocalTransport(self.name, env=self.env)

    def inventory_node(self) -> Node:
        return Node(name=self.name, host="localhost", fabric_ip=self.address, eth_if="enp1s0f1np1",
                    ib_if=["rocep1s0f1", "roceP2p1s0f1"], env=self.env, bind=self.address)


@dataclass
class TwinCluster:
    root: Path
    names: tuple[str, ...] = ("spark-a", "spark-b")
    speed: float = 1.0
    startup_speed: float | None = None  # how much faster than a Spark engines start (None: the twin's default)
    images: list[str] = field(default_factory=lambda: [DEFAULT_IMAGE])
    # The GB10 machine each node is (`host.VARIANTS`), in turn; the makers in turn when empty.
    variants: tuple[str, ...] = ()
    nodes: list[TwinNode] = field(default_factory=list)

    def variant(self, index: int) -> str:
        order = self.variants or VARIANT_ORDER
        return order[index % len(order)]

    def setup(self, fresh: bool = True) -> TwinCluster:
        if fresh and self.root.exists():
            shutil.rmtree(self.root)
        aliases = loopback_aliases_work()
        bin_dir = install(self.root / "bin")
        self.nodes = []
        for i, name in enumerate(self.names):
            address = f"127.0.0.{i + 2}" if aliases else "127.0.0.1"
            host = TwinHost(self.root / name)
            host.setup(name, speed=self.speed, images=list(self.images), address=address,
                       startup_speed=self.startup_speed, variant=self.variant(i))
            self.nodes.append(TwinNode(name, address, host, bin_dir))
        return self

    def node(self, name: str) -> TwinNode:
        return next(n for n in self.nodes if n.name == name)

    def inventory(self) -> Inventory:
        """The nodes as an inventory: vLLM's image is the one `run_solo` serves from, and the pace is the
        twins' (`defaults.twin_speed`), so predictions for these nodes are scaled as they serve."""
        return Inventory(nodes=[n.inventory_node() for n in self.nodes],
                         defaults=Defaults(image=self.images[0], twin_speed=self.speed))

    def port_for(self, index: int, port: int) -> int:
        """Same port on every node when each has its own address."""
        return port if self.nodes[index].address != "127.0.0.1" else port + index

    async def run_solo(self, model: str = DEMO_MODEL, port: int = 8000, startup_speed: float = 30.0,
                       extra: list[str] | None = None, name: str | None = None,
                       engines: list[str] | None = None) -> list[str]:
        """Start one solo engine on every node (through the twin's docker); `engines`: the engine each node
        runs in turn (`vllm`, `sglang`, `llama.cpp`, `trtllm`; vLLM on every node by default), each in a
        container named after its engine (`sparktop-llama-cpp`) unless `name` is given."""
        urls = []
        for i, node in enumerate(self.nodes):
            p = self.port_for(i, port)
            engine = (engines or [DEFAULT])[i % len(engines or [DEFAULT])]
            run = ["docker", "run", "-d", "--name", name or container_name(engine), "--gpus", "all", "--ipc=host",
                   "--network", "host"]
            twin = ["--speed", str(self.speed), "--startup-speed", str(startup_speed), *(extra or [])]
            argv = run + self._serve(engine, node, model, p, twin)
            result = await node.transport().run(shlex.join(argv), timeout=30)
            if not result.ok:
                raise RuntimeError(f"{node.name}: {result.first_error_line()}")
            urls.append(f"http://{node.address}:{p}")
        return urls

    def _serve(self, engine: str, node: TwinNode, model: str, port: int, twin: list[str]) -> list[str]:
        """The image and command that serve `model` with `engine`, as its own images start it."""
        where = ["--host", node.address, "--port", str(port)]
        dialect = dialect_for(engine)
        image = RUNTIME_IMAGES.get(dialect.id) or self.images[0]  # vLLM: the cluster's first image
        return dialect.demo_argv(image, model, where, twin, self.root)

    async def stop_all(self, name: str | None = None) -> None:
        names = [name] if name else [container_name(e) for e in (DEFAULT, *RUNTIME_IMAGES)]
        for node in self.nodes:
            await node.transport().run(shlex.join(["docker", "rm", "-f", *names]), timeout=30)


async def wait_ready(urls: list[str], timeout: float = 120.0) -> None:
    """Until every endpoint answers /health with 200."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = list(urls)
    async with httpx.AsyncClient(timeout=2.0) as client:
        while pending:
            if loop.time() > deadline:
                raise TimeoutError(f"not ready after {timeout:.0f}s: {', '.join(pending)}")
            for url in list(pending):
                try:
                    if (await client.get(url + "/health")).status_code == 200:
                        pending.remove(url)
                except httpx.HTTPError:
                    pass
            if pending:
                await asyncio.sleep(0.3)
