"""The monitor's depth on a twin: requests finished by reason and latency
percentiles held to the server's own counters and histograms, the event
log on a restart and on a preemption burst, and energy per token checked
by hand against the same scrapes."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time

import openai
import pytest

from sparktop.observe.engines.vllm import NAMES as VLLM
from sparktop.observe.poller import EngineTarget, NodeTarget, Poller
from sparktop.observe.prometheus import EngineMetrics
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot, Notice
from sparktop.observe.state import ENERGY_WINDOW_S, ClusterState
from sparktop.remote.local import LocalTransport
from tests.conftest import free_port
from tests.helpers import depth
from tests.helpers.fake_gpu import fake_gpu
from tests.helpers.recording_proxy import RecordingProxy
from tests.helpers.twin_process import start_twin_process

pytestmark = pytest.mark.slow


async def watch(poller: Poller, state: ClusterState, seconds: float, stop=None) -> list:
    """Every event the poller yields for `seconds` (or until `stop(events)`), applied to `state`."""
    events: list = []
    deadline = time.monotonic() + seconds

    async def consume():
        async for event in poller.events():
            state.apply(event)
            events.append(event)
            if stop is not None and stop(events):
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(consume(), max(0.1, deadline - time.monotonic()))
    return events


def answered(proxy: RecordingProxy, snaps: list[EngineSnapshot]) -> list:
    """The scrapes the watch saw as snapshots: a poll still in flight when the watch's time ran out is
    recorded by the proxy (its body went back) but never becomes a snapshot."""
    return [r for r in proxy.scrapes if snaps and r.t <= snaps[-1].t]


async def load(url: str, seconds: float) -> None:
    """Requests that end every way a client makes them end: at max_tokens
    (length), naturally (stop), and dropped mid-stream (abort)."""
    oa = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    deadline = time.monotonic() + seconds

    async def one(i: int) -> None:
        if i % 3 == 2:  # a client that hangs up after a few tokens
            stream = await oa.chat.completions.create(
                model="llama-3.1-8b", messages=[{"role": "user", "content": f"{i} hello " * 50}],
                max_tokens=400, stream=True, extra_body={"ignore_eos": True})
            n = 0
            async for _ in stream:
                n += 1
                if n >= 3:
                    break
            await stream.close()
            return
        await oa.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": f"{i} hello " * 200}],
            max_tokens=40 if i % 3 == 0 else 400, extra_body={"ignore_eos": i % 3 == 0})

    i = 0
    try:
        while time.monotonic() < deadline:
            await asyncio.gather(*(one(i + k) for k in range(6)))
            i += 6
    finally:
        await oa.close()


async def test_request_figures_agree_with_the_twins_counters_and_histograms(twin):
    server = await twin("llama-3.1-8b", "--max-num-seqs", "4", speed=40)
    proxy = await RecordingProxy(server.url).start()
    poller = Poller([], [EngineTarget(proxy.url)], interval=1.0, default_port=None)
    state = ClusterState()
    await poller.start()
    try:
        events, _ = await asyncio.gather(watch(poller, state, 16), load(server.url, 15))
    finally:
        await poller.close()
        await proxy.stop()
    snaps = [e for e in events if isinstance(e, EngineSnapshot) and e.state == "ready"]
    scrapes = answered(proxy, snaps)
    assert len(snaps) == len(scrapes) >= len(proxy.scrapes) - 1, "one snapshot per scrape, nothing else scraping"
    texts, times = [r.text for r in scrapes], [s.t for s in snaps]
    window = EngineMetrics(VLLM).rate_window
    found = []
    for i, snap in enumerate(snaps):
        found += depth.problems(snap, texts, times, i, window)
    assert not found, "\n".join(found)
    last = snaps[-1]
    assert (last.finished_by_reason or {}).get("length", 0) > 0 and (last.finished_by_reason or {}).get("abort", 0) > 0
    assert any(s.finished_rate for s in snaps), "no finished rate while requests finished"
    assert any((s.finished_rate_by_reason or {}).get("abort") for s in snaps), "aborts never showed as a rate"
    assert last.latency and all(last.latency[name]["p95"] is not None for name in ("ttft", "itl", "queue", "e2e"))
    assert last.latency["queue"]["p95"] > 0, "four seats for six clients: someone queued"
    assert last.requests == sum(last.finished_by_reason.values())
    peaks = state.peaks[last.key]
    assert peaks["running"] == max(s.running for s in snaps) == 4
    assert peaks["gen_tps"] == max(s.gen_tps for s in snaps if s.gen_tps is not None)


@pytest.mark.parametrize("rate_window", [3.0, 8.0])
async def test_tokens_per_second_are_over_the_window_the_user_chose(twin, rate_window):
    """`--rate-window S` (or rate_window_s in settings.yaml): each snapshot's
    gen t/s is the server's own generation counter over the last S seconds,
    not over the default 10 nor between two polls."""
    server = await twin("llama-3.1-8b", "--max-num-seqs", "4", speed=40)
    proxy = await RecordingProxy(server.url).start()
    poller = Poller([], [EngineTarget(proxy.url)], interval=1.0, default_port=None, rate_window=rate_window)
    await poller.start()
    try:
        events, _ = await asyncio.gather(watch(poller, ClusterState(), rate_window + 6),
                                         load(server.url, rate_window + 5))
    finally:
        await poller.close()
        await proxy.stop()
    snaps = [e for e in events if isinstance(e, EngineSnapshot) and e.state == "ready"]
    scrapes = answered(proxy, snaps)
    assert len(snaps) == len(scrapes) >= len(proxy.scrapes) - 1, "one snapshot per scrape, nothing else scraping"
    gen = [depth.counter(r.text, "vllm:generation_tokens_total") for r in scrapes]
    # When each body went back to the poller (the clock its rates are taken on: the answer's arrival),
    # not when its snapshot was made, which a busy event loop may delay.
    times = [r.t for r in scrapes]
    spans = []
    for i, snap in enumerate(snaps):
        if times[i] - times[0] < rate_window + 0.5 or not snap.gen_tps:
            continue  # the window is not full yet
        matches = [k for k in range(i)
                   if depth.close(snap.gen_tps, (gen[i] - gen[k]) / (times[i] - times[k]), rel=0.02)]
        assert matches, f"t={snap.t:.1f}: {snap.gen_tps:.1f} t/s matches no span of the server's counter"
        # A steady counter can match several spans: the longest inside the window, if any is.
        inside = [k for k in matches if times[i] - times[k] <= rate_window + 0.1]
        k = min(inside) if inside else max(matches)
        dt = times[i] - times[k]
        # The oldest scrape inside the window: a span of S seconds less at most one poll; longer only
        # when a stalled poll (a busy machine) left no scrape inside it, and then the one before.
        assert rate_window - 1.1 <= dt <= rate_window + 0.1 or (dt > rate_window and k == i - 1), \
            (snap.t, dt, [round(times[i] - times[j], 2) for j in range(i)])
        spans.append(dt)
    assert len(spans) >= 3, "too few full windows to judge"
    assert statistics.median(spans) > rate_window - 0.6, spans


async def test_an_engine_killed_and_restarted_gives_down_back_restarted_in_order():
    port = free_port()
    proc, url = start_twin_process("llama-3.1-8b", speed=20, port=port)
    poller = Poller([], [EngineTarget(url)], interval=0.5, down_after=5, default_port=None)
    state = ClusterState()
    await poller.start()
    try:
        await watch(poller, state, 10, lambda ev: any(isinstance(e, EngineSnapshot) and e.state == "ready"
                                                      and e.started_at for e in ev))
        proc.kill()
        proc.wait()
        await watch(poller, state, 15, lambda ev: any(isinstance(e, Notice) and e.kind == "down" for e in ev))
        proc, _ = await asyncio.to_thread(start_twin_process, "llama-3.1-8b", speed=20, port=port)
        await watch(poller, state, 15, lambda ev: any(isinstance(e, Notice) and e.kind == "restarted" for e in ev))
    finally:
        await poller.close()
        proc.kill()
        proc.wait()
    kinds = [n.kind for n in state.log(url)]
    assert kinds == ["down", "back", "restarted"], [n.text for n in state.log(url)]
    down, back, restarted = state.log(url)
    assert "refused" in down.text and down.level == "error"
    assert down.t < back.t <= restarted.t


async def test_a_preemption_burst_on_a_full_cache_gives_its_events(twin):
    # ~8k tokens of KV for 32 requests of 1.2k: the scheduler preempts.
    server = await twin("llama-3.1-8b", "--gpu-memory-utilization", "0.112", "--max-model-len", "4096", speed=50)
    poller = Poller([], [EngineTarget(server.url)], interval=0.5, default_port=None)
    state = ClusterState()
    oa = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    await poller.start()
    try:
        await watch(poller, state, 5, lambda ev: any(isinstance(e, EngineSnapshot) and e.state == "ready"
                                                     for e in ev))
        burst = asyncio.gather(*(oa.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": f"{i} " + "tok " * 1000}],
            max_tokens=200, extra_body={"ignore_eos": True}) for i in range(32)))
        await asyncio.gather(burst, watch(poller, state, 60, lambda ev: {"preempting", "kv_high"} <= {
            e.kind for e in ev if isinstance(e, Notice)}))
    finally:
        await poller.close()
        await oa.close()
    log = state.log(server.url)
    kinds = [n.kind for n in log]
    assert kinds.count("preempting") == 1, [n.text for n in log]  # one burst, one line
    assert "kv_high" in kinds
    preempting = next(n for n in log if n.kind == "preempting")
    assert preempting.level == "warn" and "KV" in preempting.text
    assert server.engine.total_preemptions > 0


async def test_energy_per_token_is_power_over_the_token_rate_by_hand(twin, tmp_path):
    server = await twin("llama-3.1-8b", speed=40)
    proxy = await RecordingProxy(server.url).start()
    env, power = fake_gpu(tmp_path)
    node = NodeTarget("spark-a", LocalTransport(env=env))
    poller = Poller([node], [EngineTarget(proxy.url, node="spark-a")], interval=0.5, default_port=None)
    state = ClusterState()
    await poller.start()

    async def vary() -> None:
        for watts in (30.0, 55.0, 42.0, 61.0, 48.0, 35.0):
            # Whole or not at all, as the driver's reading is: a write the fake nvidia-smi reads half-way
            # (truncated, not yet written) gave a reading without a power figure.
            staged = power.with_suffix(".new")
            staged.write_text(f"{watts}")
            staged.replace(power)
            await asyncio.sleep(1.3)

    try:
        events, _, _ = await asyncio.gather(watch(poller, state, 9), load(server.url, 8.5), vary())
    finally:
        await poller.close()
        await proxy.stop()
    nodes = [e for e in events if isinstance(e, NodeSnapshot) and e.state == "ok"]
    engine = next(e for e in reversed(events) if isinstance(e, EngineSnapshot) and e.gen_tps)
    energy = state.engine_energy(engine)
    assert energy is not None and energy.nodes == ["spark-a"]
    # By hand: the node's readings over the rate window before the snapshot ...
    readings = [n.gpu.power for n in nodes if engine.t - ENERGY_WINDOW_S - 0.5 <= n.t <= engine.t + 0.5]
    watts = sum(readings) / len(readings)
    # ... over the generation counter's growth across the scrapes the rate spans.
    snaps = [e for e in events if isinstance(e, EngineSnapshot) and e.state == "ready"]
    i = next(k for k, s in enumerate(snaps) if s is engine)
    counter = [r.values["vllm:generation_tokens_total"] for r in proxy.scrapes]
    candidates = [(counter[i] - counter[k]) / (snaps[i].t - snaps[k].t)
                  for k in range(i) if snaps[i].t - snaps[k].t <= EngineMetrics(VLLM).rate_window + 1.0]
    assert any(abs(engine.gen_tps - tps) <= 0.01 * tps for tps in candidates), (engine.gen_tps, candidates)
    assert energy.watts == pytest.approx(watts, rel=1e-9)
    assert energy.j_per_token == pytest.approx(watts / engine.gen_tps, rel=1e-9)
    assert energy.wh_per_million == pytest.approx(watts / engine.gen_tps * 1e6 / 3600, rel=1e-9)
    assert energy.cost_per_million(0.30) == pytest.approx(watts / engine.gen_tps * 1e6 / 3600 / 1000 * 0.30)
    assert len(set(readings)) > 1, "the power never changed inside the window: the average was not tested"
    node_energy = state.node_energy("spark-a")
    assert node_energy is not None and node_energy.tokens_per_s == engine.gen_tps
