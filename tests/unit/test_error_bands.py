"""The error `predict` states for a model nobody measured: left-out figures
grouped by model and by source, a band at a quantile of their errors (not
their mean), the share it holds, and `predict` reading it as saved."""

from __future__ import annotations

import json
import statistics

import pytest

from sparktop.cli import main
from sparktop.model import fit
from sparktop.model.cards import find_card
from sparktop.model.constants import DEFAULT_CONSTANTS
from sparktop.model.predict import BASIS, Row, band_of, bands, row_band, uncertainty


def _cell(model: str, source: str, metric: str = "decode_tps", c: int = 1) -> fit.Cell:
    return fit.Cell(model, "solo", metric, c, 50.0, source=source)


def test_leave_one_source_out_groups_by_source_and_pools_the_few_figure_sources():
    cells = ([_cell("gpt-oss-120b", "article", c=c) for c in (1, 2, 4, 8, 16)]
             + [_cell("gpt-oss-20b", "blog", c=c) for c in (1, 2, 4, 8, 16, 32)]
             + [_cell("gpt-oss-20b", "forum"), _cell("qwen3-8b", "readme"), _cell("qwen3-8b", "readme", c=2)]
             + [fit.Cell("qwen3-8b", "solo", "decode_tps", 1, 9.0, source="tiny", engine="sglang")])  # not fitted
    key = fit.by_source(cells, min_figures=5)
    assert [key(c) for c in cells[:11]] == ["article"] * 5 + ["blog"] * 6
    few = fit.FEW_SOURCES.format(n=5)
    assert {key(c) for c in cells[11:14]} == {few}  # 1 + 2 figures: left out together
    assert fit.by_model(cells)(cells[0]) == "gpt-oss-120b"
    assert set(fit.GROUPINGS) == {"model", "source"}


def test_leave_out_refits_without_each_group_and_predicts_it(monkeypatch):
    """One linearised refit per left-out group, from one Jacobian: the group's own cells are out of the solve."""
    cells = [_cell("gpt-oss-120b", "a"), _cell("gpt-oss-120b", "b", c=2), _cell("gpt-oss-20b", "b")]
    seen: list[int] = []

    def step(res, wts, jac, **kw):
        seen.append(len(res))
        return [0.0] * len(fit.GLOBAL)

    monkeypatch.setattr(fit, "linear_step", step)
    monkeypatch.setattr(fit, "evaluate", lambda k, test, workers=1: [(c, 55.0, True) for c in test])
    rows = [(c, 55.0, True) for c in cells]
    jac = [[0.1] * len(fit.GLOBAL) for _ in cells]
    table, errors = fit.leave_out(cells, fit.by_source(cells, min_figures=1), DEFAULT_CONSTANTS, (rows, jac))
    priors = len(fit.PRIORS)  # and a row per prior, in every solve
    assert seen == [2 + priors, 1 + priors]  # without a: b's two cells; without b: a's one
    assert table["a"] == {"decode_tps": 0.1, "cells": 1} and table["b"]["cells"] == 2
    assert errors["b"]["decode_tps"] == pytest.approx([0.1, 0.1])
    assert table["mean"] == {"decode_tps": 0.1}


# A skewed spread of left-out errors: most figures close, a few far off.
SKEWED = [0.02, 0.03, 0.04, 0.05, 0.05, 0.06, 0.3, 0.3, 0.6, 1.2]


def test_the_band_is_a_quantile_and_holds_its_share_where_the_mean_does_not():
    mean = statistics.fmean(SKEWED)  # 0.265: the far misses lift it
    assert fit.coverage(SKEWED, mean) == pytest.approx(0.6)  # a "±MAPE" band holds 60 %, not most
    band = fit.quantile(SKEWED, 0.8)
    assert band == 0.3 and fit.coverage(SKEWED, band) == pytest.approx(0.8)
    assert fit.quantile(SKEWED, 0.68) == 0.3 and fit.quantile(SKEWED, 0.5) == 0.05
    assert fit.quantile([0.1], 0.8) == 0.1


def test_held_out_coverage_sets_each_groups_band_without_it():
    groups = {"a": [0.01, 0.02, 0.03, 0.04], "b": [0.05, 0.06, 0.07, 0.08], "c": [0.5, 0.6]}
    # a against b+c's 50 % quantile (0.07): all 4 in; b against a+c's (0.04): none; c against a+b's (0.04): none.
    assert fit.held_out_coverage(groups, 0.5) == pytest.approx(4 / 10)
    assert fit.held_out_coverage({"only": [0.1]}, 0.8) is None


def test_error_bands_pool_models_and_sources_and_say_what_each_holds():
    errors = {"model": {"m1": {"decode_tps": SKEWED[:5]}, "m2": {"decode_tps": SKEWED[5:]}},
              "source": {"s1": {"decode_tps": SKEWED, "ttft_ms": [0.1, 0.2]}}}
    b = fit.error_bands(errors, q=0.8)
    d = b["decode_tps"]
    assert d["band"] == 0.3 and d["figures"] == 20 and d["coverage"] == pytest.approx(0.8)
    assert d["model"]["mean"] == pytest.approx(0.265, abs=1e-4) and d["model"]["coverage"] == pytest.approx(0.8)
    assert d["model"]["mean_coverage"] == pytest.approx(0.6)
    assert d["model"]["held_out"] == pytest.approx(0.5)  # m1 against m2's 0.6: 5/5; m2 against m1's 0.05: 0/5
    assert "held_out" not in d["source"]  # one group: no band without it
    assert b["ttft_ms"]["band"] == 0.2 and "model" not in b["ttft_ms"]


def test_the_band_is_the_wider_grouping_so_each_holds_its_share():
    """Sources left out miss further than models left out: the stated band is the sources' quantile, and
    both groupings then hold at least the share it claims."""
    models = {"m1": {"ttft_ms": [0.05, 0.1, 0.1, 0.2, 0.3]}}
    sources = {"s1": {"ttft_ms": [0.1, 0.2, 0.4, 0.5, 0.9]}}
    b = fit.error_bands({"model": models, "source": sources}, q=0.8)["ttft_ms"]
    assert b["model"]["band"] == 0.2 and b["source"]["band"] == 0.5 and b["band"] == 0.5
    assert b["model"]["coverage"] == 1.0 and b["source"]["coverage"] == pytest.approx(0.8)
    assert b["coverage"] == pytest.approx(0.9)


SAVED = {"cross_validation": {"mean": {"decode_tps": 0.13, "prefill_tps": 0.22, "ttft_ms": 0.24},
                              "bands": {m: {"band": v, "quantile": 0.8, "figures": 100, "coverage": 0.8,
                                            "model": {"mean": v / 2, "coverage": 0.82},
                                            "source": {"mean": v, "coverage": 0.78}}
                                        for m, v in (("decode_tps", 0.2), ("prefill_tps", 0.5), ("ttft_ms", 0.4),
                                                     ("output_tps", 0.25))}}}


def test_a_figures_band_holds_what_would_be_measured():
    assert band_of(100.0, 0.25) == [pytest.approx(80.0), pytest.approx(100 / 0.75)]
    assert band_of(100.0, 1.5) == [pytest.approx(40.0), None]
    assert band_of(None, 0.2) is None and band_of(10.0, None) is None
    row = Row("m", "solo", 1, 1024, 128, 50.0, 50.0, 2000.0, 500.0, 0.1, True, e2e_tps_total=40.0)
    got = row_band(row, bands(SAVED))
    assert got["decode_tps"] == [pytest.approx(41.667, abs=1e-3), pytest.approx(62.5)]
    assert got["ttft_ms"] == [pytest.approx(357.143, abs=1e-3), pytest.approx(833.333, abs=1e-3)]
    assert set(got) == {"decode_tps", "prefill_tps", "ttft_ms", "e2e_tps_total"}


def test_the_text_names_the_bands_basis(monkeypatch):
    monkeypatch.setattr(fit, "load_fit_summary", lambda path=fit.FITTED: SAVED)
    text = uncertainty(find_card("llama-3.1-70b"))
    assert "expect ±20% on decode, ±50% on prefill, ±40% on TTFT (" + BASIS.format(q=0.8) + ")" in text
    assert "80% of left-out figures within; leave-one-model-out and leave-one-source-out" in text
    # An older fit, without bands: its leave-one-model-out mean, said as such.
    monkeypatch.setattr(fit, "load_fit_summary", lambda path=fit.FITTED: {"cross_validation": SAVED[
        "cross_validation"] | {"bands": {}}})
    assert "±13% on decode" in uncertainty(find_card("llama-3.1-70b"))
    assert fit.expected_error("prefill_tps") == 0.22


def test_the_shipped_fit_carries_bands_for_each_headline_metric():
    cv = fit.load_fit_summary()["cross_validation"]
    assert cv["by_source"] and cv["mean"]
    for m in fit.HEADLINE:
        b = cv["bands"][m]
        assert b["band"] > 0 and b["quantile"] == fit.BAND_QUANTILE
        assert {"model", "source"} <= set(b) and b["quantile"] <= b["coverage"] < 1
        assert min(b["model"]["coverage"], b["source"]["coverage"]) >= b["quantile"]
    assert fit.expected_error("decode_tps") == cv["bands"]["decode_tps"]["band"]


@pytest.mark.slow
def test_predict_json_gives_each_figure_its_band(capsys):
    assert main(["predict", "--model", "llama-3.1-70b", "-c", "1,8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    stated = bands()
    for r in data["rows"]:
        lo, hi = r["band"]["decode_tps"]
        assert lo < r["decode_tps"] < hi
        assert lo == pytest.approx(r["decode_tps"] / (1 + stated["decode_tps"]), rel=1e-3)
        assert set(r["band"]) >= {"decode_tps", "prefill_tps", "ttft_ms"}
    assert data["error"]["basis"] == BASIS.format(q=fit.BAND_QUANTILE)
    assert data["error"]["prefill_tps"]["band"] == stated["prefill_tps"]
    assert "leave-one-source-out" in data["uncertainty"]


def test_the_cross_validation_text_has_both_tables_and_the_bands():
    cv = {"m1": {"decode_tps": 0.1, "prefill_tps": 0.2, "cells": 3}, "mean": {"decode_tps": 0.1},
          "by_source": {"s1": {"ttft_ms": 0.3, "cells": 2}, "mean": {"ttft_ms": 0.3}},
          "bands": fit.error_bands({"model": {"m1": {"decode_tps": [0.1, 0.2]}},
                                    "source": {"s1": {"decode_tps": [0.1, 0.3]}}}), "seconds": 3.0,
          "method": "linearised"}
    text = fit.cross_validation_text(cv)
    assert "leave one model out" in text and "leave one source out" in text
    assert "mean over models" in text and "mean over sources" in text and "s1" in text
    assert "80% quantile" in text and "decode" in text
    assert "bands" not in text.split("leave one source out")[0].split("\n", 1)[1]  # no group named "bands"
