"""One engine is one name however it is given (issue 38): `--engine http://user:pw@localhost:8000` and
the same engine found on this machine's node as `http://127.0.0.1:8000` are one engine, named without
the credentials, which are still sent to it."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from sparktop.errors import SparktopError
from sparktop.masking import without_credentials
from sparktop.observe.poller import NodeTarget, Poller
from sparktop.observe.snapshot import EngineSnapshot, ServerProcess, to_dict
from sparktop.observe.targets import check_engine_url, engine_key, engine_targets
from tests.unit.test_server_processes import Silent, node


@pytest.mark.parametrize(("given", "key"), [
    ("http://user:s3cret@localhost:8000", "http://127.0.0.1:8000"),
    ("http://localhost:8000/v1", "http://127.0.0.1:8000"),
    ("localhost:8000", "http://127.0.0.1:8000"),
    ("http://[::1]:8000", "http://127.0.0.1:8000"),
    ("http://0.0.0.0:8000/", "http://127.0.0.1:8000"),
    ("http://u:p%40ss@127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("https://admin:pw@spark-b.lan:8443", "https://spark-b.lan:8443"),
    ("http://127.0.0.2:8000", "http://127.0.0.2:8000"),  # another address (a test's node): another engine
])
def test_an_engine_is_named_without_credentials_and_this_machine_by_one_name(given, key):
    (target,) = engine_targets([given])
    assert target.url == key == engine_key(given)
    assert "s3cret" not in repr(target) and "pw" not in repr(target)


def test_the_address_as_typed_and_its_credentials_are_what_the_engine_is_read_with():
    (target,) = engine_targets(["http://user:p%40ss@localhost:8000/v1"])
    assert target.address == "http://localhost:8000"
    assert target.auth == "Basic " + base64.b64encode(b"user:p@ss").decode()
    (plain,) = engine_targets(["127.0.0.1:8000"])
    assert plain.address is None and plain.auth is None


def test_a_refused_engine_url_is_quoted_without_its_password():
    with pytest.raises(SparktopError) as refused:
        check_engine_url("http://user:s3cret@localhost:http")  # no port
    assert "s3cret" not in str(refused.value) and "localhost" in str(refused.value)
    assert without_credentials("user:p@ss@host:80/v1") == "host:80/v1"


def twin_process(port: int) -> ServerProcess:
    """The twin as this machine's process list shows it, listening on 127.0.0.1:`port`."""
    return ServerProcess(4242, ["python", "-m", "sparktop", "twin", "serve", "llama-3.1-8b", "--host", "127.0.0.1",
                                "--port", str(port)], [port])


async def local_poller(given: list[str]) -> Poller:
    poller = Poller([NodeTarget("this", Silent(), "127.0.0.1")], engine_targets(given),  # type: ignore[arg-type]
                    default_port=None)
    poller.pause()
    await poller.start()
    return poller


async def test_an_engine_given_as_localhost_and_found_on_this_node_is_one_engine():
    poller = await local_poller(["http://user:s3cret@localhost:8000"])
    try:
        poller._discover(poller._nodes["this"], node("this", [twin_process(8000)]))
        (key,) = poller._engines
        target = poller._engines[key].target
        assert key == "http://127.0.0.1:8000"
        # The user's, with what discovery knows of it (its model, its layout), read where it was typed.
        assert target.found == "given (--engine)" and target.model == "llama-3.1-8b" and target.topology == "solo"
        assert poller._engines[key].probe.direct == "http://localhost:8000"
    finally:
        await poller.close()


async def test_found_first_and_given_after_it_is_still_one_engine_read_as_given():
    """`status` polls the nodes first (their engines are found), then the engines given."""
    poller = Poller([NodeTarget("this", Silent(), "127.0.0.1")], default_port=None)  # type: ignore[arg-type]
    poller.pause()
    await poller.start()
    try:
        poller._discover(poller._nodes["this"], node("this", [twin_process(8000)]))
        (given,) = engine_targets(["http://user:s3cret@localhost:8000"])
        poller._add_engine(given)
        (worker,) = poller._engines.values()
        assert worker.target.found == "given (--engine)"
        assert worker.probe.direct == "http://localhost:8000" and worker.probe.auth == given.auth
    finally:
        await poller.close()


@dataclass
class BasicAuthGate:
    """An engine behind HTTP basic auth (a reverse proxy in front of a twin): 401 without the credentials."""

    upstream: str
    user: str
    password: str
    refused: int = 0
    passed: int = 0
    port: int = 0
    _runner: web.AppRunner | None = field(default=None, repr=False)

    async def start(self) -> BasicAuthGate:
        import aiohttp

        session = aiohttp.ClientSession()
        expected = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()

        async def forward(request: web.Request) -> web.Response:
            if request.headers.get("Authorization") != expected:
                self.refused += 1
                return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="engine"'})
            self.passed += 1
            async with session.get(self.upstream + request.path_qs) as r:
                return web.Response(body=await r.read(), status=r.status,
                                    headers={"Content-Type": r.headers.get("Content-Type", "text/plain")})

        app = web.Application()
        app.router.add_get("/{tail:.*}", forward)
        app.on_cleanup.append(lambda _: session.close())
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def test_the_credentials_are_sent_to_the_engine_and_kept_out_of_what_is_shown(twin):
    server = await twin("llama-3.1-8b", speed=20)
    gate = await BasicAuthGate(server.url, "watcher", "s3cret").start()
    poller = Poller([], engine_targets([f"http://watcher:s3cret@localhost:{gate.port}"]), interval=0.2,
                    default_port=None)
    await poller.start()
    seen: list[EngineSnapshot] = []
    try:
        async with asyncio.timeout(30):
            async for event in poller.events():
                if isinstance(event, EngineSnapshot):
                    seen.append(event)
                    if event.state == "ready" and event.model:
                        break
    finally:
        await poller.close()
        await gate.stop()
    ready = seen[-1]
    assert ready.model == "llama-3.1-8b" and gate.passed > 0 and gate.refused == 0
    assert {s.key for s in seen} == {s.url for s in seen} == {f"http://127.0.0.1:{gate.port}"}
    assert not [s for s in seen if "s3cret" in repr(to_dict(s)) or "watcher" in repr(to_dict(s))]
