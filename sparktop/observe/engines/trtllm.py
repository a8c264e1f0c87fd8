"""TensorRT-LLM's `trtllm-serve`: recognised by `owned_by: tensorrt_llm` in
/v1/models (its `Server` header is uvicorn's, like vLLM's and SGLang's);
found as `trtllm-serve` (under `mpirun ... trtllm-llmapi-launch` over
several nodes) in containers (`nvcr.io/nvidia/tensorrt-llm/*`) and
processes; read from `/prometheus/metrics`.

Read from TensorRT-LLM's source (`tensorrt_llm/metrics/collector.py`,
`serve/openai_server.py`; commits in tests/fixtures/SOURCES.md):
- the Prometheus route exists only with `return_perf_metrics: true` in the
  `--extra_llm_api_options` YAML (404 otherwise: nothing exported, said so),
  and its iteration gauges (KV use, running, waiting) only with
  `enable_iter_perf_stats: true`; they move when a request finishes, and
  so do its token counters: tokens/s are taken over the last 30 s, not 5,
  so that a request ending reads as the rate it ran at, not a burst;
- its plain `/metrics` is JSON iteration stats taken off a queue: reading it
  steals them from whoever owns the deployment. It is never read, nor
  `/perf_metrics` (also drained);
- names carry the `trtllm_` prefix since early 2026; older releases export
  five histograms and a counter without it, which are read too;
- it binds localhost unless given `--host`: on another node it is read
  through an SSH forward, as any engine bound to loopback is;
- gauges carry a `pid` label (prometheus-client's multiprocess mode): summed
  or averaged like any other label.
"""

from __future__ import annotations

import re

from sparktop import engine_ids
from sparktop.layouts import Layout
from sparktop.observe import argv as a
from sparktop.observe.engine_log import LogPatterns
from sparktop.observe.engines.base import Answer, Engine, EngineUnreachable, Get
from sparktop.observe.prometheus import Derived, MetricNames
from sparktop.observe.snapshot import FIGURES, EngineSnapshot

NAMES = MetricNames(
    prefix="trtllm_",
    kv_usage=("trtllm_kv_cache_utilization",),
    running=("trtllm_num_requests_running",),
    waiting=("trtllm_num_requests_waiting",),
    prompt_tokens=("trtllm_prompt_tokens_total",),
    gen_tokens=("trtllm_generation_tokens_total",),
    cached_tokens=("trtllm_prompt_cached_tokens_total",),
    prefix_hit_rate=("trtllm_kv_cache_hit_rate",),
    requests=("trtllm_request_success_total", "request_success_total"),
    finished_label="finished_reason",
    ttft=("trtllm_time_to_first_token_seconds", "time_to_first_token_seconds"),
    itl=("trtllm_time_per_output_token_seconds", "time_per_output_token_seconds"),
    queue=("trtllm_request_queue_time_seconds", "request_queue_time_seconds"),
    e2e=("trtllm_e2e_request_latency_seconds", "e2e_request_latency_seconds"),
    spec_draft_tokens=("trtllm_spec_decode_num_draft_tokens_total",),
    spec_accepted=("trtllm_spec_decode_num_accepted_tokens_total",),
    spec_accept_len=("trtllm_spec_decode_acceptance_length",),
    created_by_first_request=True,
    counted_at_end=True,
)


# trtllm-serve's log: "[12/20/2025-04:20:21] [TRT-LLM] [I] Use 63.32 GB for model weights." and the C++ side's
# "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 5.95 GiB for max tokens in paged KV cache (86720)." (the last
# such line is the cache that stays: the first is sized for profiling); newer releases print no "Uvicorn running".
LOG = LogPatterns(
    stages=(("initializing", re.compile(r"TensorRT-LLM version|Using LLM with PyTorch backend")),
            ("waiting for workers", re.compile(r"mpi_rank: |tllm_mpi_size|MpiPoolSession")),
            ("loading weights", re.compile(r"for model weights|Loading weights|Loading safetensors")),
            ("compiling", re.compile(r"Autotuning process starts")),
            ("memory profiling", re.compile(r"Model init total|memory usage profiling")),
            ("kv cache", re.compile(r"\[MemUsageChange\] Allocated .* paged KV cache|"
                                    r"Estimated max memory in KV cache")),
            ("graph capture", re.compile(r"CUDA graph warmup|Creating CUDA graph instances")),
            ("ready", re.compile(r"Application startup complete|Uvicorn running on"))),
    failure=re.compile(r"^[\w.]*(Error|Exception): |Executor creation failed|CUDA out of memory|"
                       r"Executor worker returned error|Executor worker died|ptxas fatal|Traceback \(most recent"),
    wrapper=re.compile(r"Executor worker returned error|Executor worker died during initialization"),
    dead=re.compile(r"CppExecutorError|Executor worker died|\[TensorRT-LLM\]\[ERROR\]"),
    kv_tokens=re.compile(r"paged KV cache \((\d+)\)"),
    weights_gib=re.compile(r"Use ([\d.]+) GB for model weights"),
    level=re.compile(r"^\[\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d\] \[TRT-LLM\] \[(?P<level>[IWEF])\] "),
)


class TensorRtLlm(Engine):
    row = engine_ids.get("trtllm")
    names = NAMES
    metrics_path = "/prometheus/metrics"
    owned_by = ("tensorrt_llm",)
    process_arg = r"(^|/)trtllm-serv[e]$"
    process_bytes = (b"trtllm",)
    log = LOG

    def __init__(self, how: str = ""):
        super().__init__(how)
        self.perf_off = False  # started without return_perf_metrics: no /prometheus/metrics

    @classmethod
    def command(cls, argv: list[str]) -> str | None:
        return "trtllm-serve" if any(a.basename(x) == "trtllm-serve" for x in argv) else None

    @classmethod
    def served_model(cls, argv: list[str]) -> str | None:
        rest = argv[argv.index(next(x for x in argv if a.basename(x) == "trtllm-serve")) + 1:]
        if rest[:1] == ["serve"]:
            rest = rest[1:]
        model = a.positional(rest)
        return model.rstrip("/").rsplit("/", 1)[-1] if model and model.startswith("/") else model

    @classmethod
    def layout(cls, argv: list[str]) -> Layout:
        tp = a.flag_int(argv, "--tp_size", "--tensor_parallel_size") or 1
        pp = a.flag_int(argv, "--pp_size", "--pipeline_parallel_size") or 1
        ep = (a.flag_int(argv, "--ep_size", "--moe_expert_parallel_size") or 1) > 1
        return Layout(tp=max(1, tp), pp=max(1, pp), ep=ep and tp > 1)

    async def details(self, get: Get, models: Answer | None = None) -> None:
        await super().details(get, models)
        try:
            answer = await get("/version")
        except EngineUnreachable:
            return
        data = answer.json() if answer.status == 200 else None
        if isinstance(data, dict) and data.get("version"):
            self.version = str(data["version"])

    async def read(self, get: Get, t: float, histograms: bool) -> Derived:
        try:
            return await super().read(get, t, histograms)
        except EngineUnreachable as exc:
            if "HTTP 404" not in exc.reason:
                raise
        # Served, but without return_perf_metrics: up, nothing exported (its /metrics is not to be read).
        answer = await get("/health")
        if answer.status != 200:
            raise EngineUnreachable(f"/health answered HTTP {answer.status}", bound=True)
        self.perf_off = True
        return Derived(missing=list(FIGURES))

    def fill(self, snap: EngineSnapshot, d: Derived) -> None:
        super().fill(snap, d)
        if self.perf_off:
            snap.reason = ("trtllm-serve runs without return_perf_metrics: true (in --extra_llm_api_options): "
                           "it exports no metrics")
