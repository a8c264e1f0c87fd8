"""Rate sweeps against a twin over real HTTP: the schedule is kept (or the
client says it was not), the cap holds, every request is on disk as it
finishes, and --find-max-rate brackets what the server can serve."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparktop.bench.events import MaxRateFound, RateLevelDone, RequestDone
from sparktop.bench.load import RateSweep
from sparktop.bench.results import load_run
from sparktop.bench.sweep import SweepSettings
from tests.helpers.twin_process import start_twin_process


def settings(url: str, **kw) -> SweepSettings:
    base = dict(endpoint=url, pp=64, tg=16, metrics=False, warmup=False, latency_mode="none")
    base.update(kw)
    return SweepSettings(**base)


async def test_constant_arrivals_leave_on_time_and_are_on_disk_as_they_finish(twin, tmp_path):
    server = await twin("llama-3.1-8b", speed=20)
    sweep = RateSweep(settings(server.url, rates=[10.0], requests=30, arrivals="constant"), tmp_path)
    seen_on_disk = []
    async for event in sweep.events():
        if isinstance(event, RequestDone) and sweep.writer is not None and not seen_on_disk:
            seen_on_disk.append(len((sweep.writer.dir / "requests.jsonl").read_text().splitlines()))
        if isinstance(event, RateLevelDone):
            lv = event.stats
    assert seen_on_disk and seen_on_disk[0] >= 1  # written the moment the first one finished
    assert lv.requests == 30 and lv.errors == 0
    assert lv.lag_p95 is not None and lv.lag_p95 < 0.02 and lv.behind is None
    assert lv.send_rate == pytest.approx(10.0, rel=0.05)
    run = load_run(sweep.writer.dir)
    (again,) = run.rate_levels()  # the level's figures come back from the file alone
    assert again.request_throughput == pytest.approx(lv.request_throughput)
    assert run.levels() == []  # no lockstep levels in a rate run


async def test_max_concurrency_caps_what_is_in_flight(twin, tmp_path):
    server = await twin("llama-3.1-8b", speed=5)
    sweep = RateSweep(settings(server.url, rates=[50.0], requests=20, max_concurrency=2), tmp_path)
    await sweep.run()
    (lv,) = sweep.rate_levels
    assert lv.concurrency_peak <= 2
    assert lv.held_mean is not None and lv.held_mean > 0  # requests waited for a slot ...
    assert lv.behind is None  # ... which is not the client falling behind


async def test_a_rate_the_client_cannot_send_is_said_so(twin, tmp_path):
    server = await twin("llama-3.1-8b", speed=1000)
    sweep = RateSweep(settings(server.url, rates=[20000.0], requests=1500, pp=16, tg=2, arrivals="constant",
                               max_error_rate=1.0), tmp_path)
    await sweep.run()
    (lv,) = sweep.rate_levels
    assert lv.behind is not None


@pytest.mark.slow
async def test_find_max_rate_brackets_what_the_twin_serves(tmp_path):
    proc, url = start_twin_process("llama-3.1-8b", "--max-num-seqs", "16", speed=4.0)
    try:
        sweep = RateSweep(settings(url, rates=[4.0], duration=4.0, slo="ttft_p95=500ms,itl_p95=80ms",
                                   find_max_rate=True, tg=32), tmp_path)
        found = None
        async for event in sweep.events():
            if isinstance(event, MaxRateFound):
                found = event.result
    finally:
        proc.terminate()
        proc.wait(10)
    assert found is not None and found.rate is not None and found.failed_at is not None
    assert found.rate < found.failed_at <= 2.2 * found.rate  # a bracket, narrowed
    best = next(lv for lv in sweep.rate_levels if lv.rate == found.rate)
    assert best.meets_slo and not best.saturated and not best.behind
    # Physics: what it served at the max rate is what was asked of it, and no more.
    assert best.request_throughput <= 1.05 * found.rate
    failed = [lv for lv in sweep.rate_levels if lv.rate == found.failed_at]
    assert failed and (not failed[0].meets_slo or failed[0].saturated)


def test_the_cli_prints_json_a_script_can_read(tmp_path):
    proc, url = start_twin_process("llama-3.1-8b", speed=20)
    try:
        out = subprocess.run([sys.executable, "-m", "sparktop", "sweep", "-e", url, "--rate", "4", "--requests",
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
    assert doc["mode"] == "rate" and lv["rate"] == 4.0 and lv["requests"] == 12
    for key in ("request_throughput", "output_tps", "ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "goodput",
                "slo_share", "lag_p95"):
        assert isinstance(lv[key], float), key
    assert bad.returncode != 0 and "--slo" in bad.stderr and "Traceback" not in bad.stderr


async def test_a_trace_is_replayed_at_its_own_times_with_its_own_lengths(twin, tmp_path):
    server = await twin("llama-3.1-8b", speed=20)
    lines = [{"timestamp": 1000 + 150 * i, "input_length": 200 + 100 * (i % 3), "output_length": 8 + 4 * (i % 2),
              "hash_ids": [i % 2]} for i in range(16)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    sweep = RateSweep(settings(server.url, trace=str(trace), pp=128), tmp_path)
    await sweep.run()
    (lv,) = sweep.rate_levels
    assert lv.rate is None and lv.requests == 16 and lv.errors == 0 and lv.behind is None
    records = sorted((r for r in load_run(sweep.writer.dir).records if r.scheduled is not None),
                     key=lambda r: r.scheduled)
    # Each at its own time (150 ms apart, within the event loop's noise) ...
    gaps = [b.start - a.start for a, b in zip(records, records[1:], strict=False)]
    assert all(abs(g - 0.150) < 0.03 for g in gaps), gaps
    # ... with the server counting the trace's own prompt and output lengths.
    assert [r.prompt_tokens for r in records] == [x["input_length"] for x in lines]
    assert [r.completion_tokens for r in records] == [x["output_length"] for x in lines]


async def test_rate_runs_compare_rate_by_rate(twin, tmp_path, capsys):
    from sparktop.cli import main

    # Ten times apart and a prefill of 1024 tokens: the TTFTs differ by ~80 ms of modeled time. At 64 tokens and
    # four times apart they differed by 9 ms, less than the in-process twins' real work on a busy machine (one
    # CI run read p95 41 ms for the faster, 39 for the slower).
    fast = await twin("llama-3.1-8b", speed=20)
    slow = await twin("llama-3.1-8b", speed=2)
    a = await RateSweep(settings(fast.url, rates=[4.0], requests=12, pp=1024, slo="ttft_p95=2s", label="fast"),
                        tmp_path).run()
    b = await RateSweep(settings(slow.url, rates=[4.0], requests=12, pp=1024, slo="ttft_p95=2s", label="slow"),
                        tmp_path).run()
    assert main(["compare", str(a.path), str(b.path), "--md", "--label", "fast", "--label", "slow"]) == 0
    text = capsys.readouterr().out
    assert "| Rate | fast | slow | Best |" in text
    ttft = text.split("### TTFT p95 (ms)")[1].split("###")[0]
    assert "| 4/s |" in ttft and ttft.strip().splitlines()[-1].endswith("| fast |")  # the faster twin's is lower
    from sparktop.bench.sweep import Sweep

    lockstep = await Sweep(SweepSettings(endpoint=fast.url, levels=[1], runs=1, pp=64, tg=16, metrics=False,
                                         warmup=False), tmp_path / "lockstep").run()
    assert main(["compare", str(a.path), str(lockstep.path)]) != 0  # a rate run beside a lockstep one: refused
    assert "measure different things" in capsys.readouterr().err


async def test_no_metrics_reads_nothing_but_the_api_while_it_measures(twin, tmp_path):
    """`--no-metrics`: the server sees only what AIPerf or vLLM's client would send it (the API), counted by a
    proxy in front of the twin; without it the guard reads /metrics during the level."""
    import asyncio
    from collections import Counter

    import aiohttp
    from aiohttp import web

    server = await twin("llama-3.1-8b", speed=20)
    seen: Counter = Counter()

    async def forward(request: web.Request) -> web.StreamResponse:
        seen[request.path] += 1
        async with aiohttp.ClientSession() as s, s.request(request.method, server.url + request.path_qs,
                                                            data=await request.read(),
                                                            headers={"Content-Type": request.content_type}) as r:
            out = web.StreamResponse(status=r.status, headers={"Content-Type": r.content_type})
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    proxy = f"http://127.0.0.1:{port}"
    try:
        for flags in (["--no-metrics"], []):
            seen.clear()
            done = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sparktop", "sweep", "--endpoint", proxy, "--rate", "5", "--duration", "3",
                "--pp", "64", "--tg", "16", "--no-warmup", "--json", "--results", str(tmp_path / "r"), *flags,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(done.communicate(), 120)
            assert done.returncode == 0, err.decode()[-2000:]
            assert json.loads(out)["levels"][0]["errors"] == 0
            if flags:
                assert seen["/metrics"] == 0 and seen["/v1/chat/completions"] >= 10, seen
            else:
                assert seen["/metrics"] >= 3, seen  # the guard's reads, about one a second
    finally:
        await runner.cleanup()
