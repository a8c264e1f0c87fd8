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


def _bool_flag(parser: argparse.ArgumentParser, name: str, default: bool) -> None:
    parser.add_argument(f"--{name}", dest=name.replace("-", "_"), action="store_true", default=default)
    parser.add_argument(f"--no-{name}", dest=name.replace("-", "_"), action="store_false")


def build_parser(prog: str = "vllm serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False, add_help=True)
    p.add_argument("model_tag", nargs="?", help="model name or HF id")
    p.add_argument("--model", dest="model_opt")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=str)
    p.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--kv-cache-dtype", default="auto")
    _bool_flag(p, "enable-prefix-caching", True)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"])
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--api-key")
    p.add_argument("--tokenizer")
    p.add_argument("--reasoning-parser")
    p.add_argument("--enable-sleep-mode", action="store_true")
    p.add_argument("--enable-mfu-metrics", action="store_true")
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--max-num-queued-reqs", type=int)
    p.add_argument("--max-num-queued-tokens", type=int)
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
