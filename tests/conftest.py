"""Shared fixtures: in-process twin servers, free ports, a clean XDG home."""

from __future__ import annotations

import contextlib
import io
import socket

import pytest

from sparktop.twin.args import parse_serve_args
from sparktop.twin.server import TwinServer


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Never read or write the developer's real config, results or state."""
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_STATE_HOME", "state")):
        monkeypatch.setenv(var, str(tmp_path / "xdg" / sub))
    monkeypatch.delenv("SPARKTOP_TWIN_HOME", raising=False)
    monkeypatch.delenv("SPARKTOP_TWIN_SPEED", raising=False)


def free_port(host: str = "127.0.0.1") -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture
async def twin():
    """Factory: `await twin("gpt-oss-120b", "--max-num-seqs", "8", speed=2)`
    returns a started in-process TwinServer; all are stopped at teardown."""
    servers: list[TwinServer] = []

    async def make(model: str = "gpt-oss-120b", *flags: str, speed: float = 1.0,
                   startup_speed: float = 1e6, host=None) -> TwinServer:
        args = parse_serve_args([model, "--host", "127.0.0.1", "--port", "0", "--speed", str(speed),
                                 "--startup-speed", str(startup_speed), *flags])
        server = TwinServer(args, log=io.StringIO(), host=host)
        servers.append(server)
        await server.start()
        return server

    yield make
    for server in servers:
        await server.stop()
