"""The monitor's depth on a twin: requests finished by reason and latency
percentiles held to the server's own counters and histograms, token rates
over the window the user chose, the event log on a restart and on a
preemption burst, and energy per token checked by hand against the same
polls.

Where the poller watches an in-process twin alone (no node, no other
process), both run on one virtual-time loop and the poller is given the
loop's clock (tests/helpers/simulated.py): every scrape is taken when the
schedule says, and a rate is the counters' change over simulated seconds,
so the tests hold the figures to the bodies the poller read exactly."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

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
from tests.helpers.recording_proxy import RecordingProxy
from tests.helpers.simulated import sim_clock, sim_twin, simulated
from tests.helpers.twin_process import start_twin_process

slow = pytest.mark.slow


async def watch(poller: Poller, state: ClusterState, seconds: float, stop=None) -> list:
    """Every event the poller yields for `seconds` of the loop's time (or until `stop(events)`), applied to
    `state`."""
    events: list = []

    async def consume():
        async for event in poller.events():
            state.apply(event)
            events.append(event)
            if stop is not None and stop(events):
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(consume(), seconds)
    return events


def paired(proxy: RecordingProxy, snaps: list[EngineSnapshot]) -> list:
    """The scrapes the watch saw as snapshots, one each, in order (on simulated time: the poller went on
    scraping until the load's last requests ended, after the watch). They are paired by the counter the
    snapshot read, so a scrape that made no snapshot (or anyone else's) cannot slip in."""
    scrapes = proxy.scrapes[:len(snaps)]
    assert [s.gen_tokens_total for s in snaps] == [
        r.values.get("vllm:generation_tokens_total") for r in scrapes], "one snapshot per scrape, in order"
    return scrapes


async def load(url: str, seconds: float) -> None:
    """Requests that end every way a client makes them end: at max_tokens
    (length), naturally (stop), and dropped mid-stream (abort), for
    `seconds` of the loop's time."""
    oa = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

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
        while loop.time() < deadline:
            await asyncio.gather(*(one(i + k) for k in range(6)))
            i += 6
    finally:
        await oa.close()


@simulated
async def test_request_figures_agree_with_the_twins_counters_and_histograms():
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", "--max-num-seqs", "4", speed=4, clock=clock) as server:
        proxy = await RecordingProxy(server.url).start()
        poller = Poller([], [EngineTarget(proxy.url)], interval=1.0, default_port=None, clock=clock)
        state = ClusterState()
        await poller.start()
        try:
            events, _ = await asyncio.gather(watch(poller, state, 16), load(server.url, 15))
        finally:
            await poller.close()
            await proxy.stop()
    snaps = [e for e in events if isinstance(e, EngineSnapshot) and e.state == "ready"]
    scrapes = paired(proxy, snaps)
    assert len(snaps) >= 15
    texts, times = [r.text for r in scrapes], [s.t for s in snaps]
    window = EngineMetrics(VLLM).rate_window
    found = []
    for i, snap in enumerate(snaps):
        # The snapshots' times on simulated time are the poller's own stamps to a microsecond: rates to 1e-6.
        found += depth.problems(snap, texts, times, i, window, rel=1e-6)
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


INTERVAL = 0.7  # no whole number of polls spans either window: the oldest scrape inside it is never in doubt


@simulated
@pytest.mark.parametrize("rate_window", [3.0, 8.0])
async def test_tokens_per_second_are_over_the_window_the_user_chose(rate_window):
    """`--rate-window S` (or rate_window_s in settings.yaml): each snapshot's
    gen t/s is the server's own generation counter over the last S seconds,
    not over the default 10 nor between two polls: from the oldest scrape
    inside the window (or the oldest there is, while it fills). On simulated
    time the polls come exactly every INTERVAL, so the span is known."""
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", "--max-num-seqs", "4", speed=4, clock=clock) as server:
        proxy = await RecordingProxy(server.url).start()
        poller = Poller([], [EngineTarget(proxy.url)], interval=INTERVAL, default_port=None, rate_window=rate_window,
                        clock=clock)
        await poller.start()
        try:
            events, _ = await asyncio.gather(watch(poller, ClusterState(), rate_window + 6),
                                             load(server.url, rate_window + 6))
        finally:
            await poller.close()
            await proxy.stop()
    snaps = [e for e in events if isinstance(e, EngineSnapshot) and e.state == "ready"]
    gen = [depth.counter(r.text, "vllm:generation_tokens_total") for r in paired(proxy, snaps)]
    times = [s.t for s in snaps]  # when each body arrived, on the poller's clock
    assert all(b - a == pytest.approx(INTERVAL, abs=1e-5) for a, b in itertools.pairwise(times)), times
    span = INTERVAL * int(rate_window / INTERVAL)  # the oldest scrape inside the window: 2.8 s of 3, 7.7 of 8
    full = 0
    for i, snap in enumerate(snaps[1:], 1):
        k = next(k for k in range(i) if times[i] - times[k] <= rate_window + 1e-5)
        if times[i] - times[0] > rate_window:
            assert times[i] - times[k] == pytest.approx(span, abs=1e-5)
            full += 1
        else:
            assert k == 0  # still filling: from the first scrape
        expected = (gen[i] - gen[k]) / (times[i] - times[k])
        assert snap.gen_tps == pytest.approx(expected, rel=1e-6), (i, k, snap.gen_tps, expected)
    assert full >= 5 and gen[-1] > gen[0]


@simulated
async def test_one_slow_answer_from_a_busy_engine_keeps_the_rate_window():
    """A busy engine's /metrics can take longer than a poll may wait: that poll fails, and the next ones
    answer. The counters went on meanwhile, so the next rate is still the growth over the whole window,
    scrapes from before the slow answer included, not a fresh start that reads the window's tokens as
    none. (Status printed 0.0 t/s for a real vLLM that served 1,500 tokens in its window, so.)"""
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", "--max-num-seqs", "4", speed=4, clock=clock) as server:
        proxy = RecordingProxy(server.url)
        forward = proxy._forward
        seen = []

        async def stalls_once(request):  # the fourth /metrics answer comes after the poll gave up on it
            if request.path == "/metrics":
                seen.append(clock.now())
                if len(seen) == 4:
                    await asyncio.sleep(60)
            return await forward(request)

        proxy._forward = stalls_once  # type: ignore[method-assign]
        await proxy.start()
        poller = Poller([], [EngineTarget(proxy.url)], interval=1.0, default_port=None, rate_window=10.0,
                        clock=clock)
        await poller.start()
        try:
            events, _ = await asyncio.gather(watch(poller, ClusterState(), 12), load(server.url, 12))
        finally:
            await poller.close()
            await proxy.stop()
    ready = [e for e in events if isinstance(e, EngineSnapshot) and e.state == "ready"]
    # The slow poll was given up on: the only gap between answers longer than a poll.
    gaps = [j for j in range(1, len(ready)) if ready[j].t - ready[j - 1].t > 1.5]
    assert len(gaps) == 1 and gaps[0] == 3, [round(e.t - ready[0].t, 2) for e in ready]
    before, after = ready[:3], ready[3]
    # From the oldest scrape inside the window, which came before the slow answer.
    oldest = next(e for e in before if after.t - e.t <= 10.0)
    expected = (after.gen_tokens_total - oldest.gen_tokens_total) / (after.t - oldest.t)
    assert after.gen_tps == pytest.approx(expected, rel=1e-6) and expected > 0


@slow
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


@slow
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


def varying_gpu(tmp_path, watts: tuple[float, ...]) -> dict[str, str]:
    """A PATH whose `nvidia-smi` answers the probe's GPU query as a GB10 does, with the next of `watts` at
    each query (in turn, round and round): the power read changes from one poll to the next, whenever the
    polls come."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "gpu-queries"
    table = " ".join(str(w) for w in watts)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$*" in
  *query-gpu=*)
    echo q >> {calls}
    n=$(wc -l < {calls})
    set -- {table}
    shift $(( (n - 1) % $# ))
    echo "NVIDIA GB10, 90, 61, $1, 2405, P0, 0x0000000000000000" ;;
  *query-compute-apps*) echo "4242, VLLM::EngineCore, 90000" ;;
esac
""")
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


@slow
async def test_energy_per_token_is_power_over_the_token_rate_by_hand(twin, tmp_path):
    """The node is this machine's (a local probe running a stand-in nvidia-smi), so this runs on real time:
    it waits for enough polls, and checks the figures against the polls it saw, whenever they came."""
    server = await twin("llama-3.1-8b", speed=40)
    watts_in_turn = (30.0, 55.0, 42.0, 61.0, 48.0, 35.0)
    node = NodeTarget("spark-a", LocalTransport(env=varying_gpu(tmp_path, watts_in_turn)))
    # Not discovering: the node is this machine, where other tests' engines may run.
    poller = Poller([node], [EngineTarget(server.url, node="spark-a")], interval=0.5, default_port=None,
                    discover=False)
    state = ClusterState()

    def busy(events) -> list[EngineSnapshot]:
        return [e for e in events if isinstance(e, EngineSnapshot) and e.key == server.url and e.state == "ready"
                and e.gen_tps]

    await poller.start()
    working = asyncio.create_task(load(server.url, 600))
    try:
        # Enough polls under load that the energy window (5 s) is full of the node's readings.
        events = await watch(poller, state, 120, stop=lambda ev: len(busy(ev)) >= ENERGY_WINDOW_S / 0.5 + 2)
    finally:
        working.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await working
        await poller.close()
    assert len(busy(events)) >= 12, "the watch ran out before enough polls"
    nodes = [e for e in events if isinstance(e, NodeSnapshot) and e.state == "ok"]
    engine = busy(events)[-1]
    energy = state.engine_energy(engine)
    assert energy is not None and energy.nodes == ["spark-a"]
    # By hand: the node's readings over the energy window before the snapshot (ClusterState.mean_power's
    # half a second either side: the node's polls and the engine's are not at the same instant) ...
    readings = [n.gpu.power for n in nodes if engine.t - ENERGY_WINDOW_S - 0.5 <= n.t <= engine.t + 0.5]
    assert len(set(readings)) > 1, "the power never changed inside the window: the average was not tested"
    assert set(readings) <= set(watts_in_turn)  # each reading is one the stand-in gave
    watts = sum(readings) / len(readings)
    # ... over the token rate, which is the generation counter's growth over a span of the polls it read
    # (each snapshot says the counter it read, and when).
    polls = list({s.t: s for s in events if isinstance(s, EngineSnapshot) and s.key == server.url
                  and s.state == "ready"}.values())
    i = polls.index(engine)
    candidates = [(engine.gen_tokens_total - polls[k].gen_tokens_total) / (engine.t - polls[k].t)
                  for k in range(i) if engine.t - polls[k].t <= EngineMetrics(VLLM).rate_window + 0.1]
    assert any(abs(engine.gen_tps - tps) <= 1e-3 * tps for tps in candidates), (engine.gen_tps, candidates)
    assert energy.watts == pytest.approx(watts, rel=1e-9)
    assert energy.j_per_token == pytest.approx(watts / engine.gen_tps, rel=1e-9)
    assert energy.wh_per_million == pytest.approx(watts / engine.gen_tps * 1e6 / 3600, rel=1e-9)
    assert energy.cost_per_million(0.30) == pytest.approx(watts / engine.gen_tps * 1e6 / 3600 / 1000 * 0.30)
    node_energy = state.node_energy("spark-a")
    assert node_energy is not None and node_energy.tokens_per_s == engine.gen_tps
