"""A transparent HTTP proxy in front of a real server that keeps every
/metrics body it passes on, with the time it passed it (and every other
JSON body sparktop reads, llama-server's /slots among them).

Two clients scraping the same server never see the same moment (on two busy
cores one scrape can take seconds), so comparing sparktop's figures with a
scrape of one's own can only be loose. Through this proxy the test reads the
very bodies sparktop read and holds sparktop's figures to them exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from tests.helpers.scraper import parse


@dataclass
class Recorded:
    t: float  # when the body went back to the client
    values: dict[str, float]  # prometheus-client's parse, summed over label sets
    text: str = ""  # the body itself, for figures by label (finish reasons, histogram buckets)


@dataclass
class RecordingProxy:
    upstream: str
    scrapes: list[Recorded] = field(default_factory=list)
    url: str = ""
    bodies: dict[str, list[tuple[float, bytes]]] = field(default_factory=dict)  # path -> (when, body)

    async def start(self) -> RecordingProxy:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body or None,
                                         headers={"Content-Type": request.content_type}) as r:
            data = await r.read()
            ctype = r.headers.get("Content-Type", "text/plain")
            server = r.headers.get("Server")
        if request.path == "/metrics" and r.status == 200:
            self.scrapes.append(Recorded(time.time(), parse(data.decode()), data.decode()))
        elif request.method == "GET":
            self.bodies.setdefault(request.path, []).append((time.time(), data))
        response = web.Response(body=data, status=r.status)
        response.headers["Content-Type"] = ctype
        if server:
            response.headers["Server"] = server  # llama-server says who it is in this header
        return response
