"""The vLLM dialect's /metrics: vLLM 0.32's metric names, types, labels and buckets.

Built with prometheus-client, as vLLM is, in a registry of its own so that
several twins can live in one process (tests). Counters are declared without
the `_total` suffix; prometheus-client adds `_total` and `_created` exactly
as it does for vLLM. Every `vllm:` family a real vLLM 0.32 exports for a
text model (`tests/fixtures/vllm-0.32.0/metrics-after.txt`) is here, with
its labels and, for labelled families, the same label values pre-created so
that an idle twin shows the same series an idle vLLM does.

The figures follow the twin's simulation, with vLLM's definitions
(`vllm/v1/metrics/loggers.py`):

- waiting by reason: `capacity` is every queued request (the twin's queue
  waits only for scheduling capacity); `deferred` (LoRA budget, KV
  transfer) is always 0, the twin having none of those;
- prompt tokens by source: counted when a request's prefill completes,
  split into computed and prefix-cache hits as the twin's prefix cache
  reports them; `external_kv_transfer` is 0 (no KV connector);
- `prompt_tokens_cached_by_source{source="device"}` counts the prefix-cache
  hits at admission, as `prefix_cache_hits` does;
- `iteration_tokens_total` observes, per step, the prompt tokens computed by
  prefills that completed plus the tokens generated (vLLM's definition, not
  the tokens scheduled);
- estimated FLOPs and bytes per GPU: from the performance model's account of
  each step (`engine.step_traffic`), only with `--enable-mfu-metrics`;
- the sleep state and admission rejections: set by the vLLM dialect's sleep
  routes and admission check (`dialects/vllm.py`), as vLLM's AsyncLLM sets
  them; the cache config's info by its start-up, from the KV cache the twin
  sized.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from sparktop.twin.dialects.base import TwinMetrics

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
REQUEST_PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]
REQUEST_PREEMPTIONS_BUCKETS = [1, 2, 3, 4, 5, 10, 20]
SLEEP_OPERATION_BUCKETS = [0.01, 0.1, 1, 10, 30, 60, 120, 300, 600]

# Label values vLLM 0.32 creates up front (so they show at 0 before use).
WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")

# vLLM 0.32's CacheConfig.metrics_info() for a plain-attention model with the
# default settings (the fixture's values); the twin overrides what it sizes.
CACHE_CONFIG_DEFAULTS = {
    "_block_size_resolved": "True", "block_size": "16", "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None", "effective_attention_block_size": "16",
    "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.9", "hash_block_size": "None", "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None", "kv_cache_max_concurrency": "None",
    "kv_cache_memory_bytes": "None", "kv_cache_size_tokens": "None", "kv_offloading_backend": "native",
    "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
    "mamba_cache_dtype": "auto", "mamba_cache_mode": "none", "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32", "num_cpu_blocks": "None", "num_gpu_blocks": "None",
    "num_gpu_blocks_override": "None", "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256", "prefix_match_unit": "None", "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None", "sliding_window": "None", "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False", "use_replayssm": "False", "user_specified_block_size": "False",
}


def buckets_1_2_5(maximum: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `maximum` (vLLM's build_1_2_5_buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > maximum:
                return out
            out.append(value)
        exponent += 1


class VllmMetrics(TwinMetrics):
    """Engine metrics as vLLM exports them; also the engine's MetricsSink."""

    def __init__(self, model_name: str, max_model_len: int, engine: str = "0"):
        self.registry = CollectorRegistry(auto_describe=True)
        # vLLM exports through prometheus-client's default registry, which
        # also holds the process, platform and garbage-collector figures.
        for collector in (GCCollector, PlatformCollector, ProcessCollector):
            collector(registry=self.registry)
        self.engine = engine
        self._recent_prefix: deque[tuple[int, int]] = deque(maxlen=1000)  # (queries, hits) per admitted request
        self._labels = ["model_name", "engine"]
        self._values = (model_name, engine)
        self._model_name = model_name
        # Prompt tokens of the prefills completed in the current step, until
        # on_step counts them: (computed, cached).
        self._step_prompt = [0, 0]
        self._sleep_ops: tuple[Histogram, Gauge] | None = None
        self._token_buckets = buckets_1_2_5(max_model_len)
        self._scheduler_state()
        self._cache_counters()
        self._token_counters()
        self._request_histograms(self._token_buckets)
        self._timing_histograms()

    # -- declaration ------------------------------------------------------------

    def _gauge(self, name: str, doc: str):
        return Gauge(name, doc, self._labels, registry=self.registry).labels(*self._values)

    def _counter(self, name: str, doc: str):
        return Counter(name, doc, self._labels, registry=self.registry).labels(*self._values)

    def _histogram(self, name: str, doc: str, buckets):
        return Histogram(name, doc, self._labels, buckets=buckets, registry=self.registry).labels(*self._values)

    def _by(self, kind, name: str, doc: str, label: str, values: tuple[str, ...]) -> dict:
        """One series per value of an extra label, all created up front."""
        family = kind(name, doc, self._labels + [label], registry=self.registry)
        return {value: family.labels(*self._values, value) for value in values}

    def _scheduler_state(self) -> None:
        # Estimated FLOPs and bytes come first in vLLM's output (PerfMetricsProm).
        mfu = "(for Model Flops Utilization calculations)."
        self.est_flops = self._counter("vllm:estimated_flops_per_gpu",
                                       f"Estimated number of floating point operations per GPU {mfu}")
        self.est_read = self._counter("vllm:estimated_read_bytes_per_gpu",
                                      f"Estimated number of bytes read from memory per GPU {mfu}")
        self.est_write = self._counter("vllm:estimated_write_bytes_per_gpu",
                                       f"Estimated number of bytes written to memory per GPU {mfu}")
        self.running = self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = self._by(
            Gauge, "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.", "reason", WAITING_REASONS)
        self.sleep_state = self._by(
            Gauge, "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            "sleep_state", SLEEP_STATES)
        self.record_sleep_state(False, 0)
        self.kv_usage = self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")

    def _cache_counters(self) -> None:
        self.prefix_queries = self._counter("vllm:prefix_cache_queries",
                                            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = self._counter("vllm:prefix_cache_hits",
                                         "Prefix cache hits, in terms of number of cached tokens.")
        # No KV connector and no multi-modal input in the twin: these stay at 0.
        self._counter("vllm:external_prefix_cache_queries",
                      "External prefix cache queries from KV connector cross-instance cache sharing, "
                      "in terms of number of queried tokens.")
        self._counter("vllm:external_prefix_cache_hits",
                      "External prefix cache hits from KV connector cross-instance cache sharing, "
                      "in terms of number of cached tokens.")
        self._counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.")
        self._counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")

    def _token_counters(self) -> None:
        self.preemptions = self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = self._by(Counter, "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                         "source", PROMPT_SOURCES)
        self.prompt_cached = self._counter("vllm:prompt_tokens_cached",
                                           "Number of cached prompt tokens (local + external).")
        self.cached_by_source = self._by(
            Counter, "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
            "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            "source", CACHE_HIT_SOURCES)
        self.generation_tokens = self._counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = self._by(Counter, "vllm:request_success", "Count of successfully processed requests.",
                                "finished_reason", FINISH_REASONS)
        # One counter per API server, so no `engine` label.
        rejections = Counter("vllm:admission_rejections",
                             "Number of admission attempts rejected by a queue limit, by reason.",
                             ["model_name", "reason"], registry=self.registry)
        self.rejections = {reason: rejections.labels(self._model_name, reason) for reason in ADMISSION_REASONS}

    def _request_histograms(self, token_buckets: list[int]) -> None:
        h = self._histogram
        self.req_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets)
        self.req_generation = h("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                token_buckets)
        self.iteration_tokens = h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                  ITERATION_TOKEN_BUCKETS)
        self.max_generation = h("vllm:request_max_num_generation_tokens",
                                "Histogram of maximum number of requested generation tokens.", token_buckets)
        self.params_n = h("vllm:request_params_n", "Histogram of the n request parameter.", REQUEST_PARAMS_N_BUCKETS)
        self.max_tokens_param = h("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
                                  token_buckets)

    def _timing_histograms(self) -> None:
        h = self._histogram
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      TTFT_BUCKETS)
        self.itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = h("vllm:request_time_per_output_token_seconds",
                      "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                     REQUEST_LATENCY_BUCKETS)
        self.queue_time = h("vllm:request_queue_time_seconds",
                            "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference_time = h("vllm:request_inference_time_seconds",
                                "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill_time = h("vllm:request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode_time = h("vllm:request_decode_time_seconds",
                             "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.req_preemptions = h("vllm:request_num_preemptions",
                                 "Histogram of the number of times a request was preempted.",
                                 REQUEST_PREEMPTIONS_BUCKETS)
        self.prefill_kv_computed = h("vllm:request_prefill_kv_computed_tokens",
                                     "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                                     self._token_buckets)

    def log_cache_config(self, info: dict[str, str]) -> None:
        """`vllm:cache_config_info`, set once the KV cache is sized (vLLM's
        log_engine_initialized): vLLM's labels, the twin's values."""
        labels = {**CACHE_CONFIG_DEFAULTS, **info, "engine": self.engine}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", sorted(labels),
              registry=self.registry).labels(**labels).set(1)

    # -- MetricsSink ----------------------------------------------------------

    def on_step(self, *, prompt_tokens, generation_tokens, preemptions, running, waiting, kv_usage,
                iteration_tokens):
        self.set_idle(running, waiting, kv_usage)
        if preemptions:
            self.preemptions.inc(preemptions)
        computed, cached = self._step_prompt
        self._step_prompt = [0, 0]
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)
            self.prompt_by_source["local_compute"].inc(computed)
            self.prompt_by_source["local_cache_hit"].inc(cached)
            self.prompt_cached.inc(cached)
        if generation_tokens:
            self.generation_tokens.inc(generation_tokens)
        # vLLM observes an iteration when it has outputs; a step that only
        # advanced a prefill chunk has none.
        if computed or generation_tokens:
            self.iteration_tokens.observe(computed + generation_tokens)

    @property
    def prefix_hit_rate(self) -> float | None:
        """The log line's "Prefix cache hit rate": hits over queries of the last 1,000 requests
        (`CachingMetrics` in vllm/v1/metrics/stats.py); None before the first, when vLLM leaves it out."""
        recent = self._recent_prefix
        if not recent:
            return None
        queries = sum(q for q, _ in recent)
        return sum(h for _, h in recent) / queries if queries else 0.0

    def on_prefix(self, *, queries, hits):
        self._recent_prefix.append((queries, hits))
        self.prefix_queries.inc(queries)
        if hits:
            self.prefix_hits.inc(hits)
            self.cached_by_source["device"].inc(hits)

    def on_first_token(self, seq, ttft, queue_time):
        self.ttft.observe(ttft)
        # The prefill is complete: its prompt counts by source in this step.
        self._step_prompt[0] += seq.prompt_len - seq.cached_tokens
        self._step_prompt[1] += seq.cached_tokens

    def on_token_gap(self, gap):
        self.itl.observe(gap)

    def on_finish(self, seq, reason, now):
        if reason in self.success:
            self.success[reason].inc()
        if reason == "error":
            return
        self.e2e.observe(now - seq.arrival)
        self.req_prompt.observe(seq.prompt_len)
        self.req_generation.observe(seq.output_count)
        self.max_tokens_param.observe(seq.max_tokens)
        self.max_generation.observe(seq.output_count)  # the longest of n = 1 sequence
        self.params_n.observe(1)  # the twin serves n = 1
        self.req_preemptions.observe(seq.preemptions)
        self.prefill_kv_computed.observe(seq.prompt_len - seq.cached_tokens)
        if seq.first_scheduled is not None:
            self.queue_time.observe(seq.first_scheduled - seq.arrival)
            self.inference_time.observe(now - seq.first_scheduled)
            if seq.first_token_t is not None:
                self.prefill_time.observe(seq.first_token_t - seq.first_scheduled)
                self.decode_time.observe(now - seq.first_token_t)
                # vLLM observes every finished request, 0 when one token or none.
                gaps = seq.output_count - 1
                self.tpot.observe((now - seq.first_token_t) / gaps if gaps > 0 else 0.0)

    # -- what the engine loop and the API server report --------------------------

    def on_traffic(self, flops: float, read_bytes: float, write_bytes: float) -> None:
        """One step's estimated work per GPU (`--enable-mfu-metrics`)."""
        self.est_flops.inc(flops)
        self.est_read.inc(read_bytes)
        self.est_write.inc(write_bytes)

    def record_sleep_state(self, sleeping: bool, level: int) -> None:
        """vLLM's record_sleep_state: level 1 offloads weights, level 2 discards
        everything; level 0 only pauses scheduling (neither is set)."""
        self.sleep_state["awake"].set(0 if sleeping else 1)
        self.sleep_state["weights_offloaded"].set(1 if sleeping and level == 1 else 0)
        self.sleep_state["discard_all"].set(1 if sleeping and level == 2 else 0)

    @contextlib.contextmanager
    def sleep_operation(self, operation: str) -> Iterator[None]:
        """vLLM's sleep-mode operation metrics (sleep, wake), which its API
        server registers on the first operation: in flight while it runs,
        then its duration."""
        if self._sleep_ops is None:
            self._sleep_ops = (
                Histogram("vllm:sleep_mode_operation_duration_seconds", "Duration of one sleep-mode operation.",
                          ["operation"], buckets=SLEEP_OPERATION_BUCKETS, registry=self.registry),
                Gauge("vllm:sleep_mode_operations_in_flight", "Sleep-mode operations currently awaited.",
                      ["operation"], registry=self.registry),
            )
        duration, in_flight = self._sleep_ops
        started = time.perf_counter()
        in_flight.labels(operation).inc()
        try:
            yield
        finally:
            in_flight.labels(operation).dec()
            duration.labels(operation).observe(time.perf_counter() - started)

    def record_admission_rejection(self, reason: str) -> None:
        self.rejections[reason].inc()

    def set_idle(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        # Every request the twin queues waits for capacity (or for the engine
        # to wake up, which vLLM counts the same way).
        self.waiting_by_reason["capacity"].set(waiting)
        self.waiting_by_reason["deferred"].set(0)
        self.kv_usage.set(kv_usage)

    def render(self) -> bytes:
        return generate_latest(self.registry)
