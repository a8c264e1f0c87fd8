"""The twin speaking TensorRT-LLM (`trtllm-serve` 1.3.0rc13): read by sparktop
as a real one would be, held to the metric families of TensorRT-LLM's own
collector (tests/fixtures/trtllm, read from its source; SOURCES.md says
where), and answering, logging and sizing its KV cache in its words.

sparktop must never read the plain /metrics of a trtllm-serve: it is JSON
iteration stats taken off a queue, so a read steals them from whoever owns
the deployment. The dialect counts those reads (`drained`)."""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sparktop.clock import SYSTEM, Clock
from sparktop.observe.engine_probe import EngineProbe
from sparktop.observe.engines import Answer, EngineUnreachable, recognise
from sparktop.observe.engines.trtllm import NAMES
from sparktop.observe.prometheus import RATE_WINDOW_S
from sparktop.observe.snapshot import FIGURES
from sparktop.twin.dialects import trtllm
from sparktop.twin.dialects.trtllm import TrtllmDialect, options_of
from sparktop.twin.server import StartupError, TwinServer
from tests.helpers.recording_proxy import RecordingProxy
from tests.helpers.simulated import sim_clock, simulated

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "trtllm"
PERF = {"return_perf_metrics": True, "enable_iter_perf_stats": True}
MODEL = "llama-3.1-8b"


def families(name: str) -> dict[str, dict]:
    """A fixture of collector families: name -> type, labels (required, optional), buckets, doc."""
    out = {}
    for row in (FIX / name).read_text().splitlines():
        if not row or row.startswith("#"):
            continue
        fam, kind, labels, buckets, doc = row.split("\t")
        names = labels.split(",")
        out[fam] = {"type": kind, "required": [n for n in names if not n.startswith("[")],
                    "optional": {n.strip("[]") for n in names if n.startswith("[")},
                    "buckets": None if buckets == "-" else [float(b) for b in buckets.split(",")], "doc": doc}
    return out


SOURCE = families("collector-families.txt")
UNPREFIXED = families("collector-families-unprefixed.txt")


@pytest.fixture
async def trt(tmp_path):
    """Factory: a started TRT-LLM twin and its dialect; every one is stopped at teardown."""
    servers: list[TwinServer] = []

    async def make(*flags: str, config: dict | None = None, model: str = MODEL, speed: float = 20.0,
                   start: bool = True, clock: Clock = SYSTEM) -> tuple[TwinServer, TrtllmDialect]:
        argv = [model, "--host", "127.0.0.1", "--port", "0", "--speed", str(speed), "--startup-speed", "1e6", *flags]
        if config is not None:
            path = tmp_path / f"extra-llm-api-config-{len(servers)}.yml"
            path.write_text(yaml.safe_dump(config))
            argv += ["--extra_llm_api_options", str(path)]
        dialect = TrtllmDialect()
        server = TwinServer(dialect.parse(argv), log=io.StringIO(), dialect=dialect, clock=clock)
        servers.append(server)
        if start:
            await server.start()
        return server, dialect

    yield make
    for server in servers:
        await server.stop()


def session() -> aiohttp.ClientSession:
    # A bound on every request: a twin whose engine broke fails the test instead of hanging it.
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))


def getter(client: aiohttp.ClientSession, base: str):
    """A `Get` for sparktop's recognition, answering as EngineProbe's does."""

    async def get(path: str) -> Answer:
        try:
            async with client.get(base + path, timeout=aiohttp.ClientTimeout(total=5)) as r:
                body = await r.read()
                return Answer(path, r.status, {k.lower(): v for k, v in r.headers.items()}, body)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise EngineUnreachable(str(exc)) from None

    return get


async def stream(client: aiohttp.ClientSession, url: str, max_tokens: int, text: str = "hello ") -> int:
    """One streamed chat to its end; the number of chunks."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text * 40}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True}
    chunks = 0
    async with client.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        async for line in r.content:
            chunks += line.startswith(b"data: {")
    return chunks


async def scrape(client: aiohttp.ClientSession, url: str) -> str:
    async with client.get(url + "/prometheus/metrics") as r:
        assert r.status == 200
        return await r.text()


def samples(text: str, name: str) -> list[float]:
    return [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


# -- 1. sparktop reads it as TensorRT-LLM, and never drains its /metrics ---------------------


async def test_recognised_and_read_by_sparktop_which_never_drains_its_metrics(trt, monkeypatch):
    server, dialect = await trt(config=PERF)
    async with session() as client:
        engine = await recognise(getter(client, server.url))
        assert (engine.id, engine.name, engine.version) == ("trtllm", "TensorRT-LLM", "1.3.0rc13")
        assert engine.how == "owned_by tensorrt_llm in /v1/models"
        async with client.get(server.url + "/metrics") as r:
            assert await r.json() == []  # nothing before the first request
        dialect.drained = 0

        probe = EngineProbe(server.url, client, histogram_every=0.0)  # percentiles on every poll
        await stream(client, server.url, 8)  # families appear once a request has finished
        await probe.poll()
        assert sum(await asyncio.gather(*(stream(client, server.url, n) for n in (16, 24, 32, 40)))) > 0
        snap = await probe.poll()

        assert (snap.kind, snap.engine, snap.version, snap.model) == ("trtllm", "TensorRT-LLM", "1.3.0rc13", MODEL)
        assert snap.state == "ready" and snap.reason is None
        assert snap.gen_tps and snap.gen_tps > 0 and snap.prompt_tps and snap.prompt_tps > 0
        assert snap.kv_usage is not None and snap.running == 0 and snap.waiting == 0
        assert snap.ttft_p50 is not None and snap.ttft_p95 is not None
        assert snap.itl_p50 is not None and snap.itl_p95 is not None
        assert snap.requests == 5 and snap.finished_by_reason == {"length": 5.0}
        assert not {"kv", "running", "waiting", "gen_tps", "ttft", "itl", "e2e"} & set(snap.not_exported)

        assert dialect.drained == 0, "sparktop read the draining /metrics"
        async with client.get(server.url + "/metrics") as r:
            stats = await r.json()
        async with client.get(server.url + "/metrics") as r:
            again = await r.json()
    assert dialect.drained == 2
    assert stats and again == []
    assert {"gpuMemUsage", "iter", "iterLatencyMS", "kvCacheStats", "numActiveRequests",
            "numQueuedRequests", "inflightBatchingStats"} <= set(stats[-1])
    assert [s["iter"] for s in stats] == sorted(s["iter"] for s in stats)
    # While the five requests overlapped, their KV blocks were in use: the gauge moved.
    assert max(s["kvCacheStats"]["usedNumBlocks"] for s in stats) > 0
    assert max(s["numActiveRequests"] for s in stats) >= 2


async def test_before_its_first_request_finishes_nothing_is_called_not_exported(trt):
    """TensorRT-LLM's collector creates its series at the first finished
    request: a fresh server's empty scrape says nothing yet about what it
    exports, so the card shows no figures rather than "not exported"."""
    server, dialect = await trt(config=PERF)
    async with session() as client:
        async with client.get(server.url + "/prometheus/metrics") as r:
            text = await r.text()
        assert r.status == 200 and "trtllm_request_success_total" not in text and "trtllm_kv_cache_utilization" \
            not in text
        probe = EngineProbe(server.url, client)
        fresh = await probe.poll()
        await stream(client, server.url, 8)
        await probe.poll()
        served = await probe.poll()
    assert fresh.state == "ready" and fresh.not_exported == ["preemptions"]  # it has no such series at all
    assert fresh.kv_usage is None and fresh.gen_tps is None
    assert served.not_exported == ["preemptions", "spec"] and served.kv_usage is not None


@simulated
async def test_tokens_counted_when_requests_end_never_read_as_a_burst(trt):
    """TensorRT-LLM adds a request's tokens when it ends. Four long requests ending together must not read as
    their tokens over the last poll's seconds (a rate the GPU never ran): every poll's figure is the tokens
    counted over the whole window it looks back on, so it never exceeds what the engine ran.

    On simulated time (tests/helpers/simulated.py): the twin's steps, the probe's stamps and the polls' pace
    are the loop's clock, so each figure is exactly the counters the probe read over the seconds between."""
    clock = sim_clock()
    server, _ = await trt(config=PERF, speed=1.0, clock=clock)
    proxy = await RecordingProxy(server.url).start()  # the very bodies the probe reads
    try:
        async with session() as client:
            async def long_request() -> float:  # when its last token came
                assert await stream(client, server.url, 400) > 400
                return clock.now()

            probe = EngineProbe(proxy.url, client, clock=clock)  # its stamps on the loop's clock too
            await stream(client, server.url, 8)  # its series exist from the first finished request on
            snaps = [await probe.poll()]
            start = clock.now()
            batch = asyncio.gather(*(long_request() for _ in range(4)))
            while not batch.done():
                await asyncio.sleep(1.0)
                snaps.append(await probe.poll())
            took = max(await batch) - start
            for _ in range(4):  # the polls right after they ended: where a burst would show
                await asyncio.sleep(1.0)
                snaps.append(await probe.poll())
    finally:
        await proxy.stop()
    bodies = [body.decode() for _, body in proxy.bodies["/prometheus/metrics"]]
    assert len(bodies) == len(snaps)
    counted = [sum(samples(text, "trtllm_generation_tokens_total")) for text in bodies]
    tokens = counted[-1] - counted[0]
    assert tokens == 4 * 400
    # The tokens land in one scrape, all at once: over the poll before, they read as a burst.
    jumps = [(counted[i + 1] - counted[i], snaps[i + 1].t - snaps[i].t) for i in range(len(counted) - 1)
             if counted[i + 1] > counted[i]]
    assert [n for n, _ in jumps] == [tokens]
    burst, ran = tokens / jumps[0][1], tokens / took
    assert burst > 10 * ran
    # The batch outlasts the window other engines' rates are taken over: a rate over that window would read
    # the burst too.
    assert took > RATE_WINDOW_S
    # Each poll: the tokens counted since the first poll, over the seconds since it.
    rates = [s.gen_tps or 0.0 for s in snaps[1:]]
    expected = [(counted[i] - counted[0]) / (snaps[i].t - snaps[0].t) for i in range(1, len(snaps))]
    assert rates == pytest.approx(expected, rel=1e-5, abs=1e-9)
    # Never more than the engine ran (to the rounding of epoch-second stamps); the first poll after the end
    # reads the batch's tokens over little more than the time they took.
    assert max(rates) <= ran * (1 + 1e-5), f"read up to {max(rates):.0f} t/s; the engine ran {ran:.0f} t/s"
    assert max(rates) >= 0.8 * ran


# -- 2. without return_perf_metrics there is nothing to read, and sparktop says so -----------------


async def test_without_return_perf_metrics_it_is_up_and_exports_nothing(trt):
    server, dialect = await trt()
    async with session() as client:
        async with client.get(server.url + "/prometheus/metrics") as r:
            assert r.status == 404
            assert await r.json() == {"detail": "Not Found"}
        snap = await EngineProbe(server.url, client).poll()
    assert snap.kind == "trtllm" and snap.state == "ready"
    assert snap.reason == ("trtllm-serve runs without return_perf_metrics: true (in --extra_llm_api_options): "
                           "it exports no metrics")
    assert set(snap.not_exported) == set(FIGURES)
    assert snap.kv_usage is None and snap.gen_tps is None
    assert dialect.drained == 0


# -- 3. the families are TensorRT-LLM's own -------------------------------------------------------


def test_the_fixture_is_the_collector_read_from_source():
    """A few facts of collector.py @ 050f80de, so the fixture cannot drift quietly."""
    assert len(SOURCE) == 64
    assert SOURCE["trtllm_request_success_total"]["required"] == ["model_name", "engine_type", "finished_reason"]
    assert SOURCE["trtllm_kv_cache_utilization"]["type"] == "gauge"
    assert SOURCE["trtllm_kv_cache_reused_blocks_total"]["type"] == "counter"
    assert SOURCE["trtllm_time_to_first_token_seconds"]["buckets"][:3] == [0.001, 0.005, 0.01]
    assert set(UNPREFIXED) == {"request_success_total", "e2e_request_latency_seconds", "time_to_first_token_seconds",
                               "time_per_output_token_seconds", "request_queue_time_seconds"}


def exported(text: str) -> dict[str, dict]:
    """What a scrape exports, family by family, named as the fixture names them."""
    out = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        labels: set[str] = set()
        buckets = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf":
                buckets.add(float(s.labels["le"]))
        out[name] = {"type": fam.type, "labels": labels, "buckets": sorted(buckets), "doc": fam.documentation}
    return out


async def test_every_family_the_twin_exports_is_the_collectors(trt):
    server, _ = await trt("--max_seq_len", "4096", config={**PERF, "perf_metrics_max_requests": 10})
    async with session() as client:
        await stream(client, server.url, 12, text="shared prefix ")
        await asyncio.gather(*(stream(client, server.url, n, text="shared prefix ") for n in (4, 20)))
        text = await scrape(client, server.url)
    families_out = exported(text)
    required = {"trtllm_kv_cache_utilization", "trtllm_kv_cache_hit_rate", "trtllm_num_requests_running",
                "trtllm_num_requests_waiting", "trtllm_prompt_tokens_total", "trtllm_generation_tokens_total",
                "trtllm_request_success_total", "trtllm_time_to_first_token_seconds",
                "trtllm_time_per_output_token_seconds", "trtllm_e2e_request_latency_seconds",
                "trtllm_request_queue_time_seconds", "trtllm_prompt_cached_tokens_total"}
    assert required <= set(families_out)
    for name, got in families_out.items():
        assert name in SOURCE, f"{name} is not a family of TensorRT-LLM's collector"
        want = SOURCE[name]
        assert got["type"] == want["type"], name
        assert got["doc"] == want["doc"], name
        # prometheus-client's multiprocess mode labels every gauge with its process.
        labels = got["labels"] - ({"pid"} if want["type"] == "gauge" else set())
        assert set(want["required"]) <= labels <= set(want["required"]) | want["optional"], name
        if want["buckets"] is not None:
            assert got["buckets"] == want["buckets"], name
    assert samples(text, "trtllm_prompt_cached_tokens_total")[0] > 0  # the shared prefix was reused
    assert "_created" not in text  # multiprocess mode has no creation times


def test_the_names_sparktop_reads_are_the_collectors():
    exported_names = set(SOURCE) | set(UNPREFIXED)
    # A histogram is read by its family name, a counter by its `_total` samples.
    for group, names in NAMES.groups().items():
        for name in names:
            assert name in exported_names, f"sparktop reads {name} ({group}), which TensorRT-LLM does not export"
    assert NAMES.finished_label in SOURCE["trtllm_request_success_total"]["required"]


# -- 4. its answers --------------------------------------------------------------------------------------


async def test_answers_in_trtllm_serves_words(trt):
    server, _ = await trt("--max_seq_len", "512")
    async with session() as client:
        body = {"model": MODEL, "prompt": list(range(1, 601)), "max_tokens": 8}
        async with client.post(server.url + "/v1/completions", json=body) as r:
            assert r.status == 400
            error = await r.json()
        async with client.get(server.url + "/health") as r:
            assert (r.status, await r.read()) == (200, b"")
            assert r.headers["server"] == "uvicorn"
        async with client.get(server.url + "/v1/models") as r:
            models = await r.json()
        async with client.get(server.url + "/version") as r:
            version = await r.json()
        async with client.get(server.url + "/perf_metrics") as r:
            perf = await r.json()
        other = {"model": "some/other-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with client.post(server.url + "/v1/chat/completions", json=other) as r:
            other_status = r.status
        async with client.get(server.url + "/health_generate") as r:
            generated = (r.status, await r.text())
    assert error == {"object": "error", "message": "`default_max_tokens` (-88) must be greater than 0, "
                     "`default_max_tokens` (-88) = max_seq_len (512) - `splited_prompt_len` (600)",
                     "type": "BadRequestError", "param": None, "code": 400}
    assert models["object"] == "list" and len(models["data"]) == 1
    card = models["data"][0]
    assert set(card) == {"id", "object", "created", "owned_by"}
    assert (card["id"], card["object"], card["owned_by"]) == (MODEL, "model", "tensorrt_llm")
    assert version == {"version": "1.3.0rc13"}
    assert perf == []  # perf_metrics_max_requests is 0
    assert other_status == 200  # any model name is served
    assert generated == (200, "Generation health check OK")


async def test_perf_metrics_are_taken_off_too(trt, monkeypatch):
    # Without the collector a /metrics read waits 2 s for one more stat; not here.
    monkeypatch.setattr(trtllm, "STATS_TIMEOUT_S", 0.05)
    server, _ = await trt(config={"return_perf_metrics": True, "perf_metrics_max_requests": 4})
    async with session() as client:
        await stream(client, server.url, 6)
        async with client.get(server.url + "/perf_metrics") as r:
            first = await r.json()
        async with client.get(server.url + "/perf_metrics") as r:
            second = await r.json()
        async with client.get(server.url + "/metrics") as r:
            iteration = await r.json()  # enable_iter_perf_stats is off: the executor keeps no stats
    assert len(first) == 1 and second == [] and iteration == []
    item = first[0]["perf_metrics"]
    timing = item["timing_metrics"]
    assert timing["arrival_time"] <= timing["first_scheduled_time"] <= timing["first_token_time"] <= \
        timing["last_token_time"]
    assert item["first_iter"] <= item["last_iter"]


async def test_a_local_directory_is_served_under_its_name(tmp_path):
    folder = tmp_path / "models" / MODEL
    folder.mkdir(parents=True)
    args = TrtllmDialect().parse(["serve", str(folder), "--tp_size", "1", "--max_batch_size", "64",
                                  "--max_num_tokens", "4096", "--kv_cache_free_gpu_memory_fraction", "0.5"])
    assert args.name == MODEL and args.model == str(folder)
    assert (args.host, args.port) == ("localhost", 8000)
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (64, 4096)
    assert options_of(args).free_gpu_memory_fraction == 0.5
    assert args.given == {"max_batch_size": 64, "max_num_tokens": 4096, "free_gpu_memory_fraction": 0.5}


def test_the_yaml_overrides_the_flags(tmp_path):
    config = tmp_path / "extra.yml"
    config.write_text(yaml.safe_dump({"print_iter_log": False, "return_perf_metrics": True,
                                      "kv_cache_config": {"free_gpu_memory_fraction": 0.8, "enable_block_reuse": False,
                                                          "dtype": "fp8"},
                                      "max_batch_size": 4}))
    args = TrtllmDialect().parse([MODEL, "--max_batch_size", "64", "--free_gpu_memory_fraction", "0.9",
                                  "--config", str(config), "--backend", "pytorch", "--trust_remote_code"])
    opts = options_of(args)
    assert opts.free_gpu_memory_fraction == 0.8 and opts.return_perf_metrics and not opts.enable_iter_perf_stats
    assert args.max_num_seqs == 4 and not args.enable_prefix_caching and args.kv_cache_dtype == "fp8"


async def test_tensor_parallel_is_timed_here_as_rank_0_of_mpirun(trt):
    """Under `mpirun ... trtllm-llmapi-launch trtllm-serve --tp_size 2` the twin is rank 0: it holds
    half the weights and waits for no vLLM-style workers."""
    single, _ = await trt()
    tp2, _ = await trt("--tp_size", "2")
    assert tp2.args.tensor_parallel_size == 2 and tp2.plan is not None and single.plan is not None
    assert tp2.plan.perf.weights_bytes_per_node == pytest.approx(single.plan.perf.weights_bytes_per_node / 2)
    assert "Use 4.23 GB for model weights." in tp2.log.stream.getvalue()


async def test_the_kv_cache_is_a_fraction_of_what_the_weights_leave(trt):
    full, _ = await trt()
    half, _ = await trt("--kv_cache_free_gpu_memory_fraction", "0.45")
    assert full.engine is not None and half.engine is not None
    assert half.engine.kv_capacity_tokens / full.engine.kv_capacity_tokens == pytest.approx(0.5, rel=0.01)


# -- 5. its log ---------------------------------------------------------------------------------------------


TRT_LINE = re.compile(r"^\[\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d\] \[TRT-LLM\] \[[IWE]\] ")


def in_order(lines: list[str], wanted: list[str]) -> list[int]:
    """The index of each wanted line start (or substring), each after the one before."""
    at, found = -1, []
    for text in wanted:
        at = next(i for i in range(at + 1, len(lines)) if text in lines[i])
        found.append(at)
    return found


async def test_the_startup_log_is_trtllm_serves(trt):
    server, _ = await trt(config=PERF)
    lines = server.log.stream.getvalue().splitlines()
    in_order(lines, [
        "[TensorRT-LLM] TensorRT-LLM version: 1.3.0rc13",
        "[TRT-LLM] [I] Using LLM with PyTorch backend",
        "[TRT-LLM] [I] Use 8.46 GB for model weights.",
        "Loading weights: 100%|",
        "Model init total -- ",
        "[TRT-LLM] [I] max_seq_len is not specified, using inferred value 131072",
        "[TensorRT-LLM][INFO] [MemUsageChange] Allocated",
        "[TRT-LLM] [I] Run generation only CUDA graph warmup for batch size=1, draft_len=0",
        "[TRT-LLM] [I] Estimated max memory in KV cache : ",
        "[TensorRT-LLM][INFO] [MemUsageChange] Allocated",
        "[TRT-LLM] [I] Setting PyTorch memory fraction to ",
        "INFO:     Started server process [",
        "INFO:     Waiting for application startup.",
        "[TRT-LLM] [I] Started background iteration stats collector task",
    ])
    assert lines[-1] == "INFO:     Application startup complete."
    assert not any("Uvicorn running on" in line for line in lines)
    assert all(TRT_LINE.match(line) for line in lines if "[TRT-LLM]" in line)
    kv = [re.search(r"Allocated ([\d.]+) GiB for max tokens in paged KV cache \((\d+)\)\.$", line)
          for line in lines if "[MemUsageChange]" in line]
    assert all(kv) and len(kv) == 2
    assert server.engine is not None and int(kv[-1].group(2)) == server.engine.kv_capacity_tokens
    assert not any("iter = " in line for line in lines)  # print_iter_log is off: nothing periodic


async def test_print_iter_log_logs_every_iteration(trt):
    server, _ = await trt(config={"print_iter_log": True})
    async with session() as client:
        chunks = await stream(client, server.url, 5)
    iters = [line for line in server.log.stream.getvalue().splitlines() if "] iter = " in line]
    assert chunks and len(iters) >= 5
    assert re.search(r"\[TRT-LLM\] \[I\] iter = \d+, global_rank = 0, rank = 0, currank_total_requests = \d+/\d+, "
                     r"host_step_time = [\d.]+ms, prev_device_step_time = [\d.]+ms, timestamp = .+, "
                     r"num_scheduled_requests: \d+, states = \{'num_ctx_requests': \d+, 'num_ctx_tokens': \d+, "
                     r"'num_generation_tokens': \d+\}$", iters[0])


async def test_a_model_that_does_not_fit_fails_as_trtllm_words_it(trt):
    server, dialect = await trt(model="qwen3-235b-a22b", start=False)
    with pytest.raises(StartupError) as failure:
        await server.start()
    dialect.start_failed(server, str(failure.value))
    log = server.log.stream.getvalue()
    assert "Executor creation failed due to insufficient GPU memory." in log
    assert "The following component could not be created: Model" in log
    assert log.splitlines()[-1] == "RuntimeError: Executor worker returned error"


# -- TensorRT-LLM's semantics: iteration gauges move when a request finishes ------------------------------------


@simulated
async def test_iteration_gauges_move_only_when_a_request_finishes(trt):
    # On simulated time: the scrape comes while the request is a tenth of the way through, however busy the
    # machine (on real time a stall could let it finish first).
    server, _ = await trt(config=PERF, speed=5.0, clock=sim_clock())
    async with session() as client:
        long = asyncio.create_task(stream(client, server.url, 120))
        while server.engine is None or not server.engine.running or server.engine.running[0].output_count < 12:
            await asyncio.sleep(0.001)
        during = await scrape(client, server.url)
        assert server.engine.running and server.engine.running[0].output_count < 120
        await long
        after = await scrape(client, server.url)
    assert samples(during, "trtllm_num_requests_running") == []  # nothing finished yet: no gauge at all
    assert samples(during, "trtllm_request_success_total") == []
    assert samples(after, "trtllm_num_requests_running") == [0.0]
    assert samples(after, "trtllm_request_success_total") == [1.0]


async def test_without_iteration_stats_the_gauges_never_appear(trt):
    server, _ = await trt(config={"return_perf_metrics": True})
    async with session() as client:
        await stream(client, server.url, 6)
        text = await scrape(client, server.url)
    assert samples(text, "trtllm_request_success_total") == [1.0]
    assert samples(text, "trtllm_generation_tokens_total") == [6.0]
    assert samples(text, "trtllm_kv_cache_utilization") == []
    assert samples(text, "trtllm_num_requests_running") == []
    assert "Started background iteration stats collector task" not in server.log.stream.getvalue()


def test_the_yaml_is_read_as_yaml(tmp_path):
    config = tmp_path / "c.yml"
    config.write_text(json.dumps({"enable_iter_perf_stats": True}))  # JSON is YAML too
    assert options_of(TrtllmDialect().parse([MODEL, "--extra_llm_api_options", str(config)])).enable_iter_perf_stats


def test_a_multi_node_plan_runs_on_twin_hosts_without_its_container_set_up_touching_the_host():
    """The plan's containers set up sshd and keys inside themselves; on a twin host a container is the host, so
    the twin's docker runs only their programs (the sshd and mpirun stand-ins), never `ssh-keygen -A` or
    `mkdir /run/sshd` on the machine running the tests."""
    from sparktop.launch.catalog import find_recipe
    from sparktop.launch.topology import make_plan
    from sparktop.settings import Inventory, Node
    from sparktop.twin.docker_lifecycle import runnable

    inventory = Inventory(nodes=[Node(f"spark-{c}", host=f"spark-{c}", fabric_ip=f"10.0.0.{i}", eth_if="enp1s0f1np1")
                                 for i, c in ((1, "a"), (2, "b"))])
    plan = make_plan(find_recipe("gpt-oss-120b-trtllm"), "tp=2", inventory)
    commands = {}
    for step in plan.steps:
        if step.container:
            argv = shlex.split(step.command)
            i = argv.index("--entrypoint")
            commands[step.role] = runnable([argv[i + 1], *argv[i + 3:]], path="")
    assert commands["worker"] == ["sshd", "-D", "-p", "2233"]
    assert commands["engine"][:4] == ["mpirun", "--allow-run-as-root", "-np", "2"]
    assert "trtllm-llmapi-launch" in commands["engine"]
