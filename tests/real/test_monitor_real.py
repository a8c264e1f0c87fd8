"""The monitor reads what vLLM 0.32 says: on a real server under a sweep's
load, the figures sparktop shows (the poller's snapshots, `status --json`,
the engine card) agree with the server's own counters.

sparktop reads the server through a recording proxy (tests/helpers/
recording_proxy.py), and the test parses the very bodies sparktop read with
prometheus-client alone: gauges (running, waiting, KV) must be equal, and a
token rate must be the counter's growth between the two scrapes it spans
over the time between them (within 1 % on the poller's clock).
A scrape of the test's own would not do: on two busy cores one scrape can
take seconds, and no two clients see the same moment."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from sparktop.observe.engines.vllm import NAMES as VLLM
from sparktop.observe.poller import EngineTarget, Poller
from sparktop.observe.prometheus import EngineMetrics
from sparktop.observe.snapshot import EngineSnapshot
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from tests.helpers import depth
from tests.helpers.pilot import until
from tests.helpers.real_vllm import MODEL_NAME, VLLM_VERSION
from tests.helpers.recording_proxy import RecordingProxy
from tests.helpers.scraper import scrape

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "kv_usage": "vllm:kv_cache_usage_perc"}
RATES = {"gen_tps": "vllm:generation_tokens_total", "prompt_tps": "vllm:prompt_tokens_total",
         # vLLM 0.32's own estimate of the bytes it moves (the server runs with --enable-mfu-metrics)
         "mem_read_bps": "vllm:estimated_read_bytes_per_gpu_total",
         "mem_write_bps": "vllm:estimated_write_bytes_per_gpu_total"}


def start_sweep(server, tmp_path, *, c: int = 12, runs: int = 4, pp: int = 512, tg: int = 1024):
    """A sweep in its own process: the load a user puts on the engine."""
    return subprocess.Popen(
        [sys.executable, "-m", "sparktop", "sweep", "--endpoint", server.url + "/v1", "--tokenizer",
         str(server.model / "tokenizer.json"), "--pp", str(pp), "--tg", str(tg), "-c", str(c), "--runs", str(runs),
         "--exact-tg", "--no-warmup", "--json", "--results", str(tmp_path / "results")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(sweep) -> None:
    out, err = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, err[-2000:]


async def wait_busy(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await asyncio.to_thread(scrape, url)).get("vllm:num_requests_running", 0) > 0:
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the sweep never got a request running")


def source(proxy: RecordingProxy, snap: EngineSnapshot) -> int:
    """The index of the recorded scrape a snapshot was made from."""
    # The poller starts a scrape only after the last one is done: the latest
    # body passed before the snapshot was taken is the one it was made from.
    return max(k for k, r in enumerate(proxy.scrapes) if r.t <= snap.t)


def expected_rate(values: list[dict[str, float]], times: list[float], name: str, window: float) -> list[float]:
    """The counter's rate at the last scrape, from the scrapes the poller may
    have taken as the start of its `window`-second rate (the boundary is a
    matter of ms), on the poller's own clock (`times`: when it read each)."""
    i = len(values) - 1
    j = next(k for k in range(i + 1) if times[i] - times[k] <= window)
    return [(values[i][name] - values[k][name]) / (times[i] - times[k]) for k in (j - 1, j, j + 1) if 0 <= k < i]


async def test_snapshots_agree_with_the_servers_counters(vllm_server, tmp_path):
    proxy = await RecordingProxy(vllm_server.url).start()
    poller = Poller([], [EngineTarget(proxy.url)], interval=1.0, default_port=None)
    snaps: list[EngineSnapshot] = []
    sweep = start_sweep(vllm_server, tmp_path)
    try:
        await wait_busy(vllm_server.url)
        await poller.start()

        async def consume():
            async for event in poller.events():
                if isinstance(event, EngineSnapshot) and event.state in ("ready", "sleeping"):
                    snaps.append(event)

        task = asyncio.create_task(consume())
        await asyncio.sleep(12)
        task.cancel()
        await poller.close()
    finally:
        await asyncio.to_thread(finish, sweep)
        await proxy.stop()

    assert snaps and snaps[-1].model == MODEL_NAME and snaps[-1].version == VLLM_VERSION
    busy = [s for s in snaps if s.gen_tps is not None]
    assert len(busy) >= 6, f"only {len(busy)} snapshots with rates in 12 s at a 1 s interval"
    window = EngineMetrics(VLLM).rate_window
    problems = []
    read = {source(proxy, snap): snap for snap in snaps}
    assert len(read) == len(snaps), "two snapshots from one scrape"
    for snap in snaps:
        i = source(proxy, snap)
        theirs = proxy.scrapes[i].values
        mine_so_far = sorted(k for k in read if k <= i)  # the scrapes this poller made, to this one
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
        # Requests finished by reason, and latency percentiles (TTFT, ITL, queue, e2e; the window's and the
        # last minute's), against the very bodies, parsed and computed without sparktop's code.
        k_i = mine_so_far.index(i)
        problems += depth.problems(snap, [proxy.scrapes[k].text for k in mine_so_far[:k_i + 1]],
                                   [read[k].t for k in mine_so_far[:k_i + 1]], k_i, window)
        for field, name in RATES.items():
            mine = getattr(snap, field)
            if mine is None:
                continue
            rates = expected_rate([proxy.scrapes[k].values for k in mine_so_far],
                                  [read[k].t for k in mine_so_far], name, window)
            if not any(abs(mine - r) <= 0.01 * max(r, 10) for r in rates):
                problems.append(f"t={snap.t:.2f} {field} {mine:.0f} but the counter's rate was "
                                + " or ".join(f"{r:.0f}" for r in rates))
    assert max(s.waiting or 0 for s in snaps) > 0, "the load never queued: waiting was not tested"
    assert max(s.kv_usage or 0 for s in snaps) > 0.5, "the load never filled the cache: KV was not tested"
    assert max(s.mem_read_bps or 0 for s in snaps) > 0, "vLLM's byte estimates never moved: bandwidth not tested"
    assert any(s.finished_rate for s in snaps), "no request finished while watched: finished/s not tested"
    assert any((s.latency or {}).get("queue", {}).get("p95") for s in snaps), "queue percentiles never computed"
    assert not problems, "\n".join(problems)


def test_status_json_agrees_with_the_servers_counters(vllm_server, tmp_path):
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
            await asyncio.to_thread(finish, sweep)
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
    assert any((engine["running"], engine["waiting"], engine["kv_cache_usage"])
               == (v[GAUGES["running"]], v[GAUGES["waiting"]], round(v[GAUGES["kv_usage"]], 4)) for v in last), \
        (engine, [{k: v[n] for k, n in GAUGES.items()} for v in last])
    # status does not print when it read each scrape: the proxy's clock
    # stands in for it, a few ms to a second off on two busy cores.
    window = EngineMetrics(VLLM).rate_window
    rates = expected_rate([r.values for r in proxy.scrapes], [r.t for r in proxy.scrapes], RATES["gen_tps"], window)
    assert any(abs(engine["gen_tps"] - r) <= 0.25 * max(r, 10) for r in rates), (engine["gen_tps"], rates)


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
        await asyncio.to_thread(finish, sweep)
        await proxy.stop()
    assert MODEL_NAME in text and proxy.url.removeprefix("http://") in text
    running = float(text.split("run ", 1)[1].split()[0])
    # The card shows the last snapshot; the proxy may have passed one more scrape since.
    assert running in [v[GAUGES["running"]] for v in recent], (text, recent)
