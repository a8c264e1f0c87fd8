"""Hugging Face's Text Generation Inference: recognised by its `/info`
(`router: text-generation-router`); found as `text-generation-launcher` in
containers (`ghcr.io/huggingface/text-generation-inference`) and processes;
read from `/metrics` (`tgi_*`: its queue and batch sizes, token counts from
its per-request histograms' sums, queue time and time per token). Its
counters may lack the `_total` suffix (an old exporter): both are read.
TTFT is not among its figures.
"""

from __future__ import annotations

from sparktop import engine_ids
from sparktop.observe import argv as a
from sparktop.observe.engines.base import Answer, Engine, EngineUnreachable, Get
from sparktop.observe.prometheus import MetricNames

NAMES = MetricNames(
    prefix="tgi_",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    prompt_tokens=("tgi_request_input_length_sum",),
    gen_tokens=("tgi_request_generated_tokens_sum",),
    requests=("tgi_request_success_total", "tgi_request_success"),
    itl=("tgi_request_mean_time_per_token_duration",),
    queue=("tgi_request_queue_duration",),
    e2e=("tgi_request_duration",),
)


class Tgi(Engine):
    row = engine_ids.get("tgi")
    names = NAMES
    metrics_path = "/metrics"
    info_path = "/info"
    process_arg = r"(^|/)text-generation-launche[r]$"
    process_bytes = (b"text-generation",)

    @classmethod
    def claims_info(cls, answer: Answer) -> str | None:
        data = answer.json()
        if answer.status == 200 and isinstance(data, dict) and data.get("router") == "text-generation-router":
            return "/info answered as TGI's router"
        return None

    @classmethod
    def command(cls, argv: list[str]) -> str | None:
        return "text-generation-launcher" if any(a.basename(x) == "text-generation-launcher" for x in argv[:3]) \
            else None

    @classmethod
    def served_model(cls, argv: list[str]) -> str | None:
        return a.flag_value(argv, "--model-id")

    async def details(self, get: Get, models: Answer | None = None) -> None:
        await super().details(get, models)
        try:
            answer = await get("/info")
        except EngineUnreachable:
            return
        data = answer.json() if answer.status == 200 else None
        if isinstance(data, dict):
            self.version = str(data.get("version") or "") or self.version
            self.model = self.model or (str(data["model_id"]) if data.get("model_id") else None)
            total = data.get("max_total_tokens")
            self.max_model_len = total if isinstance(total, int) and total > 0 else self.max_model_len
