"""The twin's stand-in for torch.distributed across two nodes (vLLM without Ray).

The head (`--node-rank 0`) listens on `--master-addr:--master-port`, like a
TCPStore, and waits for the other ranks; each worker (`--headless`) connects
and stays connected. The head then streams its GPU utilisation to the
workers so their `nvidia-smi` shows them busy together. When either side
goes away the other fails, as an NCCL communicator would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from sparktop.twin import wire


@dataclass
class Peer:
    rank: int
    host: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


@dataclass
class HeadRendezvous:
    host: str
    port: int
    world: int  # number of nodes, head included
    model: str
    on_lost: Callable[[str], None] | None = None
    peers: list[Peer] = field(default_factory=list)
    _server: asyncio.AbstractServer | None = None
    _joined: asyncio.Event = field(default_factory=asyncio.Event)
    _hello: dict = field(default_factory=dict)

    async def start(self) -> None:
        bind = "0.0.0.0" if self.host in ("0.0.0.0", "") else self.host
        self._server = await asyncio.start_server(self._handle, bind, self.port)

    async def _handle(self, reader, writer) -> None:
        try:
            await self._serve_peer(reader, writer)
        except asyncio.CancelledError:
            # The head is shutting down. Not re-raised: on Python 3.11 a cancelled connection task makes
            # start_server's callback log a traceback ("Exception in callback ... CancelledError") into the
            # engine's log, which reads as a failure in the log of its next start.
            writer.close()

    async def _serve_peer(self, reader, writer) -> None:
        hello = await wire.recv(reader)
        if not hello or hello.get("op") != "join":
            writer.close()
            return
        if hello.get("model") != self.model:
            await wire.send(writer, {"ok": False, "error": f"model mismatch: head serves {self.model}, "
                                                            f"rank {hello.get('rank')} loads {hello.get('model')}"})
            writer.close()
            return
        if len(self.peers) >= self.world - 1:
            await wire.send(writer, {"ok": False, "error": "world is already complete"})
            writer.close()
            return
        peer = Peer(int(hello.get("rank", len(self.peers) + 1)), str(hello.get("host", "?")), reader, writer)
        self.peers.append(peer)
        await wire.send(writer, {"ok": True, **self._hello})
        if len(self.peers) >= self.world - 1:
            self._joined.set()
        # Watch the connection: EOF means the worker died.
        while await wire.recv(reader) is not None:
            pass
        if peer in self.peers and self.on_lost:
            self.on_lost(f"rank {peer.rank} on {peer.host} disconnected")

    async def wait(self, timeout: float, hello: dict) -> None:
        self._hello = hello
        async with asyncio.timeout(timeout):  # not wait_for, which can lose a cancel on Python 3.11
            await self._joined.wait()

    async def broadcast(self, message: dict) -> None:
        for peer in list(self.peers):
            with contextlib.suppress(ConnectionError, OSError):
                await wire.send(peer.writer, message)

    async def close(self) -> None:
        for peer in self.peers:
            peer.writer.close()
        self.peers.clear()
        if self._server:
            self._server.close()


async def join(master_addr: str, master_port: int, hello: dict, timeout: float):
    """Worker side: connect (retrying, as torch does) and introduce ourselves."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Exception | None = None
    while loop.time() < deadline:
        try:
            async with asyncio.timeout(2):
                reader, writer = await asyncio.open_connection(master_addr, master_port)
        except (TimeoutError, OSError) as exc:
            last = exc
            await asyncio.sleep(0.2)
            continue
        await wire.send(writer, {"op": "join", **hello})
        reply = await wire.recv(reader)
        if not reply or not reply.get("ok"):
            writer.close()
            raise RuntimeError((reply or {}).get("error", "the head closed the connection"))
        return reader, writer, reply
    raise TimeoutError(f"could not reach the head at {master_addr}:{master_port}: {last}")
