"""`sparktop web` in a real browser (Chromium through Playwright) against a
two-node twin cluster: the monitor renders, updates and follows the window;
keys work; read-only unless --allow-control; no token, no app.

Without Chromium or Playwright these fail with what to install; they are
never skipped."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.integration.test_report_browser import pixels
from tests.web.conftest import TOKEN, open_app

pytestmark = pytest.mark.slow

# The README's picture is rewritten only when asked (SPARKTOP_SCREENSHOTS=1), so a test run leaves the tree clean.
README_SCREENSHOT = Path(__file__).resolve().parents[2] / "screenshots" / "web-monitor.png"
CLOCK = re.compile(r"\d\d:\d\d:\d\d")


def clock(text: str) -> str:
    """The status line's clock."""
    found = CLOCK.search(text.splitlines()[0] if text else "")
    return found.group() if found else ""


def engine_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "t/s" in line or "run " in line]


def live(cluster):
    """Both nodes and both engines drawn, with figures (an engine is known
    by its address: other twins on these addresses may show too)."""
    endpoints = [url.split("//")[1] for url in cluster.urls]

    def check(text: str) -> bool:
        return (all(f"─ {name} " in text for name in ("spark-a", "spark-b"))  # "─ spark-a · DGX Spark ─"
                and all(e in text for e in endpoints) and text.count("llama-3.1-8b · solo") >= 2
                and text.count("● ready") >= 2 and len(re.findall(r"gen \d[\d.]*k? t/s", text)) >= 2)

    return check


def test_the_monitor_renders_updates_and_follows_the_window(cluster, web_read_only, browser, tmp_path):
    with open_app(browser, web_read_only) as term:
        text = term.wait_for(live(cluster), "both nodes and both engines, with figures", timeout=30)
        cols, rows = term.size()
        assert cols >= 140 and rows >= 40, (cols, rows)
        # Wide enough for two cards a row: the nodes side by side, as in a wide terminal.
        assert any("spark-a" in line and "spark-b" in line for line in text.splitlines())
        assert "read-only" in text.splitlines()[0]

        # It updates: the status line's clock moves and so do the engines' figures and charts.
        first = term.text()
        later = term.wait_for(lambda t: clock(t) not in ("", clock(first)) and engine_lines(t) != engine_lines(first),
                              "the clock and the engines' figures moving")
        assert live(cluster)(later)

        # Histories fill for a few seconds, then the picture for the README.
        term.wait_for(lambda t: len(re.findall(r"TTFT \d", t)) >= 2, "TTFT measured on both engines")
        time.sleep(6)
        shot = README_SCREENSHOT if os.environ.get("SPARKTOP_SCREENSHOTS") else tmp_path / "web-monitor.png"
        shot.parent.mkdir(exist_ok=True)
        term.page.screenshot(path=str(shot))
        width, height, px = pixels(shot)
        assert (width, height) == (1400, 900)
        assert len(set(px[::97])) > 20, "the screenshot is nearly one colour: a blank page or a spinner"

        # The window shrinks: the terminal follows, and so does the app (one card a row).
        term.page.set_viewport_size({"width": 640, "height": 800})
        term.wait_for(lambda t: term.size()[0] < 80, "the terminal following the window")
        narrow, _ = term.size()
        text = term.wait_for(lambda t: not any("spark-a" in line and "spark-b" in line for line in t.splitlines())
                             and "spark-a" in t and "spark-b" in t, "the cards laid out again, one a row")
        assert all(len(line.rstrip()) <= narrow for line in text.splitlines())


def test_read_only_keys_say_why(cluster, web_read_only, browser):
    with open_app(browser, web_read_only) as term:
        text = term.wait_for(live(cluster), "the monitor")
        footer = text.rstrip().splitlines()[-1]
        assert "Quit" in footer and not any(word in footer for word in ("Launch", "Stop", "Sweep"))
        for key, what in (("l", "launching"), ("x", "stopping"), ("s", "sweeping")):
            term.press(key)
            text = term.wait_for(lambda t, what=what: f"read-only: {what} is off in this browser" in t,
                                 f"{key}: the read-only notice")
            assert "sparktop web --allow-control" in text
        assert "plan (exactly what will run)" not in text  # no launcher behind the notice
        term.press("?")
        help_text = term.wait_for(lambda t: "— keys" in t, "the help")
        assert "only watches" in help_text and "launch a recipe" not in help_text


def test_with_allow_control_l_opens_the_launcher(cluster, web_control, browser):
    with open_app(browser, web_control) as term:
        text = term.wait_for(live(cluster), "the monitor")
        assert "Launch" in text.rstrip().splitlines()[-1]
        term.press("l")
        text = term.wait_for(lambda t: "plan (exactly what will run)" in t and "preflight" in t, "the launcher")
        assert "llama-3.1-8b" in text and "read-only" not in text


def _sessions(pids: set[int]) -> dict[int, str]:
    """Of these processes, the sessions' (each runs `sparktop monitor`, started through a shell's exec)."""
    found = {}
    for pid in pids:
        try:
            line = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        if "sparktop monitor" in line:
            found[pid] = line
    return found


def test_without_the_token_401_and_no_app_process(web_read_only, browser):
    server = web_read_only
    before = server.children()
    upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    cookie = f"sparktop_web_{server.url.rsplit(':', 1)[1]}"
    refused = [("/", {}, {}), ("/ws?width=80&height=24", upgrade, {}), ("/static/js/textual.js", {}, {}),
               ("/download/x", {}, {}), ("/?token=wrong", {}, {}), ("/ws?token=wrong", upgrade, {}),
               ("/", {}, {"sparktop_web_0": TOKEN}), ("/ws", upgrade, {cookie: "wrong"}),
               (f"/?token={TOKEN[:-1]}", {}, {})]
    for path, headers, cookies in refused:
        r = httpx.get(server.url + path, headers=headers, cookies=cookies, timeout=5, follow_redirects=False)
        assert r.status_code == 401, (path, r.status_code, r.text)
    # And in the browser: no token, then a wrong one.
    context = browser.new_context()
    try:
        page = context.new_page()
        for url in (server.url + "/", server.url + "/?token=not-it"):
            response = page.goto(url)
            assert response is not None and response.status == 401
            assert "needs its token" in page.content()
        # Then with the token: a session's process starts (so the check can fail). One started by a request
        # without it would be there by then, as the server took those first: after it, exactly one session.
        page.goto(f"{server.url}/?token={TOKEN}")
        deadline = time.monotonic() + 30
        while not (started := _sessions(server.children() - before)):
            assert time.monotonic() < deadline, "no session process with the token either"
            time.sleep(0.2)
        assert len(started) == 1, f"processes started without the token: {started}"
    finally:
        context.close()
    log = server.output()
    assert log.count(TOKEN) == 1, "the token is printed once, in the URL at start, and never logged"
