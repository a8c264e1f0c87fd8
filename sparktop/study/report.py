"""`sparktop report STUDY`: a study's measurements as the articles present them.

One table per metric (a row per concurrency, a column per topology with the
measured value and the prediction beside it, a Winner column with its
margin, "Tie" when the gap is within the batches' noise), the crossovers and
the recommendation per workload in words, how far the predictions were off,
what failed and why, and what ran — image, vLLM version, every command line
(secrets masked), nodes, dates and durations — enough to run it again.

`build()` gathers everything into one dict (what `--json` prints);
`markdown()` and `html()` draw that dict: the Markdown next to chart files
(SVG and PNG), the HTML as one self-contained file with the charts inline.
Winners come from `bench.compare.winner` with the runs' spreads, so
`sparktop compare` of the same runs names the same winners.
"""

from __future__ import annotations

import html as _html
import json
import re
import shlex
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparktop import __version__
from sparktop.bench import compare
from sparktop.bench.compare import METRICS, Metric, Spread
from sparktop.bench.load import share_text
from sparktop.bench.results import load_run
from sparktop.bench.run import Run
from sparktop.bench.stats import knee
from sparktop.errors import SparktopError
from sparktop.masking import mask
from sparktop.settings import DEMO_INVENTORY  # the report masks again (the runner did first)
from sparktop.study.planning import is_demo_inventory
from sparktop.study.state import CANCELLED, DONE, FAILED, Study, TopologyState
from sparktop.units import ago, fmt

# The tables, in the articles' order (peak throughput is left to `sparktop compare`).
# Energy per generated token (compare's last metric) closes them when the sweeps read the nodes'
# power: where a layout, or a concurrency, pays for itself.
REPORT_METRICS: tuple[Metric, ...] = tuple(m for m in METRICS if m.key != "peak_tps")
# Predictions exist for these; their error is reported.
PREDICTED = (("tg_tps_total", "decode"), ("pp_tps_total", "prefill"), ("ttft_ms_mean", "TTFT"))
_BY_KEY = {m.key: m for m in METRICS}

# Workloads, as `model.predict.SHAPES` names them, on measured figures:
# (name, levels: a tuple, "lowest", "highest" or (lo, hi) range, metric key, predicted key).
Levels = str | tuple[int, int]
SHAPES: tuple[tuple[str, Levels, str, str], ...] = (
    ("single user", "lowest", "tg_tps_total", "tg_tps_total"),
    ("agents at c8–c16", (8, 16), "tg_tps_total", "tg_tps_total"),
    ("high concurrency", "highest", "tg_tps_total", "tg_tps_total"),
    ("prefill-heavy", "highest", "pp_tps_total", "pp_tps_total"),
    ("latency at scale", "highest", "ttft_ms_p95", "ttft_ms_mean"),
)

DIRTY = "†"  # a level the sweep reported as contaminated

# ---------------------------------------------------------------------------
# numbers in words


def pct(x: float | None) -> str:
    """+12 %, −8 %, +0.4 % (a real minus sign, a space before %)."""
    if x is None:
        return "—"
    sign = "+" if x >= 0 else "−"
    v = abs(x) * 100
    return f"{sign}{v:.1f} %" if v < 9.95 and round(v, 1) != round(v) else f"{sign}{v:.0f} %"


def short(value: float | None) -> str:
    """A prediction, to as many digits as it deserves."""
    if value is None:
        return "—"
    a = abs(value)
    return f"{value:,.0f}" if a >= 100 else f"{value:.1f}" if a >= 10 else f"{value:.2f}"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "—"


def _dur(s: float | None) -> str:
    return ago(s) if s is not None else "—"


def levels_text(levels: list[int]) -> str:
    if not levels:
        return "—"
    return f"c{levels[0]}" if len(levels) == 1 else f"c{levels[0]}–c{levels[-1]}"


# ---------------------------------------------------------------------------
# gathering


def _predicted(t: TopologyState, c: int, key: str) -> float | None:
    v = (t.predicted.get(str(c)) or {}).get(key)
    return float(v) if isinstance(v, int | float) and v > 0 else None


def _load(study: Study) -> tuple[dict[str, Run], dict[str, str]]:
    runs: dict[str, Run] = {}
    problems: dict[str, str] = {}
    for t in study.topologies:
        d = study.run_dir(t)
        if d is None:
            continue
        try:
            run = load_run(d)
        except SparktopError as e:
            problems[t.name] = str(e)
            continue
        run.meta["label"] = t.name  # the column name, the same in `sparktop compare`
        if run.levels() or (run.mode == "rate" and run.rate_levels()):
            runs[t.name] = run
    return runs, problems


def _rates(columns: list[str], runs: dict[str, Run]) -> dict | None:
    """A rate study's answer: goodput and the SLO's verdict per rate and topology, each topology's highest
    rate meeting the SLO (its search's bracket and confidence), and which serves the most (None: no rates)."""
    per = {n: runs[n].rate_levels() for n in columns if runs[n].mode == "rate"}
    if not per:
        return None
    rates = sorted({lv.rate for lvs in per.values() for lv in lvs if lv.rate is not None})
    rows = []
    for rate in rates:
        values: dict[str, dict | None] = {}
        for n, lvs in per.items():
            lv = next((x for x in reversed(lvs) if x.rate == rate), None)
            values[n] = None if lv is None else {
                "goodput": lv.goodput, "share": lv.slo_share, "meets": lv.passes,
                "request_throughput": lv.request_throughput, "output_tps": lv.output_tps,
                "ttft_p95": lv.ttft_p95, "itl_p95": lv.itl_p95, "saturated": lv.saturated, "behind": lv.behind}
        rows.append({"rate": rate, "values": values})
    max_rates = {n: runs[n].meta.get("max_rate") for n in per}
    # Without a search, a topology's max rate is the highest rate it met the SLO at, of those tried.
    for n, lvs in per.items():
        if max_rates[n] is None and any(lv.slo for lv in lvs):
            met = [lv.rate for lv in lvs if lv.rate is not None and lv.passes]
            failed = [lv.rate for lv in lvs if lv.rate is not None and lv.rate not in met]
            best_lv = next((lv for lv in lvs if met and lv.rate == max(met)), None)
            max_rates[n] = {"rate": max(met) if met else None,
                            "failed_at": min((r for r in failed if not met or r > max(met)), default=None),
                            "share": best_lv.slo_share if best_lv else None,
                            "lower": best_lv.slo_lower if best_lv else None,
                            "requests": best_lv.requests if best_lv else 0}
    ranked = sorted(((m["rate"], n) for n, m in max_rates.items() if m and m.get("rate")), reverse=True)
    best = None
    if ranked:
        best = {"topology": ranked[0][1], "rate": ranked[0][0],
                "runner_up": ranked[1][1] if len(ranked) > 1 else None,
                "margin": ranked[0][0] / ranked[1][0] - 1 if len(ranked) > 1 else None}
    slo = next((runs[n].meta.get("slo") for n in per if runs[n].meta.get("slo")), None)
    return {"slo": slo, "rows": rows, "max_rates": max_rates, "best": best}


def _contaminated(t: TopologyState, run: Run | None) -> dict[int, str]:
    """Levels reported as contaminated, with what was seen."""
    out = {int(c): "" for c in t.contaminated}
    for lv in run.levels() if run else []:
        if getattr(lv, "contaminated", False):
            out[lv.concurrency] = str(getattr(lv, "contamination", None) or "")
    return {c: (note or "other traffic reached the engine during the level") for c, note in sorted(out.items())}


def _winner_dict(w: compare.Winner) -> dict:
    return {"name": w.name, "tie": w.tie, "margin": w.margin, "runner_up": w.runner_up, "best": w.best,
            "noise": w.noise}


def _mean_spread(spreads: list[Spread | None]) -> Spread | None:
    """The spread of a mean of independent figures (as a single 'batch')."""
    if not spreads or any(s is None for s in spreads):
        return None
    se = sum(s.se ** 2 for s in spreads if s is not None) ** 0.5 / len(spreads)
    return Spread(se, 1)


def _shape_levels(at: Levels, levels: Sequence[int]) -> list[int]:
    if not levels:
        return []
    if isinstance(at, tuple):
        return [c for c in levels if at[0] <= c <= at[1]]
    return [1] if at == "lowest" and 1 in levels else [levels[0]] if at == "lowest" else [levels[-1]]


def _recommend(study: Study, columns: list[str], levels: Sequence[int], by_run: dict, spread_by_run: dict,
               dirty: dict[str, dict[int, str]]) -> list[dict]:
    out = []
    tops = {t.name: t for t in study.topologies}
    for name, at, key, pkey in SHAPES:
        metric = _BY_KEY[key]
        use = _shape_levels(at, levels)
        entry: dict = {"workload": name, "levels": use, "metric": key, "title": metric.title}
        if not use:
            why = f"not measured: no level in c{at[0]}–c{at[1]}" if isinstance(at, tuple) else "not measured"
            entry.update(topology=None, tie=False, best=None, why=why)
            out.append(entry)
            continue
        values: dict[str, float | None] = {}
        spreads: dict[str, Spread | None] = {}
        for n in columns:
            vals = [getattr(by_run[n].get(c), key, None) if c in by_run[n] else None for c in use]
            if all(v is not None and v > 0 for v in vals):
                values[n] = statistics.fmean(v for v in vals if v is not None)
                spreads[n] = _mean_spread([spread_by_run[n].get(c, {}).get(key) for c in use])
        w = compare.winner(values, metric, spreads)
        pvals: dict[str, float | None] = {}
        for n in columns:
            pv = [_predicted(tops[n], c, pkey) for c in use]
            if all(v is not None for v in pv):
                pvals[n] = statistics.fmean(v for v in pv if v is not None)
        pw = compare.winner(pvals, _BY_KEY[pkey])
        entry.update(
            topology=w.name, tie=w.tie, best=w.best, runner_up=w.runner_up, margin=w.margin, noise=w.noise,
            value=values.get(w.best) if w.best else None,
            runner_up_value=values.get(w.runner_up) if w.runner_up else None,
            values=values,
            contaminated=sorted({n for n in values for c in use if c in dirty.get(n, {})}),
            predicted={"topology": pw.name, "tie": pw.tie, "best": pw.best, "margin": pw.margin},
        )
        entry["why"] = _why(entry, metric)
        out.append(entry)
    return out


def _why(e: dict, metric: Metric) -> str:
    where = " and ".join(f"c{c}" for c in e["levels"])
    what = f"{metric.short} ({metric.unit})"
    if e["best"] is None:
        return "no topology measured it"
    if e["runner_up"] is None:
        return f"the only topology measured at {where}: {fmt(e['value'], metric.unit)} {metric.unit}"
    a, b = fmt(e["value"], metric.unit), fmt(e["runner_up_value"], metric.unit)
    if e["tie"]:
        band = f" (noise ±{pct(e['noise'])[1:]})" if e.get("noise") else ""
        return (f"{e['best']} and {e['runner_up']} are within the noise{band} at {where}: {a} vs {b} {metric.unit} "
                f"{metric.short}; either will do")
    return f"{pct(e['margin'])} {what} over {e['runner_up']} at {where} ({a} vs {b})"


def _pred_errors(study: Study, columns: list[str], by_run: dict, dirty: dict[str, dict[int, str]]) -> dict:
    """Mean absolute % error of the prediction against the measurement,
    per topology and metric and overall (contaminated levels left out)."""
    tops = {t.name: t for t in study.topologies}
    per: dict[str, dict] = {}
    every: dict[str, list[float]] = {k: [] for k, _ in PREDICTED}
    for n in columns:
        row: dict = {}
        mine: list[float] = []
        seen: set[int] = set()
        for key, _ in PREDICTED:
            errs = []
            for c, lv in by_run[n].items():
                meas, pred = getattr(lv, key), _predicted(tops[n], c, key)
                if meas and pred and c not in dirty.get(n, {}):
                    errs.append(abs(pred / meas - 1))
                    seen.add(c)
            row[key] = statistics.fmean(errs) if errs else None
            every[key] += errs
            mine += errs
        row["all"] = statistics.fmean(mine) if mine else None
        row["points"] = len(mine)
        row["levels"] = len(seen)
        per[n] = row
    flat = [e for v in every.values() for e in v]
    overall = {k: (statistics.fmean(v) if v else None) for k, v in every.items()}
    overall.update(all=statistics.fmean(flat) if flat else None, points=len(flat))
    return {"per_topology": per, "overall": overall}


def _learned(study: Study) -> dict | None:
    """The error before and after `sparktop twin fit --runs` learned from this
    inventory's studies: the published constants vs the fitted ones, on this
    study's measurements. None until a fit for its inventory exists."""
    from sparktop.model import fit

    summary = fit.fitted_summary(study.inventory_key) if study.inventory_key else None
    if summary is None or study.path is None:
        return None
    try:
        before = fit.prediction_error(study.dir, fit.load_constants())
        after = fit.prediction_error(study.dir, fit.inventory_constants(study.inventory_key))  # both at a GB10's pace
    except Exception:  # noqa: BLE001 - a report never fails for want of a refit
        return None
    return {"before": before, "after": after, "sources": summary.get("sources") or []}


def _in_words(table: dict, columns: list[str]) -> str | None:
    """Who wins where, as ranges: "cluster-mp at c1–c8, shuffle ≈ least-busy at c16–c64"."""
    spans: list[tuple[str, list[int]]] = []
    for row in table["rows"]:
        w = row["winner"]
        if w["tie"]:
            pair = sorted((w["best"], w["runner_up"]), key=columns.index)
            who = f"{pair[0]} ≈ {pair[1]} (a tie)"
        else:
            who = w["name"]
        if who is None:
            continue
        if spans and spans[-1][0] == who:
            spans[-1][1].append(row["concurrency"])
        else:
            spans.append((who, [row["concurrency"]]))
    if not spans or len(columns) < 2:
        return None
    name = table["short"][:1].upper() + table["short"][1:]
    if len(spans) == 1 and "≈" not in spans[0][0]:
        return f"{name}: {spans[0][0]} wins at every level."
    return f"{name}: " + ", ".join(f"{who} at {levels_text(cs)}" for who, cs in spans) + "."


def _recipe_ref(study: Study) -> str:
    """How to name the study's recipe again: its name when the study found it by name in the catalog (shipped
    or the user's: the name finds the same file), not the installed package's path; else the file as given."""
    if not study.recipe_path or not Path(study.recipe_path).is_absolute():  # a path the user typed: as typed
        return study.recipe_path or study.recipe
    from sparktop.launch.catalog import find_recipe

    try:
        found = find_recipe(study.recipe).path
    except SparktopError:
        return study.recipe_path
    same = found is not None and Path(found).resolve() == Path(study.recipe_path).resolve()
    return study.recipe if same else study.recipe_path


def reproduce(study: Study) -> str:
    """The command that runs the same study again."""
    layouts = list(dict.fromkeys(t.layout_name for t in study.topologies))
    runtimes = list(dict.fromkeys(t.runtime for t in study.topologies if t.runtime))
    args = ["sparktop", "study", _recipe_ref(study), "--topologies", ",".join(layouts)]
    if runtimes:
        args += ["--runtimes", ",".join(runtimes)]
    if study.rates or study.find_max_rate:
        # A rate study: its rates (a search's starting one), SLO, arrivals and level length, not levels.
        args += ["--rate", ",".join(f"{r:g}" for r in study.rates or [1.0])]
        if study.slo:
            args += ["--slo", study.slo]
        if study.find_max_rate:
            args.append("--find-max-rate")
        if study.arrivals != "poisson":
            args += ["--arrivals", study.arrivals]
        args += ["--requests", str(study.requests)] if study.requests else ["--duration", f"{study.duration:g}"]
    else:
        args += ["-c", ",".join(str(c) for c in study.levels), "--runs", str(study.runs)]
    if study.depths:
        args += ["--depth", ",".join(str(d) for d in study.depths)]
    if study.prefix_cache:
        args += ["--prefix-cache", "on"]
    args += ["--pp", str(study.pp), "--tg", str(study.tg)]
    for k, v in (study.overrides or {}).items():
        val = "true" if v is True else "false" if v is False else str(v)
        args += ["--set", f"{k}={val}"]
    for k, v in (study.extra_body or {}).items():
        args += ["--extra-body", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    if study.inventory == DEMO_INVENTORY:
        # The demo's twin nodes: `--demo` sets them up again (and at the pace this one ran at).
        args += ["--demo"] + (["--speed", f"{study.speed:g}"] if study.speed and study.speed != 1 else [])
    elif study.inventory:
        # The file `sparktop demo` writes (`--inventory demo`) by the name it was given.
        args += ["--inventory", DEMO_INVENTORY if is_demo_inventory(study.inventory) else study.inventory]
    if study.nodes:
        args += ["--nodes", ",".join(study.nodes)]
    return mask(" ".join(shlex.quote(a) for a in args))


def build(study: Study) -> dict:
    """Everything the report shows, as plain data (what `--json` prints)."""
    runs, problems = _load(study)
    columns = [t.name for t in study.topologies if t.name in runs]
    run_list = [runs[n] for n in columns]
    names, levels, by_run = compare.table(run_list)
    assert names == columns, "a study's topologies have unique names"
    spread_by_run = compare.spread_table(run_list)
    tops = {t.name: t for t in study.topologies}
    dirty = {n: _contaminated(tops[n], runs[n]) for n in columns}

    tables = []
    for m in REPORT_METRICS:
        rows: list[dict] = []
        for c in levels:
            values: dict[str, dict] = {}
            for n in columns:
                lv = by_run[n].get(c)
                meas = getattr(lv, m.key) if lv is not None else None
                pred = _predicted(tops[n], c, m.key)
                sp = spread_by_run[n].get(c, {}).get(m.key)
                values[n] = {"measured": meas, "predicted": pred,
                             "error": (pred / meas - 1) if meas and pred else None,
                             "std": sp.std if sp else None, "batches": sp.n if sp else (lv.runs if lv else None),
                             "contaminated": lv is not None and c in dirty[n]}
            w = compare.winner({n: v["measured"] for n, v in values.items()}, m,
                               compare.level_spreads(spread_by_run, c, m.key))
            rows.append({"concurrency": int(c), "depth": getattr(c, "depth", 0), "values": values,
                         "winner": _winner_dict(w)})
        if any(v["measured"] is not None for r in rows for v in r["values"].values()):
            tables.append({"key": m.key, "title": m.title, "short": m.short, "unit": m.unit,
                           "higher_is_better": m.higher_is_better, "rows": rows})

    summary = [s for t in tables if t["key"] != "tg_tps_req" and (s := _in_words(t, columns))]
    cross_metrics = tuple(_BY_KEY[k] for k in ("tg_tps_total", "pp_tps_total", "ttft_ms_mean"))
    cross = compare.crossovers(run_list, cross_metrics, spread_by_run) if len(run_list) > 1 else []
    knees = {}
    for n in columns:
        k = knee(list(by_run[n].values()))
        if k is not None:
            knees[n] = k.describe("decode")

    topologies = []
    for t in study.topologies:
        run = runs.get(t.name)
        lvs = run.levels() if run else []
        topologies.append({
            "name": t.name, "layout": t.layout_name, "runtime": t.runtime or None, "recipe": t.recipe or study.recipe,
            "engine": run.meta.get("engine") if run else None,
            "status": t.status, "stage": t.stage, "reason": t.reason, "lines": list(t.lines),
            "run": t.run, "run_path": str(study.run_dir(t)) if t.run else None, "load_error": problems.get(t.name),
            "commands": [mask(c) for c in t.commands], "launched": t.launched, "nodes": list(t.nodes),
            "vllm_version": t.vllm_version,
            "startup_s": t.startup_s, "sweep_s": t.sweep_s, "started": t.started, "ended": t.ended,
            "levels_measured": [lv.concurrency for lv in lvs],
            "contaminated": {str(c): note for c, note in dirty.get(t.name, {}).items()},
            "errors": {str(lv.concurrency): {"errors": lv.errors, "requests": lv.requests,
                                             "reasons": dict(lv.error_reasons)} for lv in lvs if lv.errors},
            "serving": dict(t.serving), "predicted": bool(t.predicted),
            "tool": (run.meta.get("tool") if run else None),
        })
    unfinished = [d for d in topologies if d["status"] != DONE]
    return {
        "study": {
            "id": study.id, "recipe": study.recipe, "recipe_path": study.recipe_path, "model": study.model,
            "card": study.card, "image": study.image, "speed": study.speed, "stack": study.stack,
            "quant": study.quant, "state": study.state, "outcome": study.outcome, "levels": list(study.levels),
            "runs": study.runs, "pp": study.pp, "tg": study.tg, "extra_body": dict(study.extra_body),
            "overrides": dict(study.overrides), "nodes": list(study.nodes), "inventory": study.inventory,
            "inventory_key": study.inventory_key, "created": study.created, "updated": study.updated,
            "ended": study.ended, "estimate_s": study.estimate_s, "sparktop_version": study.sparktop_version,
            "rates": study.rates, "slo": study.slo, "find_max_rate": study.find_max_rate,
            "arrivals": study.arrivals, "depths": study.depths, "prefix_cache": study.prefix_cache,
            "path": str(study.path) if study.path else None,
        },
        "generated": {"at": time.time(), "sparktop_version": __version__},
        "columns": columns,
        "levels": levels,
        "tables": tables,
        "summary": summary,
        "crossovers": cross,
        "knees": knees,
        "recommendations": _recommend(study, columns, levels, by_run, spread_by_run, dirty),
        "prediction_error": _pred_errors(study, columns, by_run, dirty),
        "learned": _learned(study),
        "contamination": [{"topology": n, "concurrency": c, "note": note}
                          for n in columns for c, note in dirty[n].items()],
        "failed": [{"name": d["name"], "status": d["status"], "reason": d["reason"] or d["load_error"],
                    "lines": d["lines"], "levels_measured": d["levels_measured"]} for d in unfinished],
        "topologies": topologies,
        "reproduce": reproduce(study),
        "rates": _rates(columns, runs),
    }


# ---------------------------------------------------------------------------
# the document, once, for both renderers


@dataclass
class Cell:
    text: str
    note: str = ""  # beside the value, quieter: "pred 380, −8 %"
    cls: str = ""  # for HTML: win, tie, dirty, none

    def md(self) -> str:
        s = f"{self.text} ({self.note})" if self.note else self.text
        return s.replace("|", "\\|")


@dataclass
class Heading:
    level: int
    text: str
    anchor: str = ""


@dataclass
class Para:
    text: str  # `code` and **bold** are understood
    cls: str = ""


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    head: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)
    cls: str = ""


@dataclass
class Code:
    text: str


@dataclass
class Charts:
    pass


Block = Heading | Para | Bullets | Table | Code | Charts


def _value_cell(v: dict, unit: str, winner: dict) -> Cell:
    if v["measured"] is None:
        return Cell("—", cls="none")
    text = fmt(v["measured"], unit) + (DIRTY if v["contaminated"] else "")
    note = f"pred {short(v['predicted'])}, {pct(v['error'])}" if v["predicted"] is not None else ""
    return Cell(text, note, "dirty" if v["contaminated"] else "")


def _winner_cell(w: dict) -> Cell:
    if w["tie"]:
        band = f"±{pct(w['noise'])[1:]}" if w.get("noise") and w["noise"] >= compare.TIE else "< 1 %"
        return Cell("Tie", f"{w['best']} ≈ {w['runner_up']}, {band}", "tie")
    if w["name"] is None:
        return Cell("—", cls="none")
    return Cell(w["name"], pct(w["margin"]), "win")


def document(data: dict) -> list[Block]:
    st = data["study"]
    cols = data["columns"]
    out: list[Block] = []
    # A study over the whole inventory names no nodes of its own: the ones its layouts ran on, then.
    nodes = ", ".join(st["nodes"] or dict.fromkeys(n for t in data["topologies"] for n in t["nodes"])) or "—"
    out.append(Heading(1, f"{st['recipe']}: {len(data['topologies'])} topologies compared"))
    versions = sorted({t["vllm_version"] for t in data["topologies"] if t["vllm_version"]})
    if st.get("rates") or st.get("find_max_rate"):
        rates = st.get("rates") or [1.0]
        how = (f"the highest rate meeting {st.get('slo')}, searched from {rates[0]:g}/s" if st.get("find_max_rate")
               else f"{', '.join(f'{r:g}' for r in rates)} requests/s") + f", {st.get('arrivals')} arrivals"
    else:
        how = f"{levels_text(data['levels'] or st['levels'])}, {st['runs']} batches per level"
        if st.get("depths"):
            how += f", at depths {', '.join(f'{d:,}' for d in st['depths'])}"
    out.append(Para(
        f"**{st['model']}** on {nodes} · image `{st['image'] or 'unknown'}` · vLLM {', '.join(versions) or 'unknown'}"
        f" · pp{st['pp']} tg{st['tg']} · {how} · study `{st['id']}` ({st.get('outcome') or st['state']}), "
        f"{_when(st['created'])}",
        "lede"))
    if not cols:
        out.append(Para("Nothing was measured: no topology has a finished level yet."))

    # The answer first.
    recs = [r for r in data["recommendations"] if r.get("best") or r.get("why")]
    if recs and cols and data["tables"]:  # a rate study has no lockstep levels to recommend from
        out.append(Heading(2, "Recommendations", "recommendations"))
        rows = []
        for r in recs:
            pick = Cell("—", cls="none")
            if r.get("tie"):
                pick = Cell(f"{r['best']} ≈ {r['runner_up']}", "tie", "tie")
            elif r.get("topology"):
                pick = Cell(r["topology"], cls="win")
            p = r.get("predicted") or {}
            pred = "—"
            if p.get("best"):
                pred = f"tie ({p['best']})" if p.get("tie") else str(p["topology"])
                same = p.get("best") == r.get("best") or (r.get("tie") and p.get("best") in (r["best"], r["runner_up"]))
                pred += " ✓" if same else " ✗"
            dirty = f" {DIRTY}" if r.get("contaminated") else ""
            rows.append([Cell(r["workload"]), Cell(" and ".join(f"c{c}" for c in r["levels"]) or "—"),
                         Cell(_BY_KEY[r["metric"]].short), pick, Cell(r["why"] + dirty), Cell(pred)])
        notes = [f"{DIRTY} measured on a contaminated level (see the notes under the tables)"] \
            if any(r.get("contaminated") for r in recs) else []
        out.append(Table(["Workload", "Levels", "Judged on", "Best topology", "Why", "Predicted pick"], rows,
                         notes, "recs"))
        if data["summary"]:
            out.append(Bullets(data["summary"]))

    if data.get("rates"):
        out += _rate_blocks(data["rates"], cols)

    if cols and (data["tables"] or data.get("rates")):
        out.append(Heading(2, "Charts", "charts"))
        out.append(Charts())

    # A table per metric.
    for t in data["tables"]:
        arrow = "higher is better" if t["higher_is_better"] else "lower is better"
        out.append(Heading(2, f"{t['title']} — {arrow}", t["key"]))
        head = ["Concurrency", *cols] + (["Winner"] if len(cols) > 1 else [])
        rows = []
        notes = []
        for r in t["rows"]:
            cells = [Cell(f"c{r['concurrency']}")]
            for n in cols:
                v = r["values"][n]
                cells.append(_value_cell(v, t["unit"], r["winner"]))
                if v["contaminated"]:
                    note = next((x["note"] for x in data["contamination"]
                                 if x["topology"] == n and x["concurrency"] == r["concurrency"]), "")
                    notes.append(f"{DIRTY} {n} c{r['concurrency']}: contaminated — {note}")
            if len(cols) > 1:
                cells.append(_winner_cell(r["winner"]))
            rows.append(cells)
        if any(v["predicted"] is not None for r in t["rows"] for v in r["values"].values()):
            notes.insert(0, "pred: the prediction made before the topology ran, and its error against the "
                            "measurement.")
        out.append(Table(head, rows, notes, "metric"))

    if data["crossovers"] or data["knees"]:
        out.append(Heading(2, "Crossovers and scaling", "crossovers"))
        if data["crossovers"]:
            out.append(Bullets([s.replace("%)", " %)").replace("(-", "(−") for s in data["crossovers"]]))
        else:
            out.append(Para("No crossovers: where one topology leads, it leads at every level it ran."))
        if data["knees"]:
            out.append(Para("Where adding concurrency stops adding decode throughput:"))
            out.append(Bullets([f"{n}: {k}" for n, k in data["knees"].items()]))

    pe = data["prediction_error"]
    if pe["overall"]["points"]:
        out.append(Heading(2, "How good were the predictions", "prediction-error"))
        head = ["Topology", *(label for _, label in PREDICTED), "All", "Levels"]
        rows = []
        for n, row in pe["per_topology"].items():
            rows.append([Cell(n), *(Cell(_mape(row[k])) for k, _ in PREDICTED), Cell(_mape(row["all"])),
                         Cell(str(row["levels"]))])
        o = pe["overall"]
        rows.append([Cell("overall", cls="total"), *(Cell(_mape(o[k]), cls="total") for k, _ in PREDICTED),
                     Cell(_mape(o["all"]), cls="total"), Cell("", cls="total")])
        out.append(Table(head, rows, ["Mean absolute error of the prediction against the measurement, over the "
                                      "levels both have (contaminated levels left out)."], "errors"))
    learned = data.get("learned")
    if learned:
        names = {"decode_tps": "decode", "prefill_tps": "prefill", "ttft_ms": "TTFT"}
        parts = [f"{label} {_mape(learned['before'].get(k))} → {_mape(learned['after'].get(k))}"
                 for k, label in names.items() if learned["before"].get(k) is not None]
        if parts:
            out.append(Para("After `sparktop twin fit --runs` learned from this inventory's measurements ("
                            + ", ".join(learned["sources"]) + "), the prediction's error on this study went: "
                            + "; ".join(parts) + " (published constants → fitted ones)."))

    if data["failed"]:
        out.append(Heading(2, "What did not finish", "failed"))
        for f in data["failed"]:
            status = {FAILED: "failed", CANCELLED: "cancelled"}.get(f["status"], f"not finished ({f['status']})")
            got = f" — measured {levels_text(f['levels_measured'])} before it stopped" if f["levels_measured"] else ""
            out.append(Heading(3, f"{f['name']}: {status}{got}"))
            out.append(Para(f["reason"] or ("the study ended before it ran" if f["status"] not in (FAILED, CANCELLED)
                                            else "no reason was recorded")))
            if f["lines"]:
                out.append(Code("\n".join(f["lines"])))

    out += _what_ran(data)
    out.append(Heading(2, "How to read this", "how-to-read"))
    out.append(Para(
        "Every figure is the mean over the level's batches, with llama-benchy's definitions (decode total: all "
        "tokens after the first over the batch's decode span; prefill total: prompt tokens over the time to the "
        "last first token; TTFT: request start to first token). A winner's margin is over the runner-up. "
        f"**Tie** means the gap is within the noise: less than {compare.NOISE_SE:g} standard errors of the "
        "difference (from how much each topology's batches varied), or under 1 % whatever the noise — "
        "`sparktop compare` on the same runs names the same winners."))
    out.append(Para(f"Report by sparktop {data['generated']['sparktop_version']}, "
                    f"{_when(data['generated']['at'])}.", "quiet"))
    return out


def _rate_blocks(rates: dict, cols: list[str]) -> list[Block]:
    """A rate study: the most requests per second within the SLO per topology, then goodput per rate."""
    out: list[Block] = []
    slo = ", ".join(rates.get("slo") or []) or "no SLO given"
    out.append(Heading(2, f"Requests per second within the SLO ({slo})", "rates"))
    best = rates.get("best")
    if best:
        margin = f", {pct(best['margin'])} more than {best['runner_up']}" if best.get("margin") is not None else ""
        out.append(Para(f"**{best['topology']}** serves the most: {best['rate']:.3g} requests/s within the SLO"
                        f"{margin}."))
    rows = []
    for n in cols:
        m = (rates.get("max_rates") or {}).get(n) or {}
        if not m:
            continue
        conf = (f"{share_text(m['share'])} of {m['requests']} met it (95 % lower bound {share_text(m['lower'])})"
                if m.get("share") is not None and m.get("lower") is not None else "—")
        rows.append([Cell(n), Cell(f"{m['rate']:.3g}/s" if m.get("rate") else "none met it",
                                   cls="win" if best and best["topology"] == n else ""),
                     Cell(f"{m['failed_at']:.3g}/s" if m.get("failed_at") else "—"), Cell(conf)])
    if rows:
        out.append(Table(["Topology", "Max rate meeting the SLO", "First rate missing it", "At the max rate"], rows,
                         [], "rates"))
    head = ["Rate", *cols]
    body = []
    for r in rates["rows"]:
        cells = [Cell(f"{r['rate']:.3g}/s")]
        for n in cols:
            v = r["values"].get(n)
            if v is None:
                cells.append(Cell("—", cls="none"))
                continue
            good = f"{v['goodput']:.3g}/s" if v.get("goodput") is not None else fmt(v["request_throughput"], "/s")
            why = "queue grew" if v.get("saturated") else "client behind" if v.get("behind") else ""
            note = ", ".join(x for x in ((f"{v['share']:.0%} met" if v.get("share") is not None else ""),
                                         f"TTFT p95 {v['ttft_p95'] * 1000:,.0f} ms" if v.get("ttft_p95") else "",
                                         why) if x)
            cells.append(Cell(good, note, "win" if v.get("meets") else "dirty"))
        body.append(cells)
    out.append(Heading(3, "Goodput per rate (requests/s that met every target)", "goodput"))
    out.append(Table(head, body, ["green: the rate met the SLO; a queue that grew through the level, or a client "
                                  "that fell behind its schedule, does not"], "goodput"))
    return out


def _mape(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.0f} %"


def _what_ran(data: dict) -> list[Block]:
    st = data["study"]
    out: list[Block] = [Heading(2, "What ran", "what-ran")]
    end = st["ended"] or st["updated"]
    facts = [
        ("study", f"`{st['id']}` ({st.get('outcome') or st['state']})" + (f" in `{st['path']}`" if st["path"] else "")),
        ("recipe", f"`{st['recipe']}`" + (f" from `{st['recipe_path']}`" if st["recipe_path"] else "")),
        ("model", f"`{st['model']}`" + (f" (model card `{st['card']}`)" if st["card"] else "")),
        ("image", f"`{st['image'] or 'unknown'}`" + (f" (vLLM stack `{st['stack']}`)" if st.get("stack") else "")),
        ("nodes", ", ".join(f"`{n}`" for n in st["nodes"]
                            or dict.fromkeys(n for t in data["topologies"] for n in t["nodes"])) or "—"),
        ("sweep", (f"request rates from {', '.join(f'{r:g}/s' for r in st.get('rates') or [1.0])}"
                   + (f", the highest meeting {st.get('slo')} searched" if st.get("find_max_rate") else
                      f", SLO {st.get('slo')}" if st.get("slo") else "")
                   + f", {st.get('arrivals')} arrivals; pp {st['pp']}, tg {st['tg']} tokens")
                  if st.get("rates") or st.get("find_max_rate") else
                  (f"levels {', '.join(f'c{c}' for c in st['levels'])}; {st['runs']} batches per level "
                   f"(after a warm-up); pp {st['pp']}, tg {st['tg']} tokens")),
        ("engine overrides", ", ".join(f"`{k}={v}`" for k, v in st["overrides"].items()) or "none (the recipe's)"),
        ("extra request body", f"`{json.dumps(st['extra_body'])}`" if st["extra_body"] else "none"),
        ("when", f"{_when(st['created'])} → {_when(end)}" + (f" ({_dur(end - st['created'])})" if end else "")
         + (f"; estimated {_dur(st['estimate_s'])}" if st["estimate_s"] else "")),
        ("sparktop", f"{st['sparktop_version'] or 'unknown'} ran it; {data['generated']['sparktop_version']} "
                     "wrote this report"),
    ]
    speed = st.get("speed") or 1.0
    if speed != 1:
        facts.append(("speed", f"twins at ×{speed:g}: figures {speed:g} times a GB10's; predictions scaled the same"))
    if st["inventory"]:
        facts.append(("inventory", f"`{st['inventory']}`" + (f" (fitted constants `{st['inventory_key']}`)"
                                                          if st["inventory_key"] else "")))
    out.append(Bullets([f"**{k}**: {v}" for k, v in facts]))
    rows = []
    for t in data["topologies"]:
        dirty = ", ".join(f"c{c}" for c in t["contaminated"]) or "—"
        errs = ", ".join(f"c{c}: {e['errors']}/{e['requests']}" for c, e in t["errors"].items()) or "—"
        rows.append([Cell(t["name"]), Cell(t["status"], cls="win" if t["status"] == DONE else "bad"),
                     Cell(t["vllm_version"] or "—"), Cell(", ".join(t["nodes"]) or "—"),
                     Cell(_dur(t["startup_s"])), Cell(_dur(t["sweep_s"])), Cell(_when(t["started"])),
                     Cell(dirty), Cell(errs)])
    out.append(Table(["Topology", "Status", "vLLM", "Nodes", "Start-up", "Sweep", "Started", "Contaminated",
                      "Failed requests"], rows, [], "ran"))
    # Only what ran: a layout stopped by its plan or its preflight launched nothing, and says what stopped it.
    shown = [t for t in data["topologies"] if (t["commands"] and t.get("launched", True)) or t["status"] == FAILED]
    if shown:
        out.append(Heading(3, "Command lines (secrets masked)"))
        for t in shown:
            ran = bool(t["commands"]) and t.get("launched", True)
            what = (f" — run `{t['run']}`" if t["run"] else "")
            if t["status"] == FAILED:
                what += (" — failed: " if ran else " — not launched: ") + (t["reason"] or "failed")
            out.append(Para(f"**{t['name']}**" + what))
            if ran:
                out.append(Code("\n".join(t["commands"])))
    out.append(Heading(3, "Run it again"))
    out.append(Code(data["reproduce"]))
    return out


# ---------------------------------------------------------------------------
# Markdown


def _md(blocks: list[Block], charts: list[dict]) -> str:
    parts: list[str] = []
    for b in blocks:
        match b:
            case Heading(level=lv, text=text):
                parts.append("#" * lv + " " + text)
            case Para(text=text):
                parts.append(text)
            case Bullets(items=items):
                parts.append("\n".join(f"- {i}" for i in items))
            case Table(head=head, rows=rows, notes=notes):
                lines = [f"| {' | '.join(Cell(h).md() for h in head)} |", "|" + "---|" * len(head)]
                lines += [f"| {' | '.join(c.md() for c in row)} |" for row in rows]
                text = "\n".join(lines)
                if notes:
                    text += "\n\n" + "\n".join(f"<sub>{n}</sub>  " for n in dict.fromkeys(notes))
                parts.append(text)
            case Code(text=text):
                fence = "````" if "```" in text else "```"
                parts.append(f"{fence}\n{text}\n{fence}")
            case Charts():
                parts.append("\n\n".join(f"![{c['title']}]({c['png']})\n\n<sub>[{c['title']} as SVG]({c['svg']})</sub>"
                                         for c in charts) or "No charts: nothing measured.")
    return "\n\n".join(parts) + "\n"


def markdown(study: Study, out_dir: Path, data: dict | None = None) -> str:
    """The report as Markdown; its charts are written into `out_dir/charts/`
    (SVG and PNG) and referred to by paths relative to `out_dir`."""
    from sparktop.study import charts as ch

    data = data if data is not None else build(study)
    written = ch.write(data, Path(out_dir) / "charts")
    for c in written:
        c["svg"], c["png"] = f"charts/{c['svg']}", f"charts/{c['png']}"
    return _md(document(data), written)


# ---------------------------------------------------------------------------
# HTML

_CSS = """
:root { color-scheme: light; --ink:#1d2330; --quiet:#667085; --rule:#e4e7ec; --win:#0b7a3b; --winbg:#e8f6ee;
  --tie:#8a6100; --tiebg:#fff6dc; --bad:#b42318; --code:#f4f5f7; }
* { box-sizing: border-box; }
body { margin: 0; background: #fbfbfc; color: var(--ink);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 32px 64px; background: #fff; }
h1 { font-size: 28px; margin: 0 0 6px; }
h2 { font-size: 20px; margin: 36px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--rule); }
h3 { font-size: 16px; margin: 22px 0 6px; }
p.lede { color: var(--quiet); margin-top: 0; }
p.quiet, .notes { color: var(--quiet); font-size: 13px; }
nav { font-size: 13px; margin: 10px 0 0; }
nav a { color: #175cd3; margin-right: 14px; text-decoration: none; }
code { background: var(--code); padding: 1px 5px; border-radius: 4px; font-size: 13px;
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: var(--code); padding: 10px 12px; border-radius: 6px; overflow-x: auto; font-size: 12.5px;
  line-height: 1.45; white-space: pre-wrap; word-break: break-all;
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 14px; font-variant-numeric: tabular-nums; }
th, td { padding: 5px 12px; border-bottom: 1px solid var(--rule); text-align: right; white-space: nowrap;
  vertical-align: top; }
th { background: #f2f4f7; font-weight: 600; }
th:first-child, td:first-child { text-align: left; }
table.recs td, table.recs th, table.ran td, table.ran th { text-align: left; }
table.recs td:nth-child(5) { white-space: normal; min-width: 260px; }
tbody tr:nth-child(even) td { background: #fafbfc; }
td .note { display: block; color: var(--quiet); font-size: 12px; font-weight: 400; }
table.recs td .note { display: inline; margin-left: 6px; }
td.win { color: var(--win); font-weight: 600; background: var(--winbg) !important; }
td.tie { color: var(--tie); font-weight: 600; background: var(--tiebg) !important; }
td.dirty { color: var(--bad); }
td.bad { color: var(--bad); font-weight: 600; }
td.none { color: #98a2b3; }
td.total { font-weight: 700; border-top: 2px solid var(--rule); }
ul { padding-left: 22px; }
figure { margin: 14px 0 22px; }
svg.chart { width: 100%; height: auto; max-width: 1000px; display: block; }
@media print { main { max-width: none; } h2 { break-after: avoid; } figure, table { break-inside: avoid; } }
"""


def _inline(text: str) -> str:
    s = _html.escape(text, quote=False)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)


def _td(c: Cell) -> str:
    cls = f' class="{c.cls}"' if c.cls else ""
    note = f'<span class="note">{_html.escape(c.note)}</span>' if c.note else ""
    return f"<td{cls}>{_html.escape(c.text)}{note}</td>"


def _html_blocks(blocks: list[Block], charts: list[dict]) -> str:
    parts: list[str] = []
    toc = [(b.anchor, b.text) for b in blocks if isinstance(b, Heading) and b.level == 2 and b.anchor]
    for b in blocks:
        match b:
            case Heading(level=lv, text=text, anchor=anchor):
                ident = f' id="{_html.escape(anchor)}"' if anchor else ""
                parts.append(f"<h{lv}{ident}>{_html.escape(text)}</h{lv}>")
            case Para(text=text, cls=cls):
                parts.append(f"<p{f' class={chr(34)}{cls}{chr(34)}' if cls else ''}>{_inline(text)}</p>")
                if cls == "lede" and toc:
                    parts.append("<nav>" + "".join(f'<a href="#{_html.escape(a)}">{_html.escape(t.split(" — ")[0])}</a>'
                                                   for a, t in toc) + "</nav>")
            case Bullets(items=items):
                parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            case Table(head=head, rows=rows, notes=notes, cls=cls):
                t = [f'<div class="scroll"><table class="{cls}"><thead><tr>'
                     + "".join(f"<th>{_html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>"]
                t += ["<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows]
                t.append("</tbody></table></div>")
                if notes:
                    t.append('<div class="notes">' + "<br>".join(_inline(n) for n in dict.fromkeys(notes)) + "</div>")
                parts.append("".join(t))
            case Code(text=text):
                parts.append(f"<pre>{_html.escape(text)}</pre>")
            case Charts():
                parts += [f'<figure aria-label="{_html.escape(c["title"])}">{c["svg"]}</figure>' for c in charts]
    return "\n".join(parts)


def html(study: Study, data: dict | None = None) -> str:
    """The report as one HTML file that refers to nothing outside itself:
    the charts are inline SVG, the style is in the page, no scripts or fonts."""
    from sparktop.study import charts as ch

    data = data if data is not None else build(study)
    title = f"{data['study']['recipe']} — sparktop study report"
    body = _html_blocks(document(data), ch.inline(data))
    return (f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{_html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n<main>\n{body}\n"
            f"</main>\n</body>\n</html>\n")


# ---------------------------------------------------------------------------
# files


def write(study: Study, fmt_: str = "md", out_dir: Path | None = None, data: dict | None = None) -> Path:
    """Write the report as `md` (report.md and charts/), `html` (report.html)
    or `json` (report.json) into `out_dir` (default: the study's report dir)."""
    out = Path(out_dir) if out_dir is not None else study.report_dir
    out.mkdir(parents=True, exist_ok=True)
    data = data if data is not None else build(study)
    if fmt_ == "md":
        path = out / "report.md"
        path.write_text(markdown(study, out, data))
    elif fmt_ == "html":
        path = out / "report.html"
        path.write_text(html(study, data))
    elif fmt_ == "json":
        path = out / "report.json"
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    else:
        raise SparktopError(f"report format {fmt_!r}: expected md, html or json")
    return path


def write_all(study: Study, out_dir: Path | None = None) -> list[Path]:
    """report.md (with its charts) and report.html, from one reading of the runs."""
    data = build(study)
    return [write(study, f, out_dir, data) for f in ("md", "html")]
