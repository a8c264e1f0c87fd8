"""`sparktop web`: the app served to a browser, for those who cannot ssh in.

textual-serve runs one app process per browser session (a websocket) and
relays its screen and keys; the app in it is `sparktop monitor` itself with
the watch options `sparktop web` was given, and `--read-only` unless
`--allow-control`. In front of every route (the page, the websocket, the
static files) a token gate: without the token (`?token=` on the first page
load, then an HttpOnly SameSite=Strict cookie) the answer is 401 and no
process starts. The token is generated (or `SPARKTOP_WEB_TOKEN`), compared
in constant time and printed once, in the URL; the access log never has a
query string. A non-loopback bind without a token is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import ipaddress
import os
import secrets
import shlex
import signal
import socket
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

from aiohttp import WSCloseCode, web
from aiohttp.abc import AbstractAccessLogger
from textual_serve.app_service import AppService
from textual_serve.server import Server

from sparktop.errors import SparktopError

ENV_TOKEN = "SPARKTOP_WEB_TOKEN"
MIN_TOKEN = 16  # characters a token must have to guard a non-loopback address
DEFAULT_PORT = 8765
GRACE_S = 3.0  # seconds a session has to end by itself, then after SIGTERM, when the server stops


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if host == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def resolve_token(host: str, no_token: bool, environ=os.environ) -> str | None:
    """The token the server asks for: `SPARKTOP_WEB_TOKEN`, else a new one;
    None with `--no-token`, which only a loopback address may have."""
    if no_token:
        if not is_loopback(host):
            raise SparktopError(f"--no-token on {host} would let anyone who reaches it watch the nodes: refused "
                                "(drop --no-token to use a token, or serve on 127.0.0.1 and use an ssh tunnel)")
        return None
    token = environ.get(ENV_TOKEN, "").strip()
    if token and len(token) < MIN_TOKEN and not is_loopback(host):
        raise SparktopError(f"{ENV_TOKEN} has {len(token)} characters, too few to guard {host}: use at least "
                            f"{MIN_TOKEN} (or unset it and a token is generated)")
    return token or secrets.token_urlsafe(24)


def session_command(inventory: str | None, engines: list[str], interval: float, read_only: bool,
                    rate_window: float | None = None) -> str:
    """The shell command each browser session runs: this sparktop's monitor,
    every value quoted (textual-serve runs it through a shell)."""
    argv = [sys.executable, "-m", "sparktop", "monitor"]
    if inventory:
        argv.append(f"--inventory={Path(inventory).resolve()}")
    argv += [f"--engine={url}" for url in engines]
    argv.append(f"--interval={interval:g}")
    if rate_window is not None:
        argv.append(f"--rate-window={rate_window:g}")
    if read_only:
        argv.append("--read-only")
    # exec: the shell becomes the app, so a session is one process the server can end.
    return "exec " + shlex.join(argv)


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def token_gate(token: str | None, cookie: str):
    """aiohttp middleware: every request shows the token, or gets 401 before
    any handler (so no app process) runs. A page loaded with `?token=` sets
    the cookie and is sent to the same URL without it (out of the address
    bar and the history)."""

    @web.middleware
    async def gate(request: web.Request, handler):
        if token is None:
            return await handler(request)
        if _same(request.query.get("token"), token):
            if request.method == "GET" and request.path == "/":
                query = urlencode([(k, v) for k, v in request.query.items() if k != "token"])
                response = web.Response(status=302, headers={"Location": "/" + (f"?{query}" if query else ""),
                                                             "Cache-Control": "no-store"})
                response.set_cookie(cookie, token, httponly=True, samesite="Strict", path="/")
                return response
            return await handler(request)
        bearer = request.headers.get("Authorization", "")
        if _same(request.cookies.get(cookie), token) or (bearer.startswith("Bearer ") and _same(bearer[7:], token)):
            return await handler(request)
        return web.Response(status=401, text=UNAUTHORIZED, headers={"Cache-Control": "no-store",
                                                                      "WWW-Authenticate": 'Bearer realm="sparktop"'})

    return gate


UNAUTHORIZED = ("401: sparktop web needs its token. Open the URL `sparktop web` printed when it started "
                "(http://HOST:PORT/?token=...).\n")


class AccessLog(AbstractAccessLogger):
    """One line per page load and refusal: the path only, never the query
    (the token may be in it). Static files and websockets are left out
    (sessions are logged as they start and end)."""

    def log(self, request, response, time_taken: float) -> None:
        if request.path.startswith(("/static/", "/ws")) and response.status < 400:
            return
        say(f"{response.status} {request.method} {request.path} from {request.remote}")


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="stylesheet" href="/static/css/xterm.css">
<script src="/static/js/textual.js"></script>
<style>
  @font-face {{ font-family: "Roboto Mono"; src: url("/static/fonts/RobotoMono-VariableFont_wght.ttf"); }}
  body {{ background: #0c181f; margin: 0; overflow: hidden; }}
  .dialog {{ position: absolute; inset: 0; display: flex; align-items: center; justify-content: center; z-index: 10;
            color: rgba(255, 255, 255, 0.9); font: 16px "Roboto Mono", menlo, monospace; }}
  body.-first-byte .connecting {{ display: none; }}
  .closed {{ display: none; background: #0c181f; }}
  body.-closed .closed {{ display: flex; flex-direction: column; }}
  button {{ padding: 12px 28px; margin: 16px; background: #5e0ba7; color: #fff; border: none;
           font: inherit; cursor: pointer; }}
  .textual-terminal {{ opacity: 0; }}
  body.-first-byte .textual-terminal {{ opacity: 1; }}
</style>
</head>
<body>
<div class="dialog connecting">{title}: connecting…</div>
<div class="dialog closed"><div>Session ended.</div><button type="button" onclick="location.reload()">Start again
</button></div>
<div id="terminal" class="textual-terminal" data-session-websocket-url="" data-font-size="{font_size}"></div>
<script>
  // The websocket of the address the page came from (an ssh tunnel's, a proxy's).
  document.getElementById("terminal").dataset.sessionWebsocketUrl =
    (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
</script>
</body>
</html>
"""


def _size(value: str | None, default: int) -> int:
    try:
        return max(1, min(1000, int(value or default)))
    except ValueError:
        return default


class WebServer(Server):
    """textual-serve's server with sparktop's page (no fonts or scripts from
    elsewhere), the token gate, an origin check on the websocket and every
    session ended when the server stops."""

    def __init__(self, command: str, host: str, port: int, token: str | None, title: str = "sparktop"):
        super().__init__(command, host=host, port=port, title=title)
        self.token = token
        self.cookie = f"sparktop_web_{port}"  # one per port: two servers on a host keep their own
        self.sessions: set[web.WebSocketResponse] = set()
        self.services: set[AppService] = set()

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[token_gate(self.token, self.cookie)])
        app.add_routes([
            web.get("/", self.handle_index, name="index"),
            web.get("/ws", self.handle_websocket, name="websocket"),
            web.get("/download/{key}", self.handle_download, name="download"),
            web.static("/static", self.statics_path, name="static"),
        ])
        app.on_shutdown.append(self._end_sessions)
        return app

    async def handle_index(self, request: web.Request) -> web.Response:
        page = PAGE.format(title=html.escape(self.title), font_size=_size(request.query.get("fontsize"), 16))
        return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            # Another site's page (or another port's app) reusing the cookie.
            raise web.HTTPForbidden(text="403: a websocket from another origin\n")
        ws = web.WebSocketResponse(heartbeat=15)
        await ws.prepare(request)
        self.sessions.add(ws)
        async def close() -> None:  # the app quit (q)
            await ws.close()

        service = AppService(self.command, write_bytes=ws.send_bytes, write_str=ws.send_str, close=close,
                             download_manager=self.download_manager)
        who = request.remote
        self.services.add(service)
        try:
            await service.start(_size(request.query.get("width"), 80), _size(request.query.get("height"), 24))
            say(f"session from {who} started ({len(self.sessions)} open)")
            try:
                await self._process_messages(ws, service)
            finally:
                await service.stop()
        except asyncio.CancelledError:
            await ws.close()
        except Exception as exc:  # noqa: BLE001 - one session's failure must not stop the server
            say(f"session from {who} failed: {type(exc).__name__}: {exc}")
        finally:
            self.sessions.discard(ws)
            self.services.discard(service)
            say(f"session from {who} ended ({len(self.sessions)} open)")
        return ws

    async def _end_sessions(self, app: web.Application) -> None:
        for ws in list(self.sessions):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"sparktop web stopped")
        # A session still starting (importing, on a busy machine) cannot hear textual-serve's "quit"
        # yet, and would outlive the server: what has not ended by itself in a few seconds is ended.
        processes = [p for p in (getattr(s, "_process", None) for s in self.services) if p is not None]
        await end_processes(processes, grace=GRACE_S)


async def end_processes(processes: list[asyncio.subprocess.Process], grace: float) -> None:
    """Wait `grace` seconds for each to exit, then SIGTERM, then SIGKILL."""
    for signal_, wait in ((None, grace), (signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        alive = [p for p in processes if p.returncode is None]
        if not alive:
            return
        for p in alive:
            if signal_ is not None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal_)
        await asyncio.wait([asyncio.ensure_future(p.wait()) for p in alive], timeout=wait)


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"[{host}]" if ":" in host else host


def banner(host: str, port: int, token: str | None, read_only: bool) -> str:
    url = f"http://{_url_host(host)}:{port}/" + (f"?token={quote(token, safe='')}" if token else "")
    mode = ("read-only (launch, stop and sweep are off; --allow-control allows them)" if read_only
            else "with control: browser sessions can launch, stop and sweep")
    lines = [f"sparktop web: serving the monitor, {mode}", f"  open {url}"]
    if is_loopback(host):
        lines.append(f"  from another machine: ssh -L {port}:127.0.0.1:{port} {socket.gethostname()}, then open "
                     "the URL there")
    lines.append("Each browser session runs its own sparktop; Ctrl+C stops them all.")
    return "\n".join(lines)


async def serve(server: WebServer, read_only: bool) -> None:
    runner = web.AppRunner(server.make_app(), access_log_class=AccessLog, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, server.host, server.port).start()
    except OSError as exc:
        await runner.cleanup()
        raise SparktopError(f"cannot listen on {server.host}:{server.port}: {exc.strerror or exc} (another "
                            "--port?)") from None
    print(banner(server.host, server.port, server.token, read_only), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main_web(host: str, port: int, command: str, token: str | None, read_only: bool) -> int:
    # The sessions' processes inherit this environment: the token stays here.
    os.environ.pop(ENV_TOKEN, None)
    title = f"sparktop · {socket.gethostname()}"  # the browser tab says which machine
    asyncio.run(serve(WebServer(command, host, port, token, title=title), read_only))
    return 0
