"""Spark Arena: the community leaderboard's benchmark profile and its submission files.

Spark Arena (spark-arena.com) ranks DGX Spark results measured with one fixed
profile, `@official/spark-arena-v2` (spark-arena/recipe-registry,
`benchmarking/spark-arena-v2.yaml`): depths 0, 4096, 8192, 16384, 32768,
65535 and 100000 × concurrency 1, 2, 5 and 10, pp 2048, tg 128, 3 runs,
prefix caching on, its 28 cells in a fixed heat-aware order. sparkrun
(spark-arena/sparkrun) runs each cell as its own llama-benchy process (the
first with a warm-up batch and the coherence test, the others without) and
submits three files: `recipe.yaml` (the effective recipe), `benchmark.csv`
(llama-benchy's `--format csv` rows for every cell, in the order the cells
ran) and `metadata.json` (recipe, timing, cluster, benchmark, model,
runtime_info, version).

Here: the profile as data (`ARENA_V2`, `cells()`); `write_arena` writes a
run as those three files, the CSV exactly as llama-benchy 0.4.0 writes it
(its header, a cell's rows in its order, floats as Python's `repr`, an empty
field where it has no figure, CRLF line ends); `read_arena` reads them back
as a `Run` (`read_benchy_csv` reads any llama-benchy CSV); and
`submit_instructions` says what to run to submit. Nothing here uploads
anything: the board takes submissions from sparkrun's signed-in uploader only.

What the CSV's rows mean, as llama-benchy 0.4.0 measures a cell (depth d,
concurrency c) with `--enable-prefix-caching` at d > 0: each run sends c
"context load" requests together (a system message of d tokens, a user
message of ".", max_tokens tg), reported as `ctx_pp @ d…` (d tokens over the
time to the first response) and `ctx_tg @ d…`; then c requests with the same
contexts and a pp-token prompt, now cached, reported as `pp… @ d…` (pp
tokens only) and `tg… @ d…`. Every request draws its own context (a random
window of the book), so nothing is shared across requests or runs. At depth
0, or without prefix caching,
there is one request each (context and prompt together, pp + d tokens) and
no `ctx_` rows. Runs: `--runs` measured ones after one warm-up run (unless
`--no-warmup`). " (cN)" ends every name when the file's highest concurrency
is above 1.

A sparktop run written this way carries sparktop's figures (bench.stats:
llama-benchy's definitions, prefill timed to the first token, decode in
llama-benchy's count of tokens), not llama-benchy's; metadata.json says so
(`benchmark.framework: sparktop`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from sparktop import __version__, engine_ids
from sparktop.bench.request import RequestRecord
from sparktop.bench.run import Run
from sparktop.bench.stats import LevelStats, batch_stats, peak_rate
from sparktop.engine_ids import DEFAULT
from sparktop.errors import SparktopError
from sparktop.layouts import layout_of

RECIPE = "recipe.yaml"
CSV_FILE = "benchmark.csv"
METADATA = "metadata.json"
FILES = (RECIPE, CSV_FILE, METADATA)

# llama-benchy 0.4.0, results.py `save_report(format="csv")`: its columns in its order.
CSV_COLUMNS = ("model", "test_name", "t_s_mean", "t_s_std", "t_s_req_mean", "t_s_req_std", "peak_ts_mean",
               "peak_ts_std", "peak_ts_req_mean", "peak_ts_req_std", "ttfr_mean", "ttfr_std", "est_ppt_mean",
               "est_ppt_std", "e2e_ttft_mean", "e2e_ttft_std")

# Its test names: "pp2048", "tg128 @ d4096 (c5)", "ctx_pp @ d4096 (c5)", "ctx_tg @ d4096".
_STANDARD = re.compile(r"(pp|tg)(\d+)(?: @ d(\d+))?(?: \(c(\d+)\))?")
_CONTEXT = re.compile(r"ctx_(pp|tg) @ d(\d+)(?: \(c(\d+)\))?")


@dataclass(frozen=True)
class ArenaProfile:
    """A Spark Arena benchmark profile: llama-benchy's arguments and the order of its cells."""

    name: str
    ref: str  # how sparkrun names it
    depths: tuple[int, ...]
    concurrencies: tuple[int, ...]
    pp: int
    tg: int
    runs: int
    prefix_caching: bool
    schedule: tuple[tuple[int, int], ...]  # (depth, concurrency), in the order they run
    # sparkrun's scheduler gives only a session's first cell llama-benchy's warm-up run and coherence test
    # (`no_warmup`, `skip_coherence` for every later one): each cell is warmed by the one before it.
    warmup_first_cell_only: bool = True

    def cells(self) -> list[tuple[int, int]]:
        """Every (depth, concurrency) cell in the heat-aware order the profile runs them."""
        return list(self.schedule)

    def settings(self) -> dict[str, Any]:
        """What `sparktop sweep --profile NAME` sets: SweepSettings' fields (`cells` in the profile's order)."""
        return {"levels": list(self.concurrencies), "depths": list(self.depths),
                "cells": [list(c) for c in self.schedule], "pp": self.pp, "tg": self.tg, "runs": self.runs,
                "prefix_cache": self.prefix_caching, "warmup": True,
                "warmup_first_only": self.warmup_first_cell_only, "profile": self.name}

    def llama_benchy_args(self, depth: int, concurrency: int, first: bool = False) -> list[str]:
        """The arguments sparkrun gives llama-benchy for one cell (besides --base-url, --model, --format
        json and --save-result)."""
        args = ["--pp", str(self.pp), "--depth", str(depth), "--tg", str(self.tg), "--concurrency",
                str(concurrency), "--runs", str(self.runs)]
        if self.prefix_caching:
            args.append("--enable-prefix-caching")
        if not first:
            args += ["--no-warmup", "--skip-coherence"]
        return args


# spark-arena/recipe-registry, benchmarking/spark-arena-v2.yaml (2026-05-05, "runs: 3" added the same day).
# Its comment: "Heat-aware schedule generated from sparkrun-internal/benchmark-heat-load.py, strategy:
# bucket_43521_seed42 (n_buckets=5, pattern=(4,3,5,2,1), seed=42)". The generator is not public; the order
# reads as the cells ranked by the heat they make, cut into five buckets, taken round-robin 4, 3, 5, 2, 1:
# every fifth cell from the third is a concurrency-10 cell at a depth, so no hot cell follows another and
# none heats the GPU for the next. It is quoted here, not recomputed.
ARENA_V2 = ArenaProfile(
    name="spark-arena-v2", ref="@official/spark-arena-v2",
    depths=(0, 4096, 8192, 16384, 32768, 65535, 100000), concurrencies=(1, 2, 5, 10),
    pp=2048, tg=128, runs=3, prefix_caching=True,
    schedule=((8192, 5), (4096, 5), (8192, 10), (8192, 2), (4096, 2), (100000, 5), (100000, 2), (65535, 10),
              (65535, 1), (0, 1), (65535, 5), (32768, 2), (4096, 10), (16384, 1), (8192, 1), (32768, 5),
              (0, 10), (16384, 10), (32768, 1), (0, 5), (16384, 5), (100000, 1), (32768, 10), (16384, 2),
              (0, 2), (65535, 2), (4096, 1), (100000, 10)),
)
PROFILES = {ARENA_V2.name: ARENA_V2}


def cells() -> list[tuple[int, int]]:
    """spark-arena-v2's (depth, concurrency) cells in the order it runs them."""
    return ARENA_V2.cells()


def profile(name: str) -> ArenaProfile:
    """A profile by its name, with or without sparkrun's `@official/`."""
    key = name.removeprefix("@official/")
    if key not in PROFILES:
        raise SparktopError(f"--profile {name}: unknown profile (known: {', '.join(PROFILES)})")
    return PROFILES[key]


@dataclass
class ArenaLevel(LevelStats):
    """One cell as llama-benchy's CSV reports it: the level's figures in the fields LevelStats has (the
    decode figures in llama-benchy's count of tokens, which the board compares), and what else the CSV
    carries. `context_load` is the cell's context-load phase (its `ctx_pp`/`ctx_tg` rows), if measured."""

    depth: int = 0
    pp_tps_req_std: float | None = None
    tg_tps_req_std: float | None = None
    peak_tps_std: float | None = None
    peak_tps_req: float | None = None  # each request's own peak, averaged
    peak_tps_req_std: float | None = None
    ttfr_ms_mean: float | None = None  # to the first response of any kind (a role chunk counts)
    ttfr_ms_std: float | None = None
    est_ppt_ms_mean: float | None = None  # ttfr less the network latency: llama-benchy's prefill time
    est_ppt_ms_std: float | None = None
    context_load: LevelStats | None = None


def _depth(level: LevelStats) -> int:
    # Levels gain a depth when sweeps do (a cell is then (depth, concurrency)); before, every level is at 0.
    return int(getattr(level, "depth", 0) or 0)


def _blank(concurrency: int, depth: int, runs: int) -> ArenaLevel:
    return ArenaLevel(concurrency=concurrency, runs=runs, requests=runs * concurrency, errors=0, timeouts=0,
                      pp_tps_total=None, pp_tps_req=None, tg_tps_total=None, tg_tps_req=None, ttft_ms_mean=None,
                      ttft_ms_p50=None, ttft_ms_p95=None, ttft_ms_std=None, peak_tps=None, depth=depth)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _std(values: list[float]) -> float | None:
    return statistics.pstdev(values) if values else None  # numpy's np.std, as llama-benchy takes it


# -- a sparktop run's levels as the CSV's cells ------------------------------------------------------------


def _cell_batches(run: Run, context: bool) -> dict[tuple[int, int], list[list[RequestRecord]]]:
    """Complete batches per (depth, concurrency), chosen as `Run.batches` chooses them (a batch cut short is
    left out; a later complete attempt replaces an earlier one). `context`: the context-load requests (marked
    `context_load` on the record) instead of the measured ones."""
    groups: dict[tuple[int, int, int, int], list[RequestRecord]] = defaultdict(list)
    for r in run.records:
        if getattr(r, "scheduled", None) is not None or bool(getattr(r, "context_load", False)) != context:
            continue  # a rate sweep's request, or the other phase
        groups[(int(getattr(r, "depth", 0) or 0), r.level, r.run, r.attempt)].append(r)
    chosen: dict[tuple[int, int, int], list[RequestRecord]] = {}
    for (depth, level, n, _attempt), recs in sorted(groups.items()):
        if len(recs) >= level:
            chosen[(depth, level, n)] = sorted(recs, key=lambda r: r.index)
    out: dict[tuple[int, int], list[list[RequestRecord]]] = defaultdict(list)
    for (depth, level, _n), recs in sorted(chosen.items()):
        out[(depth, level)].append(recs)
    return dict(out)


def _as_arena(level: LevelStats, depth: int, batches: list[list[RequestRecord]], latency: float,
              expected_prompt: int) -> ArenaLevel:
    """A level's figures as llama-benchy reports them; what LevelStats does not keep (ttfr, est_ppt, the
    per-request spreads, each request's peak) is worked out from the level's requests where the run has them."""
    if isinstance(level, ArenaLevel):
        return level
    a = ArenaLevel(**{name: getattr(level, name) for name in LevelStats.__dataclass_fields__})
    a.depth = depth
    # The board compares llama-benchy's decode figures: sparktop keeps them beside its own (the same with
    # token ids; see bench.stats).
    if level.tg_tps_total_llama_benchy is not None:
        a.tg_tps_total = level.tg_tps_total_llama_benchy
    if level.tg_tps_req_llama_benchy is not None:
        a.tg_tps_req = level.tg_tps_req_llama_benchy
    if level.concurrency == 1:  # llama-benchy's per-request figure is its total at c1
        a.pp_tps_req_std = a.pp_tps_total_std
        a.tg_tps_req_std = a.tg_tps_total_std
    if not batches:
        return a
    per = [batch_stats(b, latency, expected_prompt) for b in batches]
    pp_req = [v for b in per for v in b.pp_tps_req]
    lb = level.tg_tps_total_llama_benchy is not None
    tg_req = [v for b in per for v in (b.tg_tps_req_llama_benchy if lb else b.tg_tps_req)]
    if level.concurrency > 1:
        tg_tot = [t for b in per if (t := b.tg_tps_total_llama_benchy if lb else b.tg_tps_total) is not None]
    else:
        tg_tot = tg_req
    a.tg_tps_total_std = _std(tg_tot) if tg_tot else a.tg_tps_total_std
    a.pp_tps_req_std = _std(pp_req) if pp_req else a.pp_tps_req_std
    a.tg_tps_req_std = _std(tg_req) if tg_req else a.tg_tps_req_std
    a.peak_tps_std = _std([b.peak_tps for b in per if b.peak_tps is not None])
    ok = [r for b in batches for r in b if r.ok]
    peaks = [peak_rate(r.token_times) for r in ok if r.token_times]
    a.peak_tps_req, a.peak_tps_req_std = _mean(peaks), _std(peaks)
    ttfr = [(r.first_response - r.start) * 1000 for r in ok if r.first_response is not None]
    est = [max(0.0, r.first_response - r.start - latency) * 1000 for r in ok
           if r.first_response is not None and r.first_token is not None]
    a.ttfr_ms_mean, a.ttfr_ms_std = _mean(ttfr), _std(ttfr)
    a.est_ppt_ms_mean, a.est_ppt_ms_std = _mean(est), _std(est)
    return a


def arena_levels(run: Run) -> list[ArenaLevel]:
    """The run's cells as the CSV reports them, in the order they ran (a file read back keeps its order)."""
    settings = run.meta.get("settings") or {}
    pp = int(settings.get("pp") or 0)
    latency = float(run.meta.get("latency_s") or 0.0)
    measured, loads = _cell_batches(run, False), _cell_batches(run, True)
    out: list[tuple[float, int, ArenaLevel]] = []
    for i, level in enumerate(run.levels()):
        depth = _depth(level)
        key = (depth, level.concurrency)
        # The prompt size the sweep gives level_stats (it counts by the server's usage where it says one), so
        # the spreads worked out here are of the same figures as the level's means.
        a = _as_arena(level, depth, measured.get(key, []), latency, pp + depth)
        ctx = getattr(level, "context_load", None)
        if isinstance(ctx, LevelStats) and not isinstance(level, ArenaLevel):
            a.context_load = _as_arena(ctx, depth, loads.get(key, []), latency, depth)
        starts = [r.start for b in measured.get(key, []) + loads.get(key, []) for r in b]
        out.append((min(starts) if starts else math.inf, i, a))
    return [a for _, _, a in sorted(out, key=lambda t: (t[0], t[1]))]


# -- writing ----------------------------------------------------------------------------------------------


def _num(v: float | None) -> str:
    # csv writes str() of llama-benchy's floats: Python's shortest round-trip repr ("1234.5678901", "3.0").
    return "" if v is None else repr(float(v))


def _phase_rows(model: str, a: LevelStats, pp_name: str, tg_name: str) -> list[list[str]]:
    def g(name: str) -> float | None:
        return getattr(a, name, None)  # a plain LevelStats has none of ArenaLevel's extras

    rows = []
    if a.pp_tps_total is not None:
        rows.append([model, pp_name, _num(a.pp_tps_total), _num(a.pp_tps_total_std), _num(a.pp_tps_req),
                     _num(g("pp_tps_req_std")), "", "", "", "", _num(g("ttfr_ms_mean")), _num(g("ttfr_ms_std")),
                     _num(g("est_ppt_ms_mean")), _num(g("est_ppt_ms_std")), _num(a.ttft_ms_mean),
                     _num(a.ttft_ms_std)])
    if a.tg_tps_total is not None or a.peak_tps is not None:
        rows.append([model, tg_name, _num(a.tg_tps_total), _num(a.tg_tps_total_std), _num(a.tg_tps_req),
                     _num(g("tg_tps_req_std")), _num(a.peak_tps), _num(g("peak_tps_std")), _num(g("peak_tps_req")),
                     _num(g("peak_tps_req_std")), "", "", "", "", "", ""])
    return rows


def csv_text(levels: list[ArenaLevel], model: str, pp: int, tg: int) -> str:
    """llama-benchy 0.4.0's CSV of these cells, byte for byte as it writes one (csv's excel dialect)."""
    suffix = max((a.concurrency for a in levels), default=1) > 1
    buf = io.StringIO()
    w = csv.writer(buf)  # excel: "\r\n" line ends and minimal quoting, as llama-benchy's DictWriter
    w.writerow(CSV_COLUMNS)
    for a in levels:
        c = f" (c{a.concurrency})" if suffix else ""
        if a.context_load is not None:
            w.writerows(_phase_rows(model, a.context_load, f"ctx_pp @ d{a.depth}{c}", f"ctx_tg @ d{a.depth}{c}"))
        d = f" @ d{a.depth}" if a.depth > 0 else ""
        w.writerows(_phase_rows(model, a, f"pp{pp}{d}{c}", f"tg{tg}{d}{c}"))
    return buf.getvalue()


def _iso(t: Any) -> str | None:
    if isinstance(t, int | float):
        return datetime.fromtimestamp(t, UTC).isoformat()
    return str(t) if t else None


def _epoch(t: Any) -> float | None:
    if isinstance(t, int | float):
        return float(t)
    if isinstance(t, str) and t:
        try:
            return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def profile_problems(run: Run, levels: list[ArenaLevel] | None = None, prof: ArenaProfile = ARENA_V2) -> list[str]:
    """Why the run is not the profile as the board runs it; empty when it is."""
    levels = arena_levels(run) if levels is None else levels
    s = run.meta.get("settings") or {}
    out = []
    if s.get("pp") != prof.pp or s.get("tg") != prof.tg:
        out.append(f"pp {s.get('pp')} tg {s.get('tg')} (the profile: pp {prof.pp} tg {prof.tg})")
    if s.get("runs") not in (None, prof.runs):
        out.append(f"{s.get('runs')} runs a cell (the profile: {prof.runs})")
    have = {(a.depth, a.concurrency) for a in levels}
    missing = [c for c in prof.cells() if c not in have]
    extra = sorted(have - set(prof.cells()))
    if missing:
        out.append(f"{len(missing)} of its {len(prof.schedule)} cells missing ("
                   + ", ".join(f"d{d} c{c}" for d, c in missing) + ")")
    if extra:
        out.append("cells outside it (" + ", ".join(f"d{d} c{c}" for d, c in extra) + ")")
    if prof.prefix_caching and any(a.depth > 0 and a.context_load is None for a in levels):
        out.append("no context-load rows at a depth (the profile measures with prefix caching: ctx_pp/ctx_tg)")
    return out


def _sparkrun_name(runtime: str | None) -> str | None:
    """sparkrun's name for a runtime (`llama-cpp` for llama.cpp), for the files sparkrun reads; else as given."""
    row = engine_ids.lookup(runtime)
    return (row.sparkrun if row is not None else None) or runtime


def _engine_id(runtime: Any) -> Any:
    """sparktop's id of the runtime an imported file names (`llama-cpp` -> llama.cpp); else as given."""
    row = engine_ids.lookup(runtime) if isinstance(runtime, str) else None
    return row.id if row is not None else runtime


def _recipe_text(run: Run, model: str, runtime: str | None, image: str | None) -> str:
    """With no recipe given: the facts known, in sparkrun's recipe shape, saying it is not a launchable one."""
    m = run.meta
    doc: dict[str, Any] = {"recipe_version": "2", "model": model, "runtime": _sparkrun_name(runtime or DEFAULT)}
    nodes = list(m.get("nodes") or [])
    if len(nodes) > 1:
        doc["min_nodes"] = len(nodes)
    if image:
        doc["container"] = image
    doc["metadata"] = {"description": f"written by sparktop {__version__} from run {run.id} "
                                      f"(topology {m.get('topology') or 'unknown'}); the recipe that served it "
                                      "was not given (sparktop export --arena --recipe FILE)"}
    return yaml.safe_dump(doc, sort_keys=False)


def _merge(into: dict, extra: dict) -> dict:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
    return into


def arena_metadata(run: Run, levels: list[ArenaLevel], recipe_text: str, model: str,
                   recipe_given: bool = True) -> dict:
    """metadata.json: the keys sparkrun writes (BenchmarkResult.generate_metadata, sparkrun 0.2.40) filled
    from the run, and a `sparktop` block with what sparktop knows that sparkrun does not say."""
    m = run.meta
    s = m.get("settings") or {}
    nodes = list(m.get("nodes") or [])
    image, runtime = m.get("image"), m.get("runtime")
    layout = layout_of(m.get("topology"))
    parallel = {k: v for k, v in (("tp", layout.tp), ("pp", layout.pp)) if v != 1} if layout else {}
    started, ended = _epoch(m.get("started")), _epoch(m.get("ended"))
    tool = str(m.get("tool") or "")
    problems = profile_problems(run, levels)
    return {
        "recipe": {"name": m.get("recipe"), "qualified_name": m.get("recipe"),
                   "type": "sparkrun" if recipe_given and _sparkrun_recipe(recipe_text) else "sparktop", "model": model,
                   "hf_model": model, "raw_container": image, "container": image, "container_pinned": False,
                   "runtime": _sparkrun_name(runtime), "runtime_full": _sparkrun_name(runtime), "registry": None,
                   "registry_git": "",
                   "hash": hashlib.sha256(recipe_text.encode("utf-8")).hexdigest()},
        "timing": {"start": _iso(m.get("started")), "end": _iso(m.get("ended")),
                   "duration": ended - started if started is not None and ended is not None else None},
        "cluster": {"cluster_id": m.get("topology") or run.id, "node_count": len(nodes) or 1, **parallel},
        "benchmark": {
            # Measured by sparktop's sweep, unless the run was imported from llama-benchy.
            "framework": "llama-benchy" if tool.startswith("llama-benchy") else "sparktop",
            "profile": ARENA_V2.ref if not problems else None,
            "args": {"depth": sorted({a.depth for a in levels}), "pp": [s.get("pp")], "tg": [s.get("tg")],
                     "concurrency": sorted({a.concurrency for a in levels}),
                     "prefix_caching": bool(s.get("prefix_cache")), "runs": s.get("runs")},
        },
        "model": {},
        "runtime_info": {"vllm": m["vllm_version"]} if m.get("vllm_version") else {},
        "sparktop": {"version": __version__, "run": run.id, "model": model, "nodes": nodes, "runtime": runtime,
                     "engine": m.get("engine"), "image": image, "topology": m.get("topology"),
                     "endpoint": m.get("endpoint"), "when": _iso(m.get("started")),
                     "csv": "llama-benchy 0.4.0 --format csv", "not_the_profile": problems,
                     "recipe_given": recipe_given},
    }


def write_arena(run: Run, out_dir: str | Path, recipe_text: str | None = None,
                extra_meta: dict | None = None) -> Path:
    """The run as Spark Arena's three files in `out_dir` (made if need be): `recipe.yaml` (`recipe_text`, the
    recipe that served; without it, one the run read back had, else the facts known), `benchmark.csv` and
    `metadata.json` (`extra_meta` merged into it, e.g. {"recipe": {"registry": …}})."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SparktopError(f"{out}: not a directory")
    levels = arena_levels(run)
    if not levels:
        raise SparktopError(f"{run.id}: no levels to export (no complete batch)")
    s = run.meta.get("settings") or {}
    if not s.get("pp") or not s.get("tg"):
        raise SparktopError(f"{run.id}: its settings have no pp and tg (llama-benchy names its rows by them)")
    model = str(run.meta.get("hf_model") or run.meta.get("model") or "Unknown")
    imported = run.meta.get("arena") or {}  # what read_arena kept, to write the same files again
    text = recipe_text if recipe_text is not None else imported.get("recipe")
    given = text is not None
    if text is None:
        text = _recipe_text(run, model, run.meta.get("runtime"), run.meta.get("image"))
    meta = json.loads(json.dumps(imported["metadata"])) if "metadata" in imported else \
        arena_metadata(run, levels, text, model, given)
    _merge(meta, extra_meta or {})
    out.mkdir(parents=True, exist_ok=True)
    (out / RECIPE).write_text(text, encoding="utf-8")
    with open(out / CSV_FILE, "w", encoding="utf-8", newline="") as f:  # newline="": keep the CRLFs
        f.write(csv_text(levels, model, int(s["pp"]), int(s["tg"])))
    # sparkrun writes json.dumps(metadata, indent=2), no newline after it.
    (out / METADATA).write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    return out


# -- reading ----------------------------------------------------------------------------------------------


@dataclass
class BenchyCsv:
    """A llama-benchy CSV read: its cells in file order, and what its names say."""

    levels: list[ArenaLevel]
    model: str
    pp: int | None
    tg: int | None
    rows: int
    prefix_cached: bool = False  # it has context-load rows
    notes: list[str] = field(default_factory=list)


def _set_phase(a: ArenaLevel, kind: str, row: dict, num) -> None:
    if kind == "pp":
        a.pp_tps_total, a.pp_tps_total_std = num("t_s_mean"), num("t_s_std")
        a.pp_tps_req, a.pp_tps_req_std = num("t_s_req_mean"), num("t_s_req_std")
        a.ttfr_ms_mean, a.ttfr_ms_std = num("ttfr_mean"), num("ttfr_std")
        a.est_ppt_ms_mean, a.est_ppt_ms_std = num("est_ppt_mean"), num("est_ppt_std")
        a.ttft_ms_mean, a.ttft_ms_std = num("e2e_ttft_mean"), num("e2e_ttft_std")
    else:
        a.tg_tps_total, a.tg_tps_total_std = num("t_s_mean"), num("t_s_std")
        a.tg_tps_req, a.tg_tps_req_std = num("t_s_req_mean"), num("t_s_req_std")
        a.peak_tps, a.peak_tps_std = num("peak_ts_mean"), num("peak_ts_std")
        a.peak_tps_req, a.peak_tps_req_std = num("peak_ts_req_mean"), num("peak_ts_req_std")
        # They are llama-benchy's decode figures: keep them under that name too, as import_llama_benchy does.
        a.tg_tps_total_llama_benchy, a.tg_tps_req_llama_benchy = a.tg_tps_total, a.tg_tps_req


def read_benchy_csv(path: str | Path, runs: int = 0) -> BenchyCsv:
    """A CSV llama-benchy 0.4 wrote (`--format csv`, or sparkrun's benchmark.csv), as cells in file order.
    Errors name the file, the line and the column."""
    p = Path(path)
    try:
        f = open(p, encoding="utf-8-sig", newline="")  # noqa: SIM115 - closed below
    except OSError as e:
        raise SparktopError(f"{p}: cannot read ({e.strerror})") from None
    with f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        if not header:
            raise SparktopError(f"{p}:1: empty (llama-benchy's CSV starts with a header: {','.join(CSV_COLUMNS)})")
        missing = [c for c in CSV_COLUMNS if c not in header]
        if missing:
            raise SparktopError(f"{p}:1: no column {missing[0]!r} (llama-benchy 0.4's CSV has "
                                f"{','.join(CSV_COLUMNS)}; this one has {','.join(header)})")
        cells: dict[tuple[int, int], ArenaLevel] = {}
        loads: dict[tuple[int, int], ArenaLevel] = {}  # the cells' context-load phases
        seen: set[tuple[str, int, int]] = set()
        model, pp, tg, n, cached = "", None, None, 0, False
        for row in reader:
            line = reader.line_num
            n += 1
            if None in row or any(v is None for v in row.values()):
                count = len(header) + len(row.get(None) or []) - sum(v is None for v in row.values())
                raise SparktopError(f"{p}:{line}: {count} fields where the header has {len(header)}")

            def num(col: str, row: dict = row, line: int = line) -> float | None:
                v = row[col].strip()
                if not v:
                    return None
                try:
                    return float(v)
                except ValueError:
                    raise SparktopError(f"{p}:{line}: column {col!r}: {v!r} is not a number") from None

            name = row["test_name"].strip()
            if m := _CONTEXT.fullmatch(name):
                kind, depth, c, context = m[1], int(m[2]), int(m[3] or 1), True
            elif m := _STANDARD.fullmatch(name):
                kind, size, depth, c, context = m[1], int(m[2]), int(m[3] or 0), int(m[4] or 1), False
                if kind == "pp" and pp not in (None, size) or kind == "tg" and tg not in (None, size):
                    raise SparktopError(f"{p}:{line}: column 'test_name': {name!r}: a second {kind} size "
                                        f"(sparktop reads one pp and one tg a file; this one had "
                                        f"{pp if kind == 'pp' else tg} before)")
                pp, tg = (size, tg) if kind == "pp" else (pp, size)
            else:
                raise SparktopError(f"{p}:{line}: column 'test_name': {name!r} is none of llama-benchy's names "
                                    "(pp2048, tg128 @ d4096 (c5), ctx_pp @ d4096 (c5), ctx_tg @ d4096)")
            key = (kind if not context else "ctx_" + kind, depth, c)
            if key in seen:
                raise SparktopError(f"{p}:{line}: column 'test_name': a second {name!r} row")
            seen.add(key)
            model = model or row["model"]
            cell = cells.setdefault((depth, c), _blank(c, depth, runs))
            if context:
                cached = True
                load = loads.setdefault((depth, c), _blank(c, depth, runs))
                cell.context_load = load
                _set_phase(load, kind, row, num)
            else:
                _set_phase(cell, kind, row, num)
    return BenchyCsv(list(cells.values()), model or "Unknown", pp, tg, n, cached)


def _load_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        line = getattr(e, "lineno", 1)
        raise SparktopError(f"{path}:{line}: not valid JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(doc, dict):
        raise SparktopError(f"{path}:1: not a JSON object (Spark Arena's metadata.json is one)")
    return doc


def _load_recipe(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise SparktopError(f"{path}:{mark.line + 1 if mark else 1}: not valid YAML "
                            f"({getattr(e, 'problem', None) or e})") from None
    return text


def _obj(doc: dict, key: str) -> dict:
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def is_arena_dir(path: str | Path) -> bool:
    """Spark Arena's three files are there (what `sparktop runs --import DIR` recognises)."""
    p = Path(path)
    return p.is_dir() and all((p / name).is_file() for name in FILES)


def read_arena(path: str | Path) -> Run:
    """Spark Arena's three files as a run: its cells as `imported_levels` (ArenaLevel, in file order), what
    metadata.json says in its meta, and the files' text kept so `write_arena` writes them again unchanged."""
    d = Path(path)
    if not d.is_dir():
        raise SparktopError(f"{d}: not a directory (a Spark Arena submission is a directory holding "
                            f"{', '.join(FILES)})")
    for name in FILES:
        if not (d / name).is_file():
            raise SparktopError(f"{d / name}: missing (a Spark Arena submission has {', '.join(FILES)})")
    doc = _load_json(d / METADATA)
    recipe_text = _load_recipe(d / RECIPE)
    bench = _obj(doc, "benchmark")
    args = _obj(bench, "args")
    given = args.get("runs")
    given = given[0] if isinstance(given, list) and given else given
    runs = given if isinstance(given, int) and not isinstance(given, bool) else 0
    table = read_benchy_csv(d / CSV_FILE, runs=runs)
    if not table.levels:
        raise SparktopError(f"{d / CSV_FILE}:2: no rows after the header")
    rec, ours, timing = _obj(doc, "recipe"), _obj(doc, "sparktop"), _obj(doc, "timing")
    cached = args.get("prefix_caching", args.get("enable_prefix_caching"))
    meta = {
        "id": d.name, "label": d.name, "model": table.model if table.model != "Unknown" else rec.get("hf_model"),
        "tool": f"{bench.get('framework') or 'llama-benchy'} (Spark Arena files)",
        "started": _epoch(timing.get("start")), "ended": _epoch(timing.get("end")),
        "settings": {"pp": table.pp, "tg": table.tg, "runs": runs or None,
                     "levels": sorted({a.concurrency for a in table.levels}),
                     "depths": sorted({a.depth for a in table.levels}),
                     "prefix_cache": bool(cached) if cached is not None else table.prefix_cached,
                     "profile": bench.get("profile")},
        "recipe": ours.get("recipe") or rec.get("name"), "topology": ours.get("topology"),
        "nodes": list(ours.get("nodes") or []), "runtime": _engine_id(rec.get("runtime")),
        "image": rec.get("container"),
        "status": "imported",
        "arena": {"metadata": doc, "recipe": recipe_text},
    }
    return Run(d, meta, [], {}, list(table.levels))


# -- submitting -------------------------------------------------------------------------------------------


def _sparkrun_recipe(text: str) -> bool:
    """Whether sparkrun can read the recipe as it is (its format: a container and no sparktop-only keys)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(doc, dict) and "container" in doc and not {"vllm", "image", "topologies", "limits"} & set(doc)


def submit_instructions(path: str | Path) -> list[str]:
    """What to run to submit the files in `path`. Nothing is uploaded from here."""
    d = Path(path)
    run = read_arena(d)
    levels = list(run.imported_levels or [])
    problems = profile_problems(run, [a for a in levels if isinstance(a, ArenaLevel)])
    rows = len((d / CSV_FILE).read_text(encoding="utf-8").splitlines()) - 1
    given = _obj(run.meta["arena"]["metadata"], "sparktop").get("recipe_given", True)
    usable = given and _sparkrun_recipe(run.meta["arena"]["recipe"])  # not the stand-in written without one
    recipe = str(d / RECIPE) if usable else "<your sparkrun recipe>"
    hosts = ",".join(run.meta.get("nodes") or []) or "<host1,host2>"
    lines = [
        "Nothing was uploaded: sparktop sends results nowhere.",
        f"{d}: {RECIPE}, {CSV_FILE} ({rows} rows in llama-benchy 0.4's CSV) and {METADATA}, the three files "
        "Spark Arena takes.",
    ]
    if problems:
        lines.append("Not the spark-arena-v2 profile as the board runs it: " + "; ".join(problems) + ".")
    lines += [
        "Spark Arena takes submissions only from sparkrun's uploader, signed in to your account (sparkrun 0.2.40 "
        "uploads its own three files after `sparkrun arena benchmark`; it has no command to upload files "
        "another tool wrote). To be on the board, run the profile with sparkrun on the same nodes:",
        "  uvx sparkrun setup            # once, if sparkrun is not installed",
        "  sparkrun arena login",
        f"  sparkrun arena benchmark {recipe} --hosts {hosts}",
        f"It runs {ARENA_V2.ref} (these cells, in this order) and uploads. Then `sparktop runs --import` its "
        "files (~/.cache/sparkrun/benchmarks/<submission>/) and `sparktop compare` them with this run.",
    ]
    return lines
