"""vLLM started outside Docker is found with no --engine: a twin run as a
plain process on this machine, watched as the local node (read in-process)
and through the probe script a remote node runs (the same shell section,
here by `sh`), appears with its port and how it was found, and goes when it
stops."""

from __future__ import annotations

import asyncio
import contextlib
import os

from sparktop.observe.host_probe import HostProbe, servers_script
from sparktop.observe.poller import NodeTarget, Poller
from sparktop.observe.snapshot import EngineGone, EngineSnapshot, NodeSnapshot
from sparktop.remote import LocalTransport
from sparktop.remote.base import CommandResult
from tests.helpers.twin_process import start_twin_process
from tests.helpers.wait import eventually


class ShellTransport:
    """A node reached through a shell that is not `LocalTransport`: the
    probe sends it the script it sends over SSH."""

    def __init__(self, name: str):
        self.name = name
        self._local = LocalTransport(name)
        self.scripts: list[str] = []

    async def run(self, cmd, timeout: float | None = 30.0, input: str | None = None) -> CommandResult:
        self.scripts.append(cmd if isinstance(cmd, str) else " ".join(cmd))
        return await self._local.run(cmd, timeout=timeout, input=input)

    async def close(self) -> None:
        pass


async def test_a_twin_started_as_a_plain_process_is_found_and_dropped_when_it_stops():
    proc, url = await asyncio.to_thread(start_twin_process, "llama-3.1-8b", speed=4)
    port = int(url.rsplit(":", 1)[1])
    poller = Poller([NodeTarget("here", LocalTransport("here"), "127.0.0.1")], interval=0.3, default_port=None)
    await poller.start()
    engines: list[EngineSnapshot] = []
    nodes: list[NodeSnapshot] = []
    gone: list[str] = []

    async def consume():
        async for event in poller.events():
            if isinstance(event, EngineSnapshot) and event.url == url:
                engines.append(event)
            elif isinstance(event, NodeSnapshot):
                nodes.append(event)
            elif isinstance(event, EngineGone) and event.key == url:
                gone.append(event.key)

    task = asyncio.create_task(consume())
    try:
        await eventually(lambda: any(e.state == "ready" for e in engines), what="the twin found and ready")
        ready = next(e for e in engines if e.state == "ready")
        assert ready.found == f"process {proc.pid} (sparktop twin serve, port {port})"
        assert ready.node == "here" and ready.model == "llama-3.1-8b"
        (server,) = [s for s in nodes[-1].servers if s.pid == proc.pid]
        assert (server.ports, server.port_source) == ([port], "socket")
        proc.kill()
        proc.wait(10)
        await eventually(lambda: gone, what="the engine gone once its process stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await poller.close()


async def test_the_probe_script_lists_it_then_skips_the_rereading_while_nothing_changes():
    proc, url = await asyncio.to_thread(start_twin_process, "llama-3.1-8b", speed=4)
    port = int(url.rsplit(":", 1)[1])
    transport = ShellTransport("sh-node")
    probe = HostProbe("sh-node", transport, docker_every=0.0)  # the servers section on every poll
    try:
        first = await probe.poll()
        (server,) = [s for s in first.servers if s.pid == proc.pid]
        assert (server.command, server.ports, server.port_source) == ("sparktop twin serve", [port], "socket")
        assert server.argv[1:5] == ["-m", "sparktop", "twin", "serve"]
        # Next time the section stops after its first grep if the same processes are there (the list is
        # kept), unless one had not shown its socket (other sessions' processes run here too).
        second = await probe.poll()
        assert ("then echo unchanged" in transport.scripts[-1]) == all(
            s.port_source == "socket" for s in first.servers)
        assert proc.pid in {s.pid for s in second.servers}
    finally:
        proc.kill()
        proc.wait(10)
    third = await probe.poll()
    assert proc.pid not in {s.pid for s in third.servers}
    assert os.getpid() not in {s.pid for s in third.servers}  # sparktop itself is no server


async def test_without_a_gpu_process_list_the_engines_memory_is_what_their_processes_hold():
    """No nvidia-smi here, as on a node where it lists no processes: a vLLM engine core (which renames
    itself `VLLM::EngineCore`) holding 400 MiB counts as engine memory, read by the in-process read and by
    the probe script a remote node runs, and the memory goes with it."""
    import subprocess
    import sys

    hold = "b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(120)"
    core = subprocess.Popen(["bash", "-c", 'exec -a VLLM::EngineCore "$0" -c "$1"', sys.executable, hold])
    try:
        for transport in (LocalTransport("here"), ShellTransport("sh-node")):
            probe = HostProbe(transport.name, transport, docker_every=0.0)
            # The bytes are touched a moment after the start: wait until they are resident.
            for _ in range(50):
                with_core = await probe.poll()
                if with_core.gpu_status == "missing" and with_core.engines_mib >= 400:
                    break
                await asyncio.sleep(0.1)
            assert with_core.gpu_status == "missing" and not with_core.processes
            assert with_core.engines_mib >= 400, f"{transport.name}: {with_core.engines_mib} MiB"
            if isinstance(transport, ShellTransport):
                # Its own line in what the node printed, and none once it is gone (the total would move
                # with whatever else runs here).
                script = servers_script()
                answer = await transport.run(["sh", "-c", script])
                assert f"/proc/{core.pid}/rss:" in answer.stdout
                core.kill()
                core.wait(10)
                answer = await transport.run(["sh", "-c", script])
                assert f"/proc/{core.pid}/rss:" not in answer.stdout
    finally:
        if core.poll() is None:
            core.kill()


class _Shell:
    """A twin node reached through its shell, as over SSH: the probe sends it the script."""

    def __init__(self, transport):
        self.name, self._local = transport.name, transport

    async def run(self, cmd, timeout: float | None = 30.0, input: str | None = None) -> CommandResult:
        return await self._local.run(cmd, timeout=timeout, input=input)

    async def close(self) -> None:
        pass


async def test_twin_nodes_share_this_machines_processes_but_each_lists_only_its_own(tmp_path):
    """A twin started by hand on this machine is on no demo node; one started on spark-a's shell is on
    spark-a only, read in-process and through the script alike (the demo once showed a hand-started twin
    under both nodes)."""
    import subprocess
    import sys

    import httpx

    from sparktop.twin.cluster import TwinCluster
    from tests.conftest import free_port

    cluster = TwinCluster(tmp_path / "demo").setup()
    a, b = cluster.nodes
    by_hand, _ = await asyncio.to_thread(start_twin_process, "llama-3.1-8b", speed=4)
    port = free_port()
    on_a = subprocess.Popen([sys.executable, "-m", "sparktop", "twin", "serve", "llama-3.1-8b", "--host", "127.0.0.1",
                             "--port", str(port), "--speed", "4", "--startup-speed", "1000000"],
                            env={**os.environ, "SPARKTOP_TWIN_HOME": str(a.host.home)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        for _ in range(600):
            if await healthy():
                break
            await asyncio.sleep(0.1)
        for node in (a, b):
            for transport in (node.transport(), _Shell(node.transport())):
                snap = await HostProbe(node.name, transport, docker_every=0.0).poll()
                pids = {s.pid for s in snap.servers}
                assert by_hand.pid not in pids, (node.name, type(transport).__name__)
                assert (on_a.pid in pids) == (node is a), (node.name, type(transport).__name__)
    finally:
        for proc in (by_hand, on_a):
            proc.kill()
            proc.wait(10)
