"""The twin's `ray` command: enough of a Ray cluster for vLLM's Ray executor.

    ray start --head --port 6379 [--node-ip-address IP] [--block]
    ray start --address HEAD:6379 [--node-ip-address IP] [--block]
    ray status [--address HEAD:6379]
    ray stop [--force]

`ray start --head` runs a small daemon (the GCS stand-in) listening on the
head's address; `ray start --address` runs a member daemon on another host
that joins it and stays connected. A vLLM twin started with
`--distributed-executor-backend ray` connects as a driver, checks the cluster
has enough GPUs, and asks the GCS to place its tensor-parallel worker on a
member node; that node's `nvidia-smi` then shows a `ray::RayWorkerWrapper`
process. A member that dies takes the engine down with it, as in Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparktop.twin import wire
from sparktop.twin.host import TwinHost, pid_alive, read_json, write_json
from sparktop.twin.link import LinkTraffic

DEFAULT_PORT = 6379


def _state(host: TwinHost, role: str) -> Path:
    return host.home / "ray" / f"{role}.json"


# -- the daemons ----------------------------------------------------------------


class Gcs:
    """The head daemon: node table, drivers, worker placement."""

    def __init__(self, host: TwinHost, ip: str, port: int):
        self.host = host
        self.ip = ip
        self.port = port
        self.nodes: dict[str, dict] = {}  # node id -> {name, ip, gpus, writer}
        self.drivers: dict[str, asyncio.StreamWriter] = {}
        self.placements: dict[str, str] = {}  # engine id -> node id
        self.stopped = asyncio.Event()

    async def run(self) -> None:
        server = await asyncio.start_server(self._handle, self.ip, self.port)
        head_id = f"node_{self.host.name}"
        self.nodes[head_id] = {"name": self.host.name, "ip": self.ip, "gpus": 1, "writer": None, "head": True}
        write_json(_state(self.host, "head"), {
            "pid": os.getpid(), "address": f"{self.ip}:{self.port}", "started": time.time(),
        })
        print(f"Ray runtime started. GCS address: {self.ip}:{self.port}", flush=True)
        async with server:
            await self.stopped.wait()

    async def _handle(self, reader, writer) -> None:
        msg = await wire.recv(reader)
        if not msg:
            writer.close()
            return
        op = msg.get("op")
        if op == "status":
            await wire.send(writer, {"nodes": [
                {"id": nid, "name": n["name"], "ip": n["ip"], "gpus": n["gpus"], "head": n.get("head", False)}
                for nid, n in self.nodes.items()
            ], "placements": self.placements})
            writer.close()
        elif op == "join":
            await self._member(msg, reader, writer)
        elif op == "driver":
            await self._driver(msg, reader, writer)
        else:
            writer.close()

    async def _member(self, msg, reader, writer) -> None:
        node_id = f"node_{msg.get('name')}"
        self.nodes[node_id] = {"name": msg.get("name"), "ip": msg.get("ip"), "gpus": int(msg.get("gpus", 1)),
                               "writer": writer}
        await wire.send(writer, {"ok": True, "node_id": node_id})
        while await wire.recv(reader) is not None:
            pass
        self.nodes.pop(node_id, None)
        for engine, where in list(self.placements.items()):
            if where == node_id:
                self.placements.pop(engine)
                driver = self.drivers.get(engine)
                if driver:
                    with contextlib.suppress(ConnectionError, OSError):
                        await wire.send(driver, {"op": "node_dead", "node": msg.get("name")})

    async def _driver(self, msg, reader, writer) -> None:
        engine = str(msg.get("engine"))
        gpus = sum(n["gpus"] for n in self.nodes.values())
        need = int(msg.get("gpus", 1))
        if gpus < need:
            await wire.send(writer, {"ok": False, "error": (
                f"The number of required GPUs exceeds the total number of available GPUs in the placement "
                f"group. Required: {need}, available: {gpus} on {len(self.nodes)} node(s)")})
            writer.close()
            return
        members = [nid for nid, n in self.nodes.items() if not n.get("head") and n["writer"] is not None]
        placed = []
        for nid in members[: need - 1]:
            await wire.send(self.nodes[nid]["writer"], {"op": "host_worker", "engine": engine,
                                                        "used_mib": msg.get("used_mib", 0)})
            self.placements[engine] = nid
            placed.append(self.nodes[nid]["name"])
        self.drivers[engine] = writer
        await wire.send(writer, {"ok": True, "workers": placed})
        while True:
            m = await wire.recv(reader)
            if m is None:
                break
            if m.get("op") in ("util", "link") and engine in self.placements:
                node = self.nodes.get(self.placements[engine])
                if node and node["writer"] is not None:
                    with contextlib.suppress(ConnectionError, OSError):
                        await wire.send(node["writer"], {**m, "engine": engine})
        self.drivers.pop(engine, None)
        placed_on = self.placements.pop(engine, None)
        node = self.nodes.get(placed_on) if placed_on else None
        if node and node["writer"] is not None:
            with contextlib.suppress(ConnectionError, OSError):
                await wire.send(node["writer"], {"op": "release", "engine": engine})


async def member(host: TwinHost, head_ip: str, head_port: int, ip: str) -> int:
    try:
        async with asyncio.timeout(10):  # not wait_for, which can lose a cancel on Python 3.11
            reader, writer = await asyncio.open_connection(head_ip, head_port)
    except (TimeoutError, OSError) as exc:
        print(f"ConnectionError: Unable to connect to GCS at {head_ip}:{head_port}: {exc}", file=sys.stderr, flush=True)
        return 1
    await wire.send(writer, {"op": "join", "name": host.name, "ip": ip, "gpus": 1})
    reply = await wire.recv(reader)
    if not reply or not reply.get("ok"):
        print("ConnectionError: the GCS refused this node", file=sys.stderr, flush=True)
        return 1
    write_json(_state(host, "member"), {"pid": os.getpid(), "address": f"{head_ip}:{head_port}",
                                        "started": time.time()})
    print(f"Ray runtime started. Connected to {head_ip}:{head_port}", flush=True)
    hosting: set[str] = set()
    links: dict[str, LinkTraffic] = {}  # per engine: its NCCL's traffic on this node
    used = 0
    while True:
        msg = await wire.recv(reader)
        if msg is None:
            break
        op = msg.get("op")
        if op == "host_worker":
            hosting.add(msg["engine"])
            used += int(msg.get("used_mib", 0))
            host.register(os.getpid(), "ray::RayWorkerWrapper", used)
        elif op == "util":
            host.update_util(os.getpid(), float(msg.get("util", 0)))
        elif op == "link" and msg.get("engine") in hosting:
            if msg["engine"] not in links:
                links[msg["engine"]] = LinkTraffic(host.home)
            links[msg["engine"]].advance(float(msg.get("link", 0)))
        elif op == "release":
            hosting.discard(msg["engine"])
            links.pop(msg["engine"], None)
            if not hosting:
                used = 0
                host.unregister(os.getpid())
    host.unregister(os.getpid())
    print("The GCS is gone; this Ray node is shutting down.", file=sys.stderr, flush=True)
    return 1


def _daemon_main(argv: list[str]) -> int:
    host = TwinHost.from_env()
    if host is None:  # `ray start` checked it and passes its environment on; this is a daemon run by hand
        print("ray (sparktop twin): SPARKTOP_TWIN_HOME is not set", file=sys.stderr)
        return 2
    role, ip, port = argv[0], argv[1], int(argv[2])
    loop_exit = 0

    def on_term(*_):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    try:
        if role == "head":
            gcs = Gcs(host, ip, port)
            asyncio.run(gcs.run())
        else:
            head_ip, head_port = argv[3], int(argv[4])
            loop_exit = asyncio.run(member(host, head_ip, head_port, ip))
    except OSError as exc:
        print(f"Failed to start the Ray runtime: {exc}", file=sys.stderr, flush=True)
        loop_exit = 1
    finally:
        host.unregister(os.getpid())
        state = _state(host, "head" if role == "head" else "member")
        data = read_json(state)
        if data and data.get("pid") == os.getpid():
            state.unlink(missing_ok=True)
    return loop_exit


# -- the driver (used by the vLLM twin) -------------------------------------------


def head_address(host: TwinHost | None) -> str | None:
    """The address `ray.init(address="auto")` would find on this host."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    if host is None:
        return None
    for role in ("head", "member"):
        data = read_json(_state(host, role))
        if data and pid_alive(int(data["pid"])):
            return data["address"]
    return None


class RayDriver:
    def __init__(self, address: str, engine: str):
        self.address = address
        self.engine = engine
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self, gpus: int, used_mib: int) -> list[str]:
        ip, port = self.address.rsplit(":", 1)
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(ip, int(port))
        self.reader, self.writer = reader, writer
        await wire.send(writer, {"op": "driver", "engine": self.engine, "gpus": gpus, "used_mib": used_mib})
        reply = await wire.recv(reader)
        if not reply or not reply.get("ok"):
            raise RuntimeError((reply or {}).get("error", "the Ray GCS closed the connection"))
        return reply.get("workers", [])

    async def watch(self) -> str:
        """Returns the reason when the cluster loses our worker."""
        reader = self.reader
        assert reader is not None, "watch() after connect()"
        while True:
            msg = await wire.recv(reader)
            if msg is None:
                return "the Ray GCS is gone"
            if msg.get("op") == "node_dead":
                return f"node {msg.get('node')} died"

    async def util(self, value: float) -> None:
        if self.writer is not None:
            with contextlib.suppress(ConnectionError, OSError):
                await wire.send(self.writer, {"op": "util", "util": value})

    async def link(self, total: float) -> None:
        """The bytes each node has sent over the link so far, for the worker's node to count."""
        if self.writer is not None:
            with contextlib.suppress(ConnectionError, OSError):
                await wire.send(self.writer, {"op": "link", "link": total})

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# -- the command line -------------------------------------------------------------


def _spawn_daemon(host: TwinHost, args: list[str]) -> subprocess.Popen:
    # The daemon gets its own copy of the log's descriptor; ours can close.
    with open(host.home / "logs" / "ray.log", "ab") as log:
        # Inside a (twin) container the daemon stays in the container's process
        # group, so removing the container stops Ray, as with real containers.
        return subprocess.Popen(
            [sys.executable, "-m", "sparktop.twin.ray", "_daemon", *args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=not os.environ.get("SPARKTOP_TWIN_CONTAINER"),
        )


def _wait_state(host: TwinHost, role: str, proc: subprocess.Popen, timeout: float = 15) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        data = read_json(_state(host, role))
        if data and data.get("pid") == proc.pid:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_daemon":
        return _daemon_main(argv[1:])
    host = TwinHost.from_env()
    if host is None:
        print("ray (sparktop twin): SPARKTOP_TWIN_HOME is not set", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="ray")
    sub = parser.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start")
    start.add_argument("--head", action="store_true")
    start.add_argument("--address")
    start.add_argument("--port", type=int, default=DEFAULT_PORT)
    start.add_argument("--node-ip-address")
    start.add_argument("--block", action="store_true")
    start.add_argument("--num-gpus", type=int, default=1)
    status = sub.add_parser("status")
    status.add_argument("--address")
    stop = sub.add_parser("stop")
    stop.add_argument("--force", action="store_true")
    stop.add_argument("-g", "--grace-period", type=int, default=16)
    ns, _unknown = parser.parse_known_args(argv)

    return {"start": _start, "status": _status, "stop": _stop}[ns.cmd](host, ns)


def _start(host: TwinHost, ns: argparse.Namespace) -> int:
    """`ray start --head` or `ray start --address HEAD:PORT`."""
    ip = ns.node_ip_address or host.address
    if ns.head:
        args = ["head", ip, str(ns.port)]
        role = "head"
    elif ns.address:
        head_ip, _, head_port = ns.address.rpartition(":")
        args = ["member", ip, "0", head_ip, head_port or str(DEFAULT_PORT)]
        role = "member"
    else:
        print("ray start: one of --head or --address is required", file=sys.stderr)
        return 2
    existing = read_json(_state(host, role))
    if existing and pid_alive(int(existing["pid"])):
        print("ConnectionError: Ray is already running on this node; run `ray stop` first.", file=sys.stderr)
        return 1
    if ns.block:
        return _daemon_main(args)
    proc = _spawn_daemon(host, args)
    if not _wait_state(host, role, proc):
        print("Failed to start the Ray runtime; see the log in "
              f"{host.home / 'logs' / 'ray.log'}", file=sys.stderr)
        return 1
    print(f"Local node IP: {ip}\n--------------------\nRay runtime started.\n--------------------")
    return 0


def _status(host: TwinHost, ns: argparse.Namespace) -> int:
    """`ray status`: the cluster's nodes and GPUs, as Ray prints them."""
    address = ns.address or head_address(host)
    if not address:
        print("ConnectionError: Could not find any running Ray instance. Please specify the one to "
              "connect to by setting `--address` flag or `RAY_ADDRESS` environment variable.",
              file=sys.stderr)
        return 1
    ip, port = address.rsplit(":", 1)
    try:
        reply = asyncio.run(wire.request(ip, int(port), {"op": "status"}))
    except (TimeoutError, OSError) as exc:
        print(f"ConnectionError: GCS at {address} is not reachable: {exc}", file=sys.stderr)
        return 1
    nodes = (reply or {}).get("nodes", [])
    gpus = sum(n["gpus"] for n in nodes)
    used = len((reply or {}).get("placements", {})) * 2
    print(f"======== Autoscaler status: {time.strftime('%Y-%m-%d %H:%M:%S')} ========")
    print("Node status\n" + "-" * 63 + "\nActive:")
    for n in nodes:
        print(f" 1 {n['id']} ({n['ip']})")
    print("Pending:\n (no pending nodes)\nRecent failures:\n (no failures)\n")
    print("Resources\n" + "-" * 63 + "\nUsage:")
    print(f" 0.0/{20.0 * len(nodes):.1f} CPU\n {min(used, gpus):.1f}/{gpus:.1f} GPU")
    return 0


def _stop(host: TwinHost, ns: argparse.Namespace) -> int:
    """`ray stop`: every Ray process of this host."""
    stopped = 0
    for role in ("head", "member"):
        data = read_json(_state(host, role))
        if data and pid_alive(int(data["pid"])):
            try:
                os.killpg(int(data["pid"]), signal.SIGKILL if ns.force else signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(data["pid"]), signal.SIGTERM)
            stopped += 1
        _state(host, role).unlink(missing_ok=True)
    print(f"Stopped all {stopped} Ray processes." if stopped else "Did not find any active Ray processes.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
