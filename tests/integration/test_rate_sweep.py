"""Rate sweeps against a twin over real HTTP: the schedule is kept (or the
client says it was not), the cap holds, every request is on disk as it
finishes, and --find-max-rate brackets what the server can serve.

Most run the twin and the sweep in one process on simulated time
(tests/helpers/simulated.py): a request leaves at the loop time its schedule
gives it and the twin's steps take the time its model gives them, so a
schedule is kept exactly (no lag at all), a trace's gaps are its own to the
microsecond, and a max-rate search finds the same bracket on any machine.
What the CLI prints and what `--no-metrics` leaves the server to see are
checked with the CLI as a process, on real time, by what they count.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from sparktop.bench.events import MaxRateFound, RateLevelDone, RequestDone
from sparktop.bench.load import RATE_METRICS_INTERVAL, RateSweep
from sparktop.bench.results import load_run
from sparktop.bench.sweep import Sweep, SweepSettings
from sparktop.units import fmt
from tests.helpers.simulated import sim_clock, sim_twin, simulated
from tests.helpers.twin_process import start_twin_process

# A send on simulated time leaves when it is due: its lag is nothing but the clock's microsecond ticks and
# the rounding of epoch seconds (a double holds 1.7e9 s to 2.4e-7 s).
NO_LAG = 1e-5


def settings(url: str, **kw) -> SweepSettings:
    base = dict(endpoint=url, pp=64, tg=16, metrics=False, warmup=False, latency_mode="none")
    base.update(kw)
    return SweepSettings(**base)


@simulated
async def test_constant_arrivals_leave_on_time_and_are_on_disk_as_they_finish(tmp_path):
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", clock=clock) as server:
        sweep = RateSweep(settings(server.url, rates=[10.0], requests=30, arrivals="constant"), tmp_path,
                          clock=clock)
        seen_on_disk = []
        async for event in sweep.events():
            if isinstance(event, RequestDone) and sweep.writer is not None and not seen_on_disk:
                seen_on_disk.append(len((sweep.writer.dir / "requests.jsonl").read_text().splitlines()))
            if isinstance(event, RateLevelDone):
                lv = event.stats
    assert seen_on_disk == [1]  # written the moment the first one finished, before the next did
    assert lv.requests == 30 and lv.errors == 0
    # Each request left when it was due, a tenth of a second after the one before: no lag, not "behind".
    records = sorted(load_run(sweep.writer.dir).records, key=lambda r: r.scheduled)
    assert len(records) == 30
    due = [r.scheduled - records[0].scheduled for r in records]
    assert due == pytest.approx([i / 10.0 for i in range(30)], abs=NO_LAG)
    assert all(abs(r.start - r.scheduled) <= NO_LAG for r in records)
    assert lv.lag_max is not None and lv.lag_max <= NO_LAG and lv.behind is None
    assert lv.send_rate == pytest.approx(10.0, rel=1e-6)
    run = load_run(sweep.writer.dir)
    (again,) = run.rate_levels()  # the level's figures come back from the file alone
    assert again.request_throughput == pytest.approx(lv.request_throughput)
    assert run.levels() == []  # no lockstep levels in a rate run


@simulated
async def test_max_concurrency_caps_what_is_in_flight(tmp_path):
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", clock=clock) as server:
        sweep = RateSweep(settings(server.url, rates=[50.0], requests=20, max_concurrency=2), tmp_path, clock=clock)
        await sweep.run()
    (lv,) = sweep.rate_levels
    # A request takes longer than the gaps between them (16 tokens of a Spark's decode), so the cap is reached
    # and held to: two in flight, never three.
    assert lv.concurrency_peak == 2
    records = load_run(sweep.writer.dir).records
    assert any(r.held_s > 0 for r in records) and lv.held_mean is not None and lv.held_mean > 0
    # A request held for a slot left the moment it got one: its wait is the cap's, not the client's lag ...
    assert all(abs(r.start - r.scheduled - r.held_s) <= NO_LAG for r in records)
    assert lv.behind is None  # ... which is not the client falling behind


async def test_a_rate_the_client_cannot_send_is_said_so(twin, tmp_path):
    """On real time: no Python client sends 20 000 requests a second, so this one must say it fell behind.
    (On simulated time every send would leave on time.)"""
    server = await twin("llama-3.1-8b", speed=1000)
    sweep = RateSweep(settings(server.url, rates=[20000.0], requests=1500, pp=16, tg=2, arrivals="constant",
                               max_error_rate=1.0), tmp_path)
    await sweep.run()
    (lv,) = sweep.rate_levels
    assert lv.behind is not None


@simulated
async def test_find_max_rate_brackets_what_the_twin_serves(tmp_path):
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", "--max-num-seqs", "16", clock=clock) as server:
        sweep = RateSweep(settings(server.url, rates=[2.0], requests=24, slo="ttft_p95=500ms,itl_p95=80ms",
                                   find_max_rate=True, tg=16), tmp_path, clock=clock)
        found = None
        async for event in sweep.events():
            if isinstance(event, MaxRateFound):
                found = event.result
    assert found is not None and found.rate is not None and found.failed_at is not None
    levels = {lv.rate: lv for lv in sweep.rate_levels}
    assert [rate for rate, _, _ in found.tried] == [lv.rate for lv in sweep.rate_levels]
    # Each verdict is its level's own: passed when its percentiles were within the SLO, the queue steady and
    # the client on schedule (on simulated time it always is).
    for rate, ok, why in found.tried:
        lv = levels[rate]
        assert lv.behind is None and lv.errors == 0
        assert ok == lv.passes == (lv.meets_slo and not lv.saturated), (rate, why)
        assert lv.meets_slo == all(v is not None and v <= limit for v, limit in
                                   zip(lv.slo_values.values(), (0.5, 0.08), strict=True))
    # The search: doubling from 2/s up to the first rate that failed, then halving the bracket until it is
    # within --rate-tolerance (10 %).
    passed = sorted(r for r, ok, _ in found.tried if ok)
    failed = sorted(r for r, ok, _ in found.tried if not ok)
    assert found.rate == passed[-1] and found.failed_at == failed[0]
    assert found.rate < found.failed_at <= 1.1 * found.rate
    doubling = [r for r in (2.0 * 2 ** i for i in range(len(found.tried))) if r <= failed[0]]
    assert [r for r, _, _ in found.tried][:len(doubling)] == doubling
    best = levels[found.rate]
    assert found.share == best.slo_share and found.requests == best.requests == 24
    # Physics: n requests sent over n gaps of 1/rate, and the last one still took its time: fewer served per
    # second than asked.
    assert best.request_throughput < found.rate


def test_the_cli_prints_json_a_script_can_read(tmp_path):
    proc, url = start_twin_process("llama-3.1-8b", speed=20)
    try:
        out = subprocess.run([sys.executable, "-m", "sparktop", "sweep", "-e", url, "--rate", "20", "--requests",
                              "12", "--pp", "64", "--tg", "16", "--slo", "ttft_p95=2s", "--json", "--results",
                              str(tmp_path)], capture_output=True, text=True, timeout=120)
        bad = subprocess.run([sys.executable, "-m", "sparktop", "sweep", "-e", url, "--rate", "4", "--slo",
                              "ttft<2", "--results", str(tmp_path)], capture_output=True, text=True, timeout=60)
    finally:
        proc.terminate()
        proc.wait(10)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (lv,) = doc["levels"]
    assert doc["mode"] == "rate" and lv["rate"] == 20.0 and lv["requests"] == 12
    for key in ("request_throughput", "output_tps", "ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "goodput",
                "slo_share", "lag_p95"):
        assert isinstance(lv[key], float), key
    assert bad.returncode != 0 and "--slo" in bad.stderr and "Traceback" not in bad.stderr


@simulated
async def test_a_trace_is_replayed_at_its_own_times_with_its_own_lengths(tmp_path):
    lines = [{"timestamp": 1000 + 150 * i, "input_length": 200 + 100 * (i % 3), "output_length": 8 + 4 * (i % 2),
              "hash_ids": [i % 2]} for i in range(16)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", clock=clock) as server:
        sweep = RateSweep(settings(server.url, trace=str(trace), pp=128), tmp_path, clock=clock)
        await sweep.run()
    (lv,) = sweep.rate_levels
    assert lv.rate is None and lv.requests == 16 and lv.errors == 0 and lv.behind is None
    records = sorted((r for r in load_run(sweep.writer.dir).records if r.scheduled is not None),
                     key=lambda r: r.scheduled)
    # Each at its own time: the trace's 150 ms apart, ...
    gaps = [b.start - a.start for a, b in zip(records, records[1:], strict=False)]
    assert gaps == pytest.approx([0.150] * 15, abs=NO_LAG), gaps
    assert all(abs(r.start - r.scheduled) <= NO_LAG for r in records)
    # ... with the server counting the trace's own prompt and output lengths.
    assert [r.prompt_tokens for r in records] == [x["input_length"] for x in lines]
    assert [r.completion_tokens for r in records] == [x["output_length"] for x in lines]


@simulated
async def test_rate_runs_compare_rate_by_rate(tmp_path, capsys):
    from sparktop.cli import main

    # Ten times apart, with a prefill of 1024 tokens: on simulated time each run's TTFTs are its twin's
    # model's, the same on every machine, and the faster twin's are the lower.
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", speed=20, clock=clock) as fast, \
            sim_twin("llama-3.1-8b", speed=2, clock=clock) as slow:
        a = await RateSweep(settings(fast.url, rates=[4.0], requests=12, pp=1024, slo="ttft_p95=2s", label="fast"),
                            tmp_path, clock=clock).run()
        b = await RateSweep(settings(slow.url, rates=[4.0], requests=12, pp=1024, slo="ttft_p95=2s", label="slow"),
                            tmp_path, clock=clock).run()
        lockstep = await Sweep(SweepSettings(endpoint=fast.url, levels=[1], runs=1, pp=64, tg=16, metrics=False,
                                             warmup=False), tmp_path / "lockstep", clock=clock).run()
    (fast_lv,) = load_run(a.path).rate_levels()
    (slow_lv,) = load_run(b.path).rate_levels()
    assert fast_lv.ttft_p95 < slow_lv.ttft_p95
    assert main(["compare", str(a.path), str(b.path), "--md", "--label", "fast", "--label", "slow"]) == 0
    text = capsys.readouterr().out
    assert "| Rate | fast | slow | Best |" in text
    ttft = text.split("### TTFT p95 (ms)")[1].split("###")[0]
    # Each run's own figure in its column, and the lower one named best.
    row = f"| 4/s | {fmt(fast_lv.ttft_p95 * 1000, 'ms')} | {fmt(slow_lv.ttft_p95 * 1000, 'ms')} | fast |"
    assert ttft.strip().splitlines()[-1] == row, ttft
    assert main(["compare", str(a.path), str(lockstep.path)]) != 0  # a rate run beside a lockstep one: refused
    assert "measure different things" in capsys.readouterr().err


@asynccontextmanager
async def counting_proxy(upstream: str, now) -> AsyncIterator[tuple[str, list[tuple[str, float, float, bool]]]]:
    """An HTTP proxy in front of `upstream` that logs every request it forwards: (path, when it arrived, when
    its answer ended, whether it asked for a stream), times on `now`. Yields (its URL, that log)."""
    log: list[tuple[str, float, float, bool]] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        arrived = now()
        body = await request.read()
        streamed = request.method == "POST" and bool(json.loads(body or b"{}").get("stream"))
        async with aiohttp.ClientSession() as s, s.request(request.method, upstream + request.path_qs, data=body,
                                                            headers={"Content-Type": request.content_type}) as r:
            out = web.StreamResponse(status=r.status, headers={"Content-Type": r.content_type})
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
        log.append((request.path, arrived, now(), streamed))
        return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        await runner.cleanup()


async def test_no_metrics_reads_nothing_but_the_api_while_it_measures(twin, tmp_path):
    """`sparktop sweep --no-metrics`: the server sees only what AIPerf or vLLM's client would send it (the
    API), counted by a proxy in front of the twin: no /metrics at all, and one streamed request per request
    the run recorded. Real time (the CLI is its own process); only counts are asserted."""
    server = await twin("llama-3.1-8b", speed=20)
    loop = asyncio.get_running_loop()
    async with counting_proxy(server.url, loop.time) as (proxy, log):
        done = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sparktop", "sweep", "--endpoint", proxy, "--rate", "10", "--requests", "8",
            "--pp", "64", "--tg", "16", "--no-warmup", "--json", "--results", str(tmp_path / "r"), "--no-metrics",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(done.communicate(), 120)
    assert done.returncode == 0, err.decode()[-2000:]
    assert json.loads(out)["levels"][0]["errors"] == 0
    (path,) = (tmp_path / "r").iterdir()
    records = load_run(path).records
    seen = Counter(p for p, *_ in log)
    assert seen["/metrics"] == 0, seen
    assert sum(1 for *_, streamed in log if streamed) == len(records) == 8, seen


@simulated
async def test_without_no_metrics_the_guard_reads_metrics_while_requests_are_in_flight(tmp_path):
    """The other side: with metrics on, the guard reads the engine's /metrics once a second during the level
    (as well as before and after it). On simulated time, with the proxy's log on the same clock, every second
    of the level has its read."""
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", clock=clock) as server, counting_proxy(server.url, clock.now) as (url, log):
        sweep = RateSweep(settings(url, rates=[5.0], requests=15, arrivals="constant", metrics=True), tmp_path,
                          clock=clock)
        await sweep.run()
    records = load_run(sweep.writer.dir).records
    assert len(records) == 15 and all(r.ok for r in records)
    streamed = [(arrived, ended) for _, arrived, ended, s in log if s]
    assert len(streamed) == len(records)
    first, last = min(a for a, _ in streamed), max(e for _, e in streamed)
    during = [t for path, t, _, _ in log if path == "/metrics" and first <= t <= last]
    assert len(during) >= math.floor((last - first) / RATE_METRICS_INTERVAL) >= 3, (during, first, last)
