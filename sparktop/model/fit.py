"""Fit the performance model's few shared constants to published Spark figures,
and say honestly how far a prediction can be trusted.

Two reference files, each figure with its source and workload:

- `data/published-benchmarks.yaml`: the three articles (llama-benchy sweeps
  at pp1024 tg128 over five topologies);
- `data/published-more.yaml`: figures gathered from reviews, NVIDIA's own
  numbers, forums and project READMEs (llama-benchy, `vllm bench serve`,
  single-stream decode), for more models, precisions and concurrencies.

Every cell is predicted the way it was measured: a llama-benchy level by
`simulate.predict` (vLLM's scheduler on a virtual clock, the sweep's own
statistics), a `vllm bench serve` run by `simulate.predict_serve`. Only
vLLM figures are fitted; figures of other engines are reported beside them.

What is fitted: bandwidth and compute efficiency, attention efficiency,
per-step, per-layer and per-sequence overheads, the link's efficiency and
latency, Ray's per-step cost, the router's per-request cost, and how
strongly a batch's tokens share experts — all shared by every model. No
model and no cell has its own knob.

`cross_validate` refits without each model in turn and predicts it, then
without each source (an unseen harness and build): the band a user should
expect for a model no one measured (`error_bands`: a quantile of the
left-out figures' errors, and the share it holds), which `predict` states.
The result of both is kept in `data/fitted-constants.json`, with each
card's error over its own figures (`Report.per_card`) and a digest of the
figure files, so `predict` states them without predicting a published
cell; `twin fit --save-summary` refreshes those two when the figures
change (`--cross-validate --save-summary` the bands as well).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktop import engine_ids
from sparktop.errors import SparktopError
from sparktop.model.cards import ModelCard, UnknownModel, find_card
from sparktop.model.constants import DEFAULT_CONSTANTS, STACK_FACTOR_FIELDS, STACK_FACTOR_RANGE, Constants
from sparktop.model.quant import Quantization, fmt
from sparktop.model.routers import for_source
from sparktop.model.serving import Serving
from sparktop.model.simulate import TOPOLOGIES, predict, predict_serve
from sparktop.model.stacks import STACKS_FILE, UNKNOWN, load_stacks
from sparktop.yamlfile import load_published

if TYPE_CHECKING:
    from sparktop.settings import Inventory

DATA = Path(__file__).parent / "data"
PUBLISHED = DATA / "published-benchmarks.yaml"
MORE = DATA / "published-more.yaml"
FITTED = DATA / "fitted-constants.json"

# Metrics a cell can hold, and the statistic that predicts each.
METRICS = {"decode_tps": "tg_tps_total", "prefill_tps": "pp_tps_total", "ttft_ms": "ttft_ms_mean",
           "decode_tps_per_request": "tg_tps_req", "output_tps": "e2e_tps_total", "wall_s": "wall_s_mean"}
HEADLINE = ("decode_tps", "prefill_tps", "ttft_ms")
HIGHER_IS_BETTER = {"decode_tps": True, "prefill_tps": True, "ttft_ms": False, "decode_tps_per_request": True,
                    "output_tps": True, "wall_s": False, "request_throughput": True}
TARGET = {"decode_tps": 0.08, "prefill_tps": 0.12, "ttft_ms": 0.12}
LOMO_TARGET = 0.15  # leave-one-model-out decode MAPE, every model

# How each article served its model (from the runs' notes): memory share,
# context, KV dtype. Everything else is vLLM's default.
SERVING = {
    "gpt-oss-120b": Serving(gpu_memory_utilization=0.70),
    "gemma4-26b-a4b": Serving(gpu_memory_utilization=0.70, max_model_len=131072, kv_cache_dtype="fp8"),
    "nemotron-3-super-120b-a12b": Serving(gpu_memory_utilization=0.70, max_model_len=262144),
}
# The build the article ran where it differs from the checkpoint as published:
# gpt-oss ran the community MXFP4 image (data/gb10-sources.md §2).
ARTICLE_QUANT = {"gpt-oss-120b": "mxfp4-spark"}
GLOBAL = ("bandwidth_efficiency", "compute_efficiency", "moe_efficiency", "attention_efficiency", "activation_passes",
          "step_overhead_s",
          "layer_overhead_s", "seq_overhead_s", "allreduce_latency_s", "link_efficiency", "ray_step_overhead_s",
          "request_overhead_s", "router_overhead_s", "expert_batch_exponent", "expert_read_s")
CAPPED = ("bandwidth_efficiency", "compute_efficiency", "moe_efficiency", "attention_efficiency", "link_efficiency",
          "expert_batch_exponent")
# Physical ranges the fit may not leave. A two-node NCCL all-reduce of a few
# KiB over RoCE costs tens of microseconds (two ring hops, NIC and PCIe
# latency); left free, the simplex parks it near 90 µs to absorb misses of
# other cells, which makes TP=2 no faster than one node at c1 — against
# every article (data/gb10-sources.md §1.4).
BOUNDS = {"allreduce_latency_s": (5e-6, 40e-6)}
# What a constant is known to be before any fitted figure, and how much that
# knowledge counts (in the fit's own weight units: a fitted figure weighs 0.11
# on average, so 5.0 counts as much as about 45 of them). A prior matters
# where the figures cannot pin a constant: left without its largest source,
# the fit keeps no dense model's prefill, and the dense GEMM share drifted to
# 0.35 and missed that source's dense models by 20-40 % on prefill and
# 55-90 % on TTFT. With the prior it stays near what a dense engine is
# measured to reach; with every figure the figures still decide.
#
# compute_efficiency: the share of the measured large-GEMM rate
# (hardware/gb10.yaml `achieved_tflops`) that an engine's whole dense prefill
# reaches on a Spark, from figures the fit does not use (SGLang, LMSYS's
# review, `lmsys-review` in published-more.yaml; data/gb10-sources.md §1.5):
# prefill t/s x 2 x the weights a prompt token multiplies (attention and MLP,
# not the embedding or the LM head) / 188 TFLOPS FP8: Llama-3.1-8B FP8 7,991
# t/s -> 0.593, Llama-3.1-70B FP8 803 t/s -> 0.585; their geometric mean.
# (A whole prefill also spends time in attention and non-GEMM kernels, so the
# GEMMs' own share is a little higher: a lower-side anchor.)
# tests/unit/test_fit_priors.py computes it again from those figures.
PRIORS: dict[str, tuple[float, float]] = {"compute_efficiency": (0.589, 5.0)}


@dataclass(frozen=True)
class Cell:
    model: str  # the card's name
    topology: str
    metric: str
    concurrency: int
    published: float | None  # None: the source reports it failed (out of memory)
    source: str = ""
    engine: str = engine_ids.DEFAULT  # engine_ids' id (the figure's name when no row has it)
    workload: tuple = ("llama-benchy", 1024, 128, 0)  # (tool, input, output, requests)
    serving: Serving = Serving()
    quant: str = ""  # the figure's checkpoint format when it differs from the card's
    weight: float = 1.0  # how much the cell counts in the fit, beside its group's share (see study_cells)
    stack: str = ""  # the software stack it was measured on (model/stacks.py; "" or "unknown": not said)
    documented: float = 1.0  # how completely its source documents its setup, 0..1 (data/stacks.yaml)

    @property
    def fitted(self) -> bool:
        row = engine_ids.lookup(self.engine)
        return row is not None and row.base_model


# -- the reference files ---------------------------------------------------------------


def with_stack_facts(serving: Serving, graphs: bool | None, kv_dtype: str | None) -> Serving:
    """A run's serving as its source says it ran: without CUDA graphs, or an FP8 KV cache, where the
    source (or the image it names) says so and the figure's own flags do not say otherwise."""
    if graphs is False and not serving.enforce_eager:
        serving = replace(serving, enforce_eager=True)
    if kv_dtype and kv_dtype.startswith("fp8") and serving.kv_cache_dtype == "auto":
        serving = replace(serving, kv_cache_dtype="fp8")
    return serving


def _article_cells(path: Path) -> list[Cell]:
    data = load_published(path)
    stacks = load_stacks()
    cells = []
    for run in data["runs"]:
        if "what" in run:  # the kernel-backend comparison is not a topology table
            continue
        levels = run["concurrency"]
        source = str(run.get("source", ""))
        stack, graphs, kv, documented = stacks.for_figure(source, run)
        serving = with_stack_facts(SERVING.get(run["model"], Serving()), graphs, kv)
        for metric in HEADLINE:
            for topology, values in (run.get(metric) or {}).items():
                for c, v in zip(levels, values, strict=True):  # one value per level
                    cells.append(Cell(run["model"], topology, metric, c, v, source=source, serving=serving,
                                      quant=ARTICLE_QUANT.get(run["model"], ""), stack=stack,
                                      documented=documented))
    return cells


_MORE_METRICS = ("decode_tps", "decode_tps_per_request", "prefill_tps", "ttft_ms", "output_tps", "wall_s",
                 "request_throughput")


def _topology_of(fig: dict) -> str | None:
    nodes, tp = int(fig.get("nodes") or 1), int(fig.get("tp") or 1)
    if nodes == 1 and tp == 1:
        return "solo"
    if nodes == 2 and tp == 2:
        return "cluster-ray" if "ray" in str(fig.get("executor", "")).lower() else "cluster-mp"
    return None  # layouts the model does not cover yet


def _more_cells(path: Path, skipped: list[str] | None = None) -> list[Cell]:
    """Figures of the gathered reference file that name a known model, a
    layout the model covers and a workload it can replay. Left out, with the
    reason: speculative decoding and multi-turn prefix reuse (not modelled),
    open-loop arrivals that never saturate the engine (they measure the
    offered load, not the engine), figures their source marks suspect."""
    if not path.exists():
        return []
    data = load_published(path) or {}
    sources = data.get("sources") or {}
    stacks = load_stacks()
    cells = []

    def skip(where: str, why: str) -> None:
        if skipped is not None:
            skipped.append(f"{where}: {why}")

    for i, fig in enumerate(data.get("figures") or []):
        where = f"{path.name} figure {i + 1} ({fig.get('source')}, {fig.get('model')})"
        src = sources.get(fig.get("source"), {})
        engine = str(fig.get("engine") or src.get("engine") or engine_ids.DEFAULT).lower()
        engine = row.id if (row := engine_ids.lookup(engine)) is not None else engine
        if fig.get("suspect"):
            skip(where, "marked suspect by its source")
            continue
        try:
            card = find_card(str(fig.get("card") or fig.get("model")))
        except UnknownModel:
            skip(where, "no model card")
            continue
        topology = _topology_of(fig)
        wl = fig.get("workload") or {}
        sv = fig.get("serving") or {}
        tool = str(wl.get("tool", "custom")).lower()
        c = int(wl.get("concurrency") or wl.get("max_concurrency") or 1)
        pp, tg = wl.get("input_tokens"), wl.get("output_tokens")
        if tool in ("custom", "single-stream") and c == 1 and fig.get("decode_tps") is not None:
            tool, pp, tg = "single-stream", pp or 128, tg or 512  # c1 decode hardly depends on the lengths
        if topology is None:
            skip(where, f"layout not modelled (nodes {fig.get('nodes')}, tp {fig.get('tp')})")
            continue
        if sv.get("speculative") or sv.get("speculative_config"):
            skip(where, "speculative decoding is not modelled")
            continue
        if wl.get("depth_turns") or wl.get("depth"):
            skip(where, "multi-turn context reuse is not replayed")
            continue
        if tool == "vllm-bench-serve" and not wl.get("max_concurrency"):
            skip(where, "open-loop arrivals below saturation measure the offered load")
            continue
        if tool not in ("llama-benchy", "vllm-bench-serve", "single-stream") or not pp or not tg:
            skip(where, f"workload {tool} not replayed")
            continue
        requests = int(wl.get("num_requests") or c)
        try:
            serving = Serving().with_flags({k: v for k, v in sv.items() if k != "speculative"}, where)
        except SparktopError as exc:
            skip(where, str(exc))
            continue
        quant = str(fig.get("quantization") or "")
        try:
            Quantization.of(quant)
        except SparktopError:
            quant = ""
        stack, graphs, kv, documented = stacks.for_figure(str(fig.get("source")), fig)
        serving = with_stack_facts(serving, graphs, kv)
        for metric in _MORE_METRICS:
            if fig.get(metric) is None:
                continue
            if tool != "vllm-bench-serve" and metric == "request_throughput":
                continue
            if tool == "vllm-bench-serve" and metric not in ("output_tps", "request_throughput", "wall_s"):
                # Poisson arrivals queue differently from a closed loop: only
                # the saturated throughput is comparable.
                continue
            cells.append(Cell(card.name, topology, metric, c, float(fig[metric]), source=str(fig.get("source")),
                              engine=engine, workload=("llama-benchy" if tool == "single-stream" else tool, int(pp),
                                                       int(tg), requests), serving=serving, quant=quant,
                              stack=stack, documented=documented))
    return cells


def published_cells(more: bool = True) -> list[Cell]:
    cells = _article_cells(PUBLISHED)
    cells += _more_cells(MORE) if more else []
    return without_refuted(cells)[0]


def without_refuted(cells: list[Cell]) -> tuple[list[Cell], list[str]]:
    """The cells their own source refutes (`inconsistent`) left out of the fit (weight 0: the physics
    cannot meet both figures), and why, once per level."""
    refuted = inconsistent(cells)
    bad = {id(c) for c, _ in refuted}
    return [replace(c, weight=0.0) if id(c) in bad else c for c in cells], list(dict.fromkeys(w for _, w in refuted))


# How far a llama-benchy TTFT may sit from what its own prefill figure implies
# before the two refute each other: c prompts prefilled together finish
# between the first and the last, so the mean TTFT is about half to all of
# c x pp / prefill t/s; a factor of 2 beyond that on either side is not noise.
INCONSISTENT = 2.0
INCONSISTENT_SLACK_MS = 500.0


def _level(c: Cell) -> tuple:
    """The lockstep level a figure belongs to: its source, model, format, layout, concurrency and workload."""
    return c.source, c.model, c.quant, c.topology, c.concurrency, c.workload


def inconsistent(cells: Sequence[Cell]) -> list[tuple[Cell, str]]:
    """Figures their own source's other figures refute, with why: TTFTs
    whose mean implies a prefill rate the source's own prefill figure
    (same model, layout, concurrency and workload) refutes; and every figure
    of a lockstep level that cannot have had its concurrency in flight
    (`_flat_levels`)."""
    prefill = {_level(c): c for c in cells if c.metric == "prefill_tps" and c.published}
    out = []
    for c in cells:
        if c.metric != "ttft_ms" or not c.published or c.workload[0] != "llama-benchy":
            continue
        p = prefill.get(_level(c))
        if p is None:
            continue
        full = c.concurrency * c.workload[1] / p.published * 1000  # ms to prefill every prompt at that rate
        # A TTFT also holds the request's fixed costs (the API server, the first decode step), which the
        # prefill rate leaves out: up to INCONSISTENT_SLACK_MS more is not a contradiction.
        low, high = full * 0.5 / INCONSISTENT, full * INCONSISTENT + INCONSISTENT_SLACK_MS
        if not low <= c.published <= high:
            out.append((c, f"{c.model} {c.topology} c{c.concurrency} [{c.source}]: TTFT {c.published:,.0f} ms, "
                           f"but {c.concurrency} x {c.workload[1]} tokens at the printed {p.published:,.0f} t/s "
                           f"take {full:,.0f} ms (expected {full * 0.5:,.0f}-{full:,.0f} ms)"))
    return out + _flat_levels(cells)


# A level's aggregate decode within this much of the level below it has not grown ...
FLAT = 1.02
# ... where the model, every request in flight, has it grow by at least this much (a level whose queued
# prefills dilute its decode window, or whose decode is compute-bound, may be flat for real).
SHOULD_GROW = 1.10


def _flat_levels(cells: Sequence[Cell]) -> list[tuple[Cell, str]]:
    """Every figure of a llama-benchy level whose aggregate decode is no
    higher than the level below it on one engine (not a router) while the
    model, with every request in flight, has it grow: a step of c sequences
    reads the weights once for all of them, so such a level ran fewer at a
    time than its concurrency, by a cap its source does not state, and no
    replay of what the source says can reproduce it."""
    from sparktop.layouts import parse_layout

    decode: dict[tuple, dict[int, Cell]] = {}
    for c in cells:
        if (c.metric == "decode_tps" and c.published and c.workload[0] == "llama-benchy" and c.fitted
                and not parse_layout(c.topology).router):
            decode.setdefault((c.source, c.model, c.quant, c.topology, c.workload), {})[c.concurrency] = c
    flat: dict[tuple, str] = {}
    k = None
    for levels in decode.values():
        for conc, cell in levels.items():
            below = [n for n in levels if n < conc]
            if not below:
                continue
            prev = levels[max(below)]
            if (cell.published or 0.0) > (prev.published or 0.0) * FLAT:
                continue
            k = k or load_constants()
            now, before = predicted(cell, k)[0], predicted(prev, k)[0]
            if not now or not before or now < before * SHOULD_GROW:
                continue
            flat[_level(cell)] = (
                f"{cell.model} {cell.topology} c{conc} [{cell.source}]: decode {cell.published:,.1f} t/s, no more than "
                f"c{prev.concurrency}'s {prev.published:,.1f} on one engine, where all {conc} in flight give "
                f"{now / before - 1:+.0%}: it ran at most {prev.concurrency} at a time, by a cap the source does not "
                f"give (the level's every figure left out)")
    return [(c, flat[_level(c)]) for c in cells if _level(c) in flat and c.metric in HEADLINE and c.published]


# -- constants -----------------------------------------------------------------------


def load_constants(path: Path = FITTED) -> Constants:
    if not path.exists():
        return DEFAULT_CONSTANTS
    d = json.loads(path.read_text())
    return replace(DEFAULT_CONSTANTS, **{k: d[k] for k in GLOBAL if k in d},
                   stack_factors=stack_table({sid: e["factors"] for sid, e in (d.get("stacks") or {}).items()}))


def stack_table(factors: dict[str, dict[str, float]]) -> tuple:
    """Constants.stack_factors from {stack: {factor: value}}."""
    return tuple(sorted((sid, tuple(sorted(f.items()))) for sid, f in factors.items() if f))


def load_fit_summary(path: Path = FITTED) -> dict:
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def save_constants(k: Constants, summary: dict, path: Path = FITTED, cross: dict | None = None,
                   stacks: dict | None = None) -> None:
    d: dict[str, Any] = {name: getattr(k, name) for name in GLOBAL}
    d["fit"] = summary
    if stacks is None and path.exists():
        stacks = json.loads(path.read_text()).get("stacks")
    if stacks:
        d["stacks"] = stacks
    if cross is None and path.exists():
        cross = json.loads(path.read_text()).get("cross_validation")
    if cross:
        d["cross_validation"] = cross
    path.write_text(json.dumps(d, indent=2) + "\n")


# -- predicting a cell ---------------------------------------------------------------------


def _card(cell: Cell) -> ModelCard:
    """The card, in the checkpoint format the figure was measured with."""
    card = find_card(cell.model)
    if not cell.quant:
        return card
    try:
        quant = Quantization.of(cell.quant)
    except SparktopError:
        return card
    if quant == card.quant or quant.scheme != "mxfp4-spark" and fmt(quant.scheme).name == fmt(card.quant.scheme).name:
        return card
    return replace(card, quant=quant)


def predicted(cell: Cell, k: Constants) -> tuple[float | None, bool]:
    card = _card(cell)
    k = k.for_stack(cell.stack)
    tool, pp, tg, requests = cell.workload
    if tool == "vllm-bench-serve":
        sp = predict_serve(card, cell.topology, requests, cell.concurrency, pp, tg, k, cell.serving)
        value = {"output_tps": sp.output_tps, "request_throughput": sp.request_throughput,
                 "ttft_ms": sp.ttft_ms_mean, "decode_tps": sp.output_tps, "wall_s": sp.wall_s,
                 "decode_tps_per_request": 1000 / sp.tpot_ms_mean if sp.tpot_ms_mean else None}.get(cell.metric)
        return value, sp.errors == 0
    p = predict(card, cell.topology, cell.concurrency, pp, tg, k, cell.serving, router=for_source(cell.source))
    return getattr(p.stats, METRICS[cell.metric]), p.fits


def _evaluate_chunk(args) -> list[tuple[float | None, bool]]:
    k, cells = args
    return [predicted(cell, k) for cell in cells]


_POOL = None


def evaluate(k: Constants, cells: list[Cell], workers: int = 1) -> list[tuple[Cell, float | None, bool]]:
    """Every cell's prediction; with workers > 1 the cells are shared out
    between processes (a fit evaluates every cell hundreds of times)."""
    global _POOL
    if workers <= 1 or len(cells) < 50:
        return [(cell, *predicted(cell, k)) for cell in cells]
    if _POOL is None:
        import multiprocessing

        _POOL = multiprocessing.get_context("fork").Pool(workers)
        import atexit

        atexit.register(_POOL.terminate)  # closed before the interpreter tears its modules down
    # Cells of one model and workload share a simulation: keep them together.
    order = sorted(range(len(cells)), key=lambda i: (cells[i].model, cells[i].workload, cells[i].concurrency))
    chunks = [[cells[i] for i in order[len(order) * w // workers:len(order) * (w + 1) // workers]]
              for w in range(workers)]
    results = _POOL.map(_evaluate_chunk, [(k, chunk) for chunk in chunks])
    by_cell = {}
    for chunk, res in zip(chunks, results, strict=True):
        for cell, r in zip(chunk, res, strict=True):
            by_cell[id(cell)] = r
    return [(cell, *by_cell[id(cell)]) for cell in cells]


ROBUST = 0.3  # log-error scale past which a cell counts less and less (soft L1)


def _cost(e: float) -> float:
    """Soft-L1 of a log error: squared below ROBUST, linear above, so a
    figure its source measured under conditions nobody can replay (another
    job on the box, a warm-up still running) cannot drag every constant."""
    return 2 * ROBUST ** 2 * (math.sqrt(1 + (e / ROBUST) ** 2) - 1)


def prior_terms(k: Constants) -> list[tuple[int, float, float]]:
    """(index in GLOBAL, log error from the prior's value, weight) of each of PRIORS."""
    return [(GLOBAL.index(name), math.log(getattr(k, name) / value), weight)
            for name, (value, weight) in PRIORS.items()]


def loss(rows, k: Constants | None = None) -> float:
    """Mean robust log error. Each (source, model, format) group weighs the
    square root of its size, so one source's hundreds of rows do not drown
    an article's table. With `k`, the PRIORS count as figures of their
    weight, off by their constant's distance from the prior."""
    groups: dict[tuple, int] = {}
    for cell, _, _ in rows:
        groups[(cell.source, cell.model, cell.quant)] = groups.get((cell.source, cell.model, cell.quant), 0) + 1
    total = weight = 0.0
    for cell, pred, fits in rows:
        if not cell.fitted:
            continue
        # A source that documents its setup counts up to twice one that says only "vLLM".
        w = cell.weight * (0.5 + 0.5 * cell.documented) * groups[(cell.source, cell.model, cell.quant)] ** -0.5
        if cell.published and pred and pred > 0:
            total += w * _cost(math.log(pred / cell.published))
            weight += w
        # A published out-of-memory case that the model says fits costs as much
        # as a cell off by 2x; so does a cell it wrongly says does not fit.
        if (cell.published is None) == fits:
            total += w * _cost(math.log(2))
            weight += w
    for _, e, w in prior_terms(k) if k is not None else ():
        total += w * _cost(e)
        weight += w
    return total / weight if weight else 0.0


def _vector(k: Constants) -> list[float]:
    return [math.log(getattr(k, name)) for name in GLOBAL]


def _constants(v: list[float], base: Constants = DEFAULT_CONSTANTS) -> Constants:
    # Any: keyword arguments of replace(), which mypy checks against every field (model_factors too).
    g: dict[str, Any] = {name: math.exp(x) for name, x in zip(GLOBAL, v, strict=True)}
    for name in CAPPED:
        g[name] = min(g[name], 1.0)
    for name, (lo, hi) in BOUNDS.items():
        g[name] = min(max(g[name], lo), hi)
    return replace(base, **g)


def nelder_mead(f, x0: list[float], step: float = 0.3, iterations: int = 200, progress=None):
    """Minimise f; plain Nelder–Mead in the log of every constant."""
    n = len(x0)
    pts = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(p) for p in pts]
    for it in range(iterations):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if progress:
            progress(it, vals[0])
        centroid = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        worst = pts[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                best = pts[0]
                pts = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p, strict=True)] for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = min(range(n + 1), key=lambda i: vals[i])
    return pts[i], vals[i]


def refit(cells: list[Cell] | None = None, iterations: int = 150, progress=None,
          start: Constants | None = None, step: float = 0.3) -> Constants:
    cells = cells if cells is not None else published_cells()
    start = start or load_constants()
    # Start inside the range (capped constants stall the simplex at 1).
    start = replace(start, **{n: min(getattr(start, n), 0.95) for n in CAPPED})
    start = replace(start, **{n: min(max(getattr(start, n), lo), hi * 0.9) for n, (lo, hi) in BOUNDS.items()})
    workers = min(4, os.cpu_count() or 1)
    base = replace(DEFAULT_CONSTANTS, stack_factors=start.stack_factors)  # the stacks' factors held
    best, _ = nelder_mead(lambda v: loss(evaluate(kv := _constants(v, base), cells, workers), kv), _vector(start),
                          step=step, iterations=iterations, progress=progress)
    return _constants(best, base)


# -- software stacks ------------------------------------------------------------------------

YOURS = "yours"  # the stack of the user's own studies: whatever their nodes run, fitted on their cells
STACK_MIN_CELLS = 6  # fewer figures than this cannot tell a stack's factors from noise
# The prior: each factor costs this much loss per (log factor)^2, so a factor its
# figures cannot pin down stays at 1 instead of drifting to absorb noise.
STACK_PRIOR = 0.01


def fit_stack(stack: str, cells: list[Cell], k: Constants, iterations: int = 60,
              workers: int = 1) -> dict[str, Any]:
    """One stack's factors (`constants.STACK_FACTOR_FIELDS`) fitted on its own
    figures, with the shared constants `k` held: a stack's figures move its
    factors and nothing else. Returns {factors, cells, sources, before, after}."""
    mine = [c for c in cells if c.fitted and c.stack == stack]
    base = replace(k, stack_factors=tuple((s, f) for s, f in k.stack_factors if s != stack))
    names = list(STACK_FACTOR_FIELDS)
    bounds = [(math.log(STACK_FACTOR_RANGE[n][0]), math.log(STACK_FACTOR_RANGE[n][1])) for n in names]

    def factors_of(v: Sequence[float]) -> dict[str, float]:
        return {n: math.exp(min(max(x, lo), hi)) for n, x, (lo, hi) in zip(names, v, bounds, strict=True)}

    def with_factors(v: Sequence[float]) -> Constants:
        return replace(base, stack_factors=base.stack_factors + ((stack, tuple(sorted(factors_of(v).items()))),))

    def objective(v: Sequence[float]) -> float:
        return loss(evaluate(with_factors(v), mine, workers)) + STACK_PRIOR * sum(x * x for x in v)

    best, _ = nelder_mead(objective, [0.0] * len(names), step=0.25, iterations=iterations)
    factors = {n: round(v, 4) for n, v in factors_of(best).items()}
    after = evaluate(replace(base, stack_factors=base.stack_factors + ((stack, tuple(sorted(factors.items()))),)),
                     mine, workers)
    before = evaluate(base, mine, workers)
    return {"factors": factors, "cells": len(mine), "sources": sorted({c.source for c in mine}),
            "before": {m: round(v, 4) for m in HEADLINE if (v := _mape(before, m)) is not None},
            "after": {m: round(v, 4) for m in HEADLINE if (v := _mape(after, m)) is not None}}


def fit_stacks(cells: list[Cell] | None = None, k: Constants | None = None, iterations: int = 60,
               only: Sequence[str] | None = None, progress: Callable[[str], None] | None = None
               ) -> tuple[Constants, dict[str, dict]]:
    """Every stack with enough figures (or `only` those), one after another
    on the shared constants; returns the constants with the stacks' factors
    and each stack's entry (see `fit_stack`)."""
    cells = cells if cells is not None else published_cells()
    k = k or load_constants()
    counts: dict[str, int] = {}
    for c in cells:
        if c.fitted and c.stack and c.stack != UNKNOWN:
            counts[c.stack] = counts.get(c.stack, 0) + 1
    entries: dict[str, dict] = {}
    workers = min(4, os.cpu_count() or 1)
    for stack in sorted(counts, key=lambda s: counts[s]):
        if counts[stack] < STACK_MIN_CELLS or (only and stack not in only):
            continue
        if progress:
            progress(f"stack {stack}: {counts[stack]} figures")
        entries[stack] = fit_stack(stack, cells, k, iterations, workers)
        table = {s: dict(f) for s, f in k.stack_factors}
        table[stack] = entries[stack]["factors"]
        k = replace(k, stack_factors=stack_table(table))
    return k, entries


# -- the report -----------------------------------------------------------------------


def _mape(rows, metric: str, model: str | None = None) -> float | None:
    errs = [abs(pred / cell.published - 1) for cell, pred, _ in rows
            if cell.metric == metric and cell.published and pred and (model is None or cell.model == model)]
    return statistics.fmean(errs) if errs else None


@dataclass
class Report:
    rows: list[tuple[Cell, float | None, bool]]
    skipped: list[str] = field(default_factory=list)
    inconsistent: list[str] = field(default_factory=list)  # figures their own source refutes (left out of the fit)

    def by(self, key: Callable[[Cell], str]) -> dict[str, dict[str, Any]]:
        """Decode/prefill/TTFT MAPE and cell count per group (`key` of a cell: its stack, its source)."""
        groups: dict[str, list] = {}
        for row in self.fitted_rows():
            groups.setdefault(key(row[0]) or "unknown", []).append(row)
        return {g: {**{m: v for m in HEADLINE if (v := _mape(rows, m)) is not None}, "cells": len(rows),
                    "documented": round(statistics.fmean(r[0].documented for r in rows), 2)}
                for g, rows in sorted(groups.items())}

    def fitted_rows(self):
        return [r for r in self.rows if r[0].fitted]

    def mape(self, metric: str, model: str | None = None, fitted_only: bool = True) -> float | None:
        return _mape(self.fitted_rows() if fitted_only else self.rows, metric, model)

    def winners(self) -> tuple[int, int, list[str]]:
        """Cells (model, source, metric, concurrency) with two or more
        topologies published: how many name the same winner as the source."""
        groups: dict[tuple, list] = {}
        for cell, pred, _ in self.fitted_rows():
            if cell.published is not None and pred is not None and cell.metric in HEADLINE:
                groups.setdefault((cell.model, cell.workload, cell.metric, cell.concurrency), []).append((cell, pred))
        same, total, misses = 0, 0, []
        for (model, _, metric, c), items in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][3])):
            if len({cell.topology for cell, _ in items}) < 2:
                continue
            sign = 1 if HIGHER_IS_BETTER[metric] else -1
            pub = max(items, key=lambda x: sign * x[0].published)[0].topology
            pre = max(items, key=lambda x: sign * x[1])[0].topology
            total += 1
            if pub == pre:
                same += 1
            else:
                misses.append(f"{model} {metric} c{c}: published {pub}, predicted {pre}")
        return same, total, misses

    def text(self, worst: int = 15, cells: bool = True) -> str:
        lines = []
        if cells:
            lines.append(f"{'model':28} {'topology':12} {'metric':22} {'c':>4} {'published':>10} {'predicted':>12} "
                         f"{'error':>7}  source")
            for cell, pred, fits in self.rows:
                pub = "OOM" if cell.published is None else f"{cell.published:,.1f}"
                pr = "does not fit" if not fits and cell.published is None else \
                    "—" if pred is None else f"{pred:,.1f}"
                err = f"{pred / cell.published - 1:+.1%}" if cell.published and pred else \
                    ("ok" if cell.published is None and not fits else "MISS")
                src = cell.source + ("" if cell.fitted else f" [{cell.engine}, not fitted]")
                lines.append(f"{cell.model:28} {cell.topology:12} {cell.metric:22} {cell.concurrency:>4} {pub:>10} "
                             f"{pr:>12} {err:>7}  {src}")
            lines.append("")
        for metric in HEADLINE:
            m = self.mape(metric)
            if m is None:
                continue
            lines.append(f"MAPE {metric:12} {m:6.1%}  (target ≤ {TARGET[metric]:.0%})"
                         f"{'' if m <= TARGET[metric] else '  MISSED'}")
        for metric in ("decode_tps_per_request", "output_tps", "wall_s"):
            m = self.mape(metric)
            if m is not None:
                lines.append(f"MAPE {metric:12} {m:6.1%}")
        same, total, misses = self.winners()
        if total:
            lines.append(f"same winner as published: {same}/{total} cells ({same / total:.0%}, target ≥ 90 %)")
        models = sorted({c.model for c, _, _ in self.fitted_rows()})
        lines.append("")
        lines.append("per model (fitted figures): decode / prefill / TTFT MAPE, cells")
        for model in models:
            vals = [self.mape(m, model) for m in HEADLINE]
            n = sum(1 for c, _, _ in self.fitted_rows() if c.model == model)
            lines.append(f"  {model:28} " + " / ".join("—" if v is None else f"{v:5.1%}" for v in vals) + f"  ({n})")
        ranked = sorted((r for r in self.fitted_rows() if r[0].published and r[1]),
                        key=lambda r: -abs(r[1] / r[0].published - 1))[:worst]
        lines.append("")
        lines.append("cells that miss most:")
        for cell, pred, _ in ranked:
            lines.append(f"  {cell.model} {cell.topology} {cell.metric} c{cell.concurrency}: "
                         f"{cell.published:,.1f} published, {pred:,.1f} predicted ({pred / cell.published - 1:+.0%})"
                         f" [{cell.source}]")
        if misses:
            lines.append("winners that differ:")
            lines += [f"  {m}" for m in misses]
        for title, key in (("per software stack", lambda c: c.stack), ("per source", lambda c: c.source)):
            lines.append("")
            lines.append(f"{title}: decode / prefill / TTFT MAPE, cells, how well documented (0-1)")
            for group, v in self.by(key).items():
                lines.append(f"  {group[:40]:40} " + " / ".join(f"{v[m]:5.1%}" if m in v else "    —"
                                                                for m in HEADLINE)
                             + f"  ({v['cells']}, {v['documented']:.1f})")
        if self.inconsistent:
            lines.append("")
            lines.append("figures their own source refutes (left out of the fit):")
            lines += [f"  {why}" for why in self.inconsistent]
        if self.skipped:
            lines.append(f"figures not replayed: {len(self.skipped)} (`--json` lists them)")
        return "\n".join(lines)

    def summary(self) -> dict:
        same, total, _ = self.winners()
        out: dict[str, float | str] = {f"mape_{m}": round(v, 4) for m in HEADLINE if (v := self.mape(m)) is not None}
        out.update({"same_winner": f"{same}/{total}", "cells": len(self.rows),
                    "fitted_cells": len(self.fitted_rows())})
        return out

    def per_card(self) -> dict[str, dict[str, Any]]:
        """What `predict` says of each card its sources measured: the mean of |predicted / published - 1| over
        its fitted figures (every metric; `mean_error`, unrounded) and how many (`figures`), with its decode,
        prefill and TTFT MAPE."""
        errs: dict[str, list[float]] = {}
        for cell, pred, _ in self.fitted_rows():
            if cell.published and pred:
                errs.setdefault(cell.model, []).append(abs(pred / cell.published - 1))
        return {model: {"mean_error": statistics.fmean(e), "figures": len(e),
                        **{m: round(v, 4) for m in HEADLINE if (v := self.mape(m, model)) is not None}}
                for model, e in sorted(errs.items())}


def articles_summary(rep: Report) -> dict:
    """Error and winners over the three articles' cells of a report alone (the issue's check, kept in the
    saved fit), from the rows it already predicted."""
    sources = {c.source for c in _article_cells(PUBLISHED)}
    summary = Report([r for r in rep.rows if r[0].source in sources]).summary()
    return {key: v for key, v in summary.items() if key.startswith("mape_") or key == "same_winner"}


def figures_digest() -> str:
    """A hash of what the fit's report rests on besides the constants: the published figures and which
    stack ran each (`stacks.yaml`). Saved with the report's per-card errors; when the files no longer
    match it, `predict` says to run `sparktop twin fit --save-summary`."""
    h = hashlib.sha1()
    for path in (PUBLISHED, MORE, STACKS_FILE):
        h.update(path.name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return h.hexdigest()


def fit_summary(rep: Report) -> dict[str, Any]:
    """The `fit` block saved with the constants: the report's summary, the articles' share of it, each
    card's error (what `predict` states, read back without predicting a cell) and the figures' digest."""
    return {**rep.summary(), "articles": articles_summary(rep), "per_card": rep.per_card(),
            "figures_digest": figures_digest()}


def save_summary(rep: Report, path: Path | None = None, cross: dict | None = None) -> None:
    """Rewrite only the report's per-card errors and the figures' digest in the saved fit (`twin fit
    --save-summary`; the shipped file by default), and the cross-validation where one is given (`twin fit
    --cross-validate --save-summary`: the bands `predict` states), the constants and everything else as
    they are."""
    path = path or FITTED
    d = json.loads(path.read_text())
    d.setdefault("fit", {}).update({"per_card": rep.per_card(), "figures_digest": figures_digest()})
    if cross:
        d["cross_validation"] = cross
    path.write_text(json.dumps(d, indent=2) + "\n")


def report(k: Constants | None = None) -> Report:
    skipped: list[str] = []
    cells, refuted = without_refuted(_article_cells(PUBLISHED) + _more_cells(MORE, skipped))
    return Report(evaluate(k or load_constants(), cells, min(4, os.cpu_count() or 1)), skipped, refuted)


# -- leave one model out ------------------------------------------------------------------


# -- a linearised fit: what makes leave-one-model-out take minutes, not an hour ---------------
#
# Every evaluation of the published cells simulates each of them again; the
# simplex needs a hundred evaluations per fit, and leave-one-model-out is one
# fit per model. Around a fitted point the log of every prediction is close
# to linear in the log of every constant, so one Jacobian (an evaluation per
# constant) gives each left-out model's refit as a small weighted least-squares
# solve, checked by predicting that model once.

JACOBIAN_STEP = 0.05  # in the log of a constant: 5 %


def _residuals(rows) -> tuple[list[float], list[float], list[int]]:
    """(log errors, weights, row indices) of the rows the loss uses (published, predicted, weighed)."""
    groups: dict[tuple, int] = {}
    for cell, _, _ in rows:
        groups[(cell.source, cell.model, cell.quant)] = groups.get((cell.source, cell.model, cell.quant), 0) + 1
    res, wts, idx = [], [], []
    for i, (cell, pred, _) in enumerate(rows):
        if not cell.fitted or not cell.published or not pred or pred <= 0 or cell.weight <= 0:
            continue
        res.append(math.log(pred / cell.published))
        wts.append(cell.weight * (0.5 + 0.5 * cell.documented) * groups[(cell.source, cell.model, cell.quant)] ** -0.5)
        idx.append(i)
    return res, wts, idx


def jacobian(k: Constants, cells: list[Cell], workers: int = 1,
             progress: Callable[[str], None] | None = None) -> tuple[list, list[list[float]]]:
    """The rows at `k` and d log(prediction) / d log(constant) for every cell
    and GLOBAL constant (a forward step, backward for a constant at its cap)."""
    base_rows = evaluate(k, cells, workers)
    v = _vector(k)
    base = replace(DEFAULT_CONSTANTS, stack_factors=k.stack_factors)
    cols = []
    for j, name in enumerate(GLOBAL):
        h = JACOBIAN_STEP
        moved = _constants([x + (h if i == j else 0.0) for i, x in enumerate(v)], base)
        if getattr(moved, name) == getattr(_constants(v, base), name):  # at its cap or bound: step down
            h = -h
            moved = _constants([x + (h if i == j else 0.0) for i, x in enumerate(v)], base)
        if progress:
            progress(f"jacobian {j + 1}/{len(GLOBAL)}: {name}")
        rows = evaluate(moved, cells, workers)
        cols.append([(math.log(r[1]) - math.log(b[1])) / h if r[1] and b[1] and r[1] > 0 and b[1] > 0 else 0.0
                     for r, b in zip(rows, base_rows, strict=True)])
    return base_rows, [[cols[j][i] for j in range(len(GLOBAL))] for i in range(len(cells))]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """a x = b by Gaussian elimination with partial pivoting (a is small and symmetric positive definite)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        if abs(m[col][col]) < 1e-12:
            continue
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r] if abs(m[r][r]) >= 1e-12 else 0.0
    return x


def linear_step(residuals: list[float], weights: list[float], jac: list[list[float]], damping: float = 1e-2,
                max_step: float = 0.7, rounds: int = 5) -> list[float]:
    """The change of the log constants that minimises the soft-L1 loss of
    `residuals + jac @ step` (iteratively reweighted least squares, damped),
    each component at most `max_step`."""
    n = len(jac[0]) if jac else 0
    step = [0.0] * n
    for _ in range(rounds):
        ata = [[0.0] * n for _ in range(n)]
        atb = [0.0] * n
        for r, w, row in zip(residuals, weights, jac, strict=True):
            e = r + sum(a * x for a, x in zip(row, step, strict=True))
            w = w / math.sqrt(1 + (e / ROBUST) ** 2)  # soft-L1: a far-off cell counts less and less
            for i in range(n):
                if row[i]:
                    atb[i] -= w * row[i] * r
                    for j in range(n):
                        ata[i][j] += w * row[i] * row[j]
        for i in range(n):
            ata[i][i] += damping * (ata[i][i] + 1e-6) + 1e-4
        step = [max(-max_step, min(max_step, x)) for x in _solve(ata, atb)]
    return step


def with_priors(residuals: list[float], weights: list[float], jac: list[list[float]],
                k: Constants) -> tuple[list[float], list[float], list[list[float]]]:
    """The rows of a linearised solve at `k`, with a row per prior (see PRIORS):
    the constant's log distance from its prior value, of the prior's weight."""
    res, wts, rows = list(residuals), list(weights), list(jac)
    for j, e, w in prior_terms(k):
        res.append(e)
        wts.append(w)
        rows.append([1.0 if i == j else 0.0 for i in range(len(GLOBAL))])
    return res, wts, rows


def newton_refit(cells: list[Cell], start: Constants, rounds: int = 3, workers: int = 1,
                 progress: Callable[[str], None] | None = None) -> Constants:
    """The shared constants refitted by damped Gauss–Newton steps from
    `start` (each round a Jacobian and a solve), kept only when the loss falls."""
    k = start
    base = replace(DEFAULT_CONSTANTS, stack_factors=start.stack_factors)
    for r in range(rounds):
        rows, jac = jacobian(k, cells, workers, progress)
        before = loss(rows, k)
        res, wts, idx = _residuals(rows)
        step = linear_step(*with_priors(res, wts, [jac[i] for i in idx], k))
        for shrink in (1.0, 0.5, 0.25):
            trial = _constants([x + shrink * d for x, d in zip(_vector(k), step, strict=True)], base)
            after = loss(evaluate(trial, cells, workers), trial)
            if after < before:
                k = trial
                break
        else:
            break
        if progress:
            progress(f"round {r + 1}: loss {before:.4f} -> {after:.4f}")
    return k


# -- leave one group out: a model, a source ---------------------------------------------------
#
# An unmeasured model is like a model the fit never saw (leave-one-model-out);
# an unmeasured setup (another harness, another build, another box) is like a
# source the fit never saw (leave-one-source-out). Both are the same refit with
# another grouping of the cells: one Jacobian, then a solve and a prediction
# per left-out group.

CV_METRICS = HEADLINE + ("output_tps",)
# A source with fewer fitted figures than this cannot be told from noise on its
# own: such sources are left out together, as one group.
SOURCE_MIN_FIGURES = 5
FEW_SOURCES = "sources with < {n} figures"
BAND_QUANTILE = 0.8  # the share of left-out figures the stated band claims to hold


def by_model(cells: Sequence[Cell]) -> Callable[[Cell], str]:
    """Leave-one-model-out: each cell's group is its model."""
    return lambda c: c.model


def by_source(cells: Sequence[Cell], min_figures: int = SOURCE_MIN_FIGURES) -> Callable[[Cell], str]:
    """Leave-one-source-out: each cell's group is its source; sources with
    fewer than `min_figures` fitted figures are one group, left out together
    (harder than one at a time: none of them helps predict another)."""
    counts: dict[str, int] = {}
    for c in cells:
        if c.fitted:
            counts[c.source] = counts.get(c.source, 0) + 1
    few = FEW_SOURCES.format(n=min_figures)
    return lambda c: c.source if counts.get(c.source, 0) >= min_figures else few


GROUPINGS: dict[str, Callable[[Sequence[Cell]], Callable[[Cell], str]]] = {"model": by_model, "source": by_source}


def _errors(rows, metric: str) -> list[float]:
    """|predicted / published - 1| of the rows' `metric` figures that have both."""
    return [abs(pred / cell.published - 1) for cell, pred, _ in rows
            if cell.metric == metric and cell.published and pred]


def leave_out(cells: list[Cell], key: Callable[[Cell], str], start: Constants, linear: tuple | None = None,
              only: Sequence[str] | None = None, iterations: int = 60,
              progress: Callable[[str], None] | None = None) -> tuple[dict, dict[str, dict[str, list[float]]]]:
    """For every group (`key` of a fitted cell; `only` these): refit without
    its cells, predict them. `linear` is (rows, Jacobian) at `start` (see
    `jacobian`): each refit is then a linearised solve; None refits each by the
    simplex. Returns ({group: {metric: MAPE, "cells": n}}, {group: {metric:
    its left-out figures' absolute relative errors}})."""
    base = replace(DEFAULT_CONSTANTS, stack_factors=start.stack_factors)
    if linear is not None:
        res, wts, idx = _residuals(linear[0])
    table: dict[str, dict] = {}
    errors: dict[str, dict[str, list[float]]] = {}
    for group in only or sorted({key(c) for c in cells if c.fitted}):
        test = [c for c in cells if c.fitted and key(c) == group]
        if not test:
            continue
        if linear is None:
            train = [c for c in cells if key(c) != group]
            if progress:
                progress(f"without {group}: fitting on {len(train)} cells")
            k = refit(train, iterations=iterations, start=start, step=0.15)
        else:
            jac = linear[1]
            keep = [n for n, i in enumerate(idx) if key(cells[i]) != group]
            step = linear_step(*with_priors([res[n] for n in keep], [wts[n] for n in keep],
                                            [jac[idx[n]] for n in keep], start))
            k = _constants([x + d for x, d in zip(_vector(start), step, strict=True)], base)
            if progress:
                progress(f"without {group}: refitted on {len(keep)} cells, predicting its {len(test)}")
        rows = evaluate(k, test, min(4, os.cpu_count() or 1))
        table[group] = {m: round(v, 4) for m in CV_METRICS if (v := _mape(rows, m)) is not None}
        table[group]["cells"] = len(test)
        errors[group] = {m: e for m in CV_METRICS if (e := _errors(rows, m))}
    per = list(table.values())
    table["mean"] = {m: round(statistics.fmean(x[m] for x in per if m in x), 4)
                     for m in CV_METRICS if any(m in x for x in per)}
    return table, errors


def quantile(values: Sequence[float], q: float) -> float:
    """The smallest of `values` that at least a share `q` of them do not exceed (nearest rank): a band this
    wide holds at least that share of them."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def coverage(values: Sequence[float], band: float) -> float:
    """The share of `values` within ±band."""
    return sum(1 for v in values if v <= band) / len(values)


def held_out_coverage(groups: dict[str, list[float]], q: float) -> float | None:
    """The share of figures within a band set without their own group: each
    group's figures against the `q` quantile of every other group's errors.
    Near q when the band carries over to a group it has not seen."""
    inside = total = 0
    for g, errs in groups.items():
        others = [e for h, v in groups.items() if h != g for e in v]
        if not others or not errs:
            continue
        b = quantile(others, q)
        inside += sum(1 for e in errs if e <= b)
        total += len(errs)
    return inside / total if total else None


def error_bands(errors: dict[str, dict[str, dict[str, list[float]]]], q: float = BAND_QUANTILE) -> dict[str, dict]:
    """The band stated per metric for a model or setup nobody measured, from
    the left-out figures' errors of every grouping ({"model": {group: {metric:
    [errors]}}, "source": ...}): the widest of the groupings' `q` quantiles,
    so that at least that share of the figures is within it whichever way
    they were left out (a new model and a new setup at once are both); a
    quantile, not the mean (a few far misses lift the mean while most figures
    sit well inside it, so a band at the mean holds fewer than it seems to).
    With it: the share of every left-out figure within it (`coverage`), and
    for each grouping its mean error, its own quantile (`band`), the share of
    its figures within the stated band (`coverage`) and within the mean
    (`mean_coverage`), and within a band set without their own group
    (`held_out`: does a band carry over to a group it has not seen?)."""
    out: dict[str, dict] = {}
    for m in CV_METRICS:
        pooled = [e for grouping in errors.values() for g in grouping.values() for e in g.get(m, [])]
        if not pooled:
            continue
        band = max(quantile(errs, q) for grouping in errors.values()
                   if (errs := [e for g in grouping.values() for e in g.get(m, [])]))
        entry: dict[str, Any] = {"band": round(band, 4), "quantile": q, "figures": len(pooled),
                                 "coverage": round(coverage(pooled, band), 4)}
        for name, grouping in errors.items():
            errs = [e for g in grouping.values() for e in g.get(m, [])]
            if not errs:
                continue
            held = held_out_coverage({g: v[m] for g, v in grouping.items() if v.get(m)}, q)
            entry[name] = {"mean": round(statistics.fmean(errs), 4), "band": round(quantile(errs, q), 4),
                           "coverage": round(coverage(errs, band), 4),
                           "mean_coverage": round(coverage(errs, statistics.fmean(errs)), 4),
                           **({"held_out": round(held, 4)} if held is not None else {})}
        out[m] = entry
    return out


def cross_validate(cells: list[Cell] | None = None, iterations: int = 60, start: Constants | None = None,
                   progress: Callable[[str], None] | None = None, models: list[str] | None = None,
                   exact: bool = False, by: Sequence[str] = ("model", "source"),
                   q: float = BAND_QUANTILE) -> dict:
    """For every model with fitted figures: fit without it, predict it; then
    the same for every source (`by`: the groupings, of GROUPINGS). Returns
    {model: {metric: MAPE, "cells": n}} plus "mean" over models (leave-one-
    model-out, as before), "by_source" (the same table per left-out source),
    "bands" (`error_bands`: the error stated for an unmeasured model, per
    metric, and how many left-out figures it holds), "seconds" and "method".
    By default each refit is the linearised one around `start` (one Jacobian
    for every grouping, then a solve and one prediction per left-out group);
    `exact` refits each by the simplex (`iterations`), hours on 2 cores."""
    import time as _time

    t0 = _time.monotonic()
    cells = cells if cells is not None else published_cells()
    start = start or load_constants()
    linear = None if exact else jacobian(start, cells, min(4, os.cpu_count() or 1), progress)
    out: dict = {}
    errors: dict[str, dict[str, dict[str, list[float]]]] = {}
    for name in by:
        table, errors[name] = leave_out(cells, GROUPINGS[name](cells), start, linear,
                                        only=models if name == "model" else None, iterations=iterations,
                                        progress=progress)
        if name == "model":
            out.update(table)
        else:
            out[f"by_{name}"] = table
    out["bands"] = error_bands(errors, q)
    out["seconds"] = round(_time.monotonic() - t0, 1)
    out["method"] = "simplex" if exact else "linearised"
    return out


_NOT_GROUPS = ("mean", "bands", "seconds", "method")


def _table_text(table: dict, title: str, what: str, flag_over: float | None = None) -> list[str]:
    lines = [f"{title:40} {'decode':>8} {'prefill':>8} {'TTFT':>8} {'output':>8} {'cells':>6}"]
    for group, v in table.items():
        if group in _NOT_GROUPS or group.startswith("by_") or not isinstance(v, dict):
            continue
        cols = [f"{v[m]:8.1%}" if m in v else f"{'—':>8}" for m in CV_METRICS]
        flag = "" if flag_over is None or v.get("decode_tps") is None or v["decode_tps"] <= flag_over else \
            f"  over {flag_over:.0%}"
        lines.append(f"{group[:40]:40} {' '.join(cols)} {v.get('cells', 0):>6}{flag}")
    mean = table.get("mean", {})
    lines.append(f"{'mean over ' + what:40} " + " ".join(f"{mean[m]:8.1%}" if m in mean else f"{'—':>8}"
                                                         for m in CV_METRICS))
    return lines


def bands_text(bands: dict) -> list[str]:
    """The stated band per metric and how much of what was left out it holds."""
    if not bands:
        return []
    q = next(iter(bands.values())).get("quantile", BAND_QUANTILE)
    lines = [f"the error stated for an unmeasured model: the wider of the {q:.0%} quantiles of the left-out figures' "
             "errors, models left out and sources left out",
             f"{'':12} {'band':>7} {'figures':>8} {'within':>7}   {'left out':8} {'mean':>7} {'quantile':>9} "
             f"{'within mean':>12} {'within band':>12} {'band set without it':>20}"]
    names = {"decode_tps": "decode", "prefill_tps": "prefill", "ttft_ms": "TTFT", "output_tps": "output"}
    for m, b in bands.items():
        first = True
        for grouping in ("model", "source"):
            g = b.get(grouping)
            if not g:
                continue
            head = (f"{names.get(m, m):12} ±{b['band']:6.1%} {b['figures']:>8} {b['coverage']:7.0%}" if first
                    else f"{'':12} {'':7} {'':8} {'':7}")
            held = f"{g['held_out']:20.0%}" if "held_out" in g else f"{'—':>20}"
            lines.append(f"{head}   {grouping:8} {g['mean']:7.1%} {g['band']:9.1%} {g['mean_coverage']:12.0%} "
                         f"{g['coverage']:12.0%} {held}")
            first = False
    return lines


def cross_validation_text(cv: dict) -> str:
    lines = ["leave one model out (fit without it, predict it):"]
    lines += _table_text(cv, "left out", "models", LOMO_TARGET)
    if cv.get("by_source"):
        lines += ["", "leave one source out (fit without its figures, predict them):"]
        lines += _table_text(cv["by_source"], "left out", "sources")
    if cv.get("bands"):
        lines += [""] + bands_text(cv["bands"])
    if cv.get("seconds") is not None:
        lines.append(f"({cv.get('method', '')} refits, {cv['seconds']:.0f} s)")
    if PRIORS:  # what holds a constant the figures left in cannot pin (data/gb10-sources.md §1.5)
        lines.append("every refit holds " + ", ".join(f"{name} near {value:g} (a prior weighing {weight:g})"
                                                      for name, (value, weight) in PRIORS.items())
                     + ": figures it does not fit, data/gb10-sources.md §1.5")
    return "\n".join(lines)


def expected_error(metric: str = "decode_tps") -> float | None:
    """The error to expect for a model no source measured, as saved: the
    stated band (leave-one-model-out and leave-one-source-out), else the
    leave-one-model-out mean of an older fit."""
    cv = load_fit_summary().get("cross_validation") or {}
    band = ((cv.get("bands") or {}).get(metric) or {}).get("band")
    return band if band is not None else (cv.get("mean") or {}).get(metric)


# -- the user's own measurements -------------------------------------------------------
#
# A study (`sparktop.study`, read here as plain JSON: the model part may not
# import it) measured a recipe in several topologies on the user's nodes.
# Its levels become cells like the published ones, and a fit over both gives
# constants for that inventory only, kept beside the user's data; `predict`
# and the study's planner use them for that inventory (`inventory_constants`).

STUDY = "study.json"

# A published figure was measured on another Spark, with another vLLM build,
# by someone else's harness; a study's figure was measured on these nodes,
# with the software the user runs, by this sweep — what the constants of
# this inventory are for. So each of the user's cells counts three times
# what a published cell of a group its size counts, and the user's group
# is not shrunk by the square root the published groups are (that guards
# against one source drowning the others; here the user's source is the
# point). The published cells stay in the fit with their usual weight: they
# hold what the user did not measure (other models, other shapes) where it was.
STUDY_WEIGHT = 3.0


def inventory_key(inventory: Inventory) -> str:
    """A short key for an inventory's hardware: its nodes' hosts (a node on
    this machine by its name), sorted, hashed. The same nodes listed in
    another order or another file get the same key."""
    names = sorted(f"local:{n.name}" if n.is_local else n.host for n in inventory.nodes)
    return hashlib.sha1("\n".join(names).encode()).hexdigest()[:12]


def fitted_path(key: str) -> Path:
    from sparktop.settings import data_dir

    return data_dir() / "fitted" / f"{key}.json"


def fitted_summary(key: str | None) -> dict | None:
    """The saved fit for an inventory (constants, `fit`, `sources`), or None."""
    if not key:
        return None
    path = fitted_path(key)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def inventory_constants(key: str | None) -> Constants:
    """The constants fitted to this inventory's own measurements, where there
    are any; else the shipped ones."""
    if fitted_summary(key) is not None:
        assert key is not None
        return load_constants(fitted_path(key))
    return load_constants()


def save_fitted(key: str, k: Constants, summary: dict, sources: list[str]) -> Path:
    """Constants fitted for one inventory, in the shipped file's format, with
    the studies they were fitted to."""
    path = fitted_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    d: dict[str, Any] = {name: getattr(k, name) for name in GLOBAL}
    d["fit"] = summary
    d["sources"] = sources
    d["inventory_key"] = key
    d["stacks"] = {s: {"factors": dict(f)} for s, f in k.stack_factors}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(d, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def find_study(ref: str | Path) -> Path:
    """A study by directory or by id (under the data dir's `studies`)."""
    from sparktop.settings import data_dir

    p = Path(ref)
    if (p / STUDY).is_file():
        return p
    q = data_dir() / "studies" / str(ref)
    if (q / STUDY).is_file():
        return q
    raise SparktopError(f"{ref}: no such study (not a directory with {STUDY}, nor an id under "
                        f"{data_dir() / 'studies'}; see `sparktop studies`)")


def _read_study(path: Path) -> dict:
    try:
        data = json.loads((path / STUDY).read_text())
    except ValueError as e:
        raise SparktopError(f"{path / STUDY}:{getattr(e, 'lineno', 1)}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise SparktopError(f"{path / STUDY}: not a study (expected a JSON object)")
    return data


# Metric -> the level statistic that measures it. Per request only past c1,
# where it is not the decode figure again.
_STUDY_METRICS = (("decode_tps", "tg_tps_total"), ("prefill_tps", "pp_tps_total"), ("ttft_ms", "ttft_ms_mean"),
                  ("decode_tps_per_request", "tg_tps_req"))


def _cells_of_study(path: Path) -> tuple[str, list[Cell]]:
    """(study id, its measured cells): every complete, uncontaminated level of
    every finished topology, each metric one cell."""
    from sparktop.bench.results import load_run

    data = _read_study(path)
    sid = str(data.get("id") or path.name)
    name = data.get("card")
    if not name:
        raise SparktopError(f"{path / STUDY}: the study names no model card (`card`), so it cannot be predicted")
    try:
        card = find_card(str(name))
    except UnknownModel as e:
        raise SparktopError(f"{sid}: {e}") from None
    pp, tg = int(data.get("pp") or 1024), int(data.get("tg") or 128)
    # Twins at --speed S measure S times a GB10's rates (and a GB10's times over S): what a GB10 would give.
    speed = float(data.get("speed") or 1.0)
    quant = str(data.get("quant") or "")
    quant = "" if quant == card.quant.scheme else quant
    known = set(Serving.__dataclass_fields__)
    cells: list[Cell] = []
    for t in data.get("topologies") or []:
        if not isinstance(t, dict) or t.get("status") not in ("done", "failed") or not t.get("run"):
            continue
        topology = str(t.get("name"))
        if topology not in TOPOLOGIES:
            continue
        run_dir = path / "runs" / str(t["run"])
        if not run_dir.exists():
            continue
        try:
            serving = Serving(**{k: v for k, v in (t.get("serving") or {}).items() if k in known})
        except TypeError as e:
            raise SparktopError(f"{path / STUDY}: topology {topology}: serving settings not understood ({e})") \
                from None
        bad = set(t.get("contaminated") or [])
        for lv in load_run(run_dir).levels():
            if getattr(lv, "contaminated", False) or lv.concurrency in bad:
                continue
            for metric, stat in _STUDY_METRICS:
                if metric == "decode_tps_per_request" and lv.concurrency <= 1:
                    continue
                value = getattr(lv, stat, None)
                if value is None or not value > 0:
                    continue
                value = float(value) * speed if metric == "ttft_ms" else float(value) / speed
                cells.append(Cell(card.name, topology, metric, lv.concurrency, value, source=f"study {sid}",
                                  workload=("llama-benchy", pp, tg, 0), serving=serving, stack=YOURS, quant=quant))
    return sid, cells


def study_cells(paths: Sequence[str | Path]) -> list[Cell]:
    """The measured cells of these studies (ids or directories). A study
    without a finished topology, or whose card is unknown, is an error."""
    cells: list[Cell] = []
    for ref in paths:
        path = find_study(ref)
        sid, own = _cells_of_study(path)
        if not own:
            raise SparktopError(f"{sid}: no finished topology with measured levels yet "
                                "(see `sparktop studies`; a study is fitted once a topology is done)")
        cells += own
    return _ungrouped(cells)


def _ungrouped(cells: list[Cell]) -> list[Cell]:
    """Study cells, their weight raised by the square root `loss` takes off
    each group's cells (see STUDY_WEIGHT)."""
    sizes: dict[tuple, int] = {}
    for c in cells:
        sizes[(c.source, c.model, c.quant)] = sizes.get((c.source, c.model, c.quant), 0) + 1
    return [replace(c, weight=STUDY_WEIGHT * sizes[(c.source, c.model, c.quant)] ** 0.5) for c in cells]


def headline_mape(rows) -> dict[str, float]:
    """MAPE per headline metric (decode, prefill, TTFT) of evaluated rows."""
    return {m: round(v, 4) for m in HEADLINE if (v := _mape([r for r in rows if r[0].fitted], m)) is not None}


def prediction_error(study_dir: str | Path, k: Constants) -> dict:
    """How far predictions made with `k` are from what the study measured:
    {metric: MAPE} for decode, prefill and TTFT, and "cells". A study with
    nothing measured yet gives {"cells": 0}."""
    _, cells = _cells_of_study(find_study(study_dir))
    out: dict[str, Any] = headline_mape(evaluate(k, cells)) if cells else {}
    out["cells"] = len(cells)
    return out


@dataclass
class StudyFit:
    """What `fit_studies` did: the constants, where they went, the errors
    before (shipped constants) and after, on the user's and the published cells."""

    key: str
    constants: Constants
    sources: list[str]
    path: Path | None
    cells: int
    before: dict[str, dict[str, float]]  # {"yours": {metric: MAPE}, "published": {...}}
    after: dict[str, dict[str, float]]
    after_stack: dict[str, dict[str, float]] = field(default_factory=dict)  # with your stack's factors alone

    def text(self) -> str:
        names = {"decode_tps": "decode", "prefill_tps": "prefill", "ttft_ms": "TTFT"}
        lines = [f"fitted to {self.cells} measured cells of {', '.join(self.sources)} (inventory {self.key})",
                 f"{'MAPE':26} {'before':>8} {'stack':>8} {'after':>8}   (stack: your stack's factors alone)"]
        for which, label in (("yours", "your measurements"), ("published", "published figures")):
            for m in HEADLINE:
                b, st, a = (self.before[which].get(m), (self.after_stack.get(which) or {}).get(m),
                            self.after[which].get(m))
                if b is None and a is None:
                    continue
                lines.append(f"{label + ' ' + names[m]:26} " + " ".join(f"{'—':>8}" if v is None else f"{v:8.1%}"
                                                                        for v in (b, st, a)))
        factors = dict(next((f for s, f in self.constants.stack_factors if s == YOURS), ()))
        if factors:
            lines.append("your stack: " + ", ".join(f"{n} x{v:.2f}" for n, v in factors.items())
                         + " (on the published constants: model/stacks.py)")
        if self.path:
            lines.append(f"saved {self.path}")
        return "\n".join(lines)


def fit_studies(refs: Sequence[str | Path], key: str | None = None, iterations: int = 120,
                progress: Callable[[int, float], None] | None = None, save: bool = True) -> StudyFit:
    """Refit from the shipped constants on the published cells and the
    studies' cells; save the result for the inventory `key` (by default the
    one the studies recorded)."""
    paths = [find_study(r) for r in refs]
    mine = study_cells(paths)
    if key is None:
        keys = {str(k) for p in paths if (k := _read_study(p).get("inventory_key"))}
        if len(keys) > 1:
            raise SparktopError(f"the studies were measured on different inventories ({', '.join(sorted(keys))}): "
                                "fit them one inventory at a time, or name one with --inventory FILE")
        if not keys:
            raise SparktopError("the studies do not say which inventory they measured: name it with --inventory FILE")
        key = str(keys.pop())
    sources = []
    for p in paths:
        sid = str(_read_study(p).get("id") or p.name)
        if sid not in sources:
            sources.append(sid)
    published = published_cells()
    start = load_constants()
    cells = published + mine

    def errors(k: Constants) -> dict[str, dict[str, float]]:
        rows = evaluate(k, cells, min(4, os.cpu_count() or 1))
        return {"yours": headline_mape(rows[len(published):]), "published": headline_mape(rows[:len(published)])}

    before = errors(start)
    # First the user's own stack: a few factors on their cells alone (seconds), which is most of the
    # way from the published stacks to the software they run; then, with it held, the shared constants.
    own = fit_stack(YOURS, mine, start, iterations=60, workers=min(4, os.cpu_count() or 1))
    k = replace(start, stack_factors=stack_table({**{s: dict(f) for s, f in start.stack_factors},
                                                  YOURS: own["factors"]}))
    stacked = errors(k)
    if iterations > 0:
        k = refit(cells, iterations=iterations, start=k, step=0.2, progress=progress)
    after = errors(k)
    path = None
    if save:
        summary = {"cells": len(mine), "published_cells": len(published), "iterations": iterations,
                   "before": before, "after_stack": stacked, "after": after}
        path = save_fitted(key, k, summary, sources)
    return StudyFit(key, k, sources, path, len(mine), before, after, stacked)


__all__ = ["Cell", "TOPOLOGIES", "cross_validate", "evaluate", "fit_studies", "inventory_constants", "inventory_key",
           "load_constants", "prediction_error", "published_cells", "refit", "report", "study_cells"]
