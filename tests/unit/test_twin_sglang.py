"""The twin speaking SGLang 0.5.23: recognised and read by sparktop as a real
SGLang would be, held to the metric families SGLang's own wheel declares
(read with `zipfile` and `ast` from the release on PyPI, fetched once by
tests/helpers/sglang_wheel.py), and answering, refusing and logging in
SGLang's words (sparktop/twin/dialects/sglang.py says where each comes from)."""

from __future__ import annotations

import ast
import asyncio
import io
import json
import math
import os
import re
import zipfile
from dataclasses import dataclass

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparktop.observe.engine_log import runtime_failure, startup_state
from sparktop.observe.engine_probe import EngineProbe
from sparktop.observe.engines import Answer, EngineUnreachable, recognise
from sparktop.observe.engines.sglang import NAMES, Sglang
from sparktop.observe.prometheus import FIGURE_GROUPS
from sparktop.twin.dialects.sglang import SglangDialect, SglangLog, SglangMetrics
from sparktop.twin.server import TwinServer
from tests.helpers.sglang_wheel import sglang_wheel

MODEL = "llama-3.1-8b"
STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Z]+\d+)*\] ")


@pytest.fixture
async def sglang():
    """Factory: a started SGLang twin (its warm-up done); every one is stopped at teardown."""
    servers: list[TwinServer] = []

    async def make(*flags: str, model: str = MODEL, speed: float = 50.0, warm: bool = True) -> TwinServer:
        dialect = SglangDialect()
        args = dialect.parse(["--model-path", model, "--host", "127.0.0.1", "--port", "0", "--speed", str(speed),
                              "--startup-speed", "1e6", *flags])
        server = TwinServer(args, log=io.StringIO(), dialect=dialect)
        servers.append(server)
        await server.start()
        if warm:
            await until(lambda: dialect.up)
        return server

    yield make
    for server in servers:
        await server.stop()


async def until(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def counter_passes(client: aiohttp.ClientSession, base: str, name: str, value: float,
                         timeout: float = 15.0, **labels: str) -> None:
    """Until the sum of `name`'s samples (those with `labels`) in a scrape of `base` exceeds `value`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        async with client.get(base + "/metrics") as r:
            found = samples(await r.text()).get(name, [])
        total = sum(v for got, v in found if all(got.get(k) == want for k, want in labels.items()))
        if total > value:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{name} {labels} stayed at {total}, not over {value}"
        await asyncio.sleep(0.02)


def log_of(server: TwinServer) -> list[str]:
    stream = server.log.stream
    assert isinstance(stream, io.StringIO)
    return stream.getvalue().splitlines()


def getter(client: aiohttp.ClientSession, base: str):
    """A `Get` for sparktop's recognition, answering as EngineProbe's does."""
    async def get(path: str) -> Answer:
        async with client.get(base + path) as r:
            return Answer(path, r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read())
    return get


async def chat(client: aiohttp.ClientSession, base: str, text: str, *, stream: bool = True, max_tokens: int = 16,
               **extra) -> tuple[int, str]:
    body = {"model": "anything", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "stream": stream, **extra}
    async with client.post(base + "/v1/chat/completions", json=body) as r:
        return r.status, await r.text()


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


# -- 1. recognised and read by sparktop ----------------------------------------------------------------------------

async def test_sparktop_recognises_it_as_sglang_with_its_version(sglang):
    server = await sglang("--enable-metrics")
    async with aiohttp.ClientSession() as client:
        engine = await recognise(getter(client, server.url))
    assert (engine.id, engine.version, engine.model) == ("sglang", "0.5.23", MODEL)
    assert engine.how == "owned_by sglang in /v1/models"
    assert engine.max_model_len == server.plan.max_model_len


async def test_engine_probe_reads_its_metrics_after_streamed_requests(sglang, monkeypatch):
    server = await sglang("--enable-metrics")
    async with aiohttp.ClientSession() as client:
        probe = EngineProbe(url=server.url, client=client, histogram_every=0.0)  # percentiles every poll
        first = await probe.poll()
        answers = await asyncio.gather(*(chat(client, server.url, f"tell me about the number {i} " * 5)
                                         for i in range(4)))
        assert all(status == 200 and text.rstrip().endswith("data: [DONE]") for status, text in answers)
        # [DONE] may reach the client before the request is counted: until it is, as a scrape shows it.
        await counter_passes(client, server.url, "sglang:num_requests_total", 4)
        snap = await probe.poll()
        async with client.get(server.url + "/metrics") as r:
            scrape = await r.text()
    assert (first.kind, snap.kind, snap.engine, snap.version, snap.model) == ("sglang", "sglang", "SGLang", "0.5.23",
                                                                              MODEL)
    assert snap.prompt_tps and snap.prompt_tps > 0 and snap.gen_tps and snap.gen_tps > 0
    assert snap.running == 0 and snap.waiting == 0 and snap.kv_usage is not None
    assert snap.ttft_p50 is not None and snap.ttft_p95 is not None and snap.itl_p50 is not None
    assert snap.requests == 5  # the four, and SGLang's own warm-up request
    # Streams are counted as streams, the warm-up (a /generate) as not.
    by_stream = {labels["is_streaming"]: value for labels, value in samples(scrape)["sglang:num_requests_total"]}
    assert by_stream == {"true": 4.0, "false": 1.0}
    # What it lists as not exported, it does not export; what it exports is not listed.
    present = set(samples(scrape))
    for figure, groups in FIGURE_GROUPS.items():
        names = [n for group in groups for n in getattr(NAMES, group)]
        exported = any(n in present or n + "_bucket" in present for n in names)
        assert (figure in snap.not_exported) == (not exported and figure not in NAMES.first_counted), figure
    # No retraction yet: SGLang shows its counter at the first one, so it reads 0, not "not exported".
    assert "sglang:num_retracted_requests_total" not in present
    assert snap.not_exported == [] and snap.preemptions == 0



async def test_tokens_per_second_show_while_a_long_generation_runs(sglang):
    """SGLang's tokenizer counts a request's tokens only when it finishes; the
    scheduler's realtime counter moves as it decodes. A user watching a long
    generation must see its rate, not 0 t/s until the end."""
    server = await sglang("--enable-metrics", speed=5.0)  # 4000 tokens: half a minute, cancelled long before
    async with aiohttp.ClientSession() as client:
        probe = EngineProbe(url=server.url, client=client, histogram_every=0.0)  # percentiles every poll
        await probe.poll()
        long = asyncio.create_task(chat(client, server.url, "write a long story", max_tokens=4000,
                                        ignore_eos=True))
        # Until a scrape shows the scheduler has counted over 40 tokens decoded (the warm-up decoded 8 at most).
        await counter_passes(client, server.url, "sglang:realtime_tokens_total", 40, mode="decode")
        snap = await probe.poll()
        async with client.get(server.url + "/metrics") as r:
            scrape = samples(await r.text())
        long.cancel()
    assert not long.done() or long.cancelled()
    finished = sum(v for _, v in scrape["sglang:generation_tokens_total"])
    assert finished <= 8  # only the warm-up's tokens are counted by the tokenizer yet
    assert snap.running == 1 and snap.gen_tps is not None and snap.gen_tps > 0


# -- 2. no --enable-metrics --------------------------------------------------------------------------------------

async def test_without_enable_metrics_metrics_is_fastapis_404_and_sparktop_says_so(sglang):
    server = await sglang()
    async with aiohttp.ClientSession() as client:
        async with client.get(server.url + "/metrics") as r:
            assert (r.status, await r.json()) == (404, {"detail": "Not Found"})
        probe = EngineProbe(url=server.url, client=client, histogram_every=0.0)  # percentiles every poll
        with pytest.raises(EngineUnreachable) as failed:
            await probe.poll()
    assert probe.engine is not None and probe.engine.id == "sglang"  # recognised; only its figures are missing
    assert failed.value.reason == "/metrics answered HTTP 404: SGLang serves it only with --enable-metrics"


# -- 3. conformance with SGLang's own source ---------------------------------------------------------------------

OBSERVABILITY = "sglang/srt/observability/"
SOURCES = (f"{OBSERVABILITY}metrics_collector.py", f"{OBSERVABILITY}http_request_metrics.py",
           f"{OBSERVABILITY}cpu_monitor.py")
GAUGE_HISTOGRAM = "sglang/srt/utils/gauge_histogram.py"
KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary",
         "GaugeHistogram": "gauge"}
PID_MODES = ("all", "liveall")  # prometheus-client's multiprocess gauges that keep each process's value
# The families the twin must export once it has served (the brief, and every figure sparktop reads).
REQUIRED = ("token_usage", "num_running_reqs", "num_queue_reqs", "num_used_tokens", "gen_throughput",
            "cache_hit_rate", "spec_accept_length", "spec_accept_rate", "prompt_tokens", "generation_tokens",
            "cached_tokens", "num_requests", "num_retracted_requests", "time_to_first_token_seconds",
            "inter_token_latency_seconds", "e2e_request_latency_seconds", "queue_time_seconds",
            "request_time_per_output_token_seconds", "max_total_num_tokens", "context_len")


@dataclass
class Declared:
    """One family as SGLang's source declares it, named as prometheus-client exports it."""

    name: str
    kind: str
    labels: set[str] | None  # None: a collector whose base labels these tests do not read (storage, radix, encoder)
    doc: str | None  # None where the help is built at run time (an f-string)
    buckets: list[float] | None = None  # a literal bucket list, where there is one
    where: str = ""


def _literal_labels(tree: ast.AST, function: str) -> list[str]:
    """The keys of the `labels = {...}` dict a function builds (its base labels, with the default flags)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Dict) and \
                        any(isinstance(t, ast.Name) and t.id == "labels" for t in sub.targets):
                    return [ast.literal_eval(k) for k in sub.value.keys if k is not None]
    raise AssertionError(f"no labels dict in {function}")


def _resolve_labels(node: ast.AST | None, base: list[str] | None) -> list[str]:
    """labelnames=... as Python would evaluate it: `labels.keys()`, `list(...)`, `+`, `[*x, "y"]`, literals."""
    if node is None:
        return []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keys" \
            or isinstance(node, ast.Name):
        if base is None:
            raise LookupError(ast.unparse(node))
        return list(base)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "list":
        return _resolve_labels(node.args[0], base)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _resolve_labels(node.left, base) + _resolve_labels(node.right, base)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        out: list[str] = []
        for e in node.elts:
            out += _resolve_labels(e.value, base) if isinstance(e, ast.Starred) else [ast.literal_eval(e)]
        return out
    raise AssertionError(f"cannot read labelnames={ast.unparse(node)}")


def _buckets(node: ast.AST | None, function: ast.FunctionDef) -> list[float] | None:
    """A literal bucket list, or one assigned to a name in the same function (`bucket_time_to_first_token`)."""
    if isinstance(node, ast.Name):
        for sub in ast.walk(function):
            if isinstance(sub, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in sub.targets):
                node = sub.value
                break
    if isinstance(node, ast.List | ast.Tuple):
        try:
            return sorted(float(v) for v in ast.literal_eval(node))
        except ValueError:
            return None
    return None


def declared_families() -> dict[str, Declared]:
    """Every family the wheel's observability modules register, with its labels as exported."""
    with zipfile.ZipFile(sglang_wheel()) as wheel:
        trees = {path: ast.parse(wheel.read(path).decode(), path) for path in (*SOURCES, GAUGE_HISTOGRAM)}
    collector = trees[SOURCES[0]]
    base = {"SchedulerMetricsCollector": _literal_labels(collector, "init_new"),
            "TokenizerMetricsCollector": _literal_labels(collector, "tokenizer_metric_labels")}
    # GaugeHistogram makes a Gauge of its labelnames plus gt/le, in the mode its __init__ defaults to.
    gh_class = next(n for n in trees[GAUGE_HISTOGRAM].body
                    if isinstance(n, ast.ClassDef) and n.name == "GaugeHistogram")
    gh_init = next(n for n in gh_class.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    gh_gauge = next(n for n in ast.walk(gh_init) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Gauge")
    gh_labels = next(k.value for k in gh_gauge.keywords if k.arg == "labelnames")
    gh_mode = ast.literal_eval(gh_init.args.defaults[-1])
    found: dict[str, Declared] = {}
    for path, tree in trees.items():
        if path == GAUGE_HISTOGRAM:
            continue
        owners = [(n.name, f) for n in tree.body if isinstance(n, ast.ClassDef) for f in n.body
                  if isinstance(f, ast.FunctionDef)]
        owners += [("", n) for n in tree.body if isinstance(n, ast.FunctionDef)]
        for owner, function in owners:
            for call in ast.walk(function):
                if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) in KINDS):
                    continue
                kw = {k.arg: k.value for k in call.keywords}
                if not isinstance(kw.get("name"), ast.Constant):
                    continue
                kind = call.func.id  # type: ignore[attr-defined]
                name = kw["name"].value  # type: ignore[attr-defined]
                labels: list[str] | None
                try:
                    labels = _resolve_labels(kw.get("labelnames"), base.get(owner))
                except LookupError:
                    labels = None
                if kind == "GaugeHistogram":
                    labels, mode = _resolve_labels(gh_labels, labels), gh_mode
                else:
                    mode = ast.literal_eval(kw["multiprocess_mode"]) if "multiprocess_mode" in kw else "all"
                if labels is not None and kind == "Gauge" and mode in PID_MODES:
                    labels.append("pid")  # MultiProcessCollector keeps each process's value, by pid
                exported = name.removesuffix("_total") if kind == "Counter" else name
                doc = kw["documentation"]
                found[exported] = Declared(
                    exported, KINDS[kind], None if labels is None else set(labels),
                    doc.value if isinstance(doc, ast.Constant) else None, _buckets(kw.get("buckets"), function),
                    f"{path}:{call.lineno}")
    return found


def problems(text: str, declared: dict[str, Declared]) -> list[str]:
    """Where an exposition's families differ from the declared ones: name, type, help, labels, buckets."""
    out = []
    for family in text_string_to_metric_families(text):
        spec = declared.get(family.name)
        if spec is None:
            out.append(f"{family.name}: not a family SGLang 0.5.23 declares")
            continue
        if family.type != spec.kind:
            out.append(f"{family.name}: {family.type}, declared {spec.kind} ({spec.where})")
        if spec.doc is not None and family.documentation != spec.doc:
            out.append(f"{family.name}: help {family.documentation!r}, declared {spec.doc!r}")
        for labels in {frozenset(k for k in s.labels if not (k == "le" and spec.kind == "histogram"))
                       for s in family.samples}:
            if spec.labels is None or labels != spec.labels:
                out.append(f"{family.name}: labels {sorted(labels)}, declared "
                           f"{sorted(spec.labels) if spec.labels is not None else 'unread'} ({spec.where})")
        if spec.kind == "histogram" and spec.buckets is not None:
            les = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")} - {math.inf})
            if les and les != spec.buckets:
                out.append(f"{family.name}: buckets {les}, declared {spec.buckets}")
    return out


@pytest.fixture(scope="module")
def declared() -> dict[str, Declared]:
    return declared_families()


async def busy_twin(sglang) -> tuple[TwinServer, str]:
    """A twin made to export everything it can: streams and whole answers, a prompt cached, the KV pool
    overrun (retractions), the MFU estimates."""
    server = await sglang("--enable-metrics", "--enable-mfu-metrics", "--max-total-tokens", "1024",
                          "--context-length", "512")
    long = "the same long preamble about GPUs and their memory " * 6
    async with aiohttp.ClientSession() as client:
        await chat(client, server.url, long, stream=False)
        await asyncio.gather(*(chat(client, server.url, long + str(i), max_tokens=200, stream=i % 2 == 0)
                               for i in range(8)))
        async with client.get(server.url + "/metrics") as r:
            return server, await r.text()


async def test_every_family_it_exports_is_declared_so_by_sglang(sglang, declared):
    server, scrape = await busy_twin(sglang)
    assert problems(scrape, declared) == []
    exported = {f.name for f in text_string_to_metric_families(scrape)}
    missing = [n for n in REQUIRED if f"sglang:{n}" not in exported]
    assert missing == []
    # Families it declares but has not shown yet (an abort) are SGLang's too, with its type and help.
    metrics = server.metrics
    assert isinstance(metrics, SglangMetrics)
    for family in metrics.registry.collect():
        spec = declared.get(family.name)
        assert spec is not None and spec.kind == family.type, family.name
        assert spec.doc is None or spec.doc == family.documentation, family.name


def test_the_names_sparktop_reads_are_sglangs(declared):
    """Every series the monitor reads from SGLang (sparktop/observe/engines/sglang.py) is one SGLang 0.5.23
    declares, with the label its selector picks; the older names it also reads for older releases are listed
    here with the release that had them."""
    older = {"sglang:time_per_output_token_seconds", "sglang:cache_hit_rate"}  # 0.4.x (the docs' capture)
    from sparktop.observe.prometheus import series_name

    for group, names in NAMES.groups().items():
        for name in names:
            base, selector = series_name(name)
            family = base.removesuffix("_total")
            spec = declared.get(family) or declared.get(base)
            if spec is None:
                assert base in older, f"sparktop reads {name} ({group}), which SGLang 0.5.23 does not declare"
                continue
            for label, _ in selector:
                assert spec.labels is None or label in spec.labels, f"{name}: SGLang labels it {spec.labels}"


def test_the_check_fails_when_the_twin_strays(declared):
    """Renamed, retyped, a label dropped or added: each is reported."""
    good = ('# HELP sglang:num_running_reqs The number of running requests.\n'
            '# TYPE sglang:num_running_reqs gauge\n'
            'sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1\n')
    assert problems(good, declared) == []
    strays = [good.replace("num_running_reqs", "num_running_requests"),
              good.replace("gauge", "counter").replace("num_running_reqs{", "num_running_reqs_total{"),
              good.replace(',moe_ep_rank="0"', ""),
              good.replace('engine_type="unified",', 'engine="0",engine_type="unified",'),
              good.replace("The number of running requests.", "Running requests.")]
    for text in strays:
        assert problems(text, declared), text


def test_the_source_says_what_the_twin_was_built_from(declared):
    """The facts the dialect copied, read back from the wheel."""
    assert declared["sglang:token_usage"].labels == {"model_name", "engine_type", "tp_rank", "pp_rank",
                                                     "moe_ep_rank"}
    assert declared["sglang:num_requests"].labels == {"model_name", "engine_type", "is_streaming"}
    assert "pid" in (declared["sglang:num_retracted_reqs"].labels or ())
    assert declared["sglang:time_to_first_token_seconds"].buckets == [
        0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]


# -- 4. its answers and errors ------------------------------------------------------------------------------------

async def test_a_prompt_as_long_as_the_context_is_refused_in_sglangs_words(sglang):
    server = await sglang("--context-length", "64")
    async with aiohttp.ClientSession() as client:
        for stream in (False, True):  # a stream is refused with the same JSON, before any event
            async with client.post(server.url + "/v1/completions",
                                   json={"model": "x", "prompt": [7] * 64, "stream": stream}) as r:
                assert (r.status, await r.json()) == (400, {
                    "object": "error", "message": "The input (64 tokens) is longer than the model's context length "
                                                  "(64 tokens).", "type": "BadRequestError", "param": None,
                    "code": 400})
        async with client.post(server.url + "/v1/completions",
                               json={"model": "x", "prompt": [7] * 60, "max_tokens": 10}) as r:
            assert r.status == 400
            assert (await r.json())["message"] == (
                "Requested token count exceeds the model's maximum context length of 64 tokens. You requested a "
                "total of 70 tokens: 60 tokens from the input messages and 10 tokens for the completion. Please "
                "reduce the number of tokens in the input messages or the completion to fit within the limit.")
        async with client.post(server.url + "/v1/completions",
                               json={"model": "x", "prompt": [7] * 40, "max_tokens": 8}) as r:
            body = await r.json()
    assert r.status == 200 and body["usage"]["reasoning_tokens"] == 0


async def test_its_routes_answer_as_sglangs_do(sglang):
    server = await sglang("--api-key", "sk-secret-value", "--served-model-name", "my-llama")
    auth = {"Authorization": "Bearer sk-secret-value"}
    async with aiohttp.ClientSession() as client:
        async with client.get(server.url + "/") as r:
            assert r.status == 401 and await r.json() == {"error": "Unauthorized"}
        async with client.get(server.url + "/", headers=auth) as r:
            assert await r.json() == "SGLang is running"
        for path in ("/health", "/ready", "/ping"):
            async with client.get(server.url + path, headers=auth if path == "/ping" else None) as r:
                assert (r.status, await r.read()) == (200, b""), path
        async with client.get(server.url + "/version", headers=auth) as r:
            assert (r.status, await r.json()) == (404, {"detail": "Not Found"})
        async with client.get(server.url + "/server_info", headers=auth) as r:
            raw = await r.text()
        async with client.get(server.url + "/v1/models", headers=auth) as r:
            models = await r.json()
        async with client.post(server.url + "/v1/chat/completions", headers=auth, json={
                "model": "some-other-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}) as r:
            assert r.status == 200  # SGLang serves whatever model a request names
    info = json.loads(raw)
    assert info["version"] == "0.5.23" and info["model_path"] == MODEL and info["tp_size"] == 1
    assert info["api_key"] is None and "sk-secret-value" not in raw
    assert info["max_total_num_tokens"] == server.engine.kv_capacity_tokens and info["context_length"] is None
    assert Sglang.claims_info(Answer("/server_info", 200, {}, raw.encode()))
    assert models == {"object": "list", "data": [{
        "id": "my-llama", "object": "model", "created": models["data"][0]["created"], "owned_by": "sglang",
        "root": "my-llama", "parent": None, "max_model_len": server.plan.max_model_len}]}


async def test_health_is_503_until_the_warm_up_request_has_run(sglang):
    server = await sglang(warm=False, speed=0.5)
    async with aiohttp.ClientSession() as client:
        async with client.get(server.url + "/health") as r:
            assert r.status == 503
        await until(lambda: server.dialect.up)  # type: ignore[attr-defined]
        async with client.get(server.url + "/ready") as r:
            assert r.status == 200


# -- 5. its log -------------------------------------------------------------------------------------------------

STARTUP = ("server_args={'model_path': 'llama-3.1-8b'", "Init parallel begin.", "Init parallel ends. elapsed=",
           "Memory baseline taken.", "Load weight begin. avail mem=", "Load weight end. elapsed=",
           "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 20000, K size: ",
           "Memory pool end. avail mem=", "Capture target decode CUDA graph begin. backend=full",
           "Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 12, 16, 24,", "max_total_num_tokens=20000, ",
           "Engine startup timings (s): load_weight=", "INFO:     Started server process [",
           "INFO:     Waiting for application startup.", "INFO:     Application startup complete.",
           "INFO:     Uvicorn running on http://127.0.0.1:", '"GET /model_info HTTP/1.1" 200 OK',
           '"POST /generate HTTP/1.1" 200 OK', "The server is fired up and ready to roll!")


async def test_its_start_up_log_is_sglangs_stage_by_stage(sglang):
    server = await sglang("--max-total-tokens", "20000", "--api-key", "sk-secret")
    lines = log_of(server)
    assert all(STAMP.match(line) for line in lines), lines
    at = 0
    for marker in STARTUP:
        at = next((i for i in range(at, len(lines)) if marker in lines[i]), None)  # type: ignore[assignment]
        assert at is not None, f"{marker!r} missing or out of order in:\n" + "\n".join(lines)
    assert "sk-secret" not in "\n".join(lines)
    assert any(line.endswith(f"Uvicorn running on http://127.0.0.1:{server.port} (Press CTRL+C to quit)")
               for line in lines)
    # sparktop's log reader follows the stages and reads the sizes.
    seen = []
    for i in range(1, len(lines) + 1):
        stage = startup_state(lines[:i], Sglang.log).stage
        if stage and (not seen or seen[-1] != stage):
            seen.append(stage)
    assert seen == ["initializing", "loading weights", "memory profiling", "kv cache", "graph capture",
                    "api server", "ready"]
    state = startup_state(lines, Sglang.log)
    assert (state.kv_tokens, state.failed) == (20000, False)
    assert state.weights_gib == pytest.approx(server.plan.perf.weights_bytes_per_node / 1024**3, abs=0.01)


async def test_stats_stop_and_death_are_logged_as_sglang_logs_them(sglang):
    server = await sglang()
    dialect = server.dialect
    dialect.stats(server, 120.0, 45.5, 3, 1, 0.25)
    dialect.stopping(server)
    lines = log_of(server)
    assert re.search(r"\] Decode batch, #running-req: 3, #token: \d+, token usage: 0\.25, cuda graph: True, "
                     r"gen throughput \(token/s\): 45\.50, #queue-req: 1$", lines[-6])
    assert [line.split("] ", 1)[1] for line in lines[-5:]] == [
        "SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
        "INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
        "INFO:     Application shutdown complete.", f"INFO:     Finished server process [{os.getpid()}]"]
    dialect.died(server, "NCCL error: remote process exited or there was a network error")
    assert runtime_failure(log_of(server), Sglang.log) == (
        "Scheduler hit an exception: Traceback (most recent call last): RuntimeError: NCCL error: remote process "
        "exited or there was a network error")


async def test_a_model_that_does_not_fit_fails_in_sglangs_words():
    dialect = SglangDialect()
    args = dialect.parse(["--model-path", MODEL, "--port", "0", "--mem-fraction-static", "0.05", "--startup-speed",
                          "1e6"])
    server = TwinServer(args, log=io.StringIO(), dialect=dialect)
    assert await server.run() == 1
    lines = log_of(server)
    assert lines[-2:] == [
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
        "mem_fraction_static=0.05", lines[-1]]
    assert lines[-1].endswith("] Received sigquit from a child process. It usually means the child failed.")
    state = startup_state(lines, Sglang.log)
    assert state.failed and state.reason is not None and state.reason.startswith("RuntimeError: Not enough memory")


# -- its command line ------------------------------------------------------------------------------------------------

def test_its_command_line_becomes_the_twins_arguments():
    dialect = SglangDialect()
    args = dialect.parse(["Qwen/Qwen3-8B", "--tp", "2", "--nnodes", "2", "--node-rank", "1",
                          "--dist-init-addr", "10.0.0.1:5000", "--context-length", "8192", "--max-running-requests",
                          "32", "--chunked-prefill-size", "4096", "--kv-cache-dtype", "fp8_e4m3",
                          "--disable-radix-cache", "--trust-remote-code", "--attention-backend", "flashinfer",
                          "--some-future-flag", "7"])
    assert (args.model, args.name, args.host, args.port) == ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "127.0.0.1", 30000)
    assert (args.tensor_parallel_size, args.nnodes, args.node_rank, args.headless) == (2, 2, 1, True)
    assert (args.master_addr, args.master_port) == ("10.0.0.1", 5000)
    assert (args.max_model_len, args.max_num_seqs, args.max_num_batched_tokens) == (8192, 32, 4096)
    assert (args.gpu_memory_utilization, args.kv_cache_dtype, args.enable_prefix_caching) == (0.88, "fp8_e4m3", False)
    assert args.extra == ["--some-future-flag", "7"]
    assert args.given["trust_remote_code"] is True and args.given["tp_size"] == 2
    defaults = dialect.parse(["--model", MODEL])
    assert (defaults.max_num_seqs, defaults.headless, defaults.given) == (1024, False, {})
    log = SglangLog(io.StringIO())
    log.ranks = " TP1"
    log.engine("", "Load weight begin. avail mem=110.00 GB")
    assert re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP1\] Load weight begin\.", log.stream.getvalue())
