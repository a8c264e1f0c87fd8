"""TensorRT-LLM's words: `trtllm-serve` 1.3.0rc13 (the single-Spark playbook's
image) with the newest metrics collector, for the twin.

Everything here was read from TensorRT-LLM's own source; the files and
commits are in tests/fixtures/trtllm/SOURCES.md, and the metric families the
twin exports are held to `tensorrt_llm/metrics/collector.py` by
tests/unit/test_twin_trtllm.py. What the dialect says:

- the command line: `trtllm-serve [serve] MODEL` with click's underscored
  flags (`--tp_size`, `--max_batch_size`, `--kv_cache_free_gpu_memory_fraction`
  ...) and the YAML of `--extra_llm_api_options`/`--config`, which overrides
  them (`return_perf_metrics`, `enable_iter_perf_stats`, `print_iter_log`,
  `perf_metrics_max_requests`, `kv_cache_config.free_gpu_memory_fraction` ...);
- memory: the KV cache takes `free_gpu_memory_fraction` of what is left free
  once the weights and the profiled activations are in (not a share of the
  whole GPU, as vLLM's `--gpu-memory-utilization`), and a context longer
  than that cache is cut to it ("Adjusted max_seq_len");
- the log: `[MM/DD/YYYY-HH:MM:SS] [TRT-LLM] [I] ...` from Python,
  `[TensorRT-LLM][INFO] ...` from C++, uvicorn's own lines, and no
  "Uvicorn running on" (newer trtllm-serve hands uvicorn a pre-bound socket);
- routes: `/health` (200, empty body), `/health_generate`, `/version`, the
  plain `/metrics` (JSON iteration stats *taken off a queue*: each read
  empties it) and `/perf_metrics` (likewise), `/kv_cache_events`, and
  `/prometheus/metrics` only with `return_perf_metrics: true` (404
  `{"detail":"Not Found"}` otherwise, as FastAPI answers any unknown path);
- metrics: the collector's `trtllm_*` families. Per-request figures are
  logged when a request finishes; the iteration gauges (KV utilization,
  running, waiting ...) only with `enable_iter_perf_stats: true`, and only
  when a finished request wakes the collector, which drains the engine's
  stats queue. Prometheus runs in multiprocess mode: no `_created` series,
  a `pid` label on gauges, and a family shows once it has a value;
- errors: flat JSON (`{"object":"error","message":...,"code":400}`), the
  PyTorch backend's words for a prompt longer than `max_seq_len`, and
  "Executor creation failed due to insufficient GPU memory." when a model
  does not fit; any model name is served.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import http
import itertools
import math
import os
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from sparktop import engine_ids
from sparktop.clock import SYSTEM, Clock
from sparktop.model.cards import GIB
from sparktop.twin.args import ServeArgs
from sparktop.twin.dialects.base import (
    TWIN,
    Dialect,
    Serve,
    TwinLog,
    TwinMetrics,
    add_twin_flags,
    dump,
    parameter_error,
    twin_settings,
    validation_error,
)

if TYPE_CHECKING:
    from sparktop.model.perf import PerfModel
    from sparktop.twin.engine import Engine
    from sparktop.twin.server import TwinServer
    from sparktop.twin.startup import StartupPlan

TRTLLM_VERSION = "1.3.0rc13"
TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block's default ("Number of tokens per block: 32.")
MIB = 1024 * 1024
# tensorrt_llm.logger's severity_map: `--log_level` and what each line needs to show.
SEVERITY = {"internal_error": 0, "error": 1, "warning": 2, "info": 3, "verbose": 4, "debug": 5, "trace": 6}
UNAVAILABLE = "LLM is unavailable. Please check the server logs for more details."
# IterationResult waits this long for one more stat before a plain /metrics read ends.
STATS_TIMEOUT_S = 2.0
STATS_READ_LIMIT_S = 60.0  # the twin's own bound on that wait, which TRT-LLM does not have
ITER_STATS_MAX = 1000  # iter_stats_max_iterations' default: the stats queue's bound

# The collector's default buckets (collector.py).
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]
PREFILL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                   160.0, 640.0, 2560.0]
CACHED_TOKEN_BUCKETS = [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
BATCH_TOKEN_BUCKETS = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]

# TRT-LLM's QuantAlgo names for the checkpoint formats the cards use (model_config_info's `quantization`).
QUANT_ALGO = {"fp8": "FP8", "nvfp4": "NVFP4", "mxfp4": "W4A16_MXFP4", "bf16": "none", "fp16": "none"}


def _f32(x: float) -> float:
    """A fraction as TRT-LLM prints it: stored as a C++ float (0.9 -> 0.8999999761581421)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


# -- the command line -----------------------------------------------------------------


@dataclass
class TrtllmOptions:
    """What trtllm-serve's flags and YAML set that vLLM's ServeArgs has no field for."""

    backend: str = "pytorch"
    log_level: str = "info"
    free_gpu_memory_fraction: float = 0.9
    return_perf_metrics: bool = False
    enable_iter_perf_stats: bool = False
    print_iter_log: bool = False
    perf_metrics_max_requests: int = 0
    iter_stats_max_iterations: int = ITER_STATS_MAX
    enable_chunked_prefill: bool = False  # off by default on the PyTorch backend
    enable_partial_reuse: bool = True
    max_seq_len: int | None = None  # as given (flag or YAML); None: inferred from the model's config
    ep_size: int | None = None
    config: str | None = None

    @property
    def collector(self) -> bool:
        """The background iteration-stats collector runs (openai_server.py's lifespan)."""
        return self.return_perf_metrics and self.enable_iter_perf_stats


@dataclass
class TrtllmServeArgs(ServeArgs):
    trt: TrtllmOptions = field(default_factory=TrtllmOptions)


def build_parser(prog: str = "trtllm-serve") -> argparse.ArgumentParser:
    """`trtllm-serve serve`'s options (tensorrt_llm/commands/serve.py), with the twin's own."""
    # Each flag's help is what trtllm-serve's own says it does, shortened.
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False,
                                description="A twin of TensorRT-LLM's `trtllm-serve`: its API, /metrics and log, "
                                            "timed by sparktop's performance model for a GB10. Flags trtllm-serve "
                                            "has that the twin does not model are accepted and ignored.")
    p.add_argument("model", help="model name | HF checkpoint path | TensorRT engine path")
    p.add_argument("--tokenizer", help="the tokenizer's path or name (only needed with a TensorRT engine)")
    p.add_argument("--host", default="localhost", help="hostname of the server (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port of the server (default: %(default)s)")
    p.add_argument("--backend", default="pytorch", choices=["pytorch", "tensorrt", "trt", "_autodeploy"],
                   help="the backend that runs the model (default: %(default)s)")
    p.add_argument("--log_level", default="info", choices=list(SEVERITY),
                   help="the logging level (default: %(default)s)")
    p.add_argument("--max_beam_width", type=int, default=1,
                   help="most beams for beam search decoding (default: %(default)s)")
    p.add_argument("--max_batch_size", type=int, default=2048,
                   help="most requests the engine schedules at once (default: %(default)s)")
    p.add_argument("--max_num_tokens", type=int, default=8192,
                   help="most batched input tokens in one step, padding removed (default: %(default)s)")
    p.add_argument("--max_seq_len", type=int,
                   help="longest request, prompt and output together (default: the model config's)")
    p.add_argument("--tensor_parallel_size", "--tp_size", dest="tp_size", type=int, default=1,
                   help="tensor parallelism size (default: %(default)s)")
    p.add_argument("--pipeline_parallel_size", "--pp_size", dest="pp_size", type=int, default=1,
                   help="pipeline parallelism size (default: %(default)s)")
    p.add_argument("--context_parallel_size", "--cp_size", dest="cp_size", type=int, default=1,
                   help="context parallelism size (default: %(default)s)")
    p.add_argument("--moe_expert_parallel_size", "--ep_size", dest="ep_size", type=int,
                   help="expert parallelism size of a MoE model")
    p.add_argument("--moe_cluster_parallel_size", "--cluster_size", dest="cluster_size", type=int,
                   help="expert cluster parallelism size of a MoE model")
    p.add_argument("--gpus_per_node", type=int, help="GPUs per node (default: detected)")
    p.add_argument("--free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction",
                   dest="free_gpu_memory_fraction", type=float, default=0.9,
                   help="KV cache's share of GPU memory left free after weights and buffers (default: %(default)s)")
    p.add_argument("--num_postprocess_workers", type=int, default=0,
                   help="workers turning raw output into OpenAI responses (default: %(default)s)")
    p.add_argument("--trust_remote_code", action="store_true", help="allow custom model code (HF transformers)")
    p.add_argument("--revision", help="the Hugging Face model's revision: branch, tag or commit id")
    p.add_argument("--config", "--extra_llm_api_options", dest="config",
                   help="Path to a YAML file that overwrites the parameters specified by trtllm-serve.")
    p.add_argument("--reasoning_parser", help="split reasoning from the answer (e.g. deepseek-r1)")
    p.add_argument("--tool_parser", help="parse tool calls out of the output (e.g. qwen3)")
    p.add_argument("--chat_template", help="a custom chat template: a file path or a one-line template")
    p.add_argument("--enable_chunked_prefill", action="store_true", help="split long prompts' prefill into chunks")
    add_twin_flags(p)
    return p


def _read_config(parser: argparse.ArgumentParser, path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError:
        parser.error(f"Invalid value for '--config' / '--extra_llm_api_options': Path '{path}' does not exist.")
    except yaml.YAMLError as exc:
        parser.error(f"--extra_llm_api_options {path}: not YAML ({exc})")
    if not isinstance(data, dict):
        parser.error(f"--extra_llm_api_options {path}: expected a mapping of LLM API options")
    return data


def _apply_config(ns: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """The YAML over the flags (update_llm_args_with_extra_dict runs after the CLI's
    arguments): the LLM API options the twin has a use for, by their LlmArgs names."""
    renames = {"tensor_parallel_size": "tp_size", "pipeline_parallel_size": "pp_size",
               "moe_expert_parallel_size": "ep_size"}
    for key in ("backend", "max_batch_size", "max_num_tokens", "max_seq_len", "tensor_parallel_size",
                "pipeline_parallel_size", "moe_expert_parallel_size", "trust_remote_code", "enable_chunked_prefill"):
        if data.get(key) is not None:
            setattr(ns, renames.get(key, key), data[key])
    kv = data.get("kv_cache_config") or {}
    if kv.get("free_gpu_memory_fraction") is not None:
        ns.free_gpu_memory_fraction = float(kv["free_gpu_memory_fraction"])
    return kv


def _options(ns: argparse.Namespace, data: dict[str, Any], kv: dict[str, Any]) -> TrtllmOptions:
    iter_max = data.get("iter_stats_max_iterations")
    return TrtllmOptions(
        backend="tensorrt" if ns.backend == "trt" else ns.backend, log_level=ns.log_level,
        free_gpu_memory_fraction=ns.free_gpu_memory_fraction,
        return_perf_metrics=bool(data.get("return_perf_metrics", False)),
        enable_iter_perf_stats=bool(data.get("enable_iter_perf_stats", False)),
        print_iter_log=bool(data.get("print_iter_log", False)),
        perf_metrics_max_requests=int(data.get("perf_metrics_max_requests") or 0),
        iter_stats_max_iterations=ITER_STATS_MAX if not iter_max or iter_max < 0 else int(iter_max),
        enable_chunked_prefill=bool(ns.enable_chunked_prefill),
        enable_partial_reuse=bool(kv.get("enable_partial_reuse", True)), max_seq_len=ns.max_seq_len,
        ep_size=ns.ep_size, config=ns.config)


def _served_name(model: str) -> str | None:
    """A local directory is served under its own name, as OpenAIServer does (Path(model).name)."""
    path = Path(model)
    return path.name if path.exists() and path.is_dir() else None


def parse_trtllm_args(argv: list[str], prog: str = "trtllm-serve") -> TrtllmServeArgs:
    argv = list(argv)
    if argv[:1] == ["serve"]:  # a click DefaultGroup: `trtllm-serve MODEL` is `trtllm-serve serve MODEL`
        argv = argv[1:]
    parser = build_parser(prog)
    ns, extra = parser.parse_known_args(argv)
    defaults = vars(parser.parse_args([ns.model]))
    given = {k: v for k, v in vars(ns).items() if k != "model" and v != defaults.get(k)}
    data = _read_config(parser, ns.config)
    kv = _apply_config(ns, data)
    opts = _options(ns, data, kv)
    if not 0.0 < opts.free_gpu_memory_fraction <= 1.0:
        parser.error(f"free_gpu_memory_fraction must be in (0, 1], got {opts.free_gpu_memory_fraction}")
    dtype = str(kv.get("dtype") or "auto")
    return TrtllmServeArgs(
        model=ns.model, host=ns.host, port=ns.port, served_model_name=_served_name(ns.model),
        tensor_parallel_size=ns.tp_size, pipeline_parallel_size=ns.pp_size,
        enable_expert_parallel=(ns.ep_size or 1) > 1, max_model_len=ns.max_seq_len,
        max_num_seqs=ns.max_batch_size, max_num_batched_tokens=ns.max_num_tokens,
        kv_cache_dtype="fp8" if dtype.lower().startswith("fp8") else "auto",
        enable_prefix_caching=bool(kv.get("enable_block_reuse", True)),
        tokenizer=ns.tokenizer, reasoning_parser=ns.reasoning_parser, extra=extra, given=given,
        trt=opts, **twin_settings(ns))


def options_of(args: ServeArgs) -> TrtllmOptions:
    return args.trt if isinstance(args, TrtllmServeArgs) else TrtllmOptions()


# -- memory -----------------------------------------------------------------------------


@dataclass
class Memory:
    """How TRT-LLM's KvCacheCreator sizes memory on the twin's GPU (GiB)."""

    perf: PerfModel
    total: float  # what CUDA reports
    outside: float  # held before the executor starts: the OS, other processes
    weights: float
    reserve: float  # activations, workspaces, CUDA graphs: the profiling run's peak beyond the weights
    fraction: float
    max_num_tokens: int

    @property
    def free(self) -> float:
        return self.total - self.outside

    @property
    def kv(self) -> float:
        """free_gpu_memory_fraction of what the profiling run left free."""
        return max(0.0, self.fraction * (self.free - self.weights - self.reserve))

    @property
    def share(self) -> float:
        """The whole GPU's share this engine ends up holding."""
        return (self.weights + self.reserve + self.kv) / self.total

    @property
    def tokens(self) -> int:
        return int(self.kv * GIB // self.perf.kv_bytes_per_token)

    @property
    def tmp_tokens(self) -> int:
        """The temporary cache sized for the profiling run: one batch of max_num_tokens and a block."""
        return self.max_num_tokens + TOKENS_PER_BLOCK

    def gib(self, tokens: int) -> float:
        return tokens * self.perf.kv_bytes_per_token / GIB


def size_memory(server: TwinServer) -> Memory:
    from sparktop.twin.host import BASE_USED_KB
    from sparktop.twin.startup import engine_perf, twin_basis

    args = server.args
    # Memory is sized as vLLM's model sizes it, on the card and the fit the container's labels name.
    perf = engine_perf(twin_basis(server.card, "vllm", server.labels), args)
    other = server.host.used_mib(exclude_pid=os.getpid()) if server.host else 0
    batched = args.max_num_batched_tokens or 8192
    return Memory(perf, perf.hw.memory_gib, BASE_USED_KB / 1024**2 + other / 1024, perf.weights_bytes_per_node / GIB,
                  perf.activation_reserve_bytes(batched) / GIB, options_of(args).free_gpu_memory_fraction, batched)


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """The CUDA graphs TRT-LLM captures: 1, 2, 4, 8, then every 8 up to its limit of 128."""
    cap = max(1, min(max_batch_size, 128))
    return sorted({s for s in (1, 2, 4, *range(8, 129, 8)) if s <= cap} | {cap})


# -- the log -----------------------------------------------------------------------------


class TrtllmLog(TwinLog):
    """tensorrt_llm.logger's lines (`[TRT-LLM] [I]`), the C++ runtime's
    (`[TensorRT-LLM][INFO]`) and uvicorn's (`INFO:     `)."""

    level = "info"
    TAGS = {"ERROR": "E", "WARNING": "W", "INFO": "I", "VERBOSE": "V", "DEBUG": "D"}

    def shows(self, level: str) -> bool:
        return SEVERITY.get(level.lower(), 3) <= SEVERITY.get(self.level, 3)

    def line(self, level: str, where: str, message: str, process: str | None = None) -> None:
        if self.shows(level):
            stamp = time.strftime("[%m/%d/%Y-%H:%M:%S]")
            self._write(f"{stamp} [TRT-LLM] [{self.TAGS.get(level, 'I')}] {message}")

    def cpp(self, message: str, level: str = "INFO") -> None:
        if self.shows(level):
            self._write(f"[TensorRT-LLM][{level}] {message}")

    def uvicorn(self, message: str) -> None:
        self._write(f"INFO:     {message}")


# -- metrics -----------------------------------------------------------------------------


class MultiprocessView:
    """The registry as prometheus-client's MultiProcessCollector exports it
    (TRT-LLM serves its registry in multiprocess mode): no `_created`
    series, a `pid` label on every gauge (multiprocess_mode 'all'), and no
    family until one of its series has been written."""

    def __init__(self, registry: CollectorRegistry, pid: int):
        self.registry = registry
        self.pid = str(pid)

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            samples = [s for s in family.samples if not s.name.endswith("_created")]
            if not samples:
                continue
            if family.type == "gauge":
                samples = [s._replace(labels={**s.labels, "pid": self.pid}) for s in samples]
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = samples
            yield out


@dataclass
class StepTally:
    """What the scheduler told the sink during one engine step."""

    admitted: int = 0
    first_tokens: int = 0
    completed: int = 0
    finished: bool = False  # a request ended stop/length: the collector wakes


@dataclass
class KvTally:
    """KV cache block counts as TRT-LLM's KVCacheManager reports them, in its 32-token blocks."""

    reused: int = 0
    missed: int = 0
    gen_alloc: float = 0.0

    def hit_rate(self) -> float:
        total = self.reused + self.missed
        return self.reused / total if total else 0.0


class TrtllmMetrics(TwinMetrics):
    """The engine's sink and MetricsCollector's families; the engine's
    iteration-stats queue (the plain /metrics) and the /perf_metrics buffer."""

    def __init__(self, model_name: str, opts: TrtllmOptions, *, max_batch_size: int,
                 config_info: dict[str, dict[str, str]] | None = None, log: TrtllmLog | None = None,
                 gpu_used_bytes: Callable[[], int] = lambda: 0, clock: Clock = SYSTEM):
        self.opts = opts
        self.clock = clock  # the server's (`TwinServer.clock`): the iteration stats' timestamps are on it
        self.labels = {"model_name": model_name, "engine_type": opts.backend or "unknown"}
        self.max_batch_size = max_batch_size
        self.log = log
        self.gpu_used_bytes = gpu_used_bytes
        self.engine: Engine | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self._declare()
        self.counter_tokens_cached_prompt.labels(**self.labels)  # created up front, as the collector does
        for kind, info in (config_info or {}).items():
            self._config_info(kind, info)
        self.iter = 0
        self.queue: collections.deque[dict] = collections.deque(maxlen=opts.iter_stats_max_iterations)
        self.buffer: collections.deque[dict] | None = \
            collections.deque(maxlen=opts.iter_stats_max_iterations) if opts.collector else None
        self.perf: collections.deque[dict] | None = collections.deque(maxlen=opts.perf_metrics_max_requests) \
            if opts.return_perf_metrics and opts.perf_metrics_max_requests > 0 else None
        self._step = StepTally()
        self._kv = KvTally()
        self._prev_reused = 0
        self._prev_missed = 0
        self._first_iter: dict[str, int] = {}
        self._request_ids = itertools.count()

    # -- declaration (collector.py's MetricsCollector.__init__) ---------------------------

    def _declare(self) -> None:
        names = list(self.labels)
        reg = self.registry

        def hist(name: str, doc: str, buckets: list) -> Histogram:
            return Histogram("trtllm_" + name, doc, names, buckets=buckets, registry=reg)

        def count(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter("trtllm_" + name, doc, names + list(extra), registry=reg)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge("trtllm_" + name, doc, names, registry=reg)

        self.counter_request_success = count("request_success_total", "Count of successfully processed requests.",
                                             ("finished_reason",))
        self.histogram_e2e = hist("e2e_request_latency_seconds", "Histogram of end to end request latency in "
                                  "seconds.", LATENCY_BUCKETS)
        self.histogram_ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                   TTFT_BUCKETS)
        self.histogram_tpot = hist("time_per_output_token_seconds", "Histogram of time per output token in "
                                   "seconds.", TPOT_BUCKETS)
        self.histogram_queue = hist("request_queue_time_seconds", "Histogram of time spent in WAITING phase for "
                                    "request.", LATENCY_BUCKETS)
        self.histogram_prefill = hist("request_prefill_time_seconds", "Histogram of prefill (context) phase "
                                      "duration in seconds (first_token_time - first_scheduled_time).",
                                      PREFILL_BUCKETS)
        self.histogram_decode = hist("request_decode_time_seconds", "Histogram of decode (generation) phase "
                                     "duration in seconds (last_token_time - first_token_time).", LATENCY_BUCKETS)
        self.histogram_inference = hist("request_inference_time_seconds", "Histogram of total inference duration "
                                        "in seconds (last_token_time - first_scheduled_time).", LATENCY_BUCKETS)
        self.counter_prompt_tokens = count("prompt_tokens_total", "Cumulative number of prompt (input) tokens "
                                           "processed.")
        self.counter_generation_tokens = count("generation_tokens_total", "Cumulative number of generation "
                                               "(output) tokens produced.")
        self.kv_cache_hit_rate = gauge("kv_cache_hit_rate", "KV cache hit rate")
        self.kv_cache_reused_blocks = count("kv_cache_reused_blocks", "Cumulative number of KV cache blocks "
                                            "reused (cache hits)")
        self.kv_cache_missed_blocks = count("kv_cache_missed_blocks", "Cumulative number of KV cache blocks "
                                            "missed (cache misses)")
        self.kv_cache_utilization = gauge("kv_cache_utilization", "KV cache utilization")
        self._declare_iteration(gauge, count)
        self.counter_tokens_cached_prompt = count(
            "prompt_cached_tokens_total", "Process-lifetime total prompt tokens served from KV cache. Resets only "
            "when the serving process restarts, not when the KV cache is flushed or evicted.")
        self.histogram_tokens_cached_prompt = hist("prompt_cached_tokens_per_request", "Histogram of cached prompt "
                                                   "tokens per request.", CACHED_TOKEN_BUCKETS)
        self.gauge_prefill_batch_occupancy = gauge("prefill_batch_occupancy", "Fraction of max active slots "
                                                   "occupied by context requests.")
        self.histogram_prefill_batch_tokens = hist("prefill_batch_tokens", "Histogram of total context tokens per "
                                                   "iteration.", BATCH_TOKEN_BUCKETS)
        # Declared by the collector but never written by the twin (no speculative decoding, no
        # perplexity, no host/disk cache tiers): in multiprocess mode they are not exported.

    def _declare_iteration(self, gauge: Callable[[str, str], Gauge], count: Callable[..., Counter]) -> None:
        """The iteration-level gauges the twin's stats feed (log_iteration_stats)."""
        self.num_requests_running = gauge("num_requests_running", "Number of active requests")
        self.num_requests_waiting = gauge("num_requests_waiting", "Number of queued requests")
        self.counter_num_requests_completed = count("num_requests_completed_total", "Total number of completed "
                                                    "requests across iterations")
        self.max_num_active_requests = gauge("max_num_active_requests", "Maximum number of active requests")
        self.iteration_latency_seconds = gauge("iteration_latency_seconds", "Iteration latency in seconds")
        self.gpu_memory_usage_bytes = gauge("gpu_memory_usage_bytes", "GPU memory usage in bytes")
        self.cpu_memory_usage_bytes = gauge("cpu_memory_usage_bytes", "CPU memory usage in bytes")
        self.pinned_memory_usage_bytes = gauge("pinned_memory_usage_bytes", "Pinned memory usage in bytes")
        self.max_batch_size_static = gauge("max_batch_size_static", "Static maximum batch size")
        self.max_batch_size_runtime = gauge("max_batch_size_runtime", "Runtime maximum batch size")
        self.max_num_tokens_runtime = gauge("max_num_tokens_runtime", "Runtime maximum number of tokens")
        self.kv_cache_max_blocks = gauge("kv_cache_max_blocks", "Maximum number of KV cache blocks")
        self.kv_cache_free_blocks = gauge("kv_cache_free_blocks", "Number of free KV cache blocks")
        self.kv_cache_used_blocks = gauge("kv_cache_used_blocks", "Number of used KV cache blocks")
        self.kv_cache_tokens_per_block = gauge("kv_cache_tokens_per_block", "Number of tokens per KV cache block")
        self.num_context_requests = gauge("num_context_requests", "Number of context (prefill) requests")
        self.num_generation_requests = gauge("num_generation_requests", "Number of generation (decode) requests")
        self.num_paused_requests = gauge("num_paused_requests", "Number of paused requests")
        self.num_scheduled_requests = gauge("num_scheduled_requests", "Number of scheduled requests")
        self.total_context_tokens = gauge("total_context_tokens", "Total number of context tokens")
        self.avg_decoded_tokens_per_iter = gauge("avg_decoded_tokens_per_iter", "Average number of decoded tokens "
                                                 "per iteration")

    def _config_info(self, kind: str, info: dict[str, str]) -> None:
        """log_config_info: one gauge at 1 whose labels are the configuration."""
        docs = {"model": "Model configuration info", "parallel": "Parallelism configuration info",
                "kv_cache": "KV cache configuration info"}
        labels = {**self.labels, **info}
        Gauge(f"trtllm_{kind}_config_info", docs[kind], list(labels), registry=self.registry).labels(**labels).set(1)

    # -- what the collector does with what it is given --------------------------------------

    def _gauge(self, gauge: Gauge, value: float) -> None:
        gauge.labels(**self.labels).set(value)

    def _count(self, counter: Counter, value: float, **extra: str) -> None:
        counter.labels(**self.labels, **extra).inc(value)

    def _observe(self, histogram: Histogram, value: float) -> None:
        histogram.labels(**self.labels).observe(value)

    def log_request_metrics_dict(self, m: dict[str, Any]) -> None:
        """collector.py's log_request_metrics_dict, for one finished request (a value of 0 is not observed)."""
        self._count(self.counter_request_success, 1, finished_reason=m["finished_reason"])
        for histogram, key in ((self.histogram_e2e, "e2e"), (self.histogram_ttft, "ttft"),
                               (self.histogram_tpot, "tpot")):
            if m[key]:
                self._observe(histogram, m[key])
        self._observe(self.histogram_queue, m["queue"])  # logged whenever present, 0 too
        for histogram, key in ((self.histogram_prefill, "prefill"), (self.histogram_decode, "decode"),
                               (self.histogram_inference, "inference")):
            if m[key]:
                self._observe(histogram, m[key])
        if m["prompt_tokens"]:
            self._count(self.counter_prompt_tokens, m["prompt_tokens"])
        if m["generation_tokens"]:
            self._count(self.counter_generation_tokens, m["generation_tokens"])
        if m["cached_tokens"] > 0:
            self._count(self.counter_tokens_cached_prompt, m["cached_tokens"])
        self._observe(self.histogram_tokens_cached_prompt, m["cached_tokens"])

    def log_iteration_stats(self, stat: dict[str, Any]) -> None:
        """collector.py's log_iteration_stats, for the fields the twin's stats carry."""
        for gauge, key in ((self.num_requests_running, "numActiveRequests"),
                           (self.num_requests_waiting, "numQueuedRequests"),
                           (self.max_num_active_requests, "maxNumActiveRequests"),
                           (self.gpu_memory_usage_bytes, "gpuMemUsage"), (self.cpu_memory_usage_bytes, "cpuMemUsage"),
                           (self.pinned_memory_usage_bytes, "pinnedMemUsage"),
                           (self.max_batch_size_static, "maxBatchSizeStatic"),
                           (self.max_batch_size_runtime, "maxBatchSizeRuntime"),
                           (self.max_num_tokens_runtime, "maxNumTokensRuntime")):
            self._gauge(gauge, stat[key])
        if stat["numCompletedRequests"] > 0:
            self._count(self.counter_num_requests_completed, stat["numCompletedRequests"])
        self._gauge(self.iteration_latency_seconds, stat["iterLatencyMS"] / 1000.0)
        self._log_kv_stats(stat["kvCacheStats"])
        self._log_batching_stats(stat["inflightBatchingStats"], stat["maxNumActiveRequests"])

    def _log_kv_stats(self, kv: dict[str, Any]) -> None:
        self._gauge(self.kv_cache_hit_rate, kv["cacheHitRate"])
        # Cumulative block counts become counters by their deltas.
        if kv["reusedBlocks"] - self._prev_reused > 0:
            self._count(self.kv_cache_reused_blocks, kv["reusedBlocks"] - self._prev_reused)
        self._prev_reused = kv["reusedBlocks"]
        if kv["missedBlocks"] - self._prev_missed > 0:
            self._count(self.kv_cache_missed_blocks, kv["missedBlocks"] - self._prev_missed)
        self._prev_missed = kv["missedBlocks"]
        if kv["maxNumBlocks"]:
            self._gauge(self.kv_cache_utilization, kv["usedNumBlocks"] / kv["maxNumBlocks"])
        self._gauge(self.kv_cache_max_blocks, kv["maxNumBlocks"])
        self._gauge(self.kv_cache_free_blocks, kv["freeNumBlocks"])
        self._gauge(self.kv_cache_used_blocks, kv["usedNumBlocks"])
        self._gauge(self.kv_cache_tokens_per_block, kv["tokensPerBlock"])

    def _log_batching_stats(self, ifb: dict[str, Any], max_active: int) -> None:
        self._gauge(self.num_context_requests, ifb["numContextRequests"])
        self._gauge(self.num_generation_requests, ifb["numGenRequests"])
        self._gauge(self.num_paused_requests, ifb["numPausedRequests"])
        self._gauge(self.num_scheduled_requests, ifb["numScheduledRequests"])
        self._gauge(self.total_context_tokens, ifb["numCtxTokens"])
        if ifb["numCtxTokens"] > 0:
            self._observe(self.histogram_prefill_batch_tokens, ifb["numCtxTokens"])
        self._gauge(self.avg_decoded_tokens_per_iter, ifb["avgNumDecodedTokensPerIter"])
        if max_active > 0:
            self._gauge(self.gauge_prefill_batch_occupancy, ifb["numContextRequests"] / max_active)

    # -- MetricsSink --------------------------------------------------------------------------

    def on_prefix(self, *, queries, hits):
        self._step.admitted += 1
        reused = hits // TOKENS_PER_BLOCK
        self._kv.reused += reused
        self._kv.missed += max(0, math.ceil(queries / TOKENS_PER_BLOCK) - reused)

    def on_first_token(self, seq, ttft, queue_time):
        self._step.first_tokens += 1
        if self.perf is not None:
            self._first_iter[seq.request_id] = self.iter + 1

    def on_finish(self, seq, reason, now):
        first_iter = self._first_iter.pop(seq.request_id, self.iter + 1)
        if reason not in ("stop", "length"):
            return  # an aborted or failed request never reaches _extract_metrics
        self._step.completed += 1
        if not self.opts.return_perf_metrics:
            return  # no MetricsCollector
        self._step.finished = True
        self.log_request_metrics_dict(self._request_dict(seq, reason, now))
        if self.perf is not None:
            self.perf.append(self._perf_item(seq, now, first_iter))

    def on_step(self, *, prompt_tokens, generation_tokens, preemptions, running, waiting, kv_usage,
                iteration_tokens):
        self.iter += 1
        step, self._step = self._step, StepTally()
        gen_requests = max(0, generation_tokens - step.first_tokens)  # decode steps are one token each
        ctx_tokens = max(0, iteration_tokens - gen_requests)
        ctx_requests = max(step.first_tokens, 1 if ctx_tokens else 0)
        self._kv.gen_alloc += gen_requests / TOKENS_PER_BLOCK
        if self.opts.print_iter_log and self.log is not None:
            self._iter_log(ctx_requests, ctx_tokens, gen_requests, running)
        if self.opts.enable_iter_perf_stats:  # get_latest_iteration_stats is empty without it
            self.queue.append(self._stat(step, running, waiting, kv_usage, ctx_requests, ctx_tokens,
                                         gen_requests))
        if step.finished and self.opts.collector:
            self._collect()

    # -- the iteration stats -----------------------------------------------------------------

    def _latency_ms(self) -> float:
        """The step's wall time: the engine's last busy interval (its private record of
        them, which it keeps for GPU utilisation; the sink is told no durations)."""
        busy = getattr(self.engine, "_busy", None)
        if not busy:
            return 0.0
        start, end = busy[-1]
        return (end - start) * 1000.0

    def _kv_stats(self, kv_usage: float) -> dict[str, Any]:
        capacity = self.engine.kv_capacity_tokens if self.engine is not None else 0
        max_blocks = capacity // TOKENS_PER_BLOCK
        used = min(max_blocks, round(kv_usage * max_blocks))
        alloc_new = self._kv.missed + int(self._kv.gen_alloc)
        return {"allocNewBlocks": alloc_new, "allocTotalBlocks": alloc_new + self._kv.reused,
                "cacheHitRate": self._kv.hit_rate(), "freeNumBlocks": max_blocks - used, "maxNumBlocks": max_blocks,
                "missedBlocks": self._kv.missed, "reusedBlocks": self._kv.reused,
                "tokensPerBlock": TOKENS_PER_BLOCK, "usedNumBlocks": used}

    def _stat(self, step: StepTally, running: int, waiting: int, kv_usage: float, ctx_requests: int,
              ctx_tokens: int, gen_requests: int) -> dict[str, Any]:
        """One IterationStats as its JSON: keys sorted (nlohmann's std::map), the PyTorch
        backend's zeros where it sets nothing (CPU and pinned memory, runtime batch limits)."""
        ifb = {"avgNumDecodedTokensPerIter": 1.0 if gen_requests else 0.0, "microBatchId": 0,
               "numContextRequests": ctx_requests, "numCtxKvTokens": 0, "numCtxTokens": ctx_tokens,
               "numGenKvTokens": 0, "numGenRequests": gen_requests, "numPausedKvTokens": 0, "numPausedRequests": 0,
               "numQueuedContextRequests": 0, "numQueuedCtxTokens": 0, "numQueuedGenKvTokens": 0,
               "numQueuedGenRequests": 0, "numScheduledRequests": ctx_requests + gen_requests}
        stamp = self.clock.wall()
        return {"cpuMemUsage": 0, "gpuMemUsage": self.gpu_used_bytes(), "inflightBatchingStats": ifb,
                "iter": self.iter, "iterLatencyMS": self._latency_ms(), "kvCacheStats": self._kv_stats(kv_usage),
                "maxBatchSizeRuntime": 0, "maxBatchSizeStatic": 0, "maxNumActiveRequests": self.max_batch_size,
                "maxNumTokensRuntime": 0, "numActiveRequests": running, "numCompletedRequests": step.completed,
                "numNewActiveRequests": step.admitted, "numQueuedRequests": waiting, "pinnedMemUsage": 0,
                "staticBatchingStats": None,
                "timestamp": time.strftime("%m-%d-%Y %H:%M:%S", time.localtime(stamp)) + f".{int(stamp % 1 * 1e6):06d}"}

    def _collect(self) -> None:
        """The background collector, woken by a finished request: every queued stat
        to Prometheus, and into the buffer the plain /metrics then serves."""
        while self.queue:
            stat = self.queue.popleft()
            self.log_iteration_stats(stat)
            if self.buffer is not None:
                self.buffer.append(stat)

    def take_iteration_stats(self) -> list[dict]:
        """What one GET of the plain /metrics takes: the collector's buffer when it
        runs, else the engine's queue. Either way it is gone afterwards."""
        source = self.buffer if self.buffer is not None else self.queue
        stats = list(source)
        source.clear()
        return stats

    def take_perf_metrics(self) -> list[dict]:
        if self.perf is None:
            return []
        items, self.perf = list(self.perf), collections.deque(maxlen=self.perf.maxlen)
        return items

    def _iter_log(self, ctx_requests: int, ctx_tokens: int, gen_requests: int, running: int) -> None:
        assert self.log is not None
        step_ms = self._latency_ms()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.clock.wall()))
        self.log.info("", f"iter = {self.iter}, global_rank = 0, rank = 0, currank_total_requests = "
                          f"{running}/{running}, host_step_time = {step_ms}ms, prev_device_step_time = {step_ms}ms, "
                          f"timestamp = {stamp}, num_scheduled_requests: "
                          f"{ctx_requests + gen_requests}, states = {{'num_ctx_requests': {ctx_requests}, "
                          f"'num_ctx_tokens': {ctx_tokens}, 'num_generation_tokens': {gen_requests}}}")

    # -- per request ---------------------------------------------------------------------------

    @staticmethod
    def _request_dict(seq: Any, reason: str, now: float) -> dict[str, Any]:
        """A finished request's metrics_dict (tensorrt_llm/executor/result.py's timings)."""
        scheduled = seq.first_scheduled if seq.first_scheduled is not None else seq.arrival
        first = seq.first_token_t if seq.first_token_t is not None else now
        gaps = seq.output_count - 1
        return {"finished_reason": reason, "e2e": now - seq.arrival, "ttft": first - seq.arrival,
                "tpot": (now - first) / gaps if gaps > 0 else 0.0, "queue": scheduled - seq.arrival,
                "prefill": first - scheduled, "decode": now - first, "inference": now - scheduled,
                "prompt_tokens": seq.prompt_len, "generation_tokens": seq.output_count,
                "cached_tokens": seq.cached_tokens}

    def _perf_item(self, seq: Any, now: float, first_iter: int) -> dict[str, Any]:
        """One /perf_metrics entry, steady-clock seconds as the executor keeps them."""
        reused = seq.cached_tokens // TOKENS_PER_BLOCK
        blocks = math.ceil((seq.prompt_len + seq.output_count) / TOKENS_PER_BLOCK)
        first = seq.first_token_t if seq.first_token_t is not None else now
        return {"request_id": next(self._request_ids), "perf_metrics": {
            "first_iter": first_iter, "last_iter": self.iter + 1,
            "timing_metrics": {"server_arrival_time": seq.arrival, "arrival_time": seq.arrival,
                               "first_scheduled_time": seq.first_scheduled or seq.arrival, "first_token_time": first,
                               "server_first_token_time": first, "last_token_time": now},
            "kv_cache_metrics": {"num_total_allocated_blocks": blocks, "num_new_allocated_blocks": blocks - reused,
                                 "num_reused_blocks": reused,
                                 "num_missed_blocks": math.ceil(seq.prompt_len / TOKENS_PER_BLOCK) - reused}}}

    # -- serving ---------------------------------------------------------------------------------

    def render(self) -> bytes:
        view = CollectorRegistry(auto_describe=False)
        view.register(MultiprocessView(self.registry, os.getpid()))
        return generate_latest(view)


# -- the dialect -------------------------------------------------------------------------------


class TrtllmDialect(Dialect):
    """trtllm-serve's words. One instance serves one TwinServer: it keeps that
    server's memory sizing and counts the reads of its plain /metrics (`drained`)."""

    row = engine_ids.get("trtllm")
    version = TRTLLM_VERSION
    prog = "trtllm-serve"
    owned_by = "tensorrt_llm"
    process_name = "python3"  # the MPI worker that holds the GPU is a plain Python process
    server_header = "uvicorn"
    log_class = TrtllmLog
    completion_max_tokens = None  # _deduce_max_tokens: what the context leaves
    # The profiling run's autotuning and CUDA graphs take the start-up's torch.compile stage (`compiled`).
    compiles = True
    # Over several nodes it runs under mpirun (twin/mpi.py): this process is rank 0 and times the
    # engine over --tp_size; the other ranks are MPI workers, not vLLM's rendezvous.
    own_distribution = True

    def __init__(self) -> None:
        self.drained = 0  # GETs of the plain /metrics: each one empties the stats queue
        self.perf_drained = 0
        self.memory: Memory | None = None
        self.inferred_len: int | None = None  # max_seq_len before the KV cache cut it

    # -- its programs: trtllm-serve, and trtllm-llmapi-launch, mpirun and sshd beside it ------

    def tool_main(self, program: str, argv: list[str], serve: Serve) -> int:
        if program == "trtllm-serve":
            return serve(argv[1:] if argv[:1] == ["serve"] else argv)
        if program == "sshd":
            # Its worker containers run sshd for mpirun; the twin's mpirun needs none: it waits.
            print(f"Server listening on 0.0.0.0 port {argv[argv.index('-p') + 1] if '-p' in argv else 22}.",
                  file=sys.stderr, flush=True)
            stop = {signal.SIGTERM, signal.SIGINT}
            signal.pthread_sigmask(signal.SIG_BLOCK, stop)
            signal.sigwait(stop)
            return 0
        if program == "trtllm-llmapi-launch":
            # Rank 0 runs the server; the MPI ranks on the other nodes are the twin's own business (mpirun).
            if not argv:
                return 2
            os.execvp(argv[0], argv)
        from sparktop.twin.mpi import main as mpi_main  # mpirun

        return mpi_main(argv)

    # -- the command line ---------------------------------------------------------------------

    def demo_argv(self, image: str, model: str, where: list[str], twin: list[str], root: Path) -> list[str]:
        options = root / "trtllm-options.yaml"
        options.write_text("return_perf_metrics: true\nenable_iter_perf_stats: true\n")
        return ["--entrypoint", "trtllm-serve", image, model, *where, "--backend", "pytorch",
                "--extra_llm_api_options", str(options), *twin]

    def parse(self, argv: list[str], prog: str | None = None) -> ServeArgs:
        return parse_trtllm_args(argv, prog=self.prog)

    # -- start-up ---------------------------------------------------------------------------------

    @staticmethod
    def _log(server: TwinServer) -> TrtllmLog:
        log = server.log
        assert isinstance(log, TrtllmLog), "the dialect's own logger"
        return log

    def begin(self, server: TwinServer) -> None:
        log, opts = self._log(server), options_of(server.args)
        log.level = opts.log_level
        log.raw(f"[TensorRT-LLM] TensorRT-LLM version: {TRTLLM_VERSION}")
        if opts.backend == "pytorch":
            log.info("", "Using LLM with PyTorch backend")
        log.info("", "Set nccl_plugin to None.")
        log.info("", "neither checkpoint_format nor checkpoint_loader were provided, checkpoint_format will be set "
                     "to HF.")
        self._size(server)

    def _size(self, server: TwinServer) -> None:
        """Give the twin's memory share the size TRT-LLM's KvCacheCreator would reach,
        before the plan is made: the KV cache is the fraction of what remains free."""
        args = server.args
        self.memory = memory = size_memory(server)
        self.inferred_len = args.max_model_len or server.card.max_model_len
        if memory.kv <= 0:
            return  # it does not fit: the plan fails, and start_failed says so in TRT-LLM's words
        args.gpu_memory_utilization = min(1.0, memory.share)
        per_seq = memory.perf.seq_state_bytes / memory.perf.kv_bytes_per_token
        room = int(memory.tokens - per_seq) // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK
        if 0 < room < self.inferred_len:
            args.max_model_len = room  # "Adjusted max_seq_len to N"

    def planned(self, server: TwinServer, plan: StartupPlan) -> None:
        args, log = server.args, server.log
        features = (f"AttentionRuntimeFeatures(chunked_prefill={options_of(args).enable_chunked_prefill}, "
                    f"cache_reuse={args.enable_prefix_caching}, has_speculative_draft_tokens=False, "
                    f"chunk_size={plan.max_num_batched_tokens})")
        log.info("", f"ATTENTION RUNTIME FEATURES:  {features}")
        log.info("", f'Validating KV Cache config against kv_cache_dtype="{args.kv_cache_dtype}"')

    async def join(self, server: TwinServer) -> None:
        """The MPI workers are mpirun's (the twin's needs only their nodes up): nothing to reach."""

    def loading(self, server: TwinServer) -> None:
        assert self.memory is not None, "sized in begin"
        server.log.info("", f"Use {self.memory.weights:.2f} GB for model weights.")

    def loaded(self, server: TwinServer, weights_gib: float, seconds: float, total: float) -> None:
        log, card = self._log(server), server.card
        shards = max(1, math.ceil(weights_gib / 4.65))  # safetensors shards of about 5 GB
        tensors = card.layers * 9 + 3
        log.raw(f"Loading safetensors weights in parallel: 100%|██████████| {shards}/{shards} "
                f"[00:00<00:00, {shards / 0.2:.2f}it/s]")
        log.raw(f"Loading weights: 100%|██████████| {tensors}/{tensors} "
                f"[{int(seconds) // 60:02d}:{int(seconds) % 60:02d}<00:00, {tensors / max(seconds, 1e-3):.2f}it/s]")
        log.raw(f"Model init total -- {total:.2f}s")
        if options_of(server.args).max_seq_len is None:
            log.info("", f"max_seq_len is not specified, using inferred value {self.inferred_len}")
        log.info("", "Using Sampler: TorchSampler")
        assert self.memory is not None, "sized in begin"
        self._kv_cache(server, self.memory.tmp_tokens, self.memory.tmp_tokens)  # the profiling run's cache
        log.info("", "[Autotuner] Autotuning process starts ...")

    def _kv_cache(self, server: TwinServer, tokens: int, max_seq_len: int) -> None:
        """What KvCacheCreator and the C++ KVCacheManager say when they build a cache of `tokens`."""
        log, args, memory = self._log(server), server.args, self.memory
        assert memory is not None, "sized in begin"
        log.warning("", f"Both free_gpu_memory_fraction and max_tokens are set (to {_f32(memory.fraction)} and "
                        f"{tokens}, respectively). The smaller value will be used.")
        window = self.inferred_len or max_seq_len
        if window > tokens:
            log.warning("", f"Attention window size {window} exceeds upper bound {tokens} for available blocks. "
                            f"Reducing to {tokens}.")
            log.warning("", f"Adjusted max_attention_window_vec to [{tokens}]")
            log.warning("", f"Adjusted window size {window} to {tokens} in blocks_per_window")
            log.warning("", f"Adjusted max_seq_len to {max_seq_len}")
        log.cpp(f"Number of tokens per block: {TOKENS_PER_BLOCK}.")
        log.cpp(f"[MemUsageChange] Allocated {memory.gib(tokens):.2f} GiB for max tokens in paged KV cache "
                f"({tokens}).")
        batch = args.max_num_seqs
        log.info("", f"max_seq_len={max_seq_len}, max_num_requests={batch}, "
                     f"max_num_tokens={args.max_num_batched_tokens or 8192}, max_batch_size={batch}")
        log.info("", "cache_transceiver is disabled")

    def _graphs(self, server: TwinServer) -> None:
        log = server.log
        log.info("", "[Autotuner] Autotuning process ends")
        sizes = graph_batch_sizes(server.args.max_num_seqs)
        log.info("", f"Creating CUDA graph instances for {len(sizes)} batch sizes.")
        for size in reversed(sizes):
            log.info("", f"Run generation only CUDA graph warmup for batch size={size}, draft_len=0")

    def compiled(self, server: TwinServer, seconds: float) -> None:
        self._graphs(server)  # the profiling run's autotuning and graphs

    def profiled(self, server: TwinServer, plan: StartupPlan) -> None:
        log, memory = server.log, self.memory
        assert memory is not None, "sized in begin"
        tmp = memory.gib(memory.tmp_tokens)
        peak = memory.outside + memory.weights + memory.reserve + tmp
        log.info("", f"Memory used after loading model weights (inside torch) in memory usage profiling: "
                     f"{memory.weights:.2f} GiB")
        log.info("", f"Memory used after loading model weights (outside torch) in memory usage profiling: "
                     f"{memory.outside:.2f} GiB")
        log.info("", f"Memory dynamically allocated during inference (inside torch) in memory usage profiling: "
                     f"{memory.reserve:.2f} GiB")
        log.info("", f"Peak memory during memory usage profiling (torch + non-torch): {peak:.2f} GiB, available KV "
                     f"cache memory when calculating max tokens: {memory.kv:.2f} GiB, fraction is set "
                     f"{_f32(memory.fraction)}, kv size is {int(memory.perf.kv_bytes_per_token)}. device total "
                     f"memory {memory.total:.2f} GiB, , tmp kv_mem {tmp:.2f} GiB")
        log.info("", f"Estimated max memory in KV cache : {memory.kv:.2f} GiB")

    def kv_sized(self, server: TwinServer, tokens: int, max_len: int, concurrency: float) -> None:
        engine = server.engine
        assert engine is not None, "sized once the engine exists"
        # The PyTorch backend schedules whole prompts unless enable_chunked_prefill.
        engine.config.enable_chunked_prefill = options_of(server.args).enable_chunked_prefill
        if isinstance(server.metrics, TrtllmMetrics):
            server.metrics.engine = engine
        self._kv_cache(server, tokens, max_len)

    def capturing(self, server: TwinServer) -> None:
        server.log.info("", "[Autotuner] Autotuning process starts ...")

    def captured(self, server: TwinServer, seconds: float, init_seconds: float) -> None:
        self._graphs(server)
        memory = self.memory
        assert memory is not None, "sized in begin"
        held = memory.weights + memory.reserve + memory.kv
        server.log.info("", f"Setting PyTorch memory fraction to {held / memory.total} ({held} GiB)")

    def serving(self, server: TwinServer) -> None:
        log, opts = self._log(server), options_of(server.args)
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Waiting for application startup.")
        if opts.collector:
            log.info("", "Started background iteration stats collector task")
            log.info("", "Iteration stats collector loop started")
        log.uvicorn("Application startup complete.")

    def stats(self, server: TwinServer, prompt_tps: float, gen_tps: float, running: int, waiting: int,
              kv: float) -> None:
        """Nothing periodic: trtllm-serve logs each iteration only with print_iter_log (see TrtllmMetrics)."""

    def start_failed(self, server: TwinServer, message: str) -> None:
        """The executor's out-of-memory explanation (py_executor_creator.py), then the proxy's error."""
        log = self._log(server)
        if message.startswith("torch.OutOfMemoryError"):
            log.raw(message)  # PyTorch's own words come first
        explanation = self._oom_explanation(server)
        log.error("", f"Failed to initialize executor on rank 0: {explanation}")
        log.error("", "Executor worker initialization error: Traceback (most recent call last):")
        log.raw(f"RuntimeError: {explanation}")
        log.raw("")
        log.raw("RuntimeError: Executor worker returned error")

    def _oom_explanation(self, server: TwinServer) -> str:
        memory = self.memory or size_memory(server)
        model_fits = memory.weights + 1.0 < memory.free
        stage = "kv_cache" if model_fits else "model"
        friendly = {"model": "Model", "kv_cache": "KV cache"}
        advice = {"model": "reduce max_num_tokens and/or shard the model weights across GPUs by enabling pipeline "
                           "and/or tensor parallelism", "kv_cache": "reduce free_gpu_memory_fraction"}
        done = ["model"] if model_fits else []
        after_model = memory.free - memory.weights
        lines = ["Executor creation failed due to insufficient GPU memory.", "",
                 f"The following component could not be created: {friendly[stage]}",
                 f"Total GPU memory (GiB): {memory.total:.2f}",
                 f"Free GPU memory before component creation attempt (GiB): "
                 f"{after_model if model_fits else memory.free:.2f}", "",
                 "Previously created components and free GPU memory before/after creation (GiB):",
                 *(f"model: {memory.free:.2f} / {after_model:.2f}" for _ in done), "",
                 "Please refer to the TensorRT LLM documentation for information on how to control the memory usage "
                 "through TensorRT LLM configuration options. Possible options include:",
                 *(f"  {s}: {advice[s]}" for s in [*done, stage])]
        return "\n".join(lines)

    def died(self, server: TwinServer, message: str) -> None:
        # openai_chat logs the executor's error and raises SIGINT: uvicorn then shuts down (stopping).
        server.log.error("", message)

    def stopping(self, server: TwinServer) -> None:
        log = self._log(server)
        log.uvicorn("Shutting down")
        log.uvicorn("Waiting for application shutdown.")
        if options_of(server.args).collector:
            log.info("", "Iteration stats collector loop cancelled")
            log.info("", "Stopped background iteration stats collector task")
        log.uvicorn("Application shutdown complete.")
        log.uvicorn(f"Finished server process [{os.getpid()}]")

    def access(self, server: TwinServer, request: web.Request, status: int) -> None:
        """uvicorn's access line: client address and port, request line, status and its phrase."""
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else (request.remote or "-")
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        line = f'{client} - "{request.method} {request.path_qs} HTTP/1.1" {status} {phrase}'
        self._log(server).uvicorn(line.rstrip())

    # -- serving -----------------------------------------------------------------------------------

    def metrics(self, server: TwinServer, plan: StartupPlan) -> TwinMetrics:
        args, opts = server.args, options_of(server.args)
        host = server.host
        own = int(args.gpu_memory_utilization * plan.perf.hw.memory_gib * GIB)

        def gpu_used_bytes() -> int:
            # torch.cuda.mem_get_info: the whole device's use, every process's and the OS's.
            from sparktop.twin.host import BASE_USED_KB

            return BASE_USED_KB * 1024 + (host.used_mib() * MIB if host else own)

        return TrtllmMetrics(args.name, opts, max_batch_size=args.max_num_seqs,
                             config_info=self._config_info(server, plan) if opts.return_perf_metrics else None,
                             log=self._log(server), gpu_used_bytes=gpu_used_bytes, clock=server.clock)

    @staticmethod
    def _config_info(server: TwinServer, plan: StartupPlan) -> dict[str, dict[str, str]]:
        """openai_server.py's _log_config_info_metrics, from the twin's arguments."""
        args, opts, card = server.args, options_of(server.args), server.card
        model = {"model": args.model, "served_model_name": args.name, "dtype": "auto",
                 "quantization": QUANT_ALGO.get(card.quant.scheme.lower(), card.quant.scheme.upper())}
        if opts.max_seq_len is not None:  # LlmArgs.max_seq_len stays None when it is inferred
            model["max_model_len"] = str(opts.max_seq_len)
        model["gpu_type"] = "NVIDIA GB10"  # torch.cuda.get_device_name(0) on a Spark
        parallel = {"tensor_parallel_size": str(args.tensor_parallel_size),
                    "pipeline_parallel_size": str(args.pipeline_parallel_size), "context_parallel_size": "1",
                    "gpu_count": str(args.world_size)}
        if opts.ep_size is not None and opts.ep_size > 0:
            parallel["expert_parallel_size"] = str(opts.ep_size)
        kv = {"enable_block_reuse": str(args.enable_prefix_caching),
              "enable_partial_reuse": str(opts.enable_partial_reuse),
              "free_gpu_memory_fraction": str(opts.free_gpu_memory_fraction), "cache_dtype": args.kv_cache_dtype}
        return {"model": model, "parallel": parallel, "kv_cache": kv}

    def routes(self, app: web.Application, server: TwinServer) -> None:
        app.middlewares.append(self._fastapi_answers)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self._health_generate)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._iteration_stats)
        app.router.add_get("/perf_metrics", self._perf_metrics)
        app.router.add_post("/kv_cache_events", self._kv_cache_events)
        if options_of(server.args).return_perf_metrics:
            # mount_metrics(): a Starlette Mount, so the path with a slash answers too.
            app.router.add_get("/prometheus/metrics", self._prometheus)
            app.router.add_get("/prometheus/metrics/", self._prometheus)

    @web.middleware
    async def _fastapi_answers(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """FastAPI's answers to a path or method it has no route for, and uvicorn's
        access line for every route but the OpenAI ones (which log their own)."""
        try:
            response = await handler(request)
        except web.HTTPNotFound:
            response = web.json_response({"detail": "Not Found"}, status=404, dumps=dump)
        except web.HTTPMethodNotAllowed:
            response = web.json_response({"detail": "Method Not Allowed"}, status=405, dumps=dump)
        if not request.path.startswith("/v1/"):
            self.access(request.app[TWIN], request, response.status)
        return response

    async def health(self, request: web.Request) -> web.Response:
        server = request.app[TWIN]
        if server.failure or (server.engine is not None and server.engine.failed):
            return web.Response(status=503, text=UNAVAILABLE)
        return web.Response(status=200)

    async def _health_generate(self, request: web.Request) -> web.Response:
        """A real one-token chat ("hi"), as trtllm-serve runs it: it costs a step."""
        from sparktop.twin.engine import FinishEvent, Sequence

        server = request.app[TWIN]
        engine = server.engine
        # No API server's cost (`_charge_api`): trtllm-serve hands the check to its generator itself, not as a
        # user's request through its OpenAI routes. The id is a name, not a time: the machine's clock keeps it
        # unique where two checks come at one instant of a virtual clock.
        seq = Sequence(request_id=f"health-{time.monotonic_ns()}", prompt_ids=[1, *server.tokenizer.encode("hi")],
                       max_tokens=1)
        engine.submit(seq)
        while True:
            event = await seq.events.get()
            if isinstance(event, FinishEvent):
                break
        if event.reason == "error":
            return web.Response(status=500, text="Generation health check failed")
        return web.Response(status=200, text="Generation health check OK")

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": TRTLLM_VERSION}, dumps=dump)

    async def _iteration_stats(self, request: web.Request) -> web.Response:
        """get_iteration_stats: the stats taken off the queue (or the collector's buffer)."""
        self.drained += 1
        metrics = request.app[TWIN].metrics
        if not isinstance(metrics, TrtllmMetrics):
            return web.json_response([], dumps=dump)
        stats = metrics.take_iteration_stats()
        if metrics.buffer is None and metrics.iter > 0:
            stats += await self._wait_for_stats(metrics)
        return web.json_response(stats, dumps=dump)

    @staticmethod
    async def _wait_for_stats(metrics: TrtllmMetrics) -> list[dict]:
        """Without the collector, a read waits on the queue until no stat has come
        for two seconds (IterationResult's timeout): while the engine works, on and on."""
        loop = asyncio.get_running_loop()
        stats: list[dict] = []
        idle_until = loop.time() + STATS_TIMEOUT_S
        limit = loop.time() + STATS_READ_LIMIT_S
        while loop.time() < min(idle_until, limit):
            await asyncio.sleep(0.05)
            more = metrics.take_iteration_stats()
            if more:
                stats += more
                idle_until = loop.time() + STATS_TIMEOUT_S
        return stats

    async def _perf_metrics(self, request: web.Request) -> web.Response:
        self.perf_drained += 1
        metrics = request.app[TWIN].metrics
        items = metrics.take_perf_metrics() if isinstance(metrics, TrtllmMetrics) else []
        return web.json_response(items, dumps=dump)

    async def _kv_cache_events(self, request: web.Request) -> web.Response:
        return web.json_response([], dumps=dump)  # no event buffer is configured: nothing to take

    async def _prometheus(self, request: web.Request) -> web.Response:
        metrics = request.app[TWIN].metrics
        return web.Response(body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def model_card(self, server: TwinServer) -> dict[str, Any]:
        # ModelCard's `created` is a default_factory: the time of the request.
        return {"id": server.args.name, "object": "model", "created": int(server.clock.wall()),
                "owned_by": self.owned_by}

    def too_long(self, server: TwinServer, prompt: int, max_len: int, from_text: bool) -> web.Response:
        """base_worker.py's _deduce_max_tokens: the whole prompt is tokenized, then the room left is checked."""
        room = max_len - prompt
        message = (f"`default_max_tokens` ({room}) must be greater than 0, `default_max_tokens` ({room}) = "
                   f"max_seq_len ({max_len}) - `splited_prompt_len` ({prompt})")
        return web.json_response({"object": "error", "message": message, "type": "BadRequestError", "param": None,
                                  "code": 400}, status=400, dumps=dump)

    def unknown_model(self, server: TwinServer, model: str) -> web.Response | None:
        return None  # openai_chat never compares the request's model with its own

    # A parameter out of range and a body its schema refuses: the words the twin's OpenAI routes have always
    # answered with (vLLM's; TensorRT-LLM's own are not imitated).

    def invalid(self, message: str, param: str, value: object) -> web.Response:
        return parameter_error(message, param, value)

    def unparsable(self, loc: str, kind: str, msg: str, value: object, ctx: dict | None = None) -> web.Response:
        return validation_error(loc, kind, msg, value, ctx)



__all__ = ["Memory", "TrtllmDialect", "TrtllmLog", "TrtllmMetrics", "TrtllmOptions", "TrtllmServeArgs",
           "build_parser", "graph_batch_sizes", "parse_trtllm_args"]
