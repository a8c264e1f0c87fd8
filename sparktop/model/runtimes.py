"""Serving runtimes other than vLLM on GB10: the same roofline, scaled by a few
factors fitted to each runtime's own published DGX Spark figures.

The performance model (`perf`, `simulate`) is vLLM's: its constants are fitted
to published vLLM figures (`fit.py`, `data/fitted-constants.json`). llama.cpp,
SGLang, TensorRT-LLM and Ollama run other kernels on the same hardware, so each
gets a handful of multipliers on those constants — never a factor per model:

- `bandwidth`: on `bandwidth_efficiency`, the share of the nominal 273 GB/s a
  step's reads reach (decode);
- `gemm`: on `compute_efficiency` and `moe_efficiency`, the share of the
  measured GEMM rate its dense and grouped-expert GEMMs reach (prefill);
- `attention`: on `attention_efficiency` (attention and recurrent scans: what
  makes prefill and decode slow down as the context grows);
- `overhead`: on `step_overhead_s` and `layer_overhead_s` (launches, sampling,
  host work per token: what dominates small models' decode);
- `link`: on `link_efficiency`, the share of the 200 Gb/s link its all-reduces
  reach (tensor parallel over nodes).

A runtime gets only the factors its figures can tell apart (`KNOBS`); the
efficiencies stay at most 1 (`constants.apply_factors`, `FACTOR_FIELDS`). The factors are fitted jointly over all of a
runtime's figures, by least squares on log errors (soft-L1, as `fit.loss`),
each (source, model) group weighing the square root of its size.

Facts and where they come from:

- the figures: `data/published-runtimes.yaml`, each with its source (a URL, or
  repository, path and line) and the verbatim quote; what was left out and why
  is listed at its top;
- the fitted factors, figure counts and mean errors: `data/runtime-factors.json`,
  written by `python -m sparktop.model.runtimes --fit`;
- how a runtime lays a checkpoint out where it differs from the card
  (`LAYOUTS`): llama.cpp's gpt-oss GGUFs keep every tensor but the experts in
  Q8_0 (the sizes llama-bench prints, 11.27 and 59.02 GiB, and a tg32 of
  58.7 t/s above what BF16 attention would allow, say so); SGLang's Spark
  branch runs gpt-oss's attention projections and unembedding in FP8.

Each figure is replayed the way it was measured (`predicted`): llama-bench as
one sequence at its depth (`PerfModel.step_time`), llama-batched-bench as B
sequences in lockstep (all prompts, then every decode step for all: the
lockstep `simulate.predict` with a token budget that takes every prompt in one
step, no prefix cache and no API server), a served benchmark as
`simulate.predict` of c requests sent together.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparktop import engine_ids
from sparktop.errors import SparktopError
from sparktop.model.cards import ModelCard, find_card
from sparktop.model.constants import CAPPED, FACTOR_FIELDS, Constants, apply_factors
from sparktop.model.fit import FITTED, GLOBAL, METRICS, _cost, load_constants, load_fit_summary, nelder_mead
from sparktop.model.perf import PerfModel
from sparktop.model.quant import Quantization
from sparktop.model.serving import Serving
from sparktop.model.simulate import perf_for, predict
from sparktop.yamlfile import load_published

DATA = Path(__file__).parent / "data"
FIGURES = DATA / "published-runtimes.yaml"
FACTORS = DATA / "runtime-factors.json"


class CannotModel(SparktopError):
    """A runtime the performance model has no published figures for."""


# The simplex stays inside it: past it a factor would stand for another
# engine, not another kernel. The floor still leaves an overhead of tens of
# microseconds per step (a CUDA graph's launch), never none.
FACTOR_RANGE = (0.01, 20.0)

# The factors each runtime's figures can pin down.
KNOBS: dict[str, tuple[str, ...]] = {
    # 180 figures: one sequence at depths to 32K (attention), batches of 1-32
    # (bandwidth and GEMMs), prefill of 2K-8K prompts, models of 3-12B active.
    "llama.cpp": ("bandwidth", "gemm", "attention", "overhead"),  # first: Ollama shares its overhead
    # 10 figures, 2K contexts, one source's batches: no depth to see attention
    # by, and no small model to tell overheads from bandwidth.
    "sglang": ("bandwidth", "gemm"),
    # 10 figures: 2K, 32K and 128K prompts make attention visible, and one
    # model's TTFT at TP 1, 2 and 4 the link's share of a long prefill; all are
    # one stream of large models, so the per-token overheads are not.
    "trtllm": ("bandwidth", "gemm", "attention", "link"),
    # 12 decode figures, one stream each, 3.6-70B active, no usable prefill
    # figure: one factor. Left free, an overhead factor runs to the floor of
    # its range (the figures cannot tell it from none), so Ollama takes
    # llama.cpp's (`SHARED`): it runs llama.cpp's GGML kernels.
    "ollama": ("bandwidth",),
}
# Factors a runtime takes from another's fit: {runtime: {factor: from runtime}}.
SHARED: dict[str, dict[str, str]] = {"ollama": {"overhead": "llama.cpp"}}
NO_FIGURES = ("tgi",)
# The engines the model knows (engine_ids' ids, in its order): the one its shared constants are, those fitted
# to their own figures, and those with none yet.
RUNTIMES = tuple(r.id for r in engine_ids.ROWS if r.base_model or r.id in KNOBS or r.id in NO_FIGURES)

# How a runtime stores a checkpoint where it differs from the scheme's default
# layout (`Quantization.of`): {(runtime, scheme): parts in their own format}.
LAYOUTS: dict[tuple[str, str], dict[str, str]] = {
    # ggml-org's gpt-oss GGUFs: MXFP4 experts, every other tensor Q8_0.
    # llama-bench prints 11.27 and 59.02 GiB; this layout computes 11.7 and
    # 59.3 (the card counts the embedding table in BF16). In the HF layout
    # (BF16 attention and unembedding) the 120b's roofline is 54.6 t/s, below
    # the 58.7 t/s llama.cpp publishes.
    ("llama.cpp", "mxfp4"): {"linear": "q8_0", "attention": "q8_0", "lm_head": "q8_0"},
    # SGLang's `spark` branch: only the experts in MXFP4; QKV, O-projection and
    # lm_head in FP8 (community code-reading notes of that branch).
    ("sglang", "mxfp4"): {"attention": "fp8", "lm_head": "fp8"},
}

# Prompt and output lengths of a single-stream figure that states none: one
# stream's decode rate hardly depends on them (as `fit._more_cells` takes it).
SINGLE_STREAM = (128, 512)
DECODE_METRICS = ("decode_tps", "decode_tps_per_request", "tpot_ms")
PREFILL_METRICS = ("prefill_tps", "ttft_s", "ttft_ms")
TOOLS = ("llama-bench", "llama-batched-bench", "lockstep", "single-stream")


def runtime_id(name: str) -> str:
    """The engine's id (`llama-cpp` -> `llama.cpp`, as engine_ids has it); CannotModel for one the model does
    not know."""
    row = engine_ids.lookup(name)
    if row is None or row.id not in RUNTIMES:
        raise CannotModel(f"unknown runtime {name!r}; known: {', '.join(RUNTIMES)}")
    return row.id


def _name(rt: str) -> str:
    return engine_ids.get(rt).name


def _base(rt: str) -> bool:
    """Whether `rt` is the engine the shared constants are (vLLM): its constants are `k` itself."""
    return engine_ids.get(rt).base_model


def _modelled() -> str:
    names = [_name(r) for r in RUNTIMES if r not in NO_FIGURES]
    return ", ".join(names[:-1]) + " and " + names[-1]


# -- the figures ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One published figure of a runtime, as the model replays it."""

    runtime: str
    source: str  # key in the file's `sources`
    card: str
    quant: str  # the weight format the figure ran (its scheme; the runtime's layout applies)
    tool: str  # llama-bench | llama-batched-bench | lockstep | single-stream
    metric: str  # decode_tps | decode_tps_per_request | tpot_ms | prefill_tps | ttft_s | ttft_ms
    value: float
    concurrency: int = 1
    prompt_tokens: int = 0
    output_tokens: int = 0
    depth: int = 0  # tokens already in the KV cache (llama-bench's @dN)
    nodes: int = 1
    tp: int = 1
    where: str = ""
    quote: str = ""
    serving: Serving = field(default_factory=Serving)

    @property
    def kind(self) -> str:
        return "decode" if self.metric in DECODE_METRICS else "prefill"

    @property
    def topology(self) -> str:
        return "solo" if self.tp == 1 else f"tp={self.tp}"

    def label(self) -> str:
        shape = {"llama-bench": f"{'tg' if self.kind == 'decode' else 'pp'}"
                                f"{self.output_tokens or self.prompt_tokens}@d{self.depth}",
                 "llama-batched-bench": f"B{self.concurrency} pp{self.prompt_tokens}+tg{self.output_tokens}",
                 }.get(self.tool, f"c{self.concurrency} {self.prompt_tokens or '?'}/{self.output_tokens or '?'}")
        where = "" if self.topology == "solo" else f" {self.topology}"
        return f"{self.card} {self.quant}{where} {shape} {self.metric}"


def load_sources(path: Path = FIGURES) -> dict[str, dict]:
    return (load_published(path) or {}).get("sources") or {}


def load_figures(runtime: str | None = None, path: Path = FIGURES) -> list[Figure]:
    """The published figures (of one runtime, or all), as the file lists them."""
    data = load_published(path) or {}
    want = runtime_id(runtime) if runtime else None
    out = []
    for i, d in enumerate(data.get("figures") or []):
        rt = runtime_id(str(d["runtime"]))
        if want and rt != want:
            continue
        where = f"{path.name} figure {i + 1}"
        tool, metric = str(d["tool"]), str(d["metric"])
        if tool not in TOOLS or metric not in DECODE_METRICS + PREFILL_METRICS:
            raise SparktopError(f"{where}: tool {tool!r} / metric {metric!r} not replayed (tools: {', '.join(TOOLS)})")
        pp, tg = d.get("prompt_tokens"), d.get("output_tokens")
        if tool == "single-stream":
            pp, tg = pp or SINGLE_STREAM[0], tg or SINGLE_STREAM[1]
        out.append(Figure(rt, str(d["source"]), str(d["card"]), str(d["quant"]), tool, metric, float(d["value"]),
                          int(d.get("concurrency") or 1), int(pp or 0), int(tg or 0), int(d.get("depth") or 0),
                          int(d.get("nodes") or 1), int(d.get("tp") or 1),
                          str(d.get("where") or f"{d['source']} ({where})"),
                          str(d.get("quote") or ""), Serving().with_flags(d.get("serving") or {}, where)))
    return out


# -- a runtime's model -----------------------------------------------------------------------


def runtime_quant(runtime: str, scheme: str) -> Quantization:
    """The formats a runtime stores a checkpoint of this scheme in (`LAYOUTS`)."""
    parts = LAYOUTS.get((runtime_id(runtime), scheme.strip().lower()), {})
    return Quantization.of(scheme, **parts)


def runtime_card(runtime: str, card: ModelCard, scheme: str | None = None) -> ModelCard:
    """The card as the runtime runs it, in `scheme` (default: the card's own).
    The card's own scheme is its checkpoint, laid out as the card says (a
    runtime with its own layout of it aside); another format drops the card's
    measured weight memory, which was measured for the card's checkpoint."""
    scheme = (scheme or card.quant.scheme).strip().lower()
    if scheme == card.quant.scheme.lower() and (runtime_id(runtime), scheme) not in LAYOUTS:
        return card
    quant = runtime_quant(runtime, scheme)
    if quant == card.quant:
        return card
    return replace(card, quant=quant, measured_weights_gib=None)


def _engine(name: str) -> str:
    row = engine_ids.lookup(name)
    return row.id if row is not None else name


def _normalised(data: dict) -> dict:
    """The stored fit with its runtimes under engine_ids' ids (a file written as `llama-cpp` still reads)."""
    runtimes = data.get("runtimes")
    if isinstance(runtimes, dict):
        data["runtimes"] = {
            _engine(rt): ({**entry, "shared": {k: _engine(v) for k, v in entry["shared"].items()}}
                          if isinstance(entry, dict) and isinstance(entry.get("shared"), dict) else entry)
            for rt, entry in runtimes.items()}
    return data


def _stored() -> dict:
    if not FACTORS.exists():
        return {}
    return _normalised(json.loads(FACTORS.read_text()))


# How a runtime runs that no figure fits: llama.cpp spreads layers over nodes with rpc-server, and a step
# goes through them one after another (no micro-batches in flight, unlike vLLM's pipeline parallel).
TRAITS: dict[str, dict[str, Any]] = {"llama.cpp": {"pipeline_overlap": False}, "ollama": {"pipeline_overlap": False}}


def apply_runtime(runtime: str, k: Constants) -> Constants:
    """The constants of `runtime`: vLLM's (`k`) scaled by its fitted factors;
    `k` itself for vLLM. CannotModel for a runtime with no published figures."""
    rt = runtime_id(runtime)
    if _base(rt):
        return k
    entry = (_stored().get("runtimes") or {}).get(rt)
    if rt in NO_FIGURES or entry is None:
        raise CannotModel(f"no published DGX Spark figures for {_name(rt)}: predict models {_modelled()}")
    return replace(apply_factors(k, entry["factors"]), **TRAITS.get(rt, {}))


def fitted_over_nodes(runtime: str) -> bool:
    """Whether the runtime's constants were fitted to figures of engines over several nodes (vLLM's to its
    two-node articles): otherwise its multi-node predictions rest on vLLM's link model alone."""
    rt = runtime_id(runtime)
    if _base(rt):
        return True
    if rt in NO_FIGURES:
        return False
    stored = ((_stored().get("runtimes") or {}).get(rt) or {}).get("over_nodes")  # saved by its fit
    return stored if stored is not None else any(f.nodes > 1 for f in load_figures(rt))


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def describe(runtime: str) -> str:
    """One line for `predict` to print: what the runtime's constants rest on, and how far off they are."""
    rt = runtime_id(runtime)
    if _base(rt):
        fit = load_fit_summary().get("fit") or {}
        errs = ", ".join(f"{label} {_pct(fit[key])}" for key, label in (("mape_decode_tps", "decode"),
                                                                      ("mape_prefill_tps", "prefill"))
                         if key in fit)
        return (f"vLLM: the shared constants, fitted to {fit.get('fitted_cells', '?')} published DGX Spark figures "
                f"({FITTED.name})" + (f": {errs} mean error" if errs else ""))
    entry = (_stored().get("runtimes") or {}).get(rt)
    if rt in NO_FIGURES or entry is None:
        return f"{_name(rt)}: no published DGX Spark figures; predict models {_modelled()}"
    errs = entry["mean_error"]
    parts = ", ".join(f"{kind} {_pct(errs[kind])}" for kind in ("decode", "prefill") if kind in errs)
    shared = entry.get("shared") or {}
    factors = ", ".join(f"{name} x{v:.2f}" + (f" (from {_name(shared[name])})" if name in shared else "")
                        for name, v in entry["factors"].items())
    # The card the runtime's figures fit worst, where it is far from the mean.
    worst = ""
    cards = [(v.get(kind, 0.0), card, kind) for card, v in (entry.get("per_card") or {}).items()
             for kind in ("decode", "prefill")]
    if cards:
        err, card, kind = max(cards)
        if err > max(0.3, 1.5 * errs.get(kind, 0.0)):
            worst = f"; worst {card}, {kind} {_pct(err)}"
    return (f"{_name(rt)}: fitted to {entry['figures']} of its published DGX Spark figures "
            f"({'; '.join(entry['sources'])}): {parts} mean error{worst} (vLLM's constants x {factors})")


# -- replaying a figure ------------------------------------------------------------------------


def _card(fig: Figure) -> ModelCard:
    return runtime_card(fig.runtime, find_card(fig.card), fig.quant)


def _value(fig: Figure, stats: dict[str, float | None]) -> float | None:
    """The figure's metric from a replay's statistics (named as `fit.METRICS`
    names them for each metric), in the unit it was published in."""
    if fig.metric == "tpot_ms":
        rate = stats.get(METRICS["decode_tps_per_request"])
        return 1000.0 / rate if rate else None
    if fig.metric == "ttft_s":
        ms = stats.get(METRICS["ttft_ms"])
        return ms / 1000.0 if ms is not None else None
    return stats.get(METRICS[fig.metric])


def predicted(fig: Figure, k: Constants) -> tuple[float | None, bool]:
    """(the model's value of the figure with constants `k`, whether the batch's KV fits)."""
    card = _card(fig)
    if fig.tool == "llama-bench":
        # One sequence in-process: a prompt of n tokens on top of `depth`
        # cached ones in one ubatch (n_ubatch 2048), or n decode steps from it.
        perf = perf_for(card, fig.topology, k, fig.serving)
        n = fig.output_tokens if fig.kind == "decode" else fig.prompt_tokens
        if fig.kind == "decode":
            rate = n / sum(perf.step_time([fig.depth + i]) for i in range(n))
            return _value(fig, {"tg_tps_total": rate, "tg_tps_req": rate}), True
        t = perf.step_time([], [(n, fig.depth)])
        return _value(fig, {"pp_tps_total": n / t, "ttft_ms_mean": t * 1000.0}), True
    serving, kk, tg = fig.serving, k, fig.output_tokens
    if fig.tool == "llama-batched-bench":
        # B prompts, all of them before any decoding, then TG steps of all B;
        # no HTTP server in between. The first token comes with the prompt,
        # so TG decode steps follow it (S_TG = B x TG / T_TG). llama.cpp
        # allocates the KV cache it is told to (n_kv_max), and every row of
        # the table ran: no vLLM memory share to leave free, no preemption.
        kk = replace(k, request_overhead_s=0.0)
        serving = replace(serving, max_num_batched_tokens=max(serving.max_num_batched_tokens,
                                                              fig.concurrency * fig.prompt_tokens),
                          max_num_seqs=max(serving.max_num_seqs, fig.concurrency), enable_prefix_caching=False,
                          gpu_memory_utilization=1.0)
        tg = fig.output_tokens + 1
    p = predict(card, fig.topology, fig.concurrency, fig.prompt_tokens, tg, kk, serving)
    return _value(fig, {stat: getattr(p.stats, stat) for stat in METRICS.values()}), p.fits


def perf_of(fig: Figure, k: Constants) -> PerfModel:
    return perf_for(_card(fig), fig.topology, k, fig.serving)


def decode_rate(fig: Figure, value: float) -> float:
    """A decode figure (or its prediction) as the aggregate tokens/s of its batch."""
    if fig.metric == "decode_tps_per_request":
        return value * fig.concurrency
    if fig.metric == "tpot_ms":
        return 1000.0 / value * fig.concurrency
    return value


def decode_roofline(fig: Figure, k: Constants) -> float:
    """The most a decode figure's batch could generate: every byte a step
    reads at the full nominal bandwidth (`PerfModel.roofline_decode_tps`),
    at the shortest context the figure decodes at."""
    ctx = fig.depth if fig.tool == "llama-bench" else fig.prompt_tokens
    return perf_of(fig, k).roofline_decode_tps(fig.concurrency, ctx)


# -- errors and the fit --------------------------------------------------------------------------


@dataclass
class Row:
    figure: Figure
    predicted: float | None
    fits: bool

    @property
    def error(self) -> float | None:
        return self.predicted / self.figure.value - 1 if self.predicted and self.figure.value else None


def evaluate(figures: Sequence[Figure], k: Constants) -> list[Row]:
    return [Row(f, *predicted(f, k)) for f in figures]


def mean_errors(rows: Iterable[Row]) -> dict[str, float]:
    """Mean absolute relative error per kind (decode, prefill) and per metric."""
    by: dict[str, list[float]] = {}
    for r in rows:
        if r.error is None:
            continue
        by.setdefault(r.figure.kind, []).append(abs(r.error))
        by.setdefault(r.figure.metric, []).append(abs(r.error))
    return {key: round(statistics.fmean(v), 4) for key, v in by.items()}


def _loss(rows: Sequence[Row]) -> float:
    """Mean robust log error (`fit._cost`); each (source, card) group weighs
    the square root of its size, so one source's table does not drown the
    others. A figure the model cannot replay (or whose batch does not fit)
    costs as much as one off by 2x."""
    groups: dict[tuple[str, str], int] = {}
    for r in rows:
        groups[(r.figure.source, r.figure.card)] = groups.get((r.figure.source, r.figure.card), 0) + 1
    total = weight = 0.0
    for r in rows:
        w = groups[(r.figure.source, r.figure.card)] ** -0.5
        ok = r.predicted is not None and r.predicted > 0 and r.fits
        total += w * _cost(math.log(r.predicted / r.figure.value) if ok and r.predicted else math.log(2))
        weight += w
    return total / weight if weight else 0.0


def _ceiling(name: str, base: Constants) -> float:
    """The largest factor that still changes something: past it every
    efficiency it multiplies sits at its cap of 1 (so a factor is never
    reported larger than what it does)."""
    capped = [1.0 / getattr(base, f) for f in FACTOR_FIELDS[name] if f in CAPPED and getattr(base, f) > 0]
    return min(FACTOR_RANGE[1], max(capped)) if len(capped) == len(FACTOR_FIELDS[name]) else FACTOR_RANGE[1]


def _shared(runtime: str, fitted: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """The factors `runtime` takes from other runtimes' fits (`SHARED`): from
    `fitted` (this run's fits) or the stored file."""
    out = {}
    for name, other in SHARED.get(runtime, {}).items():
        src = (fitted or {}).get(other) or ((_stored().get("runtimes") or {}).get(other) or {}).get("factors") or {}
        if name not in src:
            raise CannotModel(f"{_name(runtime)} takes its {name} factor from {_name(other)}'s fit: fit "
                              f"{_name(other)} first (python -m sparktop.model.runtimes --fit {other} {runtime})")
        out[name] = src[name]
    return out


def fit_runtime(runtime: str, iterations: int = 90, base: Constants | None = None,
                fitted: dict[str, dict[str, float]] | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """Fit the runtime's factors (`KNOBS`) to its published figures by
    Nelder–Mead on their logs; returns (factors, report). The report holds
    the figure count, the mean errors per kind, metric and card, the
    sources, every figure's published and predicted value, and the run time.
    `fitted`: other runtimes' factors fitted in the same run (`SHARED`)."""
    rt = runtime_id(runtime)
    if rt not in KNOBS:
        raise CannotModel(f"no published DGX Spark figures for {_name(rt)} to fit"
                          + ("" if rt in NO_FIGURES else " (vLLM is fitted by `sparktop.model.fit`)"))
    t0 = time.monotonic()
    base = base or load_constants()
    figures = load_figures(rt)
    names = KNOBS[rt]
    shared = _shared(rt, fitted)
    bounds = [(math.log(FACTOR_RANGE[0]), math.log(_ceiling(n, base))) for n in names]

    def factors_of(v: Sequence[float]) -> dict[str, float]:
        return {n: math.exp(min(max(x, lo), hi)) for n, x, (lo, hi) in zip(names, v, bounds, strict=True)}

    best, _ = nelder_mead(lambda v: _loss(evaluate(figures, apply_factors(base, {**factors_of(v), **shared}))),
                          [0.0] * len(names), step=0.3, iterations=iterations)
    factors = {**{n: round(v, 4) for n, v in factors_of(best).items()}, **shared}
    return factors, report(rt, factors, base, figures, fit_seconds=time.monotonic() - t0)


def report(runtime: str, factors: dict[str, float], base: Constants, figures: Sequence[Figure] | None = None,
           fit_seconds: float | None = None) -> dict[str, Any]:
    """What the factors give on the runtime's figures (see `fit_runtime`)."""
    rt = runtime_id(runtime)
    figures = figures if figures is not None else load_figures(rt)
    k = apply_factors(base, factors)
    rows = evaluate(figures, k)
    sources = load_sources()
    used = list(dict.fromkeys(f.source for f in figures))
    per_card = {}
    for card in dict.fromkeys(f.card for f in figures):
        mine = [r for r in rows if r.figure.card == card]
        per_card[card] = {**{kind: v for kind, v in mean_errors(mine).items() if kind in ("decode", "prefill")},
                          "figures": len(mine)}
    # Published decode figures above what reading their step's bytes at the
    # full bandwidth allows: the model reads more than the runtime did.
    above = []
    for r in rows:
        if r.figure.kind == "decode":
            roof = decode_roofline(r.figure, k)
            if decode_rate(r.figure, r.figure.value) > roof:
                above.append(f"{r.figure.label()}: {decode_rate(r.figure, r.figure.value):,.1f} published, "
                             f"roofline {roof:,.1f} ({r.figure.where})")
    out: dict[str, Any] = {
        "name": _name(rt),
        "factors": factors,
        "multiplies": {n: list(FACTOR_FIELDS[n]) for n in factors},
        "shared": {n: other for n, other in SHARED.get(rt, {}).items() if n in factors},
        "at_bound": [n for n, v in factors.items() if n not in SHARED.get(rt, {})
                     and (v <= FACTOR_RANGE[0] * 1.001 or v >= _ceiling(n, base) * 0.999)],
        "constants": {f: getattr(k, f) for n in factors for f in FACTOR_FIELDS[n]},
        "figures": len(figures),
        "over_nodes": any(f.nodes > 1 for f in figures),  # `fitted_over_nodes`, read by predict
        "mean_error": mean_errors(rows),
        "per_card": per_card,
        "sources": [str(sources.get(s, {}).get("short") or s) for s in used],
        "above_roofline": above,
        "rows": [{"figure": r.figure.label(), "source": r.figure.source, "where": r.figure.where,
                  "published": r.figure.value, "predicted": None if r.predicted is None else round(r.predicted, 3),
                  "fits": r.fits} for r in rows],
    }
    if fit_seconds is not None:
        out["fit_seconds"] = round(fit_seconds, 1)
    return out


def table(entry: dict[str, Any]) -> str:
    lines = [f"{entry['name']}: " + ", ".join(f"{n} x{v:.3f}" for n, v in entry["factors"].items()),
             f"{'figure':62} {'published':>10} {'predicted':>10} {'error':>7}  where"]
    for r in entry["rows"]:
        pred = r["predicted"]
        err = f"{pred / r['published'] - 1:+.0%}" if pred else "—"
        lines.append(f"{r['figure']:62} {r['published']:10,.2f} {'—' if pred is None else f'{pred:,.2f}':>10} "
                     f"{err:>7}  {r['where']}")
    errs = entry["mean_error"]
    if entry.get("at_bound"):
        lines.append("at the edge of their range: " + ", ".join(entry["at_bound"]))
    lines += [f"above the bandwidth roofline: {a}" for a in entry.get("above_roofline") or []]
    lines.append(f"{entry['figures']} figures; mean error " + ", ".join(f"{k} {v:.1%}" for k, v in errs.items()))
    for card, v in entry["per_card"].items():
        lines.append(f"  {card:30} " + ", ".join(f"{k} {v[k]:.1%}" for k in ("decode", "prefill") if k in v)
                     + f"  ({v['figures']})")
    return "\n".join(lines)


def save(entries: dict[str, dict[str, Any]], base: Constants, path: Path = FACTORS) -> None:
    """Write the fitted factors (merged into what the file already holds for other runtimes)."""
    data = _normalised(json.loads(path.read_text())) if path.exists() else {}
    runtimes = data.get("runtimes") or {}
    for rt, entry in entries.items():
        runtimes[rt] = {key: v for key, v in entry.items() if key != "rows"}
    out = {
        "about": ("Multipliers on vLLM's fitted constants (fitted-constants.json) per serving runtime, fitted to "
                  "published-runtimes.yaml by `python -m sparktop.model.runtimes --fit`"),
        "base_constants": {name: getattr(base, name) for name in GLOBAL},
        "no_figures": {rt: f"no published DGX Spark figures for {_name(rt)}" for rt in NO_FIGURES},
        "runtimes": {rt: runtimes[rt] for rt in RUNTIMES if rt in runtimes},
    }
    path.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")


def stored_base() -> Constants:
    """The vLLM constants the stored factors were fitted on."""
    base = _stored().get("base_constants") or {}
    return replace(load_constants(), **{k: v for k, v in base.items() if k in GLOBAL})


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparktop.model.runtimes",
                                 description="Fit (or report) the runtime factors on published DGX Spark figures.")
    ap.add_argument("--fit", action="store_true", help=f"refit and write {FACTORS.name}")
    ap.add_argument("runtimes", nargs="*", help=f"runtimes (default: all with figures: {', '.join(KNOBS)})")
    args = ap.parse_args(argv)
    wanted = [runtime_id(r) for r in args.runtimes] or list(KNOBS)
    entries = {}
    base = load_constants() if args.fit else stored_base()
    fitted: dict[str, dict[str, float]] = {}
    for rt in wanted:
        if args.fit:
            fitted[rt], entry = fit_runtime(rt, base=base, fitted=fitted)
        else:
            stored = (_stored().get("runtimes") or {}).get(rt)
            if stored is None:
                print(f"{_name(rt)}: not fitted yet (python -m sparktop.model.runtimes --fit {rt})", file=sys.stderr)
                continue
            entry = report(rt, stored["factors"], base)
        entries[rt] = entry
        print(table(entry))
        if "fit_seconds" in entry:
            print(f"  fitted in {entry['fit_seconds']:.1f} s")
        print()
    if args.fit:
        save(entries, base)
        print(f"wrote {FACTORS}")
    for rt in entries:
        print(describe(rt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
