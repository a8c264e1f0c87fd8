"""vLLM: recognised by `owned_by: vllm` in /v1/models (or `{"version": ...}`
at /version, or `vllm:` series); found as `vllm serve` / vLLM's API server
module in containers and processes; read from its Prometheus `/metrics`.

Names: vLLM v1 (`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_*`,
`vllm:inter_token_latency_seconds`) and the older ones
(`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_*`,
`vllm:time_per_output_token_seconds`); the first present wins. vLLM 0.32
adds waiting requests by reason, admission rejections (one counter per API
server, no `engine` label), the sleep state and its own estimate of the
bytes each GPU reads and writes; speculative decoding counts drafts, drafted
and accepted tokens (`vllm:spec_decode_*`).
"""

from __future__ import annotations

from sparktop import engine_ids
from sparktop.layouts import Layout
from sparktop.observe import argv as a
from sparktop.observe.engines.base import Answer, Engine, EngineUnreachable, Get
from sparktop.observe.prometheus import MetricNames

NAMES = MetricNames(
    prefix="vllm:",
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    prompt_tokens=("vllm:prompt_tokens_total",),
    gen_tokens=("vllm:generation_tokens_total",),
    prefix_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    prefix_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    prefix_hit_rate=("vllm:gpu_prefix_cache_hit_rate",),  # v0 gauge, -1 when unknown
    preemptions=("vllm:num_preemptions_total",),
    requests=("vllm:request_success_total",),
    finished_label="finished_reason",
    ttft=("vllm:time_to_first_token_seconds",),
    itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    queue=("vllm:request_queue_time_seconds",),
    e2e=("vllm:e2e_request_latency_seconds",),
    waiting_by_reason=("vllm:num_requests_waiting_by_reason",),
    rejections=("vllm:admission_rejections_total",),
    sleep_state=("vllm:engine_sleep_state",),
    read_bytes=("vllm:estimated_read_bytes_per_gpu_total",),
    write_bytes=("vllm:estimated_write_bytes_per_gpu_total",),
    spec_drafts=("vllm:spec_decode_num_drafts_total",),
    spec_draft_tokens=("vllm:spec_decode_num_draft_tokens_total",),
    spec_accepted=("vllm:spec_decode_num_accepted_tokens_total",),
    created=("vllm:prompt_tokens_total", "vllm:generation_tokens_total"),
)


class Vllm(Engine):
    row = engine_ids.get("vllm")
    names = NAMES
    metrics_path = "/metrics"
    owned_by = ("vllm",)
    info_path = "/version"
    process_arg = r"(^|/)vll[m]$|^vll[m]\.entrypoints\.(openai\.api_server|cli\.main)$"
    process_bytes = (b"vllm",)
    process_titles = ("VLLM::",)  # its engine core and workers (`VLLM::EngineCore`, `VLLM::Worker_TP0`)
    image_needs = "serve"  # its image runs `ray` too; only `vllm serve` is the engine

    @classmethod
    def claims_info(cls, answer: Answer) -> str | None:
        data = answer.json()
        # vLLM's /version is exactly {"version": "..."}; other servers' carry more.
        if answer.status == 200 and isinstance(data, dict) and set(data) == {"version"}:
            return f"/version answered {data['version']}"
        return None

    @classmethod
    def command(cls, argv: list[str]) -> str | None:
        for i, arg in enumerate(argv):
            rest = argv[i + 1:i + 2]
            if (a.basename(arg) == "vllm" or arg == "vllm.entrypoints.cli.main") and rest == ["serve"]:
                return "vllm serve"
            if arg == "vllm.entrypoints.openai.api_server":
                return "vllm api_server"
        return None

    @classmethod
    def is_worker(cls, argv: list[str]) -> bool:
        return "--headless" in argv

    @classmethod
    def served_model(cls, argv: list[str]) -> str | None:
        model = a.flag_value(argv, "--served-model-name", "--model")
        return model or a.positional(a.after(argv, "serve"))

    @classmethod
    def layout(cls, argv: list[str]) -> Layout:
        def size(*names: str) -> int:
            value = a.flag_int(argv, *names)
            return value if value and value > 0 else 1

        tp = size("-tp", "--tensor-parallel-size")
        return Layout(tp=tp, pp=size("-pp", "--pipeline-parallel-size"),
                      backend="ray" if a.flag_value(argv, "--distributed-executor-backend") == "ray" else "mp",
                      ep="--enable-expert-parallel" in argv and tp > 1)

    @classmethod
    def head_of(cls, argv: list[str]) -> str | None:
        return a.flag_value(argv, "--master-addr") if cls.is_worker(argv) else None

    async def details(self, get: Get, models: Answer | None = None) -> None:
        await super().details(get, models)
        if self.version is None:
            try:
                answer = await get("/version")
            except EngineUnreachable:
                return
            data = answer.json() if answer.status == 200 else None
            if isinstance(data, dict) and data.get("version"):
                self.version = str(data["version"])
