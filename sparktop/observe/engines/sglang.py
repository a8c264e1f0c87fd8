"""SGLang: recognised by `owned_by: sglang` in /v1/models or its
/server_info; found as `python -m sglang.launch_server` or `sglang serve` in
containers (`lmsysorg/sglang:*`, sparkrun's `scitrera/dgx-spark-sglang`)
and processes; read from `/metrics` (served with `--enable-metrics`).

Read from SGLang 0.5.23's source (`srt/observability/metrics_collector.py`;
the wheel named in tests/fixtures/SOURCES.md, held to the twin by a test):
its series carry `tp_rank`/`pp_rank`/`dp_rank` labels (only rank 0 publishes
the running figures), summed (requests, tokens) or averaged (token usage)
over them. Tokens/s come from the scheduler's `realtime_tokens_total`
(by `mode`: prefill computed, prefill from the cache, decode), which moves
as batches run; the tokenizer's `prompt_tokens_total` and
`generation_tokens_total` move only when a request finishes and are read
only from a build without it. The KV figure is `sglang:token_usage` (the
token pool's share in use, to two decimals); preemptions are its retractions (requests pushed back
to the queue when the pool runs out); the prefix-cache hit rate is cached
over prompt tokens (from the same counters), else its
`cache_hit_rate` gauge; speculative decoding, its accept length and rate
gauges. There is no `/version`: the version is `/server_info`'s, asked once
(it is a round trip to the scheduler, and it lists the server's arguments,
its API key among them, which sparktop never shows).
"""

from __future__ import annotations

import re

from sparktop import engine_ids
from sparktop.layouts import Layout
from sparktop.observe import argv as a
from sparktop.observe.engine_log import LogPatterns
from sparktop.observe.engines.base import Answer, Engine, EngineUnreachable, Get
from sparktop.observe.prometheus import MetricNames

NAMES = MetricNames(
    prefix="sglang:",
    kv_usage=("sglang:token_usage",),
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    # The scheduler's counter moves every batch (decode: every 40 steps); the tokenizer's only when a
    # request finishes, so a monitor reading those shows 0 t/s through a long generation.
    prompt_tokens=("sglang:realtime_tokens_total{mode=prefill_compute|prefill_cache}", "sglang:prompt_tokens_total"),
    gen_tokens=("sglang:realtime_tokens_total{mode=decode}", "sglang:generation_tokens_total"),
    cached_tokens=("sglang:realtime_tokens_total{mode=prefill_cache}", "sglang:cached_tokens_total"),
    prefix_hit_rate=("sglang:cache_hit_rate",),
    preemptions=("sglang:num_retracted_requests_total",),
    requests=("sglang:num_requests_total",),
    ttft=("sglang:time_to_first_token_seconds",),
    itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    queue=("sglang:queue_time_seconds",),
    e2e=("sglang:e2e_request_latency_seconds",),
    spec_accept_len=("sglang:spec_accept_length",),
    spec_accept_rate=("sglang:spec_accept_rate",),
    created=("sglang:prompt_tokens_total", "sglang:generation_tokens_total"),
    # Its retraction counter appears with the first retraction, in releases that have it (with the realtime
    # token counter); older ones export neither.
    first_counted=("preemptions",),
    release_marks=("sglang:realtime_tokens_total",),
)


# SGLang's log (0.5.23: engine.py, model_runner.py, memory_pool.py, http_server.py; uvicorn's own lines):
# "[2026-01-01 12:00:00 TP0] Load weight begin. avail mem=110.5 GB".
LOG = LogPatterns(
    stages=(("initializing", re.compile(r"server_args=|Init parallel begin")),
            ("loading weights", re.compile(r"Load weight begin")),
            ("memory profiling", re.compile(r"Load weight end")),
            ("kv cache", re.compile(r"KV Cache is allocated|Memory pool end")),
            ("graph capture", re.compile(r"Capture .*CUDA graph begin|Capture cuda graph begin")),
            ("api server", re.compile(r"max_total_num_tokens=|Uvicorn running on|Application startup complete")),
            ("ready", re.compile(r"The server is fired up and ready to roll"))),
    failure=re.compile(r"^[\w.]*(Error|Exception): |Not enough memory|CUDA out of memory|Scheduler hit an exception|"
                       r"scheduler died during initialization|Initialization failed|Received sigquit from a child|"
                       r"Traceback \(most recent call last\)"),
    wrapper=re.compile(r"Received sigquit|Initialization failed|died during initialization|kill_process_tree|"
                       r"Scheduler hit an exception"),
    dead=re.compile(r"Scheduler hit an exception|SIGQUIT received|Subprocess \S+ \(pid=\d+\) crashed|"
                    r"out of memory\. Try to lower your batch size"),
    kv_tokens=re.compile(r"KV Cache is allocated\..*#tokens: (\d+)"),
    weights_gib=re.compile(r"Load weight end\..*mem usage=([\d.]+) GB"),
    level=re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?: [A-Z_]+\d+)*\] "),
)


class Sglang(Engine):
    row = engine_ids.get("sglang")
    names = NAMES
    metrics_path = "/metrics"
    metrics_off_hint = "SGLang serves it only with --enable-metrics"
    owned_by = ("sglang",)
    info_path = "/server_info"
    process_arg = r"^sglan[g]\.launch_server$|(^|/)sglan[g]$"
    process_bytes = (b"sglang",)
    log = LOG

    @classmethod
    def claims_info(cls, answer: Answer) -> str | None:
        data = answer.json()
        if answer.status == 200 and isinstance(data, dict) and "model_path" in data and (
                "tp_size" in data or "version" in data):
            return "/server_info answered as SGLang's"
        return None

    @classmethod
    def command(cls, argv: list[str]) -> str | None:
        for i, arg in enumerate(argv):
            if arg == "sglang.launch_server":
                return "sglang launch_server"
            if a.basename(arg) == "sglang" and argv[i + 1:i + 2] == ["serve"]:
                return "sglang serve"
        return None

    @classmethod
    def is_worker(cls, argv: list[str]) -> bool:
        rank = a.flag_int(argv, "--node-rank")
        return rank is not None and rank > 0  # only rank 0 serves HTTP

    @classmethod
    def served_model(cls, argv: list[str]) -> str | None:
        return a.flag_value(argv, "--served-model-name", "--model-path", "--model")

    @classmethod
    def layout(cls, argv: list[str]) -> Layout:
        tp = a.flag_int(argv, "--tp", "--tp-size", "--tensor-parallel-size") or 1
        pp = a.flag_int(argv, "--pp", "--pp-size", "--pipeline-parallel-size") or 1
        return Layout(tp=max(1, tp), pp=max(1, pp))

    @classmethod
    def head_of(cls, argv: list[str]) -> str | None:
        address = a.flag_value(argv, "--dist-init-addr") if cls.is_worker(argv) else None
        return address.rsplit(":", 1)[0] if address else None

    async def details(self, get: Get, models: Answer | None = None) -> None:
        await super().details(get, models)
        if self.version is not None:
            return  # /server_info is a round trip to its scheduler: asked once
        try:
            answer = await get("/server_info")
        except EngineUnreachable:
            return
        data = answer.json() if answer.status == 200 else None
        if isinstance(data, dict):
            self.version = str(data["version"]) if data.get("version") else self.version
            length = data.get("context_length")
            if isinstance(length, int) and length > 0:
                self.max_model_len = length
