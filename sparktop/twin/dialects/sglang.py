"""SGLang 0.5.23's words: `sglang serve` / `python -m sglang.launch_server`
flags, its log lines, `/metrics` with its families (only with
`--enable-metrics`), its native routes (`/`, `/health`, `/ping`, `/ready`,
`/server_info`, `/model_info`), its model card and its errors.

Every fact comes from SGLang's own source, the PyPI wheel
`sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl` (sha256 00b3cd5b…9937;
tests/fixtures/sglang/SOURCES.md), file by file:
- metric families, help strings, labels and buckets:
  `srt/observability/metrics_collector.py` (the scheduler's and the
  tokenizer's collectors), `http_request_metrics.py`, `cpu_monitor.py`;
  which of them a text model shows by default: `metrics_reporter.py`,
  `scheduler.py` (emit_constants), `tokenizer_manager.py` (collect_metrics);
  tests/unit/test_twin_sglang.py holds the families to the wheel;
- log lines: `srt/distributed/bootstrap.py`, `model_executor/model_runner.py`,
  `mem_cache/memory_pool.py`, `mem_cache/kv_cache_configurator.py`,
  `model_runner_components/cuda_graph_setup.py`, `managers/scheduler.py`,
  `entrypoints/engine.py`, `entrypoints/http_server.py`, and uvicorn's format
  as `utils/common.py` sets it (`[time] INFO:     message`);
- routes and errors: `entrypoints/http_server.py`, `utils/auth.py`,
  `managers/tokenizer_manager.py` (the context-length checks),
  `entrypoints/openai/protocol.py` (ModelCard, UsageInfo).

How SGLang differs from vLLM, and so does this twin:
- `/metrics` exists only with `--enable-metrics` (FastAPI's 404 otherwise),
  in prometheus-client's multiprocess style: no `_created` series, a family
  shows once it has a series, histograms print `_sum` before their buckets;
- the scheduler's gauges change when it publishes its stats (every prefill
  batch, every 40 decode steps, when it goes idle), not when /metrics is read;
- request counters and latencies are the tokenizer's: counted when a request
  finishes, labelled `is_streaming`; retractions are its preemptions;
- nothing listens until the model is loaded; then a warm-up request runs and
  `/health` answers 503 until it has (and always takes a second: it runs a
  generation);
- a prompt of the context's length or longer is refused (`>=`), as is one
  whose prompt and max_tokens exceed it; a request naming another model is
  served anyway.

What the twin does not imitate: the radix cache's eviction families (the
twin's prefix cache does not report evictions), the PD-disaggregation, LoRA,
HiCache, grammar and speculative families (off for a text model by default),
and the inter-token latency of non-streamed requests (SGLang observes it only
for streams; the twin for every request). Until openai_api marks a Sequence's
`stream`, a request's time to first token is observed when it finishes, the
moment the twin learns whether it streamed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import http
import json
import math
import os
import random
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from sparktop import engine_ids
from sparktop.clock import SYSTEM, Clock
from sparktop.twin.dialects.base import (
    TWIN,
    Dialect,
    Serve,
    TwinLog,
    TwinMetrics,
    add_twin_flags,
    error_json,
    parameter_error,
    twin_settings,
    validation_error,
)

if TYPE_CHECKING:
    from pathlib import Path

    from sparktop.twin.args import ServeArgs
    from sparktop.twin.server import TwinServer
    from sparktop.twin.startup import StartupPlan

SGLANG_VERSION = "0.5.23"
DEFAULT_PORT = 30000
DEFAULT_HOST = "127.0.0.1"
# SGLang sizes --mem-fraction-static from the GPU's memory (memory_hook.py: (total - reserved) / total, at least
# 10 GiB reserved): about 0.88 on a GB10.
DEFAULT_MEM_FRACTION = 0.88
CHUNKED_PREFILL = 8192  # memory_hook.py's default for a GPU of 90 to 160 GiB (a GB10)
MAX_PREFILL_TOKENS = 16384
DECODE_LOG_INTERVAL = 40
GRAPH_GIB = 0.66  # what the decode graphs hold (the vLLM dialect's figure; SGLang's is of the same order)
WARMUP_TEXT = "The capital city of France is"  # http_server.py's warm-up request, max_new_tokens 8
WARMUP_TOKENS = 8
COMPLETION_MAX_TOKENS = 16
HEALTH_SECONDS = 1.0  # /health sleeps a second before it looks for its generation
INIT_PARALLEL_S = 0.41  # NCCL's set-up on one node (the twin models no such stage)
# The new-token ratio SGLang's scheduler starts at and decays to (environ.py: 0.7, x0.14, over 600 steps).
INIT_TOKEN_RATIO = 0.7
MIN_TOKEN_RATIO = INIT_TOKEN_RATIO * 0.14
TOKEN_RATIO_DECAY = (INIT_TOKEN_RATIO - MIN_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20

GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions")
OPEN_PATHS = ("/health", "/ready", "/metrics")  # utils/auth.py: never behind --api-key
# SGLang's --quantization names -> the weight formats the performance model knows.
QUANT_FORMATS = {"fp8": "fp8", "modelopt": "fp8", "modelopt_fp8": "fp8", "w8a8_fp8": "fp8", "awq": "int4",
                 "awq_marlin": "int4", "gptq": "int4", "gptq_marlin": "int4", "moe_wna16": "int4",
                 "w8a8_int8": "int8", "modelopt_fp4": "nvfp4", "nvfp4_online": "nvfp4", "petit_nvfp4": "nvfp4",
                 "mxfp4": "mxfp4"}
KV_DTYPES = {"fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2", "mxfp8": "torch.float8_e4m3fn",
             "nvfp4": "torch.float4_e2m1fn_x2", "fp4_mx_block16": "torch.float4_e2m1fn_x2"}

# -- metric families (metrics_collector.py, 0.5.23) ------------------------------------------------------------

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")

# The gauges SchedulerMetricsCollector.log_stats writes at every stats publish (LoRA, HiCache and
# streaming-session gauges only with their features), in its order.
STATS_GAUGES: dict[str, str] = {
    "num_running_reqs": "The number of running requests.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "num_grammar_queue_reqs": "The number of requests in the grammar waiting queue.",
    "gen_throughput": "The generation throughput (token/s).",
    "cache_hit_rate": "The prefix cache hit rate.",
    "decode_sum_seq_lens": "The sum of all sequence lengths in decode.",
    "token_usage": "The token usage.",
    "full_token_usage": "The token usage for full attention layers.",
    "swa_token_usage": "The token usage for SWA layers.",
    "mamba_usage": "The token usage for Mamba layers.",
    "num_used_tokens": "The number of used tokens.",
    "kv_available_tokens": "Number of free token slots in the KV cache pool.",
    "kv_evictable_tokens": "Number of evictable (radix-cached) token slots in the KV cache pool.",
    "kv_used_tokens": "Number of actively used token slots in the KV cache pool.",
    "swa_available_tokens": "Number of free token slots in the SWA pool (hybrid-SWA only).",
    "swa_evictable_tokens": "Number of evictable (radix-cached) token slots in the SWA pool.",
    "swa_used_tokens": "Number of actively used token slots in the SWA pool.",
    "mamba_available_tokens": "Number of free state slots in the mamba SSM pool (hybrid-SSM only).",
    "mamba_evictable_tokens": "Number of evictable (radix-cached) state slots in the mamba SSM pool.",
    "mamba_used_tokens": "Number of actively used state slots in the mamba SSM pool.",
    "spec_accept_length": "Mean acceptance length of speculative decoding (accepted drafts + bonus token per "
                          "forward).",
    "spec_accept_rate": "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
    "spec_cap_length": "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when "
                       "no cap is scheduled).",
    "spec_block_accept_length": "Mean uncapped full-block accept length per verify step (accept + cap-trimmed "
                                "drafts; exact only in DSpark cap-accept mode).",
    "spec_num_steps": "Currently active speculative_num_steps.",
    "spec_num_draft_tokens": "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
    "num_prefill_bootstrap_queue_reqs": "The number of requests in the prefill bootstrap queue.",
    "num_prefill_inflight_queue_reqs": "The number of requests in the prefill inflight queue.",
    "num_decode_prealloc_queue_reqs": "The number of requests in the decode prealloc queue.",
    "num_decode_transfer_queue_reqs": "The number of requests in the decode transfer queue.",
    "num_decode_host_receive_queue_reqs": "Requests in the decode transfer queue receiving into host memory or "
                                          "waiting for device admission.",
    "num_decode_deferred_kv_release_reqs": "The number of failed decode requests whose KV allocations are held "
                                           "pending transfer drain acknowledgement or timeout.",
    "pending_prealloc_token_usage": "The token usage for pending preallocated tokens (not preallocated yet).",
    "prealloc_full_token_usage": "Share of the full-attention KV pool held by decode requests whose KV transfer "
                                 "is pending (preallocated, not yet running); same capacity basis as "
                                 "sglang:full_token_usage.",
    "prealloc_swa_token_usage": "Share of the SWA KV pool held by decode requests whose KV transfer is pending; "
                                "same capacity basis as sglang:swa_token_usage.",
    "utilization": "The utilization.",
    "fwd_occupancy": "Forward pass GPU occupancy percentage.",
    "new_token_ratio": "The new token ratio.",
    "is_cuda_graph": "Whether the batch is using CUDA graph.",
    "num_unique_running_routing_keys": "Number of unique routing keys in running batch.",
}
# Gauges in prometheus-client's default multiprocess mode ("all"): each process's value, with a `pid` label.
PID_GAUGES: dict[str, str] = {
    "num_retracted_reqs": "The number of retracted requests.",
    "num_paused_reqs": "The number of paused requests by async weight sync.",
}
# GaugeHistograms (utils/gauge_histogram.py): a gauge per bucket, labelled gt < count <= le.
ROUTING_KEY_GAUGES: dict[str, str] = {
    "routing_key_running_req_count": "Distribution of routing keys by running request count (gt < count <= le).",
    "routing_key_all_req_count": "Distribution of routing keys by running+waiting request count (gt < count <= le).",
}
ROUTING_KEY_BOUNDS = [1, 2, 3, 5, 7, 10, 20, 50, 100, 200]
# emit_constants, once at start-up (max_total_num_tokens_swa only for SWA models, max_running_requests_under_SLO
# never: it has no setter in 0.5.23).
CONSTANT_GAUGES: dict[str, str] = {
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "weight_memory_usage_gb": "Memory used by model weights in GB.",
    "kv_cache_memory_usage_gb": "Memory used by the KV cache pools in GB.",
    "page_size": "KV cache page size in tokens.",
    "num_pages": "Number of KV cache pages.",
    "context_len": "Maximum context length.",
    "startup_available_gpu_memory_gb": "Available GPU memory in GB at startup.",
}
GRAPH_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")
STARTUP_PHASES = ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e")
SCHEDULER_STAGES = ("other", "recv_requests", "process_input_requests", "get_next_batch_to_run", "process_queue",
                    "run_batch", "process_batch_result", "sanity_check_cache", "idle")
PREFILL_MODES = ("input", "device_hit", "host_hit", "storage_hit")

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
QUEUE_BUCKETS = [0.000, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60,
                 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500,
                 3000]
PROMPT_BUCKETS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500,
                  15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000,
                  300000, 400000, 600000, 800000, 1000000, 1100000]
STAGE_BUCKETS = [0.001 * 1.62**i for i in range(30)]  # exponential_buckets(start=0.001, width=1.62, length=30)
IMBALANCE_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
SYNC_WAIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
MFU = "(for Model FLOPs Utilization calculations)."


def _floats(buckets: Iterable[float]) -> list[float]:
    return [float(b) for b in buckets]


class _MultiprocessStyle(Collector):
    """A registry's families as SGLang's MultiProcessCollector shows them: no
    `_created` series, no family without a series, a histogram's `_sum` before
    its buckets and its `_count` last."""

    def __init__(self, inner: CollectorRegistry):
        self.inner = inner

    def collect(self) -> Iterable[Metric]:
        for family in self.inner.collect():
            samples = [s for s in family.samples if not s.name.endswith("_created")]
            if not samples:
                continue
            if family.type == "histogram":
                samples = _sum_first(family.name, samples)
            out = Metric(family.name, family.documentation, family.type)
            out.samples = samples
            yield out


def _sum_first(name: str, samples: list) -> list:
    groups: dict[tuple, list] = {}
    for s in samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        groups.setdefault(key, []).append(s)
    rank = {f"{name}_sum": 0, f"{name}_bucket": 1, f"{name}_count": 2}
    return [s for group in groups.values() for s in sorted(group, key=lambda s: rank.get(s.name, 3))]


@dataclass
class _Request:
    """A request the tokenizer side has yet to count: its TTFT, then what it finished with."""

    ttft: float | None = None
    ttft_seen: bool = False
    finished: tuple[int, int, int, float, float | None] | None = None  # prompt, completion, cached, e2e, tpot


class SglangMetrics(TwinMetrics):
    """SGLang's families in a registry of its own; also the engine's MetricsSink.

    The scheduler's gauges follow SGLang's publishing (prefill batches, every
    40th decode step, going idle); its counters and histograms, and the
    tokenizer's, follow the requests."""

    def __init__(self, model_name: str, context_len: int, log: TwinLog | None = None, graphs: bool = True,
                 max_graph_bs: int = 256, clock: Clock = SYSTEM):
        self.clock = clock  # the server's (`TwinServer.clock`): the throughput, idle and busy times are on it
        self.registry = CollectorRegistry(auto_describe=False)
        self._exposition = CollectorRegistry(auto_describe=False)
        self._exposition.register(_MultiprocessStyle(self.registry))
        self.log = log
        self.context_len = context_len
        self.graphs, self.max_graph_bs = graphs, max_graph_bs
        self.sched = dict(zip(SCHEDULER_LABELS, (model_name, "unified", "0", "0", "0"), strict=True))
        self.tok = dict(zip(TOKENIZER_LABELS, (model_name, "unified"), strict=True))
        self.pid = str(os.getpid())
        self.engine: Any = None  # the twin's engine, once sized (its pool and queues)
        self._declare_scheduler()
        self._declare_tokenizer()
        self._declare_http()
        # The scheduler's running figures (metrics_reporter.py's SchedulerStats).
        self._step = {"new_seqs": 0, "new_tokens": 0, "hits": 0, "first_tokens": 0}
        self._hit_rate = 0.0
        self._gen_throughput = 0.0
        self._token_ratio = INIT_TOKEN_RATIO
        self._decode_steps = 0
        self._decode_tokens = 0
        self._decode_since = clock.now()
        self._retracted = 0  # the last retraction's size, until the next publish
        self._graph_batch = 0
        self._counted = clock.now()  # where the idle/busy wall time was last counted
        self._idle = True
        self._cpu = (clock.now(), time.process_time())  # the CPU time is the process's own, whatever the clock
        self._requests: OrderedDict[str, _Request] = OrderedDict()

    # -- declaration ---------------------------------------------------------------------------------------------

    def _declare_scheduler(self) -> None:
        r, base = self.registry, list(SCHEDULER_LABELS)
        self.stats = {n: Gauge(f"sglang:{n}", doc, base, registry=r) for n, doc in STATS_GAUGES.items()}
        self.pid_gauges = {n: Gauge(f"sglang:{n}", doc, [*base, "pid"], registry=r) for n, doc in PID_GAUGES.items()}
        self.routing = {n: Gauge(f"sglang:{n}", doc, [*base, "gt", "le"], registry=r)
                        for n, doc in ROUTING_KEY_GAUGES.items()}
        self.retracted_reqs = Counter("sglang:num_retracted_requests_total", "Total number of retracted requests.",
                                      base, registry=r)
        self.retracted_in = Counter("sglang:num_retracted_input_tokens_total",
                                    "Total number of retracted input tokens.", base, registry=r)
        self.retracted_out = Counter("sglang:num_retracted_output_tokens_total",
                                     "Total number of retracted output tokens.", base, registry=r)
        self.graph_passes = Counter("sglang:cuda_graph_passes_total",
                                    "Total number of forward passes categorized by CUDA graph.", [*base, "mode"],
                                    registry=r)
        self.queue_time = Histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", base,
                                    buckets=_floats(QUEUE_BUCKETS), registry=r)
        self.stage_latency = Histogram("sglang:per_stage_req_latency_seconds", "The latency of each stage of "
                                       "requests.", [*base, "stage"], buckets=STAGE_BUCKETS, registry=r)
        self.realtime = Counter("sglang:realtime_tokens_total", "Total number of tokens processed (updated on each "
                                "log interval). mode: prefill_compute, prefill_cache, decode.", [*base, "mode"],
                                registry=r)
        self.constants = {n: Gauge(f"sglang:{n}", doc, base, registry=r) for n, doc in CONSTANT_GAUGES.items()}
        self.graph_memory = Gauge("sglang:graph_memory_usage_gb", "Memory used by captured device graphs in GB.",
                                  [*base, "phase"], registry=r)
        self.est = {kind: Counter(f"sglang:estimated_{kind}_per_gpu_total", f"Estimated number of {what} per GPU "
                                  f"{MFU}", base, registry=r)
                    for kind, what in (("flops", "floating point operations"),
                                       ("read_bytes", "bytes read from memory"),
                                       ("write_bytes", "bytes written to memory"))}
        self._preseeded(base)

    def _preseeded(self, base: list[str]) -> None:
        """The series SchedulerMetricsCollector creates at 0 on every rank, whatever runs."""
        r, labels = self.registry, self.sched
        effective = Counter("sglang:prefill_effective_tokens_total", "Effective prefill tokens with "
                            "retracted-request re-counts excluded, updated on each log interval. mode: device_hit, "
                            "host_hit, storage_hit, input. Windowed prefix cache hit rate = rate(sum of *_hit) / "
                            "rate(sum of all modes); per-tier rate uses a single *_hit mode in the numerator.",
                            [*base, "mode"], registry=r)
        self.effective = {m: effective.labels(**labels, mode=m) for m in PREFILL_MODES}
        self.idle_seconds = Counter("sglang:scheduler_idle_seconds_total", "Total wall time while the scheduler has "
                                    "no runnable or queued work.", base, registry=r).labels(**labels)
        self.sched_cpu = Counter("sglang:scheduler_process_cpu_seconds_total", "Total CPU time consumed by the "
                                 "scheduler process across all threads.", base, registry=r).labels(**labels)
        stage = Counter("sglang:scheduler_stage_seconds_total", "Total scheduler-loop wall time exclusively "
                        "attributed to each stage. forward_overlap (full, partial, none): full=both endpoints "
                        "active, partial=one, none=no observed overlap (including unavailable timing). Not exact "
                        "overlapped/exposed seconds.", [*base, "category", "forward_overlap"], registry=r)
        self.stage_seconds = {c: stage.labels(**labels, category=c, forward_overlap="none") for c in SCHEDULER_STAGES}
        dp_tokens = Counter("sglang:dp_attention_tokens_total", "Tokens of MLP-sync steps on this DP rank. "
                            "kind=scheduled: tokens this rank ran; kind=imbalance: tokens the busiest rank ran beyond "
                            "this rank, i.e. capacity lost to DP imbalance on this rank. On speculative-decode steps "
                            "the unit is batch rows (requests).", [*base, "kind"], registry=r)
        dp_steps = Counter("sglang:dp_attention_steps_total", "MLP-sync steps on this DP rank. rank_state=idle: this "
                           "rank had no tokens and only ran to keep the DP collectives in lockstep.",
                           [*base, "rank_state"], registry=r)
        dp_pairs = Counter("sglang:dp_attention_pairs_total", "Causal (query, key) pairs attended by MLP-sync steps "
                           "on this DP rank, pricing every layer as full attention: a decode row reads its sequence, "
                           "a prefill chunk its prefix plus the pairs within the chunk. kind=scheduled: this rank; "
                           "kind=imbalance: the busiest rank's excess over this rank. The context-length counterpart "
                           "of sglang:dp_attention_tokens_total; like it, speculative-decode steps count one query "
                           "per row. Sliding-window layers execute fewer pairs than counted, so on hybrid-SWA models "
                           "long rows are overstated.", [*base, "kind"], registry=r)
        for kind in ("scheduled", "imbalance"):
            dp_tokens.labels(**labels, kind=kind)
            dp_pairs.labels(**labels, kind=kind)
        for state in ("active", "idle"):
            dp_steps.labels(**labels, rank_state=state)
        Histogram("sglang:dp_attention_token_imbalance_ratio", "Per MLP-sync step, max tokens over mean tokens "
                  "across the DP ranks (1.0 = balanced, num_dp_ranks = one busy rank). Reported once per engine, by "
                  "the scheduler of DP rank 0.", base, buckets=IMBALANCE_BUCKETS, registry=r).labels(**labels)
        Histogram("sglang:dp_attention_sync_wait_seconds", "Wall time of this DP rank's scheduler MLP-sync "
                  "all-gather per step. On the gloo path (the default with overlap scheduling) this is waiting for "
                  "the slowest rank; on the device-group paths it also includes the gather's stream sync.", base,
                  buckets=SYNC_WAIT_BUCKETS, registry=r).labels(**labels)

    def _declare_tokenizer(self) -> None:
        r, base = self.registry, list(TOKENIZER_LABELS)
        stream = [*base, "is_streaming"]
        self.startup_time = Gauge("sglang:startup_time_seconds", "Engine startup duration by phase in seconds.",
                                  [*base, "phase"], registry=r)
        self.startup_graph = Gauge("sglang:startup_cuda_graph_time_seconds", "CUDA graph capture duration by phase "
                                   "in seconds.", [*base, "phase"], registry=r)
        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", stream,
                                     registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                         stream, registry=r)
        self.cached_tokens = Counter("sglang:cached_tokens_total", "Number of cached prompt tokens by source "
                                     "(device/host/storage).", [*base, "cache_source"], registry=r)
        self.requests = Counter("sglang:num_requests_total", "Number of requests processed.", stream, registry=r)
        self.aborted = Counter("sglang:num_aborted_requests_total", "Number of requests aborted.", base, registry=r)
        self.prompt_hist = Histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", base,
                                     buckets=_floats(PROMPT_BUCKETS), registry=r)
        self.uncached_hist = Histogram("sglang:uncached_prompt_tokens_histogram", "Histogram of uncached (compute) "
                                       "prompt token length.", base, buckets=_floats(PROMPT_BUCKETS), registry=r)
        self.generation_hist = Histogram("sglang:generation_tokens_histogram", "Histogram of generation token "
                                         "length.", base, buckets=_floats(PROMPT_BUCKETS), registry=r)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              stream, buckets=_floats(TTFT_BUCKETS), registry=r)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             base, buckets=ITL_BUCKETS, registry=r)
        self.tpot = Histogram("sglang:request_time_per_output_token_seconds", "Per-request TPOT in seconds: "
                              "(finished_time - first_token_time) / (completion_tokens - 1).", stream,
                              buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in "
                             "seconds", stream, buckets=_floats(E2E_BUCKETS), registry=r)

    def _declare_http(self) -> None:
        r = self.registry
        self.http_requests = Counter("sglang:http_requests_total", "Total number of HTTP requests by endpoint and "
                                     "method", ["endpoint", "method"], registry=r)
        self.http_responses = Counter("sglang:http_responses_total", "Total number of HTTP responses by endpoint "
                                      "and status code", ["endpoint", "status_code", "method"], registry=r)
        self.http_active = Gauge("sglang:http_requests_active", "Number of currently active HTTP requests",
                                 ["endpoint", "method"], registry=r)
        Gauge("sglang:routing_keys_active", "Number of unique routing keys with active requests", registry=r)
        self.process_cpu = Counter("sglang:process_cpu_seconds_total", "Total CPU time consumed by this process "
                                   "(user + system)", ["component"], registry=r)

    # -- what start-up sets ----------------------------------------------------------------------------------------

    def emit_constants(self, tokens: int, weights_gib: float, kv_gib: float, graph_gib: float,
                       available_gib: float) -> None:
        """scheduler.py's emit_metrics_constants, once the pools and graphs are made (page size 1)."""
        values = {"max_total_num_tokens": tokens, "weight_memory_usage_gb": weights_gib,
                  "kv_cache_memory_usage_gb": kv_gib, "page_size": 1, "num_pages": tokens,
                  "context_len": self.context_len, "startup_available_gpu_memory_gb": available_gib}
        for name, value in values.items():
            self.constants[name].labels(**self.sched).set(value)
        for phase in GRAPH_PHASES:
            self.graph_memory.labels(**self.sched, phase=phase).set(graph_gib if phase == "decode" else 0.0)

    def emit_startup_time(self, times: dict[str, float], graph_seconds: float) -> None:
        for phase in STARTUP_PHASES:
            self.startup_time.labels(**self.tok, phase=phase).set(times[phase])
        for phase in GRAPH_PHASES:
            self.startup_graph.labels(**self.tok, phase=phase).set(graph_seconds if phase == "decode" else 0.0)

    # -- MetricsSink ---------------------------------------------------------------------------------------------

    def on_prefix(self, *, queries, hits):
        self._step["new_seqs"] += 1
        self._step["new_tokens"] += queries - hits
        self._step["hits"] += hits

    def on_first_token(self, seq, ttft, queue_time):
        self._step["first_tokens"] += 1
        # Scheduler side: the wait before the first forward, and the stages it observes by default.
        self.queue_time.labels(**self.sched).observe(queue_time)
        self.stage_latency.labels(**self.sched, stage="request_process").observe(0.0)
        if seq.first_scheduled is not None and seq.first_token_t is not None:
            self.stage_latency.labels(**self.sched, stage="prefill_forward").observe(
                seq.first_token_t - seq.first_scheduled)
        request = self._request(seq.request_id)
        request.ttft = ttft
        self._settle(seq.request_id, getattr(seq, "stream", None))

    def on_token_gap(self, gap):
        self.itl.labels(**self.tok).observe(gap)

    def on_finish(self, seq, reason, now):
        if reason == "abort":
            # tokenizer_manager.abort_request: a request the client left (or the server dropped).
            self.aborted.labels(**self.tok).inc()
        if reason not in ("stop", "length"):
            self._requests.pop(seq.request_id, None)
            return
        completion = seq.output_count
        tpot = None
        if seq.first_token_t is not None and completion > 1:
            tpot = (now - seq.first_token_t) / (completion - 1)
        self._request(seq.request_id).finished = (seq.prompt_len, completion, seq.cached_tokens, now - seq.arrival,
                                                  tpot)
        self._settle(seq.request_id, getattr(seq, "stream", None))

    def on_step(self, *, prompt_tokens, generation_tokens, preemptions, running, waiting, kv_usage,
                iteration_tokens):
        self._account(busy=True)
        step, self._step = self._step, {"new_seqs": 0, "new_tokens": 0, "hits": 0, "first_tokens": 0}
        if preemptions:
            self._retract(preemptions)
        if step["new_seqs"]:
            self._prefill_report(step)
        decode_tokens = generation_tokens - step["first_tokens"]
        if decode_tokens > 0:
            self._decode_pass(decode_tokens, running)
        if not running and not waiting:
            self._go_idle()

    def on_traffic(self, flops: float, read_bytes: float, write_bytes: float) -> None:
        """`--enable-mfu-metrics`: the step's estimated work (counters created at their first non-zero)."""
        for kind, value in (("flops", flops), ("read_bytes", read_bytes), ("write_bytes", write_bytes)):
            if value > 0:
                self.est[kind].labels(**self.sched).inc(value)

    # -- the scheduler's reports (metrics_reporter.py) ---------------------------------------------------------------

    def _prefill_report(self, step: dict[str, int]) -> None:
        """report_prefill_stats: every prefill batch counts its tokens and publishes the stats."""
        new, hits = step["new_tokens"], step["hits"]
        self.graph_passes.labels(**self.sched, mode="prefill_none").inc()  # prefill graphs are off by default
        for mode, value in (("prefill_compute", new), ("prefill_cache", hits)):
            if value:
                self.realtime.labels(**self.sched, mode=mode).inc(value)
        if new:
            self.effective["input"].inc(new)
        if hits:
            self.effective["device_hit"].inc(hits)
        self._hit_rate = hits / (new + hits) if new + hits else 0.0
        self._graph_batch = 0
        self._publish()

    def _decode_pass(self, tokens: int, running: int) -> None:
        """One decode forward; every DECODE_LOG_INTERVAL of them the stats are published."""
        graph = self.graphs and running <= self.max_graph_bs
        self.graph_passes.labels(**self.sched, mode="decode_cuda_graph" if graph else "decode_none").inc()
        self.realtime.labels(**self.sched, mode="decode").inc(tokens)
        self._graph_batch = int(graph)
        self._token_ratio = max(MIN_TOKEN_RATIO, self._token_ratio - TOKEN_RATIO_DECAY)
        self._decode_steps += 1
        self._decode_tokens += tokens
        if self._decode_steps % DECODE_LOG_INTERVAL == 0:
            now = self.clock.now()
            self._gen_throughput = self._decode_tokens / max(now - self._decode_since, 1e-9)
            self._decode_tokens, self._decode_since = 0, now
            self._publish()

    def _retract(self, count: int) -> None:
        """A retraction: the requests pushed back to the queue's head (the twin's preemptions)."""
        queued = list(self.engine.waiting)[:count] if self.engine is not None else []
        inputs = sum(s.prompt_len for s in queued)
        outputs = sum(s.output_count for s in queued)
        self.retracted_reqs.labels(**self.sched).inc(count)
        self.retracted_in.labels(**self.sched).inc(inputs)
        self.retracted_out.labels(**self.sched).inc(outputs)
        self._retracted = count
        old = self._token_ratio
        running = list(self.engine.running) if self.engine is not None else []
        decoded = sum(s.output_count for s in running) + RETRACT_DECODE_STEPS * len(running)
        self._token_ratio = min(1.0, decoded / (sum(s.max_tokens for s in running) + 1))
        if self.log is not None:
            self.log.engine("", f"KV cache pool is full. Retract requests. #retracted_reqs: {count}, "
                                f"#new_tokens_gained: {inputs + outputs}, #new_token_ratio: {old:.4f} -> "
                                f"{self._token_ratio:.4f}")

    def _go_idle(self) -> None:
        """_maybe_log_idle_metrics: the running gauge is stale, so an idle server publishes at once."""
        self._gen_throughput = 0.0
        self._token_ratio = INIT_TOKEN_RATIO
        self._account(busy=False)
        self._publish()

    def pool(self) -> tuple[int, int, int, int]:
        """(capacity, free, evictable, used) tokens of the KV pool, as SGLang's allocator and radix tree count them."""
        if self.engine is None:
            return 0, 0, 0, 0
        from sparktop.twin.engine import BLOCK

        total = self.engine.kv_capacity_tokens
        free = self.engine.pool.free * BLOCK
        evictable = len(self.engine.pool.evictable) * BLOCK
        return total, free, evictable, max(0, total - free - evictable)

    def _publish(self) -> None:
        """SchedulerMetricsCollector.log_stats with the twin's figures (0 for what a text model has not)."""
        total, free, evictable, used = self.pool()
        running = list(self.engine.running) if self.engine is not None else []
        waiting = len(self.engine.waiting) if self.engine is not None else 0
        usage = used / total if total else 0.0
        values = dict.fromkeys(STATS_GAUGES, 0.0)
        values.update({
            "num_running_reqs": len(running), "num_queue_reqs": waiting, "gen_throughput": self._gen_throughput,
            "cache_hit_rate": self._hit_rate,
            "decode_sum_seq_lens": sum(s.prompt_len + s.output_count for s in running if s.output_count),
            "token_usage": round(usage, 2), "full_token_usage": usage, "num_used_tokens": used,
            "kv_available_tokens": free, "kv_evictable_tokens": evictable, "kv_used_tokens": used,
            "fwd_occupancy": math.nan,  # NaN unless SGLANG_ENABLE_METRICS_DEVICE_TIMER
            "new_token_ratio": self._token_ratio, "is_cuda_graph": self._graph_batch,
        })
        for name, value in values.items():
            self.stats[name].labels(**self.sched).set(value)
        self.pid_gauges["num_retracted_reqs"].labels(**self.sched, pid=self.pid).set(self._retracted)
        self.pid_gauges["num_paused_reqs"].labels(**self.sched, pid=self.pid).set(0)
        self._retracted = 0
        bounds = [str(b) for b in ROUTING_KEY_BOUNDS]
        for gauge in self.routing.values():  # no routing keys: every bucket 0
            for gt, le in zip(["0", *bounds], [*bounds, "+Inf"], strict=True):
                gauge.labels(**self.sched, gt=gt, le=le).set(0)

    def _account(self, busy: bool) -> None:
        """Wall time since the last step: the scheduler's run_batch stage, or its idle time."""
        now = self.clock.now()
        elapsed, self._counted = now - self._counted, now
        if self._idle:
            self.idle_seconds.inc(elapsed)
            self.stage_seconds["idle"].inc(elapsed)
        else:
            self.stage_seconds["run_batch"].inc(elapsed)
        self._idle = not busy

    # -- the tokenizer's side --------------------------------------------------------------------------------------

    def _request(self, request_id: str) -> _Request:
        request = self._requests.get(request_id)
        if request is None:
            request = self._requests[request_id] = _Request()
            while len(self._requests) > 4096:  # never claimed (a client gone): forgotten
                self._requests.popitem(last=False)
        return request

    def claim(self, request_id: str, streaming: bool) -> None:
        """The HTTP side says whether a request streamed: its tokenizer figures count now."""
        self._settle(request_id, streaming)

    def _settle(self, request_id: str, streaming: bool | None) -> None:
        request = self._requests.get(request_id)
        if request is None or streaming is None:
            return
        labels = {**self.tok, "is_streaming": "true" if streaming else "false"}
        if request.ttft is not None and not request.ttft_seen:
            self.ttft.labels(**labels).observe(request.ttft)
            request.ttft_seen = True
        if request.finished is None:
            return
        del self._requests[request_id]
        prompt, completion, cached, e2e, tpot = request.finished
        self.prompt_tokens.labels(**labels).inc(prompt)
        self.generation_tokens.labels(**labels).inc(completion)
        if cached > 0:
            self.cached_tokens.labels(**self.tok, cache_source="device").inc(cached)
        self.requests.labels(**labels).inc()
        self.e2e.labels(**labels).observe(e2e)
        if tpot is not None:
            self.tpot.labels(**labels).observe(tpot)
        self.prompt_hist.labels(**self.tok).observe(prompt)
        self.uncached_hist.labels(**self.tok).observe(prompt - cached)
        self.generation_hist.labels(**self.tok).observe(completion)

    # -- HTTP ---------------------------------------------------------------------------------------------------------

    def http_begin(self, endpoint: str, method: str) -> None:
        self.http_requests.labels(endpoint=endpoint, method=method).inc()
        self.http_active.labels(endpoint=endpoint, method=method).inc()

    def http_end(self, endpoint: str, method: str, status: int | None) -> None:
        if status is not None:
            self.http_responses.labels(endpoint=endpoint, status_code=str(status), method=method).inc()
        self.http_active.labels(endpoint=endpoint, method=method).dec()

    def set_idle(self, running: int, waiting: int, kv_usage: float) -> None:
        """An engine found idle without a step saying so (its last request aborted): the stale running gauge
        makes SGLang publish at once."""
        if not running and not waiting and not self._idle:
            self._go_idle()

    def render(self) -> bytes:
        if self.engine is not None:
            self.set_idle(len(self.engine.running), len(self.engine.waiting), self.engine.kv_usage)
        self._account(busy=not self._idle)
        now, cpu = self.clock.now(), time.process_time()
        if now - self._cpu[0] >= 5.0:  # cpu_monitor.py's thread adds its process's CPU time every 5 s
            # One process plays them all: its CPU is the tokenizer's; the detokenizer's thread starts too.
            self.process_cpu.labels(component="tokenizer").inc(max(0.0, cpu - self._cpu[1]))
            self.process_cpu.labels(component="detokenizer").inc(0)
            self._cpu = (now, cpu)
        return generate_latest(self._exposition)


class SglangLog(TwinLog):
    """SGLang's lines: `[time] message`, a scheduler's with its ranks (` TP1`
    only when tensor-parallel); uvicorn's as SGLang configures it."""

    ranks = ""  # " PP0 TP1": set by the dialect from the command line

    def engine(self, where: str, message: str) -> None:
        self._write(f"{time.strftime('[%Y-%m-%d %H:%M:%S')}{self.ranks}] {message}")

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        # uvicorn's levelprefix pads the level to eight characters after its colon.
        self._write(f"{time.strftime('[%Y-%m-%d %H:%M:%S]')} {level}:{' ' * (8 - len(level))} {message}")


@dataclass
class _Exchange:
    """One HTTP request as the middleware follows it."""

    stream: bool = False
    logged: bool = False


_EXCHANGE: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar("sglang_exchange", default=None)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _bad_request(message: str) -> web.Response:
    """OpenAIServingBase.create_error_response: SGLang's ErrorResponse, HTTP 400."""
    return error_json(400, {"object": "error", "message": message, "type": "BadRequestError", "param": None,
                            "code": 400})


def _not_found(status: int = 404) -> web.Response:
    """FastAPI's answer for a route it does not have."""
    return web.json_response({"detail": http.HTTPStatus(status).phrase}, status=status)


def _ranks(args: ServeArgs) -> str:
    """The scheduler's log prefix (scheduler.py): ` PP{n}` with pipeline stages, ` TP{n}` only when tp_size > 1."""
    tp, pp, rank = args.tensor_parallel_size, args.pipeline_parallel_size, args.node_rank
    return (f" PP{rank // tp}" if pp > 1 else "") + (f" TP{rank % tp}" if tp > 1 else "")


def decode_graph_sizes(max_bs: int) -> list[int]:
    """cuda_graph_hook.py's generate_decode_cuda_graph_batch_sizes without speculative decoding."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [bs for bs in sizes if bs <= max_bs]
    return sizes if max_bs in sizes else [*sizes, max_bs]


def sglang_error(message: str, mem_fraction: float) -> str:
    """The exception line SGLang prints for a start-up failure the twin words as vLLM does."""
    memory = ("No available memory for the cache blocks", "Free memory on device", "KV cache is needed")
    if any(m in message for m in memory):
        # pool_configurator.py: no room for a single token's KV once the weights are in.
        return ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                f"Current value: mem_fraction_static={mem_fraction}")
    return message  # torch's own words (CUDA out of memory, torch.distributed) are SGLang's too


def _hf_config(server: TwinServer) -> dict[str, Any]:
    """The model's config.json (the card's), as SGLang reads it for its log."""
    try:
        with open(server.card.config_path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _model_class(server: TwinServer) -> str:
    """The class SGLang loads (`type=LlamaForCausalLM`): the config's first architecture."""
    names = _hf_config(server).get("architectures") or []
    return str(names[0]) if names else server.card.architecture


def _quant_str(config: dict[str, Any]) -> str | None:
    """model_config.py's get_quantization_config_log_str: `quant=fp8, fmt=e4m3` for a quantized checkpoint."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    text = f"quant={quant.get('quant_method', 'quantized')}"
    for key in ("bits", "quant_algo", "fmt", "requantization_method"):
        if key in quant:
            text += f", {key}={quant[key]}"
    return text


def _parser(prog: str) -> argparse.ArgumentParser:
    """The flags of SGLang's ServerArgs the twin uses (arg_groups/fields/*.py); the others are accepted."""
    # argparse's abbreviations, as SGLang's parser allows them (`--tp` is `--tp-size` there by abbreviation).
    # Each flag's help is what SGLang's own says it does, shortened.
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=True,
                                description="A twin of SGLang's `python -m sglang.launch_server`: its API, /metrics "
                                            "and log, timed by sparktop's performance model for a GB10. Flags "
                                            "SGLang has that the twin does not model are accepted and ignored.")
    p.add_argument("--model-path", "--model", dest="model_path",
                   help="the model weights: a local folder or a Hugging Face repo id")
    p.add_argument("--served-model-name", help="the model's name in /v1/models (default: the model path)")
    p.add_argument("--tokenizer-path", help="the tokenizer's path (default: the model's)")
    p.add_argument("--host", default=DEFAULT_HOST, help="address the HTTP server listens on (default: %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port of the HTTP server (default: %(default)s)")
    p.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1,
                   help="tensor parallelism: GPUs one model's layers are split over (default: %(default)s)")
    p.add_argument("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1,
                   help="pipeline parallelism: stages the layers are cut into (default: %(default)s)")
    p.add_argument("--dp-size", "--dp", "--data-parallel-size", dest="dp_size", type=int, default=1,
                   help="data parallelism: replicas of the model (default: %(default)s)")
    p.add_argument("--ep-size", "--ep", "--expert-parallel-size", dest="ep_size", type=int, default=1,
                   help="expert parallelism: ranks a MoE model's experts are split over (default: %(default)s)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default: %(default)s)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank among them (default: %(default)s)")
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr",
                   help="HOST:PORT to initialise the distributed backend at (e.g. 192.168.0.2:25000)")
    p.add_argument("--mem-fraction-static", type=float,
                   help="share of GPU memory for static allocation: weights and the KV cache pool")
    p.add_argument("--context-length", type=int, help="the model's longest context (default: its config.json's)")
    p.add_argument("--max-running-requests", type=int, help="most requests running at once")
    p.add_argument("--max-total-tokens", type=int, help="tokens in the KV cache pool (default: computed from memory)")
    p.add_argument("--chunked-prefill-size", type=int,
                   help="most tokens in one chunk of a chunked prefill; -1 turns chunking off")
    p.add_argument("--max-prefill-tokens", type=int, default=MAX_PREFILL_TOKENS,
                   help="most tokens in one prefill batch (default: %(default)s)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="KV cache data type: auto (the model's), fp8_e5m2 or fp8_e4m3 (default: %(default)s)")
    p.add_argument("--quantization", help="the weights' quantization method (e.g. fp8, awq, modelopt_fp4)")
    p.add_argument("--load-format", default="auto",
                   help="how weights load; `dummy` makes random ones (default: %(default)s)")
    p.add_argument("--enable-metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    p.add_argument("--enable-mfu-metrics", action="store_true",
                   help="estimated FLOP and memory-traffic counters in /metrics (with --enable-metrics)")
    p.add_argument("--api-key", help="requests must carry this key (Authorization: Bearer)")
    p.add_argument("--disable-radix-cache", action="store_true", help="no RadixAttention prefix caching")
    p.add_argument("--disable-cuda-graph", action="store_true", help="no CUDA graphs (a slower decode step)")
    p.add_argument("--cuda-graph-backend-decode", choices=["full", "breakable", "disabled"],
                   help="how decode steps are captured as CUDA graphs; `disabled` runs them eagerly")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow custom model code from the Hugging Face Hub")
    p.add_argument("--reasoning-parser", help="split reasoning from the answer (e.g. deepseek-r1, qwen3)")
    p.add_argument("--tool-call-parser", help="parse tool calls out of the output (e.g. llama3, qwen25)")
    p.add_argument("--attention-backend", help="the attention kernels (e.g. flashinfer, triton, fa3)")
    p.add_argument("--log-level", default="info", help="the logging level of all loggers (default: %(default)s)")
    add_twin_flags(p)
    return p


class SglangDialect(Dialect):
    row = engine_ids.get("sglang")
    version = SGLANG_VERSION
    prog = "python -m sglang.launch_server"
    owned_by = "sglang"
    process_name = "sglang::scheduler"  # setproctitle of its scheduler, the process holding the GPU
    log_class = SglangLog
    compiles = False  # torch.compile only with --enable-torch-compile
    completion_max_tokens = COMPLETION_MAX_TOKENS  # protocol.py: a completion's max_tokens defaults to 16

    def __init__(self) -> None:
        self.argv: list[str] = []
        self.up = False  # the warm-up request has finished (ServerStatus.Up)
        self.closing = False  # SIGTERM received: draining

    # -- the `sglang` program ---------------------------------------------------------------------------------------

    def tool_main(self, program: str, argv: list[str], serve: Serve) -> int:
        """`sglang serve ...`; the twin's docker runs `python3 -m sglang.launch_server ...` as it."""
        if argv[:1] != ["serve"]:
            print("usage: sglang serve --model-path MODEL [options]  (sparktop twin)", file=sys.stderr)
            return 2
        return serve(argv[1:])

    # -- the command line -------------------------------------------------------------------------------------------

    def demo_argv(self, image: str, model: str, where: list[str], twin: list[str], root: Path) -> list[str]:
        return ["--entrypoint", "python3", image, "-m", "sglang.launch_server", "--model-path", model,
                "--served-model-name", model, *where, "--enable-metrics", "--mem-fraction-static", "0.7", *twin]

    def parse(self, argv: list[str], prog: str | None = None) -> ServeArgs:
        from sparktop.twin.args import ServeArgs

        self.argv = list(argv)
        if argv and not argv[0].startswith("-"):  # `sglang serve MODEL`: the model as the first argument
            argv = ["--model-path", argv[0], *argv[1:]]
        p = _parser("sglang serve")  # server_args.py names its parser so, whichever command runs it
        ns, extra = p.parse_known_args(argv)
        if not ns.model_path:
            p.error("the following arguments are required: --model-path/--model")
        defaults = vars(p.parse_args(["--model-path", ns.model_path]))
        # What was given, for the dialect's later reads; never the API key (ServeArgs.api_key holds it).
        kept_out = ("speed", "startup_speed", "twin_home", "api_key")
        given = {k: v for k, v in vars(ns).items() if v != defaults.get(k) and k not in kept_out}
        master, _, port = (ns.dist_init_addr or "").rpartition(":")
        eager = ns.disable_cuda_graph or ns.cuda_graph_backend_decode == "disabled"
        chunk = ns.chunked_prefill_size if ns.chunked_prefill_size and ns.chunked_prefill_size > 0 else None
        return ServeArgs(
            model=ns.model_path, host=ns.host, port=ns.port, served_model_name=ns.served_model_name,
            tensor_parallel_size=ns.tp_size, pipeline_parallel_size=ns.pp_size,
            gpu_memory_utilization=ns.mem_fraction_static or DEFAULT_MEM_FRACTION, max_model_len=ns.context_length,
            max_num_batched_tokens=chunk or CHUNKED_PREFILL, kv_cache_dtype=ns.kv_cache_dtype,
            quantization=QUANT_FORMATS.get((ns.quantization or "").lower()),
            enable_prefix_caching=not ns.disable_radix_cache, enforce_eager=eager, load_format=ns.load_format,
            nnodes=ns.nnodes, node_rank=ns.node_rank, master_addr=master or "127.0.0.1",
            master_port=int(port) if port.isdigit() else 29501, headless=ns.node_rank > 0,
            api_key=ns.api_key or None, tokenizer=ns.tokenizer_path, reasoning_parser=ns.reasoning_parser,
            enable_mfu_metrics=ns.enable_mfu_metrics and ns.enable_metrics,
            extra=extra, given=given, **self._running(ns), **twin_settings(ns))

    @staticmethod
    def _running(ns: argparse.Namespace) -> dict[str, Any]:
        # Without --max-running-requests SGLang derives it from the pool; the twin keeps its own default.
        return {"max_num_seqs": ns.max_running_requests} if ns.max_running_requests else {}

    # -- what the command line said (kept in ServeArgs.given, so any instance reads it) ----------------------------

    @staticmethod
    def metrics_on(server: TwinServer) -> bool:
        return bool(server.args.given.get("enable_metrics"))

    @staticmethod
    def _graph_bs(server: TwinServer) -> int:
        """The decode graphs' largest batch: 256 below tp 4 on a GB10, capped by --max-running-requests."""
        limit = 256 if server.args.tensor_parallel_size < 4 else 512
        running = server.args.given.get("max_running_requests")
        return min(limit, running) if isinstance(running, int) else limit

    def _resolved(self, server: TwinServer) -> dict[str, Any]:
        """ServerArgs.resolved_dict(): the fields a client reads, resolved as SGLang resolves them."""
        a, g = server.args, server.args.given
        return {
            "model_path": a.model, "tokenizer_path": a.tokenizer or a.model, "tokenizer_mode": "auto",
            "load_format": a.load_format, "trust_remote_code": bool(g.get("trust_remote_code")),
            # Stays null unless given: the effective length is /v1/models' max_model_len.
            "context_length": g.get("context_length"), "is_embedding": False, "dtype": "auto",
            "quantization": g.get("quantization"), "kv_cache_dtype": a.kv_cache_dtype, "host": a.host,
            "port": server.port or a.port, "served_model_name": a.name,
            # SGLang returns the API key itself here; the twin never shows a secret.
            "api_key": None, "admin_api_key": None,
            "mem_fraction_static": a.gpu_memory_utilization, "max_running_requests": g.get("max_running_requests"),
            "max_queued_requests": None, "max_total_tokens": g.get("max_total_tokens"),
            "chunked_prefill_size": a.max_num_batched_tokens or CHUNKED_PREFILL,
            "max_prefill_tokens": g.get("max_prefill_tokens", MAX_PREFILL_TOKENS), "schedule_policy": "fcfs",
            "schedule_conservativeness": 1.0, "page_size": 1, "disable_radix_cache": not a.enable_prefix_caching,
            "device": "cuda", "tp_size": a.tensor_parallel_size, "pp_size": a.pipeline_parallel_size,
            "dp_size": g.get("dp_size", 1), "ep_size": g.get("ep_size", 1), "nnodes": a.nnodes,
            "node_rank": a.node_rank, "dist_init_addr": g.get("dist_init_addr"),
            "attention_backend": g.get("attention_backend"), "reasoning_parser": a.reasoning_parser,
            "tool_call_parser": g.get("tool_call_parser"), "speculative_algorithm": None, "enable_lora": False,
            "disaggregation_mode": "null", "enable_metrics": self.metrics_on(server),
            "enable_mfu_metrics": a.enable_mfu_metrics, "decode_log_interval": DECODE_LOG_INTERVAL,
            "log_level": g.get("log_level", "info"), "stream_interval": 1, "weight_version": "default",
        }

    def _launch_command(self) -> str | None:
        """server_args.py's launch_command: the arguments as given, joined by spaces (SGLang redacts only its
        watermark key, with `<redacted>`; the twin redacts the API key the same way)."""
        if not self.argv:
            return None
        argv, hidden = [], False
        for arg in self.argv:
            if arg.startswith("--api-key="):
                arg = "--api-key=<redacted>"
            argv.append("<redacted>" if hidden else arg)
            hidden = arg == "--api-key"
        return " ".join(argv)

    # -- start-up, in SGLang's words ----------------------------------------------------------------------------------

    def kv_tokens(self, server: TwinServer, plan: StartupPlan) -> int | None:
        tokens = server.args.given.get("max_total_tokens")
        return tokens if isinstance(tokens, int) and tokens > 0 else None

    def begin(self, server: TwinServer) -> None:
        if isinstance(server.log, SglangLog):
            server.log.ranks = _ranks(server.args)
        server.log.info("", f"server_args={self._resolved(server)!r}")

    def _avail_gib(self, server: TwinServer) -> float:
        """What CUDA reports free before loading: the node's memory less the OS's and other processes'."""
        from sparktop.twin.host import BASE_USED_KB

        assert server.plan is not None, "asked once the plan is made"
        other = server.host.used_mib(exclude_pid=os.getpid()) / 1024 if server.host else 0.0
        return server.plan.perf.hw.memory_gib - BASE_USED_KB / 1024**2 - other

    def planned(self, server: TwinServer, plan: StartupPlan) -> None:
        server.log.engine("", "Init parallel begin.")

    def loading(self, server: TwinServer) -> None:
        # After the other nodes have joined, when there are any (bootstrap.py, then model_runner.py).
        server.log.engine("", f"Init parallel ends. elapsed={INIT_PARALLEL_S:.2f} s")
        server.log.engine("", "Memory baseline taken. mem usage=0.00 GB")
        server.log.engine("", f"Load weight begin. avail mem={self._avail_gib(server):.2f} GB")

    def loaded(self, server: TwinServer, weights_gib: float, seconds: float, total: float) -> None:
        avail = self._avail_gib(server) - weights_gib
        quant = _quant_str(_hf_config(server))
        quant = f"{quant}, " if quant else ""
        server.log.engine("", f"Load weight end. elapsed={seconds:.2f} s, type={_model_class(server)}, {quant}"
                              f"avail mem={avail:.2f} GB, mem usage={weights_gib:.2f} GB.")

    def _kv_gib(self, server: TwinServer, tokens: int) -> float:
        assert server.plan is not None, "asked once the plan is made"
        return tokens * server.plan.perf.kv_bytes_per_token / 1024**3

    def _after_kv_gib(self, server: TwinServer) -> float:
        assert server.plan is not None and server.engine is not None, "asked once the KV cache is sized"
        weights = server.plan.perf.weights_bytes_per_node / 1024**3
        return self._avail_gib(server) - weights - self._kv_gib(server, server.engine.kv_capacity_tokens)

    def kv_sized(self, server: TwinServer, tokens: int, max_len: int, concurrency: float) -> None:
        metrics = server.metrics
        if isinstance(metrics, SglangMetrics):
            metrics.engine = server.engine
        dtype = KV_DTYPES.get(server.args.kv_cache_dtype, "torch.bfloat16")
        half = self._kv_gib(server, tokens) / 2
        server.log.engine("", f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, K size: {half:.2f} GB, "
                              f"V size: {half:.2f} GB")
        server.log.engine("", f"Memory pool end. avail mem={self._after_kv_gib(server):.2f} GB")

    def capturing(self, server: TwinServer) -> None:
        server.log.engine("", f"Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
                              f"avail mem={self._after_kv_gib(server):.2f} GB")

    def captured(self, server: TwinServer, seconds: float, init_seconds: float) -> None:
        assert server.plan is not None and server.engine is not None, "captured after the KV cache is sized"
        graph = GRAPH_GIB if seconds else 0.0
        avail = self._after_kv_gib(server) - graph
        if seconds:
            sizes = decode_graph_sizes(self._graph_bs(server))
            server.log.engine("", f"Capture target decode CUDA graph end. bs={sizes}, elapsed={seconds:.2f} s, "
                                  f"mem usage={graph:.2f} GB, avail mem={avail:.2f} GB.")
        tokens, plan = server.engine.kv_capacity_tokens, server.plan
        prefill = server.args.given.get("max_prefill_tokens", MAX_PREFILL_TOKENS)
        server.log.engine("", f"max_total_num_tokens={tokens}, chunked_prefill_size={plan.max_num_batched_tokens}, "
                              f"max_prefill_tokens={prefill}, max_running_requests={server.args.max_num_seqs}, "
                              f"context_len={plan.max_model_len}, available_gpu_mem={avail:.2f} GB")
        if isinstance(server.metrics, SglangMetrics):
            server.metrics.emit_constants(tokens, server.plan.perf.weights_bytes_per_node / 1024**3,
                                          self._kv_gib(server, tokens), graph, avail)

    def _startup_times(self, server: TwinServer) -> dict[str, float]:
        """engine.py's startup timings, from the stages the twin modeled."""
        assert server.plan is not None, "asked once the plan is made"
        stages = self.startup_stages(server.plan, server.args.load_format)
        scheduler = sum(v for k, v in stages.items() if k != "api server")
        return {"load_weight": stages["loading weights"], "kv_cache_allocation": stages["memory profiling"],
                "scheduler_e2e": scheduler, "tokenizer_e2e": scheduler + stages["api server"],
                "graph": stages.get("graph capture", 0.0)}

    def serving(self, server: TwinServer) -> None:
        times = self._startup_times(server)
        graphs = ", ".join(f"{p}={times['graph'] if p == 'decode' else 0.0:.2f}" for p in GRAPH_PHASES)
        server.log.info("", f"Engine startup timings (s): load_weight={times['load_weight']:.2f}, "
                            f"kv_cache_allocation={times['kv_cache_allocation']:.2f}, "
                            f"scheduler_e2e={times['scheduler_e2e']:.2f}, cuda_graph={{{graphs}}}, "
                            f"tokenizer_e2e={times['tokenizer_e2e']:.2f}")
        if isinstance(server.metrics, SglangMetrics):
            server.metrics.emit_startup_time(times, times["graph"])
        log = server.log
        assert isinstance(log, SglangLog)
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        log.uvicorn(f"Uvicorn running on http://{server.args.host}:{server.port} (Press CTRL+C to quit)")

    def ready(self, server: TwinServer) -> None:
        """The warm-up request (http_server.py's _wait_and_warmup), then the line that says it is up."""
        server._tasks.append(asyncio.get_running_loop().create_task(self._warm_up(server), name="sglang-warmup"))

    async def _warm_up(self, server: TwinServer) -> None:
        from sparktop.twin.engine import FinishEvent, Sequence

        assert server.engine is not None, "the warm-up runs once the engine does"
        peer = f"127.0.0.1:{random.randint(32768, 60999)}"
        self._internal(server, "GET", "/model_info", peer)
        received = server.clock.now()  # its POST /generate goes through the API server as any request does
        seq = Sequence(request_id=f"warmup-{os.getpid()}-{id(server)}",
                       prompt_ids=[1, *server.tokenizer.encode(WARMUP_TEXT)], max_tokens=WARMUP_TOKENS)
        await server._charge_api(received)
        server.engine.submit(seq)
        while not isinstance(await seq.events.get(), FinishEvent):
            pass
        if isinstance(server.metrics, SglangMetrics):
            server.metrics.claim(seq.request_id, streaming=False)
        self._internal(server, "POST", "/generate", peer)
        self.up = True
        server.log.info("", "The server is fired up and ready to roll!")

    def _internal(self, server: TwinServer, method: str, path: str, peer: str) -> None:
        """A request the server makes to itself: counted and logged as any other."""
        metrics = server.metrics
        if self.metrics_on(server) and isinstance(metrics, SglangMetrics):
            metrics.http_begin(path, method)
            metrics.http_end(path, method, 200)
        self._access_line(server, peer, method, path, 200)

    def stats(self, server: TwinServer, prompt_tps: float, gen_tps: float, running: int, waiting: int,
              kv: float) -> None:
        engine = server.engine
        used = int(round(kv * engine.kv_capacity_tokens)) if engine is not None else 0
        graph = not server.args.enforce_eager and running <= self._graph_bs(server)
        server.log.engine("", f"Decode batch, #running-req: {running}, #token: {used}, token usage: {kv:.2f}, "
                              f"cuda graph: {graph}, gen throughput (token/s): {gen_tps:.2f}, #queue-req: {waiting}")

    def start_failed(self, server: TwinServer, message: str) -> None:
        # The scheduler dies with its traceback; the launcher learns it from the SIGQUIT it sends.
        server.log.engine("", "Scheduler hit an exception: Traceback (most recent call last):")
        server.log.raw(sglang_error(message, server.args.gpu_memory_utilization))
        server.log.info("", "Received sigquit from a child process. It usually means the child failed.")

    def died(self, server: TwinServer, message: str) -> None:
        line = message if ": " in message and message.split(": ", 1)[0].endswith(("Error", "Exception")) \
            else f"RuntimeError: {message}"
        server.log.engine("", "Scheduler hit an exception: Traceback (most recent call last):")
        server.log.raw(line)
        server.log.error("", "SIGQUIT received. signum=None, frame=None. It usually means one child failed.")

    def stopping(self, server: TwinServer) -> None:
        if server.failure:
            return  # after SIGQUIT it kills its own process tree: uvicorn says nothing more
        self.closing = True
        log = server.log
        assert isinstance(log, SglangLog)
        log.warning("", "SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        log.uvicorn("Shutting down")
        log.uvicorn("Waiting for application shutdown.")
        log.uvicorn("Application shutdown complete.")
        log.uvicorn(f"Finished server process [{os.getpid()}]")

    # -- the HTTP server ---------------------------------------------------------------------------------------------

    def access(self, server: TwinServer, request: web.Request, status: int) -> None:
        exchange = _EXCHANGE.get()
        if exchange is not None:
            if exchange.logged:
                return
            exchange.logged = True
        self._access_line(server, self._peer(request), request.method, request.path_qs, status)

    @staticmethod
    def _peer(request: web.Request) -> str:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else (request.remote or "-")

    def _access_line(self, server: TwinServer, peer: str, method: str, path: str, status: int) -> None:
        log = server.log
        if isinstance(log, SglangLog):
            try:
                phrase = http.HTTPStatus(status).phrase
            except ValueError:
                phrase = ""
            log.uvicorn(f'{peer} - "{method} {path} HTTP/1.1" {status} {phrase}'.rstrip())

    def routes(self, app: web.Application, server: TwinServer) -> None:
        @web.middleware
        async def through(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await self._through(request, handler)

        app.middlewares.append(through)
        app.router.add_get("/", self._root)
        for path in ("/health", "/health_generate"):
            app.router.add_get(path, self.health)
        app.router.add_get("/ping", self._ready)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/get_server_info", self._server_info)
        if self.metrics_on(server):
            app.router.add_get("/metrics", self._metrics)

    async def _through(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """What SGLang's middlewares do around every route: the API key, the HTTP metrics, FastAPI's 404."""
        server = request.app[TWIN]
        key = server.args.api_key
        if key and not request.path.startswith(OPEN_PATHS) and \
                request.headers.get("Authorization", "") != f"Bearer {key}":
            self._access_line(server, self._peer(request), request.method, request.path_qs, 401)
            return web.json_response({"error": "Unauthorized"}, status=401)
        metrics = server.metrics if self.metrics_on(server) and isinstance(server.metrics, SglangMetrics) else None
        route = request.match_info.route
        endpoint = route.resource.canonical if route is not None and route.resource is not None else request.path
        exchange = _Exchange()
        token = _EXCHANGE.set(exchange)
        status: int | None = None
        if metrics is not None:
            metrics.http_begin(endpoint, request.method)
        try:
            response = await self._answer(server, request, handler, exchange)
            status = response.status
            return response
        finally:
            if metrics is not None:
                metrics.http_end(endpoint, request.method, status)
            if status is not None and not exchange.logged:
                self._access_line(server, self._peer(request), request.method, request.path_qs, status)
            _EXCHANGE.reset(token)

    async def _answer(self, server: TwinServer, request: web.Request, handler: Handler,
                      exchange: _Exchange) -> web.StreamResponse:
        generation = request.method == "POST" and request.path in GENERATION_ROUTES
        if generation:
            refused = await self._validate(server, request, exchange)
            if refused is not None:
                return refused
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status in (404, 405):
                return _not_found(exc.status)
            raise
        if generation and not exchange.stream and response.status == 200 and isinstance(response, web.Response):
            self._claim_from_body(server, response)
        return response

    @staticmethod
    def _claim_from_body(server: TwinServer, response: web.Response) -> None:
        """A request answered whole: its id says which finished request it was."""
        raw = response.body
        if not isinstance(raw, bytes | bytearray):
            return
        with contextlib.suppress(ValueError):
            body = json.loads(raw)
            if isinstance(server.metrics, SglangMetrics) and isinstance(body, dict) and body.get("id"):
                server.metrics.claim(str(body["id"]), streaming=False)

    async def _validate(self, server: TwinServer, request: web.Request, exchange: _Exchange) -> web.Response | None:
        """tokenizer_manager.py's length checks, before the request reaches the engine: a prompt as long as the
        context or longer (`>=`), or a prompt and max_tokens that do not fit together."""
        try:
            body = await request.json()  # aiohttp keeps the body: the handler reads it again
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(body, dict) or server.plan is None:
            return None
        exchange.stream = bool(body.get("stream", False))
        chat = request.path == "/v1/chat/completions"
        context = server.plan.max_model_len
        # protocol.py: a chat's limit is max_completion_tokens (or the deprecated max_tokens); a completion's
        # max_tokens defaults to 16.
        requested = (body.get("max_completion_tokens") or body.get("max_tokens")) if chat \
            else body.get("max_tokens", COMPLETION_MAX_TOKENS)
        if not isinstance(requested, int) or isinstance(requested, bool):
            requested = None
        given_context = server.args.given.get("context_length")
        if chat and requested is not None and given_context and requested > context:
            return _bad_request(f"max_completion_tokens is too large: {requested}.This model supports at most "
                                f"{context} completion tokens.")
        prompt = server._prompt(body, chat)  # the tokens the handler will count, counted the same way
        if isinstance(prompt, web.Response):
            return None  # the handler words that error
        count = len(prompt[0])
        if count >= context:
            return self.too_long(server, count, context, prompt[1])
        if requested is not None and requested + count > context:
            return _bad_request(f"Requested token count exceeds the model's maximum context length of {context} "
                                f"tokens. You requested a total of {requested + count} tokens: {count} tokens from "
                                f"the input messages and {requested} tokens for the completion. Please reduce the "
                                "number of tokens in the input messages or the completion to fit within the limit.")
        return None

    # -- routes -----------------------------------------------------------------------------------------------------

    async def _root(self, request: web.Request) -> web.Response:
        return web.json_response("SGLang is running")  # FastAPI returns the string as JSON

    def _healthy(self, server: TwinServer) -> bool:
        """ServerStatus.Up after the warm-up, not failed, not draining."""
        return not server.failure and self.up and not self.closing

    async def health(self, request: web.Request) -> web.Response:
        """/health runs a one-token generation after a second's sleep: 503 while starting or failed."""
        server = request.app[TWIN]
        if not self._healthy(server):
            return web.Response(status=503)
        await asyncio.sleep(HEALTH_SECONDS / max(server.speed, 1e-9))
        return web.Response(status=200 if self._healthy(server) else 503)

    async def _ready(self, request: web.Request) -> web.Response:
        """/ready and /ping: tokenizer_manager.is_ready / is_healthy, a flag (nothing paused in the twin)."""
        return web.Response(status=200 if self._healthy(request.app[TWIN]) else 503)

    async def _model_info(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        if request.path == "/get_model_info":
            server.log.warning("", "Endpoint '/get_model_info' is deprecated and will be removed in a future "
                                   "version. Please use '/model_info' instead.")
        a = server.args
        return web.json_response({
            "model_path": a.model, "served_model_name": a.name, "tokenizer_path": a.tokenizer or a.model,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
            "load_format": a.load_format, "reasoning_parser": a.reasoning_parser,
            "tool_call_parser": a.given.get("tool_call_parser"), "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": _hf_config(server).get("model_type"),
            "architectures": _hf_config(server).get("architectures") or [_model_class(server)]})

    def server_info(self, server: TwinServer) -> dict[str, Any]:
        """/server_info: the resolved arguments, the scheduler's info, the version (build_server_info)."""
        assert server.plan is not None and server.engine is not None, "the API server starts after the engine"
        resolved = self._resolved(server)
        tokens = server.engine.kv_capacity_tokens
        times = self._startup_times(server)
        startup: dict[str, Any] = {k: times[k] for k in STARTUP_PHASES}
        startup["cuda_graph"] = {p: times["graph"] if p == "decode" else 0.0 for p in GRAPH_PHASES}
        metrics = server.metrics if isinstance(server.metrics, SglangMetrics) else None
        internal = {**resolved, "world_size": server.args.world_size, "startup_time": startup,
                    "effective_max_running_requests_per_dp": server.args.max_num_seqs,
                    "last_gen_throughput": metrics._gen_throughput if metrics else 0.0,
                    "memory_usage": {"weight": round(server.plan.perf.weights_bytes_per_node / 1024**3, 2),
                                     "kvcache": round(self._kv_gib(server, tokens), 2),
                                     "token_capacity": tokens, "graph": {"decode": GRAPH_GIB}},
                    "disaggregation_mode": "null",
                    "decode_cuda_graph_bs": decode_graph_sizes(self._graph_bs(server))}
        return {**resolved, "launch_command": self._launch_command(), "status": "ready",
                "max_total_num_tokens": tokens, "max_req_input_len": min(server.plan.max_model_len, tokens) - 1,
                "kv_events": None, "startup_time": startup, "internal_states": [internal],
                "version": SGLANG_VERSION, "frontend": "python"}

    async def _server_info(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        if request.path == "/get_server_info":
            server.log.warning("", "Endpoint '/get_server_info' is deprecated and will be removed in a future "
                                   "version. Please use '/server_info' instead.")
        return web.json_response(self.server_info(server))

    async def _metrics(self, request: web.Request) -> web.Response:
        metrics = request.app[TWIN].metrics
        return web.Response(body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    # -- serving ------------------------------------------------------------------------------------------------------

    def metrics(self, server: TwinServer, plan: StartupPlan) -> TwinMetrics:
        return SglangMetrics(server.args.name, plan.max_model_len, server.log, graphs=not server.args.enforce_eager,
                             max_graph_bs=self._graph_bs(server), clock=server.clock)

    def model_card(self, server: TwinServer) -> dict[str, Any]:
        """protocol.py's ModelCard: the served name as id and root, the effective context length."""
        assert server.plan is not None, "the API server starts after the plan"
        name = server.args.name
        return {"id": name, "object": "model", "created": int(server.clock.wall()), "owned_by": "sglang", "root": name,
                "parent": None, "max_model_len": server.plan.max_model_len}

    def too_long(self, server: TwinServer, prompt: int, max_len: int, from_text: bool) -> web.Response:
        return _bad_request(f"The input ({prompt} tokens) is longer than the model's context length ({max_len} "
                            "tokens).")

    def unknown_model(self, server: TwinServer, model: str) -> web.Response | None:
        return None  # the request's `model` is echoed, never checked against the served name

    # A parameter out of range and a body its schema refuses: the words the twin's OpenAI routes have always
    # answered with (vLLM's; SGLang's own are not imitated).

    def invalid(self, message: str, param: str, value: object) -> web.Response:
        return parameter_error(message, param, value)

    def unparsable(self, loc: str, kind: str, msg: str, value: object, ctx: dict | None = None) -> web.Response:
        return validation_error(loc, kind, msg, value, ctx)

    def usage_extra(self, server: TwinServer) -> dict[str, Any]:
        return {"reasoning_tokens": 0}  # UsageInfo's own field, beside OpenAI's

    def final_chunk_extra(self, server: TwinServer, seq: Any, completion: int) -> dict[str, Any]:
        # A stream's last chunk: the request streamed, so its tokenizer figures count now, as `is_streaming`.
        exchange = _EXCHANGE.get()
        if exchange is not None:
            exchange.stream = True
        if isinstance(server.metrics, SglangMetrics):
            server.metrics.claim(seq.request_id, streaming=True)
        return {}
