"""The sweep against real HTTP servers: twins, and a scripted server that
streams the shapes other engines send (no token_ids, multi-token chunks,
reasoning, errors mid-stream).

An in-process twin and the sweep run on simulated time
(tests/helpers/simulated.py) where a test is about time: the figures are
then the model's, exactly, and a cancel lands where the test puts it. The
CLI test kills a twin in its own process and asserts only what is left on
disk and what the sweep says."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest
from aiohttp import web

from sparktop.bench.events import SweepFinished
from sparktop.bench.request import RequestRecord, stream_chat
from sparktop.bench.results import load_run
from sparktop.bench.sweep import Sweep, SweepSettings, request_timeout
from sparktop.cli import main
from sparktop.model.cards import find_card
from sparktop.model.fit import load_constants
from sparktop.model.simulate import predict
from tests.helpers.simulated import sim_clock, sim_twin, simulated
from tests.helpers.sweep_sim import record_steps
from tests.helpers.twin_process import start_twin_process


def chunk(delta: dict | None = None, usage: dict | None = None, token_ids=None) -> bytes:
    choices = []
    if delta is not None:
        choice = {"index": 0, "delta": delta}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        choices.append(choice)
    data = {"choices": choices}
    if usage:
        data["usage"] = usage
    return b"data: " + json.dumps(data).encode() + b"\n\n"


async def scripted(script: list[tuple[float, bytes]], status: int = 200):
    """A server whose /v1/chat/completions streams `script` (delay, bytes)."""

    async def handler(request):
        if status != 200:
            return web.json_response({"error": {"message": "bad things"}}, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for delay, data in script:
            await asyncio.sleep(delay)
            await resp.write(data)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1/chat/completions"


async def run_one(script, status=200) -> RequestRecord:
    """One request to a server streaming `script`, timed on simulated time: each chunk is read apart from the
    next however busy the machine (the test must be @simulated)."""
    runner, url = await scripted(script, status)
    try:
        return await stream_chat(url, {"stream": True}, RequestRecord(level=1, run=1, index=0), 10,
                                 clock=sim_clock())
    finally:
        await runner.cleanup()


@simulated
async def test_token_ids_count_every_token_even_several_per_chunk():
    r = await run_one([(0.05, chunk({"role": "assistant", "content": ""})),
                       (0.05, chunk({"content": "Hel"}, token_ids=[1])),
                       (0.05, chunk({"content": "lo there"}, token_ids=[2, 3, 4])),
                       (0.0, chunk(None, usage={"prompt_tokens": 12, "completion_tokens": 4})),
                       (0.0, b"data: [DONE]\n\n")])
    assert r.ok and r.completion_tokens == 4 and r.prompt_tokens == 12
    assert r.first_response < r.first_token  # the empty role chunk is a response, not a token
    assert r.decode_tokens == 3


@simulated
async def test_without_token_ids_usage_counts_and_reasoning_is_a_first_token():
    r = await run_one([(0.05, chunk({"reasoning_content": "think"})),
                       (0.05, chunk({"content": "a b"})),
                       (0.05, chunk({"content": "c"})),
                       (0.0, chunk(None, usage={"prompt_tokens": 7, "completion_tokens": 6}))])
    assert r.ok and r.completion_tokens == 6
    assert r.first_token == r.token_times[0]


@simulated
async def test_one_token_per_chunk_when_the_server_says_nothing_else():
    r = await run_one([(0.02, chunk({"content": "x"})), (0.02, chunk({"content": "y"})),
                       (0.02, chunk({"reasoning": "z"}))])
    assert r.ok and r.completion_tokens == 3


@simulated
async def test_errors_say_what_happened():
    """HTTP errors, an error in the stream, and a server that goes quiet for 5 s against a 0.5 s timeout
    (on simulated time: the timeout fires at 0.5 s of the loop's clock, and the quiet 5 s cost nothing)."""
    clock = sim_clock()
    bad = await run_one([], status=400)
    assert bad.error.startswith("HTTP 400") and "bad things" in bad.error
    mid = await run_one([(0.01, chunk({"content": "x"})),
                         (0.01, b'data: {"error": {"message": "engine dead", "code": 500}}\n\n')])
    assert mid.error == "server: engine dead"
    slow_runner, url = await scripted([(0.01, chunk({"content": "x"})), (5, chunk({"content": "y"}))])
    try:
        began = clock.now()
        slow = await stream_chat(url, {}, RequestRecord(level=1, run=1, index=0), timeout=0.5, clock=clock)
        assert clock.now() - began == pytest.approx(0.5, abs=1e-3)
    finally:
        await slow_runner.cleanup()
    assert slow.timed_out and slow.error == "timed out after 0s (1 tokens received)"


def test_the_timeout_grows_with_concurrency_and_output():
    assert request_timeout(1024, 128, 256) > 20 * 60 > 3 * 60  # the published pipeline's 3 minutes
    assert request_timeout(1024, 128, 1) < request_timeout(1024, 128, 8) < request_timeout(1024, 512, 8)


@simulated
async def test_sweep_measures_a_twin_with_prompts_of_the_exact_length(tmp_path):
    """A sweep of c1 and c4 on simulated time: prompts of the length asked for, each level's figures the
    model's own prediction for that batch, and the c4 batch decoded four tokens a step, as the twin's engine
    reports each step (the batching that makes c4's throughput almost four times c1's)."""
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", clock=clock) as server:
        steps = record_steps(server)
        sweep = Sweep(SweepSettings(server.url + "/v1", levels=[1, 4], runs=2, pp=300, tg=48), tmp_path,
                      clock=clock)
        events = [event async for event in sweep.events()]
    result = events[-1]
    assert isinstance(result, SweepFinished)
    assert result.status == "done"
    run = load_run(result.path)
    ok = [r for r in run.records]
    assert len(ok) == 1 * 2 + 4 * 2  # warm-ups are not recorded
    assert {r.prompt_tokens for r in ok} == {300}
    assert run.meta["model"] == "llama-3.1-8b" and run.meta["vllm_version"]
    levels = {lv.concurrency: lv for lv in result.levels}
    for c in (1, 4):
        model = predict(find_card("llama-3.1-8b"), "solo", c, 300, 48, load_constants()).stats
        assert levels[c].tg_tps_total == pytest.approx(model.tg_tps_total, rel=1e-5)
        assert levels[c].pp_tps_total == pytest.approx(model.pp_tps_total, rel=1e-4)
        assert levels[c].ttft_ms_mean == pytest.approx(model.ttft_ms_mean, rel=1e-4)  # whole microseconds
    # The engine's steps: the c1 batches and the calibration's one-token requests generate a token a step;
    # the three c4 batches (a warm-up and two measured) four a step, for each of their 48 tokens.
    assert max(s.generation_tokens for s in steps) == 4 == max(s.running for s in steps)
    assert sum(1 for s in steps if s.generation_tokens == 4) == 3 * 48
    assert {s.generation_tokens for s in steps} == {1, 4}
    assert levels[4].running_max == 4  # the guard's /metrics reads during the level saw the batch running
    assert levels[1].running_max == 1
    names = {type(e).__name__ for e in events}
    assert {"SweepStarted", "LevelStarted", "RequestDone", "LevelDone", "SweepFinished"} <= names


@simulated
async def test_cancelled_sweep_keeps_what_finished_and_resumes(tmp_path):
    """Cancelled while the first measured batch of c4 is in the engine: c1 and c2 are kept whole, c4's
    requests are cut, and a resumed sweep does c4 again in full."""
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", clock=clock, speed=10) as server:
        settings = SweepSettings(server.url, levels=[1, 2, 4], runs=2, pp=128, tg=24)
        seen = []
        measuring_c4 = asyncio.Event()

        async def watch():
            async for event in Sweep(settings, tmp_path, clock=clock).events():
                seen.append(event)
                if type(event).__name__ == "LevelStarted" and event.concurrency == 4 and not event.warmup:
                    measuring_c4.set()

        task = asyncio.ensure_future(watch())
        await measuring_c4.wait()
        while len(server.engine.running) + len(server.engine.waiting) < 4:  # the batch reached the engine
            await asyncio.sleep(0.001)
        assert not any(type(e).__name__ == "RequestDone" and e.record.level == 4 for e in seen)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        path = next(e.path for e in seen if type(e).__name__ == "SweepStarted")
        first = load_run(path)
        assert first.meta["status"] == "cancelled"
        assert sorted(first.batches()) == [1, 2]  # complete levels are there, level 4 is not
        kept = len(first.records)
        assert kept == 2 + 4
        again = await Sweep(SweepSettings(server.url, levels=[1, 2, 4], runs=2, pp=128, tg=24), tmp_path,
                            resume=path, clock=clock).run()
    assert again.status == "done"
    run = load_run(path)
    assert len(run.records) == kept + 8  # nothing dropped; level 4 done in full
    assert [lv.concurrency for lv in run.levels()] == [1, 2, 4]
    assert [lv.runs for lv in run.levels()] == [2, 2, 2]
    assert max(r.attempt for r in run.records) == 2


def test_a_twin_killed_at_c16_leaves_every_finished_request_on_disk(tmp_path, capsys):
    """The twin process is killed once c16's first requests are on disk. It admits 2 requests at a time, so
    the first c16 records come while 30 of the level's 32 still need 15 rounds of 64 modeled decode steps;
    and the moment one is seen the twin is frozen (SIGSTOP) before it is killed, so the level cannot end
    between the two however slowly this test is scheduled."""
    twin, url = start_twin_process("llama-3.1-8b", "--max-num-seqs", "2", speed=10)
    try:
        results = tmp_path / "results"
        sweep = subprocess.Popen([sys.executable, "-m", "sparktop", "sweep", "-e", url,
                                  "-c", "1,4,16,32", "--runs", "2", "--pp", "256", "--tg", "64", "--json",
                                  "--no-warmup", "--results", str(results)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)

        def on_disk() -> list[dict]:
            return [json.loads(x) for f in results.glob("*/requests.jsonl") for x in f.read_text().splitlines()
                    if x.strip()]

        deadline = time.monotonic() + 120  # a limit for a hang: the state comes in a few seconds
        while not any(r["level"] == 16 for r in on_disk()):
            assert sweep.poll() is None, sweep.communicate()[1][-1000:]
            assert time.monotonic() < deadline, "no c16 request finished within 120 s"
            time.sleep(0.05)
        twin.send_signal(signal.SIGSTOP)  # frozen mid-level: no request of c16 finishes from here on
        frozen = {(r["level"], r["run"], r["index"]) for r in on_disk()}
        twin.kill()
        out, err = sweep.communicate(timeout=120)
    finally:
        twin.kill()
        twin.wait(timeout=30)
    assert sweep.returncode == 3, err[-1000:]
    assert "stopped at c16" in err and "Traceback" not in err
    report = json.loads(out)
    c16 = next(lv for lv in report["levels"] if lv["concurrency"] == 16)
    assert c16["errors"] > 0 and c16["error_reasons"]
    run = load_run(next(results.iterdir()))
    assert [lv.concurrency for lv in run.levels()][:2] == [1, 4]
    assert len([r for r in run.records if r.level in (1, 4)]) == 2 + 8
    at_c16 = [r for r in run.records if r.level == 16]
    kept = {(r.level, r.run, r.index) for r in at_c16 if r.ok}
    assert kept and kept >= {f for f in frozen if f[0] == 16}, "the c16 requests that finished before the kill"
    assert any(r.error for r in at_c16) and len(at_c16) < 2 * 16
    assert not any(r.level == 32 for r in run.records)  # it stopped


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--endpoint", "ftp://x"], "--endpoint 'ftp://x': expected http://HOST:PORT"),
    (["sweep", "-e", "http://127.0.0.1:9", "-c", "1,two"], "-c '1,two': expected concurrency levels"),
    (["sweep", "-e", "http://127.0.0.1:9", "--extra-body", "oops"], "--extra-body 'oops': expected KEY=VALUE"),
    (["sweep", "-e", "http://127.0.0.1:9"], "http://127.0.0.1:9: cannot reach the endpoint"),
    (["compare", "/nope"], "/nope: no such run"),
])
def test_bad_input_is_one_line_and_non_zero(argv, message, capsys, tmp_path):
    assert main([*argv, "--results", str(tmp_path)] if argv[0] == "sweep" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("body, expected", [
    (b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', (True, False, None)),
    (b'{"choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":[5,6]}]}', (True, True, 2)),
    (b'{"choices": [{"index": 0, "delta": {"reasoning_content": "\\"so"}, "token_ids": [9]}]}', (True, True, 1)),
    (b'{"choices":[{"delta":{"content":"say \\"content\\":\\"x"}}]}', (True, True, None)),
    (b'{"choices":[{"delta":{"content":null,"reasoning":"z"}}]}', (True, True, None)),
    (b'{"choices":[],"usage":{"prompt_tokens":3}}', None),
    (b'{"error":{"message":"x"}}', None),
])
def test_the_fast_scan_reads_chunks_as_json_would(body, expected):
    from sparktop.bench.request import scan

    assert scan(body) == expected
    if expected is not None:  # and agrees with a real parse
        choice = json.loads(body)["choices"][0]
        delta = choice.get("delta") or {}
        has_text = bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))
        ids = choice.get("token_ids")
        assert expected == (True, has_text, len(ids) if has_text and ids is not None else None)
