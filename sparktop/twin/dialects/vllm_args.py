"""The vLLM dialect's command line: `vllm serve` arguments as the twin understands them.

The twin accepts the flags sparktop's recipes pass to vLLM. Flags it has no
use for (attention backends, parsers, compilation settings) are accepted and
listed in the log's "non-default args", as vLLM would, so a real launch
command runs unchanged against the twin. Five flags are the twin's own:
`--speed`, `--startup-speed`, `--store-wait` (real seconds a tensor-parallel
head and its workers wait for each other), `--twin-home` and `--request-log` (one JSON
line per request served or aborted, with the server's own timestamps,
which vLLM only sums into its histograms: what a test holds a client's
first-token clock to, request by request).

Some of vLLM's flags change what the twin answers, as they change what vLLM
answers: `--enable-sleep-mode` (with `VLLM_SERVER_DEV_MODE=1`, the /sleep,
/wake_up and /is_sleeping routes), `--enable-mfu-metrics` (the estimated
FLOPs and bytes counters count), `--enable-prompt-tokens-details` (usage
carries `prompt_tokens_details`), `--max-num-queued-reqs` and
`--max-num-queued-tokens` (admission limits: 503 and
`vllm:admission_rejections_total`).
"""

from __future__ import annotations

import argparse
import os

from sparktop.model.serving import DEFAULT_MAX_NUM_SEQS, parse_length
from sparktop.twin.args import ServeArgs


def _bool_flag(parser: argparse.ArgumentParser, name: str, default: bool, help: str) -> None:
    parser.add_argument(f"--{name}", dest=name.replace("-", "_"), action="store_true", default=default,
                        help=f"{help} (default: {'on' if default else 'off'})")
    parser.add_argument(f"--no-{name}", dest=name.replace("-", "_"), action="store_false", help="turn it off")


def build_parser(prog: str = "vllm serve") -> argparse.ArgumentParser:
    # The flags as `vllm serve` names them, each with what vLLM's own help says it does, shortened; the model
    # the twin serves is its card's (`sparktop twin cards`), timed by the performance model.
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False, add_help=True,
                                description="A twin of `vllm serve`: the OpenAI API, /metrics and the log of vLLM, "
                                            "timed by sparktop's performance model for a GB10. Flags vLLM has "
                                            "that the twin does not model are accepted and ignored.")
    p.add_argument("model_tag", nargs="?", help="model name or HF id (`sparktop twin cards` lists the models)")
    p.add_argument("--model", dest="model_opt", help="the model, as a flag (the positional wins)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument("--served-model-name", nargs="+", help="the name(s) the API answers to (default: the model)")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                   help="GPUs (Spark nodes) one engine's layers are split over (default: %(default)s)")
    p.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1,
                   help="pipeline stages, one per node (default: %(default)s)")
    p.add_argument("--enable-expert-parallel", action="store_true", help="MoE experts split over the ranks")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of the GPU's memory the engine takes for weights and KV cache (default: %(default)s)")
    p.add_argument("--max-model-len", type=str, help="longest context (e.g. 32768 or 32k; default: the model's)")
    p.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS,
                   help="most requests in one batch (default: %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=int, help="most tokens in one scheduler step (prefill chunk)")
    p.add_argument("--kv-cache-dtype", default="auto", help="KV cache data type: auto or fp8 (default: %(default)s)")
    _bool_flag(p, "enable-prefix-caching", True, "reuse the KV cache of a shared prompt prefix")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (a slower decode step)")
    p.add_argument("--load-format", default="auto", help="how weights load; `dummy` skips reading them")
    p.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"],
                   help="how ranks over several nodes are run (Ray, or vLLM's own multiprocessing)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes of a multiprocessing layout (default: %(default)s)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank in it (default: %(default)s)")
    p.add_argument("--master-addr", default="127.0.0.1", help="the head node's address for the rendezvous")
    p.add_argument("--master-port", type=int, default=29501, help="its port (default: %(default)s)")
    p.add_argument("--headless", action="store_true", help="a worker node: no API server")
    p.add_argument("--api-key", help="requests must carry this key (Authorization: Bearer)")
    p.add_argument("--tokenizer", help="the tokenizer's name or path (default: the model's)")
    p.add_argument("--reasoning-parser", help="split reasoning from the answer (e.g. openai_gptoss)")
    p.add_argument("--enable-sleep-mode", action="store_true", help="the sleep and wake-up routes (with "
                   "VLLM_SERVER_DEV_MODE=1)")
    p.add_argument("--enable-mfu-metrics", action="store_true", help="FLOP and memory-traffic counters in /metrics")
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="cached prompt tokens in each response's usage")
    p.add_argument("--max-num-queued-reqs", type=int, help="refuse requests (503) past this many waiting")
    p.add_argument("--max-num-queued-tokens", type=int, help="refuse requests (503) past this many tokens waiting")
    p.add_argument("--speed", type=float, help="(twin) run every modeled duration this many times faster")
    p.add_argument("--startup-speed", type=float, help="(twin) speed-up for startup only")
    p.add_argument("--store-wait", type=float, help="(twin) seconds a multi-node head and its workers wait for "
                   "each other (default: torch's 600 s store timeout at the start-up speed, at least 30)")
    p.add_argument("--twin-home", help="(twin) the simulated host's state directory")
    p.add_argument("--request-log", help="(twin) append a JSON line per request served or aborted: its tokens and the "
                   "server's monotonic timestamps (received, arrival, first_token, first_sent, last_sent)")
    return p


def parse_serve_args(argv: list[str], prog: str = "vllm serve") -> ServeArgs:
    parser = build_parser(prog)
    ns, extra = parser.parse_known_args(argv)
    model = ns.model_opt or ns.model_tag
    if not model:
        parser.error("a model is required: vllm serve MODEL")
    given = {}
    defaults = vars(parser.parse_args([model]))
    for key, value in vars(ns).items():
        if key in ("model_tag", "model_opt"):
            continue
        if value != defaults.get(key):
            given[key] = value
    speed = ns.speed if ns.speed is not None else float(os.environ.get("SPARKTOP_TWIN_SPEED", "0") or 0) or 1.0
    return ServeArgs(
        model=model,
        host=ns.host,
        port=ns.port,
        served_model_name=ns.served_model_name[0] if ns.served_model_name else None,
        tensor_parallel_size=ns.tensor_parallel_size,
        pipeline_parallel_size=ns.pipeline_parallel_size,
        enable_expert_parallel=ns.enable_expert_parallel,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        max_model_len=parse_length(ns.max_model_len) if ns.max_model_len is not None else None,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        kv_cache_dtype=ns.kv_cache_dtype,
        enable_prefix_caching=ns.enable_prefix_caching,
        enforce_eager=ns.enforce_eager,
        load_format=ns.load_format,
        distributed_executor_backend=ns.distributed_executor_backend,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        headless=ns.headless,
        api_key=ns.api_key or os.environ.get("VLLM_API_KEY") or None,
        tokenizer=ns.tokenizer,
        reasoning_parser=ns.reasoning_parser,
        enable_sleep_mode=ns.enable_sleep_mode,
        enable_mfu_metrics=ns.enable_mfu_metrics,
        enable_prompt_tokens_details=ns.enable_prompt_tokens_details,
        max_num_queued_reqs=ns.max_num_queued_reqs,
        max_num_queued_tokens=ns.max_num_queued_tokens,
        speed=speed,
        startup_speed=ns.startup_speed,
        store_wait=ns.store_wait,
        twin_home=ns.twin_home,
        request_log=ns.request_log,
        extra=extra,
        given=given,
    )
