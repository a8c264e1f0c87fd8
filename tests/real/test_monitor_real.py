"""The monitor reads what vLLM 0.32 says: on a real server under a sweep's
load, the figures sparktop shows (the poller's snapshots, `status --json`,
the engine card) are the server's own counters.

The test holds sparktop to the very bodies it read, parsed again with
prometheus-client alone: the poller's through a spy on its parser, which
also gives the time it stamped each body with (the clock its rates are on),
so a gauge must equal the server's and a rate must be the counter's growth
over the rate window sparktop took, divided by the time between the two
stamps, exactly; `status` and the card through a recording proxy
(tests/helpers/recording_proxy.py), their figures equal to a body the proxy
passed. A scrape of the test's own would not do: on two busy cores one
scrape can take seconds, and no two clients see the same moment."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from sparktop.observe.engines.vllm import NAMES as VLLM
from sparktop.observe.poller import EngineTarget, Poller
from sparktop.observe.prometheus import LATENCY_WINDOW_S, EngineMetrics
from sparktop.observe.snapshot import EngineSnapshot
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from tests.helpers import depth
from tests.helpers.pilot import until
from tests.helpers.real_vllm import MODEL_NAME, VLLM_VERSION
from tests.helpers.recording_proxy import RecordingProxy
from tests.helpers.scraper import parse, scrape
from tests.helpers.wait import eventually

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "kv_usage": "vllm:kv_cache_usage_perc"}
RATES = {"gen_tps": "vllm:generation_tokens_total", "prompt_tps": "vllm:prompt_tokens_total",
         # vLLM 0.32's own estimate of the bytes it moves (the server runs with --enable-mfu-metrics)
         "mem_read_bps": "vllm:estimated_read_bytes_per_gpu_total",
         "mem_write_bps": "vllm:estimated_write_bytes_per_gpu_total"}


def start_sweep(server, tmp_path, *, c: int = 12, runs: int = 4, pp: int = 512, tg: int = 1024):
    """A sweep in its own process: the load a user puts on the engine (its output in tmp_path/load.log)."""
    log = open(tmp_path / "load.log", "w")  # noqa: SIM115 - the sweep's, closed when it ends
    return subprocess.Popen(
        [sys.executable, "-m", "sparktop", "sweep", "--endpoint", server.url + "/v1", "--tokenizer",
         str(server.model / "tokenizer.json"), "--pp", str(pp), "--tg", str(tg), "-c", str(c), "--runs", str(runs),
         "--exact-tg", "--no-warmup", "--json", "--results", str(tmp_path / "results")],
        stdout=log, stderr=subprocess.STDOUT)


def stop(sweep) -> None:
    """The load ends once the test has what it needed of it (a sweep's own run is test_sweep_real's)."""
    if sweep.poll() is None:
        sweep.terminate()
    sweep.wait(60)


async def wait_busy(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await asyncio.to_thread(scrape, url)).get("vllm:num_requests_running", 0) > 0:
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the sweep never got a request running")


@dataclass
class Parsed:
    t: float  # the stamp sparktop gave the body (its monotonic clock: the one its rates are taken on)
    text: str
    epoch: int  # the rates' history it joined: a new one when the engine is recognised again or reset


@pytest.fixture
def parsed_by_sparktop(monkeypatch) -> list[Parsed]:
    """Every /metrics body sparktop's engine readers parse, in order, with its stamp and history."""
    seen: list[Parsed] = []
    epochs = itertools.count()
    parse_original, reset_original = EngineMetrics.parse, EngineMetrics.reset

    def parse_and_keep(self, text: str, t: float, histograms: bool = True):
        scrape = parse_original(self, text, t, histograms=histograms)
        if not hasattr(self, "_test_epoch"):
            self._test_epoch = next(epochs)
        seen.append(Parsed(t, text, self._test_epoch))
        return scrape

    def reset_and_mark(self) -> None:
        reset_original(self)
        self._test_epoch = next(epochs)

    monkeypatch.setattr(EngineMetrics, "parse", parse_and_keep)
    monkeypatch.setattr(EngineMetrics, "reset", reset_and_mark)
    return seen


def rate_base(times: list[float], i: int, window: float) -> int | None:
    """The scrape a rate at scrape `i` is taken from: the oldest within `window` seconds of it, else the one
    before (sparktop.observe.prometheus.EngineMetrics.add); `times` are one history's."""
    if i == 0:
        return None
    return next((k for k in range(i) if times[i] - times[k] <= window), i - 1)


async def test_snapshots_are_the_servers_counters(vllm_server, tmp_path, parsed_by_sparktop):
    """15-25 s here, more on a busy machine: the load's first requests (1,024 tokens each, a queue behind them)
    must finish while it is watched."""
    poller = Poller([], [EngineTarget(vllm_server.url)], interval=1.0, default_port=None)
    snaps: list[EngineSnapshot] = []
    sweep = start_sweep(vllm_server, tmp_path)
    task = None
    try:
        await wait_busy(vllm_server.url)
        await poller.start()

        async def consume():
            async for event in poller.events():
                # A poll that timed out on two busy cores reads nothing (and starts the rates afresh).
                if isinstance(event, EngineSnapshot) and event.state in ("ready", "sleeping"):
                    snaps.append(event)

        task = asyncio.create_task(consume())
        # Until every figure has been seen moving: six polls with rates, a queue, a cache over half full, a
        # request finished and queue percentiles (the load's 1,024-token requests take a while on two cores).
        try:
            await eventually(lambda: sum(s.gen_tps is not None for s in snaps) >= 6 and all(seen(snaps).values()),
                             timeout=300, step=0.2)
        except AssertionError:
            raise AssertionError(f"not every figure moved in 300 s of load: {seen(snaps)}") from None
    finally:
        if task is not None:
            task.cancel()
        await poller.close()
        await asyncio.to_thread(stop, sweep)

    assert snaps[-1].model == MODEL_NAME and snaps[-1].version == VLLM_VERSION
    # One body parsed a poll, one snapshot a poll, in order (the poller may have parsed more as it closed:
    # each snapshot is checked to be its body's below).
    parsed = parsed_by_sparktop
    values = [parse(p.text) for p in parsed]
    assert len(parsed) >= len(snaps)
    rate_window = EngineMetrics(VLLM).rate_window
    problems = []
    for i, snap in enumerate(snaps):
        theirs = values[i]
        if (snap.gen_tokens_total, snap.prompt_tokens_total) != (theirs[RATES["gen_tps"]],
                                                                 theirs[RATES["prompt_tps"]]):
            problems.append(f"snapshot {i} is not from body {i}")
            continue
        for field, name in GAUGES.items():
            if getattr(snap, field) != theirs[name]:
                problems.append(f"t={snap.t:.2f} {field} {getattr(snap, field)} but the server said {theirs[name]}")
        by_reason = snap.waiting_by_reason or {}
        if sum(by_reason.values()) != theirs["vllm:num_requests_waiting_by_reason"] or \
                sum(by_reason.values()) != snap.waiting:
            problems.append(f"t={snap.t:.2f} waiting by reason {by_reason}, the server said "
                            f"{theirs['vllm:num_requests_waiting_by_reason']} of {theirs[GAUGES['waiting']]}")
        if snap.state != "ready" or snap.sleep_level is not None:
            problems.append(f"t={snap.t:.2f} an awake engine shown as {snap.state} {snap.sleep_level}")
        # The bodies of this body's history (since the engine was last recognised), on sparktop's stamps.
        start = next(k for k in range(i + 1) if parsed[k].epoch == parsed[i].epoch)
        times, texts = [p.t for p in parsed[start:i + 1]], [p.text for p in parsed[start:i + 1]]
        # Requests finished by reason, and latency percentiles (TTFT, ITL, queue, e2e; the window's and the
        # last minute's), against the very bodies, parsed and computed without sparktop's code.
        problems += depth.problems(snap, texts, times, i - start, rate_window, window=LATENCY_WINDOW_S, rel=1e-9)
        j = rate_base(times, i - start, rate_window)
        growth = {field: None if j is None else (theirs[name] - values[start + j][name]) / (times[-1] - times[j])
                  for field, name in RATES.items()}
        if not (growth["mem_read_bps"] or 0) + (growth["mem_write_bps"] or 0) > 0:
            growth["mem_read_bps"] = growth["mem_write_bps"] = None  # no bytes estimated: no figure, not 0 GB/s
        for field, expected in growth.items():
            mine = getattr(snap, field)
            if (mine is None or expected is None) and mine is not expected or \
                    mine is not None and mine != pytest.approx(expected, rel=1e-9):
                problems.append(f"t={snap.t:.2f} {field} {mine} but the counter grew {expected} a second "
                                f"from body {start + j if j is not None else None} to {i}")
    assert not problems, "\n".join(problems)


def seen(snaps: list[EngineSnapshot]) -> dict[str, bool]:
    """Which figures the snapshots saw away from zero: each is then held to the server above."""
    return {"a queue": max((s.waiting or 0 for s in snaps), default=0) > 0,
            "the cache over half full": max((s.kv_usage or 0 for s in snaps), default=0) > 0.5,
            "vLLM's byte estimates": max((s.mem_read_bps or 0 for s in snaps), default=0) > 0,
            "a request finished": any(s.finished_rate for s in snaps),
            "queue percentiles": any((s.latency or {}).get("queue", {}).get("p95") for s in snaps)}


def test_status_json_shows_the_servers_counters(vllm_server, tmp_path):
    async def run() -> tuple[dict, RecordingProxy]:
        proxy = await RecordingProxy(vllm_server.url).start()
        sweep = start_sweep(vllm_server, tmp_path, runs=3)
        try:
            await wait_busy(vllm_server.url)
            status = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sparktop", "status", "--json", "--engine", proxy.url, "--seconds", "3",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(status.communicate(), 60)
            assert status.returncode == 0, err.decode()
        finally:
            await asyncio.to_thread(stop, sweep)
            await proxy.stop()
        return json.loads(out)["engines"], proxy

    engines, proxy = asyncio.run(run())
    # The server itself is found too (a vLLM process on this node, `found` says so); the proxy is the one given.
    (engine,) = [e for e in engines if e["url"] == proxy.url]
    assert engine["found"] == "given (--engine)"
    port = vllm_server.url.rsplit(":", 1)[1]
    assert any(e["url"].endswith(f":{port}") and (e["found"] or "").startswith("process ")
               and f"port {port}" in e["found"] for e in engines if e is not engine), engines
    assert engine["state"] == "ready" and engine["model"] == MODEL_NAME and engine["version"] == VLLM_VERSION
    # status prints the last snapshot it made; a scrape in flight when it
    # stopped watching may have passed the proxy after it.
    last = [r.values for r in proxy.scrapes[-2:]]
    assert any((engine["running"], engine["waiting"], engine["kv_cache_usage"], engine["gen_tokens_total"])
               == (v[GAUGES["running"]], v[GAUGES["waiting"]], round(v[GAUGES["kv_usage"]], 4), v[RATES["gen_tps"]])
               for v in last), (engine, [{k: v[n] for k, n in GAUGES.items()} for v in last])
    # A rate over its seconds of load (status does not print when it read each body: the value itself is the
    # poller's arithmetic, held exactly in the test above; how close it comes to the counter's growth over the
    # proxy's clock is a benchmark's, tests/benchmarks/status_window.py).
    assert engine["gen_tps"] and engine["gen_tps"] > 0, engine["gen_tps"]
    assert engine["latency_ms"] and engine["latency_ms"]["itl"]["p50"], engine["latency_ms"]


async def test_the_engine_card_shows_the_real_engine(vllm_server, tmp_path):
    proxy = await RecordingProxy(vllm_server.url).start()
    poller = Poller([], [EngineTarget(proxy.url)], interval=1.0, default_port=None)
    await poller.start()
    app = SparktopApp(poller)
    sweep = start_sweep(vllm_server, tmp_path, runs=3)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            card = lambda: next(iter(app.screen.query(EngineCard)), None)  # noqa: E731
            await until(pilot, lambda: card() is not None and "● ready" in card().text, timeout=30)
            await until(pilot, lambda: "run 0 " not in card().text, timeout=30)
            text, recent = card().text, [r.values for r in proxy.scrapes[-2:]]
    finally:
        await poller.close()
        await asyncio.to_thread(stop, sweep)
        await proxy.stop()
    assert MODEL_NAME in text and proxy.url.removeprefix("http://") in text
    running = float(text.split("run ", 1)[1].split()[0])
    # The card shows the last snapshot; the proxy may have passed one more scrape since.
    assert running in [v[GAUGES["running"]] for v in recent], (text, recent)
