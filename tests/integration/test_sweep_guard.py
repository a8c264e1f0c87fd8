"""The sweep's clean-measurement guard against real servers: a level counts
only when the engine had nothing else to do. Foreign traffic during a level
(or an engine that never goes idle before it) marks the level contaminated;
it is measured once more, and reported as contaminated if that happens again.

Foreign traffic here is real: streaming requests sent to the same twin by
the test, or the demo's background load generator in its own process.

The in-process tests run the twin, the foreign clients and the sweep on
simulated time (tests/helpers/simulated.py): the guard's reads land where the
model's steps put them, so a level is contaminated, or not, the same way on
any machine, and the waits it reports are exact multiples of its poll."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest
from aiohttp import web

from sparktop.bench.events import (
    LevelContaminated,
    LevelDone,
    LevelStarted,
    SweepFinished,
    SweepStarted,
    WaitingForIdle,
)
from sparktop.bench.results import load_run
from sparktop.bench.sweep import IDLE_POLL, Sweep, SweepSettings
from sparktop.cli import build_parser
from tests.helpers.simulated import sim_clock, sim_twin, simulated
from tests.helpers.twin_process import start_twin_process

MODEL = "llama-3.1-8b"


@contextlib.asynccontextmanager
async def foreign(url: str, n: int = 2, max_tokens: int = 4000) -> AsyncIterator[None]:
    """`n` long streaming requests kept going against `url` by someone else."""

    async def one(session: aiohttp.ClientSession) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me a long story " * 20}],
                "max_tokens": max_tokens, "stream": True}
        while True:
            try:
                async with session.post(url + "/v1/chat/completions", json=body) as r:
                    async for _ in r.content.iter_any():
                        pass
            except aiohttp.ClientError:
                await asyncio.sleep(0.2)

    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
    tasks = [asyncio.ensure_future(one(session)) for _ in range(n)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await session.close()


async def engine_busy(url: str, timeout: float = 60.0) -> None:
    """Until the engine reports something running (`timeout` on the loop's clock)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aiohttp.ClientSession() as session:
        while loop.time() < deadline:
            async with session.get(url + "/metrics") as r:
                text = await r.text()
            if any(line.startswith("vllm:num_requests_running") and not line.rstrip().endswith(" 0.0")
                   for line in text.splitlines()):
                return
            await asyncio.sleep(0.1)
    raise AssertionError("the foreign load never reached the engine")


def engine_lines(path) -> list[dict]:
    return [json.loads(x) for x in (path / "engine.jsonl").read_text().splitlines() if x.strip()]


def measuring(event, c: int) -> bool:
    """The measured batches of level `c` (not its warm-up) begin."""
    return isinstance(event, LevelStarted) and event.concurrency == c and not event.warmup


def attempts(run, level: int) -> set[int]:
    return {r.attempt for r in run.records if r.level == level}


@simulated
async def test_foreign_requests_during_a_level_contaminate_it_and_it_is_measured_again(tmp_path):
    clock = sim_clock()
    events: list = []
    async with sim_twin(MODEL, speed=2, clock=clock) as server, contextlib.AsyncExitStack() as stack:
        settings = SweepSettings(server.url, levels=[1, 2], runs=2, pp=128, tg=64, idle_timeout=1.0)
        async for event in Sweep(settings, tmp_path, clock=clock).events():
            events.append(event)
            if measuring(event, 2) and not any(measuring(e, 2) for e in events[:-1]):
                # Someone else starts using the engine while c2 is measured, and goes on.
                await stack.enter_async_context(foreign(server.url))
    finished = events[-1]
    assert isinstance(finished, SweepFinished) and finished.status == "done"
    run = load_run(finished.path)
    levels = {lv.concurrency: lv for lv in run.levels()}
    assert not levels[1].contaminated and levels[1].foreign_requests == 0 and not levels[1].remeasured
    c2 = levels[2]
    assert c2.contaminated and c2.remeasured
    assert c2.foreign_requests is not None and c2.foreign_requests > 0
    assert "foreign request" in c2.contamination and c2.contamination.endswith("re-measured once, still contaminated")
    # Both attempts are on disk, and the figures are the second's.
    assert attempts(run, 1) == {1} and attempts(run, 2) == {1, 2}
    assert len([r for r in run.records if r.level == 2]) == 2 * 2 * 2
    assert [{r.attempt for r in b} for b in run.batches()[2]] == [{2}, {2}]
    lines = [x for x in engine_lines(finished.path) if x["concurrency"] == 2]
    assert [x["attempt"] for x in lines] == [1, 2] and all(x["contaminated"] for x in lines)
    said = [e for e in events if isinstance(e, LevelContaminated)]
    assert [(e.concurrency, e.remeasuring) for e in said] == [(2, True), (2, False)]
    assert run.meta["contaminated_levels"] == [2] and run.meta["remeasured_levels"] == [2]
    assert run.meta["guard"] == f"on: {server.url}"
    done = [e.stats for e in events if isinstance(e, LevelDone)]
    assert [(s.concurrency, s.contaminated) for s in done] == [(1, False), (2, True)]  # one LevelDone per level
    assert levels[2].as_dict()["contaminated"] is True


@simulated
async def test_an_idle_engine_is_never_flagged(tmp_path):
    clock = sim_clock()
    async with sim_twin(MODEL, speed=20, clock=clock) as server:
        settings = SweepSettings(server.url, levels=[1, 2, 4, 8], runs=2, pp=128, tg=32)
        events = [event async for event in Sweep(settings, tmp_path, clock=clock).events()]
    finished = events[-1]
    assert isinstance(finished, SweepFinished) and finished.status == "done"
    assert not [e for e in events if isinstance(e, LevelContaminated | WaitingForIdle)]
    run = load_run(finished.path)
    assert [lv.concurrency for lv in run.levels()] == [1, 2, 4, 8]
    for lv in run.levels():
        assert not lv.contaminated and not lv.remeasured and lv.contamination is None
        assert lv.foreign_requests == 0  # watched, and nothing foreign: not "unknown"
    assert {r.attempt for r in run.records} == {1}
    assert run.meta["contaminated_levels"] == [] and run.meta["guard"].startswith("on: ")
    assert all(x["idle_wait_s"] is not None for x in engine_lines(finished.path))


@simulated
async def test_an_engine_busy_before_the_level_is_waited_for_and_flagged(tmp_path):
    clock = sim_clock()
    events: list = []
    async with sim_twin(MODEL, speed=2, clock=clock) as server, contextlib.AsyncExitStack() as stack:
        settings = SweepSettings(server.url, levels=[1], runs=1, pp=128, tg=32, idle_timeout=2.0)
        await stack.enter_async_context(foreign(server.url))
        await engine_busy(server.url)
        async for event in Sweep(settings, tmp_path, clock=clock).events():
            events.append(event)
            if isinstance(event, LevelContaminated) and event.remeasuring:
                await stack.aclose()  # the other user stops; the re-measurement finds the engine idle
    finished = events[-1]
    assert isinstance(finished, SweepFinished) and finished.status == "done"
    waits = [e for e in events if isinstance(e, WaitingForIdle)]
    assert waits and all(e.concurrency == 1 and e.timeout_s == 2.0 and e.running >= 1 for e in waits)
    # A read every IDLE_POLL seconds (each takes no time on simulated time) until the idle timeout.
    polls = round(2.0 / IDLE_POLL) + 1
    assert [e.waited_s for e in waits[:polls]] == pytest.approx([i * IDLE_POLL for i in range(polls)], abs=1e-6)
    first, second = engine_lines(finished.path)
    assert first["attempt"] == 1 and first["contaminated"]
    assert first["contamination"].startswith("engine still busy after ")
    assert "s of waiting before the level (2 running" in first["contamination"]
    assert first["idle_wait_s"] == 2.0
    assert second["attempt"] == 2 and not second["contaminated"] and second["remeasured"]
    (c1,) = load_run(finished.path).levels()
    assert not c1.contaminated and c1.remeasured and c1.foreign_requests == 0


@simulated
async def test_an_engine_never_idle_is_reported_contaminated_without_a_second_try(tmp_path):
    clock = sim_clock()
    async with sim_twin(MODEL, speed=2, clock=clock) as server, foreign(server.url):
        settings = SweepSettings(server.url, levels=[1], runs=1, pp=128, tg=32, idle_timeout=0.5,
                                 remeasure_contaminated=False)
        await engine_busy(server.url)
        finished = await Sweep(settings, tmp_path, clock=clock).run()
    (c1,) = finished.levels
    assert c1.contaminated and not c1.remeasured and c1.foreign_requests >= 2
    assert c1.contamination.startswith("engine still busy after")
    assert "foreign requests between" in c1.contamination or "foreign requests at" in c1.contamination
    assert attempts(load_run(finished.path), 1) == {1}


@contextlib.asynccontextmanager
async def proxy(upstream: str) -> AsyncIterator[str]:
    """A router in front of the engine that forwards the API and has no /metrics (like LiteLLM's): its URL."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def forward(request: web.Request) -> web.StreamResponse:
        async with session.request(request.method, upstream + request.path_qs, data=await request.read(),
                                   headers={"Content-Type": request.headers.get("Content-Type", "application/json")}
                                   ) as up:
            resp = web.StreamResponse(status=up.status,
                                      headers={"Content-Type": up.headers.get("Content-Type", "application/json")})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def close(app: web.Application) -> None:
        await session.close()

    app = web.Application()
    app.router.add_route("*", "/v1/{tail:.*}", forward)
    app.router.add_get("/version", forward)
    app.on_cleanup.append(close)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@simulated
async def test_guard_urls_watch_the_engine_behind_a_router_without_metrics(tmp_path):
    clock = sim_clock()
    async with sim_twin(MODEL, speed=2, clock=clock) as server, proxy(server.url) as router:
        # The router alone: no vLLM metrics, so no guard, said once in the run's meta.
        alone = await Sweep(SweepSettings(router + "/v1", levels=[1], runs=1, pp=64, tg=16), tmp_path / "a",
                            clock=clock).run()
        assert alone.status == "done"
        assert load_run(alone.path).meta["guard"] == f"off: {router}: vLLM, /metrics answered HTTP 404"
        assert alone.levels[0].foreign_requests is None and not alone.levels[0].contaminated

        # Pointed at the engine behind it: the sweep's own requests through the
        # router are no false alarm (c1), someone else's on the engine are (c2).
        settings = SweepSettings(router + "/v1", levels=[1, 2], runs=2, pp=128, tg=64, idle_timeout=0.5,
                                 guard_urls=[server.url + "/v1"], remeasure_contaminated=False)
        events: list = []
        async with contextlib.AsyncExitStack() as stack:
            async for event in Sweep(settings, tmp_path / "b", clock=clock).events():
                events.append(event)
                if measuring(event, 2):
                    await stack.enter_async_context(foreign(server.url))
    finished = events[-1]
    assert isinstance(finished, SweepFinished) and finished.status == "done"
    run = load_run(finished.path)
    assert run.meta["guard"] == f"on: {server.url}" and run.meta["settings"]["guard_urls"] == [server.url]
    levels = {lv.concurrency: lv for lv in run.levels()}
    assert not levels[1].contaminated and levels[1].foreign_requests == 0
    # The engine's figures come from the engine, not the router: its reads during c1 saw the one request.
    assert levels[1].running_max == 1
    assert levels[2].contaminated and levels[2].foreign_requests > 0 and not levels[2].remeasured


@pytest.mark.slow
def test_the_demo_engine_with_background_load_is_reported_contaminated(tmp_path, capsys):
    """`sparktop sweep` at c1 on a twin another client keeps busy (the load generator without the demo's
    --step-aside: it goes on sending while the sweep measures)."""
    engine, url = start_twin_process(MODEL, speed=1)
    load = subprocess.Popen([sys.executable, "-m", "sparktop.twin.load", url, "--min", "1", "--max", "6",
                             "--period", "20"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = httpx.get(url + "/metrics", timeout=5).text
            if any(line.startswith("vllm:num_requests_running") and not line.rstrip().endswith(" 0.0")
                   for line in text.splitlines()):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the background load never reached the twin")
        args = build_parser().parse_args(["sweep", "-e", url, "-c", "1", "--runs", "2", "--pp", "256", "--tg", "32",
                                          "--json", "--results", str(tmp_path / "results")])
        args.idle_timeout = 1.0  # the CLI's --idle-timeout, where the parser has it
        assert args.func(args) == 0
    finally:
        load.kill()
        engine.kill()
        load.wait(timeout=30)
        engine.wait(timeout=30)
    out, err = capsys.readouterr()
    report = json.loads(out)
    (c1,) = report["levels"]
    assert c1["contaminated"] is True and c1["remeasured"] is True and c1["foreign_requests"] >= 1
    assert c1["contamination"].endswith("re-measured once, still contaminated")
    assert report["contaminated_levels"] == [1] and report["guard"] == f"on: {url}"
    assert "c1 contaminated:" in err and "measuring it again" in err  # the live progress says so
    assert "⚠ c1 is contaminated:" in err
    run = load_run(report["path"])
    assert run.levels()[0].contaminated and attempts(run, 1) == {1, 2}


def test_settings_with_the_guard_round_trip_through_meta(tmp_path):
    s = SweepSettings("http://127.0.0.1:9/v1", guard_urls=["127.0.0.1:8000/v1", "http://127.0.0.1:8000"],
                      idle_timeout=5)
    Sweep(s, tmp_path)  # normalizes the endpoint and the guard's URLs
    assert s.guard_urls == ["http://127.0.0.1:8000"]
    public = s.public()
    assert public["guard_urls"] == ["http://127.0.0.1:8000"] and public["idle_timeout"] == 5
    assert public["remeasure_contaminated"] is True
    assert SweepSettings(endpoint="http://x", **{k: v for k, v in public.items()}).guard_urls == s.guard_urls
    json.dumps(public)


@simulated
async def test_an_idle_engine_costs_one_read_before_a_level(tmp_path):
    """One /metrics read before a level on an idle engine: no waiting at all. On simulated time a read takes
    no time, so the wait before the level is exactly zero; a second read would have come IDLE_POLL later."""
    clock = sim_clock()
    async with sim_twin(MODEL, speed=20, clock=clock) as server:
        settings = SweepSettings(server.url, levels=[1], runs=1, pp=64, tg=16)
        events = [e async for e in Sweep(settings, tmp_path, clock=clock).events()]
    assert isinstance(events[0], SweepStarted)
    assert not [e for e in events if isinstance(e, WaitingForIdle)]
    (line,) = engine_lines(events[-1].path)
    assert line["idle_wait_s"] == 0.0 and not line["contaminated"]
