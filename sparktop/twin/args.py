"""`ServeArgs`: what a twin server is asked to serve, as every dialect's
command line fills it.

Each dialect parses its engine's own flags (`vllm serve`'s in
`dialects/vllm_args.py`, SGLang's, llama-server's and trtllm-serve's in
their dialect modules) into this one dataclass, which `TwinServer`, the
start-up plan and the OpenAI routes read; what only its dialect reads stays
in `given` (every flag given, by its name) or a subclass
(`TrtllmServeArgs`). The defaults are what a field means when a dialect's
command line has no such flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServeArgs:
    model: str
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_name: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int = 1024  # vLLM's default on a GPU of 70 GiB or more (model.serving)
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    quantization: str | None = None  # the weights' format where it is not the card's (a GGUF's, --quantization)
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    load_format: str = "auto"
    distributed_executor_backend: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    headless: bool = False
    api_key: str | None = None
    tokenizer: str | None = None
    reasoning_parser: str | None = None
    enable_sleep_mode: bool = False
    enable_mfu_metrics: bool = False
    enable_prompt_tokens_details: bool = False
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    speed: float = 1.0
    startup_speed: float | None = None
    store_wait: float | None = None
    twin_home: str | None = None
    request_log: str | None = None
    extra: list[str] = field(default_factory=list)
    given: dict[str, object] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model

    @property
    def world_size(self) -> int:
        """GPUs (here nodes) one engine spans: tensor x pipeline parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def ray(self) -> bool:
        return self.distributed_executor_backend == "ray"
