"""Comparing runs: winners per level and metric, and where one overtakes another.

This is the spreadsheet the articles were made with: a column per run
(usually a topology), a row per concurrency, a Winner column with the margin
over the runner-up, and sentences for the crossovers ("shuffle overtakes
cluster-mp for decode at c64 (+6 %)").

When is it a tie? When the gap is within the noise: less than two standard
errors of the difference, each run's standard error being how much its
batches' figures vary (sample standard deviation over √batches). A gap under
1 % is a tie whatever the spread (the articles call 156.40 vs 156.02 one),
and that floor is the whole rule when no spread is known (a single batch, or
a llama-benchy import without its deviations). `study.report` names its
winners with this same function, so a report and `sparktop compare` of the
same runs agree.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from sparktop.bench.run import Run
from sparktop.bench.stats import LevelKey, LevelStats, RateLevelStats, batch_stats, percentile
from sparktop.units import fmt

TIE = 0.01  # closer than 1 % is always a tie (the articles call 156.40 vs 156.02 one)
NOISE_SE = 2.0  # a gap under this many standard errors of the difference is a tie


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    short: str  # for sentences: "decode", "prefill", "TTFT"
    higher_is_better: bool
    unit: str


METRICS = (
    Metric("tg_tps_total", "Decode throughput (t/s, total)", "decode", True, "t/s"),
    Metric("tg_tps_req", "Decode per request (t/s)", "per-request decode", True, "t/s"),
    Metric("pp_tps_total", "Prefill throughput (t/s, total)", "prefill", True, "t/s"),
    Metric("ttft_ms_mean", "TTFT mean (ms)", "TTFT", False, "ms"),
    Metric("ttft_ms_p95", "TTFT p95 (ms)", "TTFT p95", False, "ms"),
    Metric("peak_tps", "Peak throughput (t/s, 1-s window)", "peak", True, "t/s"),
    # When the sweeps read the nodes' power (nvidia-smi's GPU power): what a million tokens cost in energy.
    Metric("wh_per_mtok", "Energy (Wh per million generated tokens, GPU power)", "energy", False, "Wh"),
)


def labels(runs: list[Run]) -> list[str]:
    """A column name per run: its label or topology, made unique."""
    out: list[str] = []
    for run in runs:
        name = run.label
        if name in out or sum(1 for r in runs if r.label == name) > 1:
            name = f"{name} ({run.id[-12:]})" if run.id[-12:] not in name else run.id
        out.append(name)
    return out


def table(runs: list[Run]) -> tuple[list[str], list[LevelKey], dict[str, dict[LevelKey, LevelStats]]]:
    names = labels(runs)
    # Keyed by level (stats.LevelKey: the concurrency, and the depth of a depth sweep's levels).
    by_run = {name: {lv.key: lv for lv in run.levels()} for name, run in zip(names, runs, strict=False)}
    levels = sorted({c for lv in by_run.values() for c in lv})
    return names, levels, by_run


@dataclass(frozen=True)
class Spread:
    """How much a level's figure varies from batch to batch."""

    std: float  # sample standard deviation of the batches' figures
    n: int  # how many batches

    @property
    def se(self) -> float:
        """Standard error of the level's figure (the mean over its batches)."""
        return self.std / math.sqrt(self.n)


Spreads = dict[int, dict[str, Spread]]  # concurrency -> metric key -> spread


def _spread(values: list[float]) -> Spread | None:
    return Spread(statistics.stdev(values), len(values)) if len(values) >= 2 else None


def spreads(run: Run) -> Spreads:
    """Per level and metric, the spread of the batches' figures (none for a
    level with fewer than two batches). From the requests when the run has
    them; an import has only its level deviations (decode and prefill total)."""
    out: Spreads = {}
    if run.imported_levels is not None or not run.records:
        for lv in run.levels():
            d: dict[str, Spread] = {}
            if lv.runs >= 2:
                for key, std in (("tg_tps_total", lv.tg_tps_total_std), ("pp_tps_total", lv.pp_tps_total_std)):
                    if std is not None:
                        d[key] = Spread(std, lv.runs)
            out[lv.key] = d
        return out
    latency = float(run.meta.get("latency_s") or 0.0)
    pp = int((run.meta.get("settings") or {}).get("pp") or 0)
    for c, batches in run.batches().items():
        per = [batch_stats(b, latency, pp + c.depth, peak=False) for b in batches]
        if c > 1:  # at c = 1 the level's "total" is the per-request figure, as in stats.level_stats
            tg_tot = [b.tg_tps_total for b in per if b.tg_tps_total is not None]
            pp_tot = [b.pp_tps_total for b in per if b.pp_tps_total is not None]
        else:
            tg_tot = [v for b in per for v in b.tg_tps_req]
            pp_tot = [v for b in per for v in b.pp_tps_req]
        figures = {
            "tg_tps_total": tg_tot,
            "pp_tps_total": pp_tot,
            "tg_tps_req": [statistics.fmean(b.tg_tps_req) for b in per if b.tg_tps_req],
            "ttft_ms_mean": [statistics.fmean(b.ttft_s) * 1000 for b in per if b.ttft_s],
            "ttft_ms_p95": [(percentile(b.ttft_s, 0.95) or 0.0) * 1000 for b in per if b.ttft_s],
        }
        out[c] = {k: sp for k, vals in figures.items() if (sp := _spread(vals)) is not None}
    return out


def spread_table(runs: list[Run]) -> dict[str, Spreads]:
    """`spreads` per run, under the same names as `table`."""
    return {name: spreads(run) for name, run in zip(labels(runs), runs, strict=False)}


def noise(a: Spread | None, b: Spread | None) -> float | None:
    """The gap under which two figures are a tie (absolute; None: unknown)."""
    if a is None or b is None:
        return None
    return NOISE_SE * math.hypot(a.se, b.se)


def ahead(va: float, vb: float, metric: Metric, sa: Spread | None = None, sb: Spread | None = None) -> int:
    """1 when `va` beats `vb` beyond the noise, -1 when `vb` does, 0 for a tie."""
    gap = abs(va - vb)
    worse = min(va, vb) if metric.higher_is_better else max(va, vb)
    if gap < TIE * worse or gap < (noise(sa, sb) or 0.0):
        return 0
    return 1 if (va > vb) == metric.higher_is_better else -1


@dataclass
class Winner:
    name: str | None  # None: a tie, or fewer than two values
    margin: float | None  # winner vs runner-up, relative (negative for lower-is-better)
    tie: bool = False
    runner_up: str | None = None  # second best (for a tie: the one level with the best)
    noise: float | None = None  # the gap under which it is a tie, relative to the runner-up (None: unknown)
    best: str | None = None  # the best figure's run, tie or not

    def cell(self) -> str:
        if self.tie:
            return "Tie"
        if self.name is None:
            return "—"
        return f"{self.name} ({self.margin:+.0%})"


def winner(values: dict[str, float | None], metric: Metric,
           spread: dict[str, Spread | None] | None = None) -> Winner:
    """The best of `values` and its margin over the runner-up — or a tie when
    the gap is within the noise (see the module's doc)."""
    have = sorted(((v, n) for n, v in values.items() if v is not None and v > 0),
                  key=lambda x: x[0], reverse=metric.higher_is_better)
    if len(have) < 2:
        return Winner(None, None, best=have[0][1] if have else None)
    (best, name), (second, other) = have[0], have[1]
    margin = best / second - 1
    spread = spread or {}
    band = noise(spread.get(name), spread.get(other))
    rel = band / second if band is not None else None
    if ahead(best, second, metric, spread.get(name), spread.get(other)) == 0:
        return Winner(None, margin, tie=True, runner_up=other, noise=rel, best=name)
    return Winner(name, margin, runner_up=other, noise=rel, best=name)


def level_spreads(spread_by_run: dict[str, Spreads] | None, c: int, key: str) -> dict[str, Spread | None]:
    """The spreads of one level and metric across the runs."""
    return {n: s.get(c, {}).get(key) for n, s in (spread_by_run or {}).items()}


def crossovers(runs: list[Run], metrics: tuple[Metric, ...] = METRICS[:4],
               spread_by_run: dict[str, Spreads] | None = None) -> list[str]:
    """Sentences for every level where one run moves ahead of another (beyond
    the noise; ties in between do not count as a change of lead)."""
    names, levels, by_run = table(runs)
    if spread_by_run is None:
        spread_by_run = spread_table(runs)
    out = []
    for m in metrics:
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                lead = None  # who led at the last level both ran
                for c in levels:
                    va = getattr(by_run[a].get(c), m.key, None) if c in by_run[a] else None
                    vb = getattr(by_run[b].get(c), m.key, None) if c in by_run[b] else None
                    if not va or not vb:
                        continue
                    sp = level_spreads(spread_by_run, c, m.key)
                    lead_now = ahead(va, vb, m, sp.get(a), sp.get(b))
                    now = a if lead_now > 0 else b if lead_now < 0 else None
                    if now is not None and lead is not None and now != lead:
                        other = b if now == a else a
                        vn, vo = (va, vb) if now == a else (vb, va)
                        out.append(f"{now} overtakes {other} for {m.short} at c{c} ({vn / vo - 1:+.0%})")
                    if now is not None:
                        lead = now
    return out


def markdown(runs: list[Run], metrics: tuple[Metric, ...] = METRICS) -> str:
    """The articles' tables: one per metric, a column per run, a Winner column."""
    names, levels, by_run = table(runs)
    spread_by_run = spread_table(runs)
    parts = []
    for m in metrics:
        if not any(getattr(lv, m.key) is not None for r in by_run.values() for lv in r.values()):
            continue
        head = ["Concurrency", *names] + (["Winner"] if len(names) > 1 else [])
        rows = [f"| {' | '.join(head)} |", "|" + "---|" * len(head)]
        for c in levels:
            vals = {n: (getattr(by_run[n][c], m.key) if c in by_run[n] else None) for n in names}
            cells = [f"c{c}", *(fmt(vals[n], m.unit) for n in names)]
            if len(names) > 1:
                cells.append(winner(vals, m, level_spreads(spread_by_run, c, m.key)).cell())
            rows.append(f"| {' | '.join(cells)} |")
        parts.append(f"### {m.title}\n\n" + "\n".join(rows))
    cross = crossovers(runs, spread_by_run=spread_by_run) if len(runs) > 1 else []
    if cross:
        parts.append("### Crossovers\n\n" + "\n".join(f"- {line}" for line in cross))
    return "\n\n".join(parts) + "\n"


def as_json(runs: list[Run]) -> dict:
    names, levels, by_run = table(runs)
    spread_by_run = spread_table(runs)
    winners = []
    for m in METRICS:
        for c in levels:
            vals = {n: (getattr(by_run[n][c], m.key) if c in by_run[n] else None) for n in names}
            w = winner(vals, m, level_spreads(spread_by_run, c, m.key))
            winners.append({"metric": m.key, "concurrency": int(c), "depth": getattr(c, "depth", 0),
                            "winner": w.name, "tie": w.tie,
                            "margin": w.margin, "noise": w.noise, "values": vals})
    return {
        "runs": [{"id": r.id, "label": n, "path": str(r.path) if r.path else None, **_meta(r)}
                 for n, r in zip(names, runs, strict=False)],
        "levels": {n: [lv.as_dict() for lv in runs[i].levels()] for i, n in enumerate(names)},
        "winners": winners,
        "crossovers": crossovers(runs, spread_by_run=spread_by_run),
    }


def _meta(run: Run) -> dict:
    keep = ("model", "topology", "recipe", "nodes", "vllm_version", "sparktop_version", "tool", "started",
            "ended", "status", "settings")
    return {k: run.meta.get(k) for k in keep if k in run.meta}


# -- rate sweeps --------------------------------------------------------------------------------------------

RATE_METRICS = (("goodput", "Goodput (requests/s meeting the SLO)", True, "/s"),
                ("request_throughput", "Request throughput (requests/s)", True, "/s"),
                ("output_tps", "Output tokens/s", True, "t/s"),
                ("ttft_p95", "TTFT p95 (ms)", False, "ms"),
                ("itl_p95", "ITL p95 (ms)", False, "ms"))


def rate_table(runs: list[Run]) -> tuple[list[str], list[float], dict[str, dict[float, RateLevelStats]]]:
    """Rate sweeps side by side: names, the rates any of them ran, and each run's level per rate."""
    names = labels(runs)
    by_run = {n: {lv.rate: lv for lv in run.rate_levels() if lv.rate is not None}
              for n, run in zip(names, runs, strict=False)}
    rates = sorted({r for levels in by_run.values() for r in levels})
    return names, rates, by_run


def rate_markdown(runs: list[Run]) -> str:
    """A table per figure, a row per rate, a column per run, and the best per row (no noise model: a rate
    level is one measurement)."""
    names, rates, by_run = rate_table(runs)
    parts = []
    for key, title, higher, unit in RATE_METRICS:
        if not any(getattr(lv, key, None) is not None for levels in by_run.values() for lv in levels.values()):
            continue
        head = ["Rate", *names] + (["Best"] if len(names) > 1 else [])
        rows = [f"| {' | '.join(head)} |", "|" + "---|" * len(head)]
        for rate in rates:
            vals: dict[str, float | None] = {}
            for n in names:
                lv = by_run[n].get(rate)
                v = getattr(lv, key, None) if lv is not None else None
                vals[n] = v * 1000 if v is not None and unit == "ms" else v
            cells = [f"{rate:g}/s", *(fmt(vals[n], unit) for n in names)]
            if len(names) > 1:
                known = {n: v for n, v in vals.items() if v is not None}
                cells.append((max if higher else min)(known, key=lambda n: known[n]) if known else "—")
            rows.append(f"| {' | '.join(cells)} |")
        parts.append(f"### {title}\n\n" + "\n".join(rows))
    lines = []
    for n, run in zip(names, runs, strict=False):
        m = run.meta.get("max_rate") or {}
        if not m:
            continue
        if m.get("rate"):
            tail = f" ({m['failed_at']:.3g}/s does not)" if m.get("failed_at") else ""
            lines.append(f"- {n}: {m['rate']:.3g} requests/s{tail}")
        else:
            lines.append(f"- {n}: no rate met it")
    if lines:
        parts.append("### Max rate meeting the SLO\n\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"
