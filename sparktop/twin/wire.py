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
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        await send(writer, message)
        return await asyncio.wait_for(recv(reader), timeout)
    finally:
        writer.close()
