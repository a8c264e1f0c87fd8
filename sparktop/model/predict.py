"""`sparktop predict`: what each topology would give before anything loads.

For a recipe (or a bare model card), on the topologies the recipe allows
on the inventory's nodes: decode, prefill and TTFT per concurrency, as the
sweep would measure them (the twin's scheduler on a virtual clock with the
fitted constants), the KV cache a lockstep batch needs and whether it fits,
then the recommendation per workload shape, with the crossovers. The rows
come from `sparktop.model.forecast` (the one entry point); this module keeps
the row, the recommendation, the crossovers and the uncertainty text.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sparktop.bench.compare import Metric, crossovers
from sparktop.bench.run import Run
from sparktop.layouts import order
from sparktop.model.cards import ModelCard

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class Row:
    model: str
    topology: str
    concurrency: int
    pp: int
    tg: int
    decode_tps: float | None
    per_request_tps: float | None
    prefill_tps: float | None
    ttft_ms: float | None
    kv_cache_usage: float
    fits: bool
    e2e_tps_total: float | None = None  # output tokens of the batch / its wall time (c x tg / wall)
    e2e_tps_req: float | None = None  # a request's output tokens / its own start-to-end time
    wall_s_mean: float | None = None  # wall time of one batch
    preempted: bool = False  # past the KV cache: the engine preempts and recomputes

    def as_dict(self) -> dict:
        return dict(self.__dict__)


SHAPES = (  # (what the articles call it, levels, metric key, higher is better)
    ("single user", (1,), "decode_tps", True),
    ("agents at c8-c16", (8, 16), "decode_tps", True),
    ("high concurrency", None, "decode_tps", True),
    ("prefill-heavy", None, "prefill_tps", True),
    ("latency at scale", None, "ttft_ms", False),
)


def recommend(rows: list[Row]) -> list[dict]:
    topologies = sorted({r.topology for r in rows}, key=order)
    levels = sorted({r.concurrency for r in rows})
    out = []
    for shape, at, key, higher in SHAPES:
        use = [c for c in (at or (levels[-1],)) if c in levels] or [levels[-1]]
        scores = {}
        for t in topologies:
            vals = [getattr(r, key) for r in rows if r.topology == t and r.concurrency in use]
            if vals and all(v is not None for v in vals) and all(r.fits for r in rows
                                                                   if r.topology == t and r.concurrency in use):
                scores[t] = statistics.fmean(vals)
        if not scores:
            continue
        ranked = sorted(scores, key=lambda t: scores[t], reverse=higher)
        best = ranked[0]
        margin = (scores[best] / scores[ranked[1]] - 1) if len(ranked) > 1 and scores[ranked[1]] else None
        out.append({"workload": shape, "concurrency": use, "topology": best, "metric": key,
                    "value": scores[best], "margin": margin})
    return out


def crossover_lines(rows: list[Row]) -> list[str]:
    from sparktop.bench.stats import level_stats

    runs = []
    for t in sorted({r.topology for r in rows}, key=order):
        levels = []
        for r in (x for x in rows if x.topology == t):
            lv = level_stats(r.concurrency, [])
            lv.tg_tps_total, lv.pp_tps_total, lv.ttft_ms_mean, lv.tg_tps_req = (
                r.decode_tps, r.prefill_tps, r.ttft_ms, r.per_request_tps)
            levels.append(lv)
        runs.append(Run(None, {"id": t, "label": t}, imported_levels=levels))
    return crossovers(runs, (Metric("tg_tps_total", "", "decode", True, "t/s"),
                             Metric("pp_tps_total", "", "prefill", True, "t/s"),
                             Metric("ttft_ms_mean", "", "TTFT", False, "ms")))


def uncertainty(card: ModelCard) -> str:
    """How far to trust a prediction for this card: its own error where a
    source measured it, the leave-one-model-out error where none did. Both
    are read from the saved fit (`sparktop twin fit` computes them), never
    recomputed here."""
    from sparktop.model.fit import FITTED, figures_digest, load_fit_summary

    saved = load_fit_summary()
    fitted = saved.get("fit") or {}
    cv = (saved.get("cross_validation") or {}).get("mean") or {}
    unseen = ""
    if cv.get("decode_tps") is not None:
        unseen = (f"for a model no source measured expect ±{cv['decode_tps']:.0%} on decode, "
                  f"±{cv.get('prefill_tps') or 0:.0%} on prefill, ±{cv.get('ttft_ms') or 0:.0%} on TTFT "
                  "(leave-one-model-out)")
    per_card = fitted.get("per_card")
    mine = (per_card or {}).get(card.name) or {}
    if mine.get("figures"):
        text = (f"{card.name} was measured by published sources: the fit is off by {mine['mean_error']:.0%} "
                f"on average on its {mine['figures']} figures ({FITTED.name}); "
                f"{unseen or 'no cross-validation saved'}")
    elif per_card is None:
        text = f"{card.name}: {FITTED.name} keeps no error per model; " + (unseen or "no cross-validation saved")
    else:
        text = (f"no published source measured {card.name}: this comes from the same physics and constants "
                f"({card.architecture}, {card.active_params_b:.1f}B active of {card.total_params_b:.1f}B, "
                f"{card.quant_text()}); " + (unseen or "expect ±25 % or more, most on prefill and TTFT"))
    if fitted.get("figures_digest") != figures_digest():
        text += ("; the published figures changed since these errors were saved: "
                 "run `sparktop twin fit --save-summary`")
    return text
