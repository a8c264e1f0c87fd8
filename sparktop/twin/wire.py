"""Newline-delimited JSON over TCP: how the twin's processes talk to each
other across simulated hosts (TP rendezvous, the Ray stand-in)."""

from __future__ import annotations

import asyncio
import json


async def send(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def recv(reader: asyncio.StreamReader) -> dict | None:
    """The next message, or None when the peer is gone."""
    try:
        line = await reader.readline()
    except (ConnectionError, OSError):
        return None
    if not line:
        return None
    try:
        return json.loads(line)
    except ValueError:
        return None


async def request(host: str, port: int, message: dict, timeout: float = 5.0) -> dict | None:
    """One request, one reply, then close."""
    async with asyncio.timeout(timeout):  # not wait_for, which can lose a cancel on Python 3.11
        reader, writer = await asyncio.open_connection(host, port)
    try:
        await send(writer, message)
        async with asyncio.timeout(timeout):
            return await recv(reader)
    finally:
        writer.close()
