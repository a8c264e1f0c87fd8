"""What the browser tests of `sparktop web` stand on: a two-node twin cluster
under load, `sparktop web` servers watching it (real subprocesses), and
Debian's Chromium driven by Playwright (the system browser; nothing is
downloaded)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.helpers.cluster import load
from tests.integration.test_report_browser import chromium

TOKEN = "web-test-token-0123456789abcdef"

# textual-serve's page makes its terminal in a closure; the tests reach the
# xterm.js instance by rewriting the one line that creates it, as served.
HOOK = re.compile(r"new (\w+)\((\w+),\{ping:(\w+)\}\)")


def _port_free_on(hosts: list[str]) -> int:
    for _ in range(200):
        with contextlib.closing(socket.socket()) as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for host in hosts[1:]:
                with contextlib.closing(socket.socket()) as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port free on all of {hosts}")


@dataclass
class Cluster:
    inventory: Path
    urls: list[str]
    root: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The twin cluster (spark-a, spark-b, an engine each) under a steady load,
    run by an event loop of its own in a thread, with an inventory file."""
    from sparktop.twin.cluster import TwinCluster, loopback_aliases_work, wait_ready

    root = tmp_path_factory.mktemp("web-cluster")
    hosts = ["127.0.0.2", "127.0.0.3"] if loopback_aliases_work() else ["127.0.0.1"]
    port = _port_free_on(hosts)
    ready: queue.Queue = queue.Queue()
    stop = threading.Event()

    async def main() -> None:
        # 4x a Spark fills the charts quickly; the README's picture is taken at a Spark's own pace (its
        # roofline share must read as a Spark's, under 100 %).
        twins = TwinCluster(root / "lab", speed=1.0 if os.environ.get("SPARKTOP_SCREENSHOTS") else 4.0).setup()
        try:
            urls = await twins.run_solo(model="llama-3.1-8b", port=port, startup_speed=1000,
                                        extra=["--max-model-len", "32768"])
            await wait_ready(urls, timeout=60)
            ready.put((twins, urls))
            async with load(urls, concurrency=2):
                while not stop.is_set():
                    await asyncio.sleep(0.2)
        except BaseException as exc:
            ready.put(exc)
            raise
        finally:
            await twins.stop_all()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True, name="twin-cluster")
    thread.start()
    got = ready.get(timeout=120)
    if isinstance(got, BaseException):
        raise got
    twins, urls = got
    inventory = root / "cluster.yaml"
    # The engines' port as the inventory's: the monitor looks there on each node (and not on 8000, where a
    # demo running beside the tests would show too).
    inventory.write_text(yaml.safe_dump({"defaults": {"port": port}, "nodes": [
        {"name": n.name, "host": "localhost", "fabric_ip": n.address, "bind": n.address, "env": n.env}
        for n in twins.nodes]}))
    yield Cluster(inventory, urls, root)
    stop.set()
    thread.join(30)


@dataclass
class WebServer:
    url: str
    proc: subprocess.Popen
    log: Path

    def children(self) -> set[int]:
        return {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_web(root: Path, cluster: Cluster, *flags: str) -> WebServer:
    port = _port_free_on(["127.0.0.1"])
    home = root / f"home-{port}"
    env = {**os.environ, "SPARKTOP_WEB_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1",
           **{var: str(home / sub) for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"),
                                                    ("XDG_STATE_HOME", "state"))}}
    log = root / f"web-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sparktop", "web", "--inventory", str(cluster.inventory),
                                 "--port", str(port), "-i", "0.5", *flags],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = WebServer(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            pytest.fail(f"sparktop web exited ({proc.returncode}):\n{server.output()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/", timeout=2).status_code == 401:
                return server
        if time.monotonic() > deadline:
            stop_web(server)
            pytest.fail(f"sparktop web did not answer within 30 s:\n{server.output()}")
        time.sleep(0.2)


def stop_web(server: WebServer) -> None:
    """SIGTERM, as a service manager would: the server and every session it started end."""
    sessions = [psutil.Process(pid) for pid in server.children()]
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)
        pytest.fail(f"sparktop web did not stop on SIGTERM:\n{server.output()}")
    _, alive = psutil.wait_procs(sessions, timeout=10)
    assert not alive, f"sessions left running after sparktop web stopped: {[p.pid for p in alive]}"


@pytest.fixture(scope="module")
def web_read_only(tmp_path_factory, cluster):
    server = start_web(tmp_path_factory.mktemp("web-ro"), cluster)
    yield server
    stop_web(server)


@pytest.fixture(scope="module")
def web_control(tmp_path_factory, cluster):
    server = start_web(tmp_path_factory.mktemp("web-ctl"), cluster, "--allow-control")
    yield server
    stop_web(server)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright (never `playwright install`)."""
    path = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is not installed: `pip install -e '.[test]'` (the browser tests drive Chromium "
                    "with it)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield browser
        browser.close()


class Terminal:
    """The app as the browser shows it: text read from xterm.js's buffer."""

    def __init__(self, page):
        self.page = page

    def size(self) -> tuple[int, int]:
        return tuple(self.page.evaluate("() => { const t = window.__terms[0].terminal; return [t.cols, t.rows]; }"))

    def lines(self) -> list[str]:
        return self.page.evaluate("""() => {
            const t = window.__terms[0].terminal, b = t.buffer.active, out = [];
            for (let i = 0; i < t.rows; i++) out.push(b.getLine(b.viewportY + i).translateToString(true, 0, t.cols));
            return out; }""")

    def text(self) -> str:
        return "\n".join(self.lines())

    def wait_for(self, predicate, what: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if predicate(text):
                return text
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not in the browser within {timeout:g}s; it shows:\n{text}")
            time.sleep(0.2)

    def press(self, key: str) -> None:
        self.page.focus(".xterm-helper-textarea")
        self.page.keyboard.press(key)


def _hook(route) -> None:
    response = route.fetch()
    body, found = HOOK.subn(lambda m: f"((t)=>((window.__terms=window.__terms||[]).push(t),t))"
                                      f"(new {m.group(1)}({m.group(2)},{{ping:{m.group(3)}}}))", response.text())
    if found != 1:
        route.abort()
        raise AssertionError("textual-serve's textual.js no longer creates its terminal as `new X(e,{ping:r})`: "
                             "update HOOK in tests/web/conftest.py")
    route.fulfill(response=response, body=body)


@contextlib.contextmanager
def open_app(browser, server: WebServer, size=(1400, 900)):
    """A browser session with the token: the page, its terminal, the app in it."""
    context = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = context.new_page()
    page.route("**/static/js/textual.js", _hook)
    try:
        response = page.goto(f"{server.url}/?token={TOKEN}")
        assert response is not None and response.status == 200, (response and response.status, server.output())
        assert "token" not in page.url  # the token went to a cookie, out of the address bar
        page.wait_for_function("() => window.__terms && window.__terms.length > 0", timeout=15_000)
        term = Terminal(page)
        term.wait_for(lambda t: "sparktop" in t, "the app's status line", timeout=30)
        yield term
    finally:
        context.close()
