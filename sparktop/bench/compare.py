"""Comparing runs: winners per level and metric, and where one overtakes another.

This is the spreadsheet the articles were made with: a column per run
(usually a topology), a row per concurrency, a Winner column with the margin
over the runner-up, and sentences for the crossovers ("shuffle overtakes
cluster-mp for decode at c64 (+6 %)").
"""

from __future__ import annotations

from dataclasses import dataclass

from sparktop.bench.results import Run
from sparktop.bench.stats import LevelStats
from sparktop.units import fmt

TIE = 0.01  # closer than 1 % is a tie (the articles call 156.40 vs 156.02 one)


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


def table(runs: list[Run]) -> tuple[list[str], list[int], dict[str, dict[int, LevelStats]]]:
    names = labels(runs)
    by_run = {name: {lv.concurrency: lv for lv in run.levels()} for name, run in zip(names, runs, strict=False)}
    levels = sorted({c for lv in by_run.values() for c in lv})
    return names, levels, by_run


@dataclass
class Winner:
    name: str | None  # None: a tie, or fewer than two values
    margin: float | None  # winner vs runner-up, relative (negative for lower-is-better)
    tie: bool = False

    def cell(self) -> str:
        if self.tie:
            return "Tie"
        if self.name is None:
            return "—"
        return f"{self.name} ({self.margin:+.0%})"


def winner(values: dict[str, float | None], metric: Metric) -> Winner:
    have = sorted(((v, n) for n, v in values.items() if v is not None and v > 0),
                  reverse=metric.higher_is_better)
    if len(have) < 2:
        return Winner(None, None)
    (best, name), (second, _) = have[0], have[1]
    margin = best / second - 1
    if abs(margin) < TIE:
        return Winner(None, margin, tie=True)
    return Winner(name, margin)


def crossovers(runs: list[Run], metrics: tuple[Metric, ...] = METRICS[:4]) -> list[str]:
    """Sentences for every level where one run moves ahead of another."""
    names, levels, by_run = table(runs)
    out = []
    for m in metrics:
        sign = 1 if m.higher_is_better else -1
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                lead = None  # who led at the last level both ran
                for c in levels:
                    va = getattr(by_run[a].get(c), m.key, None) if c in by_run[a] else None
                    vb = getattr(by_run[b].get(c), m.key, None) if c in by_run[b] else None
                    if not va or not vb:
                        continue
                    rel = (va / vb - 1) * sign
                    now = a if rel > TIE else b if rel < -TIE else None
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
                cells.append(winner(vals, m).cell())
            rows.append(f"| {' | '.join(cells)} |")
        parts.append(f"### {m.title}\n\n" + "\n".join(rows))
    cross = crossovers(runs) if len(runs) > 1 else []
    if cross:
        parts.append("### Crossovers\n\n" + "\n".join(f"- {line}" for line in cross))
    return "\n\n".join(parts) + "\n"


def as_json(runs: list[Run]) -> dict:
    names, levels, by_run = table(runs)
    winners = []
    for m in METRICS:
        for c in levels:
            vals = {n: (getattr(by_run[n][c], m.key) if c in by_run[n] else None) for n in names}
            w = winner(vals, m)
            winners.append({"metric": m.key, "concurrency": c, "winner": w.name, "tie": w.tie,
                            "margin": w.margin, "values": vals})
    return {
        "runs": [{"id": r.id, "label": n, "path": str(r.path) if r.path else None, **_meta(r)}
                 for n, r in zip(names, runs, strict=False)],
        "levels": {n: [lv.as_dict() for lv in runs[i].levels()] for i, n in enumerate(names)},
        "winners": winners,
        "crossovers": crossovers(runs),
    }


def _meta(run: Run) -> dict:
    keep = ("model", "topology", "recipe", "nodes", "vllm_version", "sparktop_version", "tool", "started",
            "ended", "status", "settings")
    return {k: run.meta.get(k) for k in keep if k in run.meta}
