"""`sparktop web` without a browser: the token, the gate in front of every
route (no app process before it), what each session runs, and the refusals."""

from __future__ import annotations

import shlex
import socket
import sys

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sparktop import web
from sparktop.cli import main
from sparktop.errors import SparktopError

TOKEN = "unit-test-token-0123456789"
UPGRADE = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


def test_loopback_addresses_and_names():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert web.is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "no-such-host.invalid"):
        assert not web.is_loopback(host), host


def test_the_token_is_generated_or_taken_from_the_environment():
    a, b = web.resolve_token("127.0.0.1", False, {}), web.resolve_token("127.0.0.1", False, {})
    assert a != b and len(a) >= 30
    assert web.resolve_token("0.0.0.0", False, {web.ENV_TOKEN: " x" * 10 + " "}) == ("x " * 10).strip()
    assert web.resolve_token("127.0.0.1", True, {web.ENV_TOKEN: TOKEN}) is None  # --no-token on loopback


def test_no_token_or_a_short_one_is_refused_off_loopback():
    with pytest.raises(SparktopError, match="--no-token on 0.0.0.0"):
        web.resolve_token("0.0.0.0", True, {})
    with pytest.raises(SparktopError, match="too few"):
        web.resolve_token("192.168.1.20", False, {web.ENV_TOKEN: "short"})
    assert web.resolve_token("127.0.0.1", False, {web.ENV_TOKEN: "short"}) == "short"


def test_the_cli_refuses_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(web, "main_web", lambda *a, **k: pytest.fail("served anyway"))
    assert main(["web", "--host", "0.0.0.0", "--no-token"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparktop: --no-token on 0.0.0.0") and err.count("\n") == 1 and "Traceback" not in err


def test_a_port_in_use_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv(web.ENV_TOKEN, raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["web", "--port", str(port), "--engine", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sparktop: cannot listen on 127.0.0.1:{port}") and err.count("\n") == 1


def test_each_session_runs_this_monitor_with_the_watch_options_quoted(tmp_path):
    odd = tmp_path / "my cluster; rm -rf ~ $(x).yaml"
    command = web.session_command(str(odd), ["http://a:8000", "-i 9"], 0.5, read_only=True)
    # exec: the shell becomes the monitor, one process per session that the server can end
    assert shlex.split(command) == ["exec", sys.executable, "-m", "sparktop", "monitor", f"--inventory={odd}",
                                    "--engine=http://a:8000", "--engine=-i 9", "--interval=0.5", "--read-only"]
    control = shlex.split(web.session_command(None, [], 1.0, read_only=False))
    assert "--read-only" not in control and not any(a.startswith("--inventory") for a in control)


async def test_a_session_that_does_not_quit_is_ended_when_the_server_stops():
    """One still starting (it cannot hear textual-serve's quit) and one that ignores SIGTERM: both end."""
    import asyncio

    slow = await asyncio.create_subprocess_exec("sleep", "60")
    stubborn = await asyncio.create_subprocess_exec("sh", "-c", "trap '' TERM; sleep 60 & wait; sleep 60")
    finished = await asyncio.create_subprocess_exec("true")
    await finished.wait()
    await web.end_processes([slow, stubborn, finished], grace=0.5)
    # Signalled, not waited for: a session left to end on its own would exit 0, a minute later.
    for proc in (slow, stubborn):  # signalled, but on a busy machine perhaps not yet reaped
        await asyncio.wait_for(proc.wait(), 30)
    assert slow.returncode == -15 and stubborn.returncode == -9 and finished.returncode == 0


def test_the_monitor_takes_the_hidden_read_only_flag(capsys):
    from sparktop.cli import build_parser

    assert build_parser().parse_args(["monitor", "--read-only"]).read_only
    with pytest.raises(SystemExit):
        build_parser().parse_args(["monitor", "--help"])
    assert "--read-only" not in capsys.readouterr().out


@pytest.fixture
async def client(monkeypatch):
    started = []

    async def start(self, width, height):  # what would start the app's process
        started.append((width, height))

    monkeypatch.setattr(web.AppService, "start", start)
    server = web.WebServer("true", "127.0.0.1", 8765, TOKEN)
    async with TestClient(TestServer(server.make_app())) as c:
        c.started = started
        yield c


@pytest.mark.parametrize("path", ["/", "/ws", "/static/js/textual.js", "/download/abc", "/nowhere"])
async def test_every_route_answers_401_without_the_token_and_starts_nothing(client, path):
    for query, cookies in (("", {}), ("?token=wrong", {}), (f"?token={TOKEN[:-1]}", {}),
                           ("", {"sparktop_web_8765": "wrong"}), ("", {"sparktop_web_9999": TOKEN})):
        client.session.cookie_jar.clear()
        r = await client.get(path + query, headers=UPGRADE if path == "/ws" else {}, cookies=cookies,
                             allow_redirects=False)
        assert r.status == 401, (path, query, cookies)
        assert "needs its token" in await r.text()
    assert client.started == []


async def test_the_token_becomes_a_strict_httponly_cookie_and_leaves_the_url(client):
    r = await client.get(f"/?token={TOKEN}&fontsize=20", allow_redirects=False)
    assert r.status == 302 and r.headers["Location"] == "/?fontsize=20"
    cookie = r.headers["Set-Cookie"]
    assert f"sparktop_web_8765={TOKEN}" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    page = await client.get("/?fontsize=20")  # the cookie now
    assert page.status == 200
    body = await page.text()
    assert 'data-font-size="20"' in body and TOKEN not in body
    assert "googleapis" not in body and "https://" not in body  # nothing from elsewhere
    assert (await client.get("/static/js/textual.js")).status == 200
    assert (await client.get("/static/css/xterm.css")).status == 200


async def test_a_bearer_token_works_for_scripts(client):
    assert (await client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})).status == 200
    assert (await client.get("/", headers={"Authorization": "Bearer nope"})).status == 401


async def test_the_websocket_with_the_token_starts_a_session(client):
    ws = await client.ws_connect(f"/ws?token={TOKEN}&width=120&height=40")
    await ws.close()
    assert client.started == [(120, 40)]


async def test_a_websocket_from_another_origin_is_refused(client):
    client.session.cookie_jar.update_cookies({"sparktop_web_8765": TOKEN})
    r = await client.get("/ws", headers={**UPGRADE, "Origin": "http://localhost:9999"})
    assert r.status == 403
    assert client.started == []


def test_the_banner_prints_the_url_with_the_token_and_the_tunnel():
    text = web.banner("127.0.0.1", 8765, "a/b+c", read_only=True)
    assert "http://127.0.0.1:8765/?token=a%2Fb%2Bc" in text
    assert "ssh -L 8765:127.0.0.1:8765" in text and "read-only" in text
    assert "ssh -L" not in web.banner("0.0.0.0", 8765, TOKEN, read_only=False)
    assert "?token" not in web.banner("127.0.0.1", 8765, None, read_only=True)
