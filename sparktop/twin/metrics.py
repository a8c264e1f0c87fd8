"""The twin's /metrics: vLLM v1's metric names, types, labels and buckets.

Built with prometheus-client, as vLLM is, in a registry of its own so that
several twins can live in one process (tests). Counters are declared without
the `_total` suffix; prometheus-client adds `_total` and `_created` exactly
as it does for vLLM.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


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


class VllmMetrics:
    """Engine metrics as vLLM exports them; also the engine's MetricsSink."""

    def __init__(self, model_name: str, max_model_len: int, cache_info: dict[str, str] | None = None,
                 engine: str = "0"):
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        values = (model_name, engine)
        r = self.registry

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def counter(name, doc):
            return Counter(name, doc, labels, registry=r).labels(*values)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          labels + ["finished_reason"], registry=r)
        self.success = {reason: success.labels(*values, reason) for reason in ("stop", "length", "abort")}
        token_buckets = buckets_1_2_5(max_model_len)
        self.req_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                    token_buckets)
        self.req_generation = histogram("vllm:request_generation_tokens",
                                        "Number of generation tokens processed.", token_buckets)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.",
                                          ITERATION_TOKEN_BUCKETS)
        self.max_tokens_param = histogram("vllm:request_params_max_tokens",
                                          "Histogram of the max_tokens request parameter.", token_buckets)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.",
                                    REQUEST_LATENCY_BUCKETS)
        self.inference_time = histogram("vllm:request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.",
                                        REQUEST_LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.",
                                      REQUEST_LATENCY_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.",
                                     REQUEST_LATENCY_BUCKETS)
        if cache_info:
            info = {**cache_info, "engine": engine}
            Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                  list(info), registry=r).labels(**info).set(1)

    # -- MetricsSink ----------------------------------------------------------

    def on_step(self, *, prompt_tokens, generation_tokens, preemptions, running, waiting, kv_usage,
                iteration_tokens):
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        if preemptions:
            self.preemptions.inc(preemptions)
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)
        if generation_tokens:
            self.generation_tokens.inc(generation_tokens)
        self.iteration_tokens.observe(iteration_tokens)

    def on_prefix(self, *, queries, hits):
        self.prefix_queries.inc(queries)
        if hits:
            self.prefix_hits.inc(hits)

    def on_first_token(self, seq, ttft, queue_time):
        self.ttft.observe(ttft)

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
        if seq.first_scheduled is not None:
            self.queue_time.observe(seq.first_scheduled - seq.arrival)
            self.inference_time.observe(now - seq.first_scheduled)
            if seq.first_token_t is not None:
                self.prefill_time.observe(seq.first_token_t - seq.first_scheduled)
                self.decode_time.observe(now - seq.first_token_t)
                if seq.output_count > 1:
                    self.tpot.observe((now - seq.first_token_t) / (seq.output_count - 1))

    def set_idle(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)

    def render(self) -> bytes:
        return generate_latest(self.registry)
