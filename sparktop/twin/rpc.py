"""The twin's `rpc-server` (llama.cpp's `ggml-rpc-server`): the worker of a
llama.cpp layout over several nodes. It listens where it is told (`-H`,
`-p`, 127.0.0.1:50052 by default) and holds each head that connects; while
one does, its node shows a GPU process holding that head's share of the
layers, as a real rpc-server's CUDA backend would. It prints llama.cpp's
banner (on stderr, as the real one does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

from sparktop.twin.host import TwinHost

DEFAULT_PORT = 50052
VERSION = "7.0.0"  # the RPC protocol version llama.cpp b11434's rpc-server prints


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rpc-server", add_help=True)
    p.add_argument("-H", "--host", default="127.0.0.1")
    p.add_argument("-p", "--port", type=int, default=DEFAULT_PORT)
    p.add_argument("-c", "--cache", action="store_true")
    p.add_argument("-d", "--device")
    p.add_argument("-t", "--threads", type=int)
    ns = p.parse_args(argv)
    return asyncio.run(_serve(ns.host, ns.port))


async def _serve(host: str, port: int) -> int:
    twin = TwinHost.from_env()
    heads: set[asyncio.StreamWriter] = set()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.add(writer)
        if twin is not None:  # the head's layers on this node's GPU, as long as it is connected
            twin.register(os.getpid(), "rpc-server", 1024, util=0.0)
        try:
            while await reader.read(65536):
                pass
        finally:
            heads.discard(writer)
            if twin is not None and not heads:
                twin.unregister(os.getpid())
            writer.close()

    try:
        server = await asyncio.start_server(held, host, port)
    except OSError as exc:
        print(f"Failed to create server on {host}:{port}: {exc.strerror}", file=sys.stderr, flush=True)
        return 1
    if host != "127.0.0.1":
        print("\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
              f"WARNING: Host ('{host}') is != '127.0.0.1'\n"
              "         Never expose the RPC server to an open network!\n"
              "         This is an experimental feature and is not secure!\n"
              "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n", file=sys.stderr)
    print(f"Starting RPC server v{VERSION}\n  endpoint       : {host}:{port}\n  local cache    : n/a\nDevices:\n"
          "  CUDA0: NVIDIA GB10 (122502 MiB, 119000 MiB free)", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    if twin is not None:
        twin.unregister(os.getpid())
    return 0
