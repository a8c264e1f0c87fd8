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
    if (stated := bands(saved)):
        q = next(iter((saved["cross_validation"]["bands"]).values())).get("quantile", 0.8)
        unseen = (f"for a model no source measured expect ±{stated.get('decode_tps', 0):.0%} on decode, "
                  f"±{stated.get('prefill_tps', 0):.0%} on prefill, ±{stated.get('ttft_ms', 0):.0%} on TTFT "
                  f"({BASIS.format(q=q)})")
    elif cv.get("decode_tps") is not None:  # an older fit: the mean, not a band
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


# What the stated band is: a share of left-out figures (`fit.error_bands`), both ways of leaving out.
BASIS = "{q:.0%} of left-out figures within; leave-one-model-out and leave-one-source-out"
# A row's figures and the metric of the fit whose band is theirs.
BANDED = {"decode_tps": "decode_tps", "prefill_tps": "prefill_tps", "ttft_ms": "ttft_ms",
          "e2e_tps_total": "output_tps"}


def bands(saved: dict | None = None) -> dict[str, float]:
    """The stated relative error per metric for a model or setup nobody
    measured, as saved by `sparktop twin fit --cross-validate` ({} when the
    saved fit has no bands): read, never recomputed."""
    if saved is None:
        from sparktop.model.fit import load_fit_summary

        saved = load_fit_summary()
    stated = (saved.get("cross_validation") or {}).get("bands") or {}
    return {m: float(b["band"]) for m, b in stated.items() if isinstance(b, dict) and b.get("band") is not None}


def band_of(value: float | None, error: float | None) -> list[float | None] | None:
    """[low, high] of what would be measured given a prediction `value` and a
    stated relative error `error` (|predicted / measured - 1| <= error): the
    measurement lies between value / (1 + error) and value / (1 - error); no
    upper bound (None) from an error of 100 % or more."""
    if value is None or error is None:
        return None
    return [value / (1 + error), value / (1 - error) if error < 1 else None]


def row_band(row: Row, stated: dict[str, float]) -> dict[str, list[float | None]]:
    """Each figure of a row with its band (`band_of`), for the figures a band was stated for."""
    out = {}
    for field_name, metric in BANDED.items():
        b = band_of(getattr(row, field_name), stated.get(metric))
        if b is not None:
            out[field_name] = [round(x, 3) if x is not None else None for x in b]
    return out


def error_json(saved: dict | None = None) -> dict:
    """`predict --json`'s "error": the stated band per metric, the share it claims and what it held when
    cross-validated, and its basis."""
    if saved is None:
        from sparktop.model.fit import load_fit_summary

        saved = load_fit_summary()
    stated = (saved.get("cross_validation") or {}).get("bands") or {}
    if not stated:
        return {}
    q = next(iter(stated.values())).get("quantile", 0.8)
    return {"basis": BASIS.format(q=q), "quantile": q,
            **{m: {"band": b["band"], "coverage": b.get("coverage"),
                   **{g: b[g] for g in ("model", "source") if g in b}}
               for m, b in stated.items()}}
