"""What vLLM 0.32's new series look like to a user: a sleeping engine as a
state of its own, the queue by reason, admission rejections in red and the
memory bandwidth vLLM estimates against the node's, on the card, in the
detail view and in `status --json`.

The engines are tiny aiohttp servers answering what a real vLLM 0.32.0
served (tests/fixtures/vllm-0.32.0), changed as a sleeping engine or a busy
GPU server would change it (tests/unit/test_vllm032_metrics.py), with
counters that grow in real time so the poller's rates are real rates."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web
from rich.text import Text

from sparktop.observe.poller import EngineTarget, Poller
from sparktop.observe.snapshot import EngineSnapshot
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from sparktop.ui.screens import DetailScreen
from tests.conftest import free_port
from tests.helpers.pilot import until
from tests.unit.test_vllm032_metrics import V032, busy, real, sleeping

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RATES = {"rejected_reqs": 2.0, "read": 150e9, "write": 30e9}  # 2 rejections/s, 180 GB/s


class FakeVllm:
    """/metrics from `metrics(seconds since start)`; /v1/models and /version as vLLM 0.32.0 answered."""

    def __init__(self, metrics: Callable[[float], str]):
        self.metrics = metrics
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.t0 = time.monotonic()
        self._runner: web.AppRunner | None = None

    async def start(self) -> FakeVllm:
        async def metrics(_request):
            return web.Response(text=self.metrics(time.monotonic() - self.t0))

        def fixed(body: str):
            async def handler(_request):
                return web.Response(text=body)
            return handler

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        for path, name in (("/v1/models", "models.json"), ("/version", "version.json"), ("/health", "health.txt")):
            app.router.add_get(path, fixed((V032 / name).read_text()))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def engines():
    """A sleeping engine (level 1) and a busy one: a queue with deferred
    requests, rejections and bytes moving."""
    asleep = await FakeVllm(lambda t: sleeping(1)).start()
    working = await FakeVllm(lambda t: busy(t, capacity=1, deferred=2, **RATES)).start()
    yield asleep, working
    await asleep.stop()
    await working.stop()


def snap(**kw) -> EngineSnapshot:
    base = dict(key="k", url="http://127.0.0.1:8000", t=1.0, state="ready", model="tiny-llama", kv_usage=0.1,
                running=1, waiting=0, preemptions=0, gen_tps=10.0, prompt_tps=0.0)
    return EngineSnapshot(**{**base, **kw})


def text_of(lines: list[Text]) -> str:
    return "\n".join(line.plain for line in lines)


def style_of(lines: list[Text], word: str) -> str:
    """The style of the span right after `word` (its value)."""
    for line in lines:
        at = line.plain.find(word)
        if at >= 0:
            return " ".join(str(s.style) for s in line.spans if s.start <= at + len(word) + 1 < s.end)
    raise AssertionError(f"{word!r} not shown")


# -- the card's lines ------------------------------------------------------------------


def test_an_older_engine_card_is_unchanged():
    lines = EngineCard("k")._lines(snap(), None, 58)
    text = text_of(lines)
    assert "wait 0" in text and "deferred" not in text and "rejected" not in text and "bw " not in text


def test_deferred_requests_rejections_and_bandwidth_on_the_card():
    s = snap(waiting=3, waiting_by_reason={"capacity": 1.0, "deferred": 2.0}, rejections=8.0, rejection_rate=2.0,
             rejections_recent=8.0, mem_read_bps=150e9, mem_write_bps=30e9)
    lines = EngineCard("k")._lines(s, None, 58)
    text = text_of(lines)
    assert "wait 3 (2 deferred)" in text
    assert "rejected 2.0/s" in text and "red" in style_of(lines, "rejected")
    assert "bw 180/273 GB/s" in text  # against GB10's bandwidth, the roofline's own figure
    # Nothing deferred, nothing rejected lately, nothing moving: none of it shows.
    quiet = text_of(EngineCard("k")._lines(snap(waiting=1, waiting_by_reason={"capacity": 1.0, "deferred": 0.0},
                                                 rejections=8.0, rejection_rate=0.0, rejections_recent=0.0), None, 58))
    assert "wait 1 " in quiet + " " and "deferred" not in quiet and "rejected" not in quiet and "bw" not in quiet


def test_rejections_stay_in_view_for_the_window_after_the_rate_falls():
    lines = EngineCard("k")._lines(snap(rejections=3.0, rejection_rate=0.0, rejections_recent=3.0,
                                        rejections_span=30.0), None, 58)
    assert "rejected 3 in 30s" in text_of(lines) and "red" in style_of(lines, "rejected")
    # Watched for 8 s so far: the count says so.
    lines = EngineCard("k")._lines(snap(rejections=9.0, rejection_rate=0.0, rejections_recent=3.0,
                                        rejections_span=8.2), None, 58)
    assert "rejected 3 in 8s" in text_of(lines)


def test_bandwidth_comes_before_the_models_roofline_share_where_room_is_short():
    # llama-3.1-8b has a model card: its roofline share shows too where there is room.
    busy_8b = snap(model="llama-3.1-8b", running=4, gen_tps=80.0, mem_read_bps=150e9, mem_write_bps=30e9)
    wide = text_of(EngineCard("k")._lines(busy_8b, None, 78))
    assert "bw 180/273 GB/s" in wide and "of roofline" in wide
    medium = text_of(EngineCard("k")._lines(busy_8b, None, 58))
    assert "bw 180/273 GB/s" in medium and "of roofline" not in medium
    assert len(medium.splitlines()) == len(text_of(EngineCard("k")._lines(snap(model="llama-3.1-8b", running=4,
                                                                                gen_tps=80.0), None, 58)).splitlines())


@pytest.mark.parametrize(("level", "word"), [(1, "sleeping L1"), (2, "sleeping L2"), (None, "sleeping")])
def test_a_sleeping_engine_card_says_so_in_its_state_and_first_line(level, word):
    card = EngineCard("k")
    s = snap(state="sleeping", sleep_level=level, running=0, gen_tps=0.0)
    lines = card._lines(s, None, 36)
    assert lines[1].plain.startswith(word + ":")
    assert all(line.cell_len <= 36 for line in lines)


# -- the app ---------------------------------------------------------------------------


SIZES = [(80, 24), (120, 40), (160, 48)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_cards_show_sleep_queue_rejections_and_bandwidth_within_their_size(engines, size, tmp_path):
    asleep, working = engines
    poller = Poller([], [EngineTarget(asleep.url), EngineTarget(working.url)], interval=0.3, down_after=3.0,
                    default_port=None)
    await poller.start()
    app = SparktopApp(poller)
    try:
        async with app.run_test(size=size) as pilot:
            def card(url):
                return next((c for c in app.screen.query(EngineCard) if c.key == url), None)

            def ready():
                a, w = card(asleep.url), card(working.url)
                return (a is not None and w is not None and "● sleeping L1" in a.text
                        and re.search(r"rejected \d", w.text) is not None and "bw " in w.text)
            try:
                await until(pilot, ready, timeout=20)
            except AssertionError:
                raise AssertionError([c.text for c in app.screen.query(EngineCard)]) from None
            await pilot.pause(1.0)  # a few more polls: rates over more than one interval
            a, w = card(asleep.url), card(working.url)
            screenshot = app.export_screenshot()
            for c in (a, w):
                # Drawn to fit: no line wider than the card, the card inside the screen.
                width = c.content_size.width
                assert all(line.cell_len <= width for line in c._card_lines), c.text
                assert c.region.right <= size[0]
            texts = {"asleep": a.text, "busy": w.text}
    finally:
        await poller.close()
    (tmp_path / "monitor.svg").write_text(screenshot)
    out = os.environ.get("SPARKTOP_SHOTS")  # to look at them: SPARKTOP_SHOTS=/tmp/dir pytest ...
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"vllm032-monitor-{size[0]}x{size[1]}.svg").write_text(screenshot)
        (Path(out) / f"vllm032-cards-{size[0]}x{size[1]}.txt").write_text(texts["asleep"] + "\n\n" + texts["busy"])
    asleep_text, busy_text = texts["asleep"], texts["busy"]
    assert "● ready" not in asleep_text and "sleeping L1: weights offloaded\n" in asleep_text
    assert "wait 3 (2 deferred)" in busy_text and "● ready" in busy_text
    rejected = float(re.search(r"rejected (\d+\.\d)/s", busy_text).group(1))
    assert 1.5 <= rejected <= 2.5  # the server's 2/s
    bw = float(re.search(r"bw (\d+)/273 GB/s", busy_text).group(1))
    assert 165 <= bw <= 195  # 150 + 30 GB/s
    assert "bw" not in asleep_text  # counters that do not move show nothing


async def test_the_real_032_scrape_shows_ready_and_nothing_new():
    server = await FakeVllm(lambda t: real()).start()
    poller = Poller([], [EngineTarget(server.url)], interval=0.3, down_after=3.0, default_port=None)
    await poller.start()
    app = SparktopApp(poller)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            card = lambda: next(iter(app.screen.query(EngineCard)), None)  # noqa: E731
            await until(pilot, lambda: card() is not None and "● ready" in card().text and "tiny-llama" in card().text)
            await pilot.pause(1.0)
            text = card().text
    finally:
        await poller.close()
        await server.stop()
    assert "wait 0 " in text and "deferred" not in text and "rejected" not in text and "bw " not in text
    assert "sleeping" not in text


async def test_the_detail_view_says_everything(engines):
    asleep, working = engines
    poller = Poller([], [EngineTarget(asleep.url), EngineTarget(working.url)], interval=0.3, down_after=3.0,
                    default_port=None)
    await poller.start()
    app = SparktopApp(poller)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            def card(url):
                return next((c for c in app.screen.query(EngineCard) if c.key == url), None)
            await until(pilot, lambda: card(working.url) is not None and "bw " in card(working.url).text
                        and card(asleep.url) is not None and "sleeping" in card(asleep.url).text, timeout=20)
            card(working.url).focus()
            await pilot.press("enter")
            assert isinstance(app.screen, DetailScreen)
            await pilot.pause(0.6)
            busy_detail = str(app.screen.query_one("#charts").content)
            await pilot.press("escape")
            card(asleep.url).focus()
            await pilot.press("enter")
            await pilot.pause(0.6)
            asleep_detail = str(app.screen.query_one("#charts").content)
    finally:
        await poller.close()
    assert "waiting 3: 1 capacity, 2 deferred" in busy_detail
    assert re.search(r"admission rejections: \d+ since the server started \(max_num_queued_reqs \d+\); "
                     r"\d+\.\d/s now, \d+ in the last \d+s", busy_detail), busy_detail
    assert re.search(r"memory bandwidth: \d+ of 273 GB/s \(\d+%\), vLLM's estimate per GPU; read \d+, write \d+ GB/s",
                     busy_detail), busy_detail
    assert "tokens/s" in busy_detail  # the charts are still there
    assert "sleeping (level 1): weights offloaded, KV cache freed" in asleep_detail


async def test_status_json_says_sleeping_and_the_new_figures(engines, tmp_path):
    asleep, working = engines
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sparktop", "status", "--json", "--engine", asleep.url + "/v1", "--engine", working.url,
        "--seconds", "2.5", cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    engines_json = {e["url"]: e for e in json.loads(out)["engines"]}
    a, w = engines_json[asleep.url], engines_json[working.url]
    assert a["state"] == "sleeping" and a["sleep_level"] == 1 and a["mem_bw_gbs"] is None
    assert w["state"] == "ready" and w["sleep_level"] is None
    assert w["waiting"] == 3 and w["waiting_by_reason"] == {"capacity": 1.0, "deferred": 2.0}
    assert 1.5 <= w["admission_rejection_rate"] <= 2.5 and w["admission_rejections_recent"] > 0
    assert 0 < w["admission_rejections_recent_s"] <= 30
    assert set(w["admission_rejections_by_reason"]) == {"max_num_queued_reqs", "max_num_queued_tokens"}
    assert 165 <= w["mem_bw_gbs"] <= 195 and 140 <= w["mem_read_gbs"] <= 160
