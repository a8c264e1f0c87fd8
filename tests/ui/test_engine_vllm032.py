"""What vLLM 0.32's new series look like to a user: a sleeping engine as a
state of its own, the queue by reason, admission rejections in red and the
memory bandwidth vLLM estimates against the node's, on the card, in the
detail view and in `status --json`.

The engines are tiny aiohttp servers answering what a real vLLM 0.32.0
served (tests/fixtures/vllm-0.32.0), changed as a sleeping engine or a busy
GPU server would change it (tests/unit/test_vllm032_metrics.py), with
counters that grow in real time so the poller's rates are real rates. Each
fake keeps every /metrics body it served and when: a rate sparktop shows is
held to the counters in the very bodies it read, over seconds that must lie
between when those bodies were served (a reader stamps a body after it was
served and before it asks for the next), which no machine's speed moves."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from rich.text import Text

from sparktop.observe.poller import EngineTarget, Poller
from sparktop.observe.snapshot import EngineSnapshot
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from sparktop.ui.screens import DetailScreen
from tests.helpers.pilot import until
from tests.helpers.scraper import parse
from tests.unit.test_vllm032_metrics import V032, busy, real, sleeping

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RATES = {"rejected_reqs": 2.0, "read": 150e9, "write": 30e9}  # 2 rejections/s, 180 GB/s
REJECTIONS, READ, WRITE = ("vllm:admission_rejections_total", "vllm:estimated_read_bytes_per_gpu_total",
                           "vllm:estimated_write_bytes_per_gpu_total")


@dataclass
class Served:
    t: float  # time.monotonic() as the body was made: its reader stamps it later, and asks again later still
    values: dict[str, float]  # the body's samples, summed over label sets (prometheus-client's parse)


@dataclass
class Span:
    """Two scrapes a figure was taken over, found by their counters, and the
    seconds a reader can have counted between them."""

    first: Served
    last: Served
    shortest: float  # from the first's successor being served to the last being served
    longest: float  # from the first being served to the last's successor being served (or to now)

    def delta(self, name: str) -> float:
        return self.last.values[name] - self.first.values[name]


class FakeVllm:
    """/metrics from `metrics(seconds since start)`; /v1/models and /version as vLLM 0.32.0 answered."""

    def __init__(self, metrics: Callable[[float], str]):
        self.metrics = metrics
        self.url = ""
        self.t0 = time.monotonic()
        self.served: list[Served] = []
        self._runner: web.AppRunner | None = None

    def span(self, total: float, recent: float, now: float) -> Span:
        """The scrape whose rejections counter read `total` and the one `recent` before it (a figure's
        window); fails if no body it served says so."""
        totals = [s.values[REJECTIONS] for s in self.served]
        assert total in totals, f"{total} rejections: no body served said so ({totals})"
        k = totals.index(total)
        j = next((i for i in range(k) if total - totals[i] == recent), None)
        assert j is not None, f"{recent} rejections before {total}: no body served said so ({totals})"
        after = self.served[k + 1].t if k + 1 < len(self.served) else now
        return Span(self.served[j], self.served[k], self.served[k].t - self.served[j + 1].t, after - self.served[j].t)

    async def start(self) -> FakeVllm:
        async def metrics(_request):
            t = time.monotonic()
            text = self.metrics(t - self.t0)
            self.served.append(Served(t, parse(text)))
            return web.Response(text=text)

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
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
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


def rates_problems(snap: EngineSnapshot, fake: FakeVllm, now: float) -> list[str]:
    """What in `snap`'s rates disagrees with the bodies `fake` served: the
    rejections and bytes counted between the window's two scrapes, over the
    seconds the reader counted between them (`rejections_span`), which lie
    between when the fake served those scrapes and their successors."""
    assert snap.rejections is not None and snap.rejections_recent is not None and snap.rejections_span is not None
    span = fake.span(snap.rejections, snap.rejections_recent, now)
    seconds = snap.rejections_span
    out = []
    if not span.shortest < seconds < span.longest:
        out.append(f"{seconds} s between scrapes served {span.shortest:.3f} to {span.longest:.3f} s apart")
    # Rates over the window the counts are kept for: the count over its seconds.
    for name, mine, counted in (("rejections/s", snap.rejection_rate, span.delta(REJECTIONS)),
                                ("read B/s", snap.mem_read_bps, span.delta(READ)),
                                ("write B/s", snap.mem_write_bps, span.delta(WRITE))):
        if mine != pytest.approx(counted / seconds, rel=1e-12):
            out.append(f"{name} {mine} is not {counted} over {seconds} s")
    return out


def window_of(card: EngineCard, fake: FakeVllm) -> int:
    """How many of the fake's scrapes apart the two the card's rates were taken over are (0: none yet)."""
    snap = card._last[0] if card._last else None
    if snap is None or not snap.rejections_recent or snap.rejections is None:
        return 0
    totals = [s.values[REJECTIONS] for s in fake.served]
    if snap.rejections not in totals:
        return 0
    k = totals.index(snap.rejections)
    return next((k - i for i in range(k) if snap.rejections - totals[i] == snap.rejections_recent), 0)


# Rates over the same window as the counts kept in view (the latency window's minute), so that a rate is
# exactly its window's count over the window's seconds.
WINDOW = 60.0


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_cards_show_sleep_queue_rejections_and_bandwidth_within_their_size(engines, size, tmp_path):
    asleep, working = engines
    poller = Poller([], [EngineTarget(asleep.url), EngineTarget(working.url)], interval=0.3, down_after=3.0,
                    default_port=None, rate_window=WINDOW, latency_window=WINDOW)
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
            # Rates over several intervals: until the card shows one taken over six scrapes or more (the
            # seconds between two scrapes are known to within one interval: to within 1/6 over six).
            await until(pilot, lambda: window_of(card(working.url), working) >= 6, timeout=20,
                        what=lambda: f"rates over {window_of(card(working.url), working)} scrapes")
            a, w = card(asleep.url), card(working.url)
            shown = w._last[0]  # the snapshot the busy card is drawn from
            now = time.monotonic()
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
    # The card shows its snapshot's rates, and they are the server's counters over the seconds between.
    assert shown.rejection_rate and shown.mem_bw
    assert f"rejected {shown.rejection_rate:.1f}/s" in busy_text
    assert f"bw {shown.mem_bw / 1e9:.0f}/273 GB/s" in busy_text
    assert rates_problems(shown, working, now) == []
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
            # Rates need two scrapes: until the card has drawn three snapshots, the last with rates to show.
            drawn: set[float] = set()

            def three_drawn() -> bool:
                drawn.add(card()._last[0].t)
                return len(drawn) >= 3
            await until(pilot, three_drawn, what=lambda: f"{len(drawn)} snapshots drawn")
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
            def detail(*words: str) -> Callable[[], bool]:
                return lambda: isinstance(app.screen, DetailScreen) and all(
                    w in str(app.screen.query_one("#charts").content) for w in words)

            card(working.url).focus()
            await pilot.press("enter")
            assert isinstance(app.screen, DetailScreen)
            await until(pilot, detail("waiting 3", "admission rejections", "memory bandwidth"))
            busy_detail = str(app.screen.query_one("#charts").content)
            await pilot.press("escape")
            card(asleep.url).focus()
            await pilot.press("enter")
            await until(pilot, detail("sleeping"))
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
    now = time.monotonic()
    assert proc.returncode == 0, err.decode()
    engines_json = {e["url"]: e for e in json.loads(out)["engines"]}
    a, w = engines_json[asleep.url], engines_json[working.url]
    assert a["state"] == "sleeping" and a["sleep_level"] == 1 and a["mem_bw_gbs"] is None
    assert w["state"] == "ready" and w["sleep_level"] is None
    assert w["waiting"] == 3 and w["waiting_by_reason"] == {"capacity": 1.0, "deferred": 2.0}
    assert set(w["admission_rejections_by_reason"]) == {"max_num_queued_reqs", "max_num_queued_tokens"}
    # The figures are the server's counters in two bodies it served (both exact in the JSON), over seconds
    # between when it served them and their successors; the JSON rounds the rest (to 0.001/s, 0.1 s, 0.01 GB/s).
    recent, rate, seconds = w["admission_rejections_recent"], w["admission_rejection_rate"], \
        w["admission_rejections_recent_s"]
    assert recent > 0 and rate > 0
    span = working.span(w["admission_rejections"], recent, now)
    assert span.shortest - 0.05 <= seconds <= span.longest + 0.05, (seconds, span.shortest, span.longest)
    assert recent / span.longest - 0.0005 <= rate <= recent / max(span.shortest, 1e-9) + 0.0005, \
        (rate, span.shortest, span.longest)
    assert abs(rate * seconds - recent) <= 0.0005 * seconds + 0.05 * rate + 1e-4  # the count over its span
    for key, name in (("mem_read_gbs", READ), ("mem_write_gbs", WRITE)):
        # Bytes counted over the same seconds as the rejections: GB per rejection times rejections/s.
        per_rejection = span.delta(name) / span.delta(REJECTIONS) / 1e9
        assert abs(w[key] - rate * per_rejection) <= 0.005 + 0.0005 * per_rejection, (key, w[key], rate)
    assert w["mem_bw_gbs"] == pytest.approx(w["mem_read_gbs"] + w["mem_write_gbs"], abs=0.011)


def test_a_rate_above_the_roofline_reads_as_the_measurement_it_is():
    # llama-3.1-8b at one request cannot make 900 t/s on a GB10: the window's tokens came from a larger batch.
    fell = snap(model="llama-3.1-8b", running=1, gen_tps=900.0)
    text = text_of(EngineCard("k")._lines(fell, None, 100))
    assert "above roofline: rate window vs batch now" in text and "% of roofline" not in text
    steady = text_of(EngineCard("k")._lines(snap(model="llama-3.1-8b", running=1, gen_tps=20.0), None, 100))
    assert "% of roofline" in steady and "above roofline" not in steady


def test_a_twin_started_by_hand_at_its_own_speed_is_held_to_that_pace_not_called_above_the_roofline():
    from sparktop.ui.cards import roofline_share

    # A 5x twin serves five times a GB10's rate: against one GB10's roofline it reads impossible.
    fast = snap(model="llama-3.1-8b", running=1, gen_tps=120.0)
    at_one = roofline_share(fast, None)
    assert at_one is not None and at_one > 1.0
    fast.argv = ["python", "-m", "sparktop", "twin", "serve", "llama-3.1-8b", "--speed", "5"]
    assert roofline_share(fast, None) == pytest.approx(at_one / 5)
    assert "above roofline" not in text_of(EngineCard("k")._lines(fast, None, 78))
