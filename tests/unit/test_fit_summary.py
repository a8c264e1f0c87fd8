"""What `predict` says of the fit's error per card is computed by `twin fit`
and saved beside the constants: `predict` reads it, never predicts a
published cell, and says when the figures changed since it was saved."""

from __future__ import annotations

import argparse
import json

import pytest

from sparktop.cli import main
from sparktop.model import fit, runtimes
from sparktop.model.cards import find_card
from sparktop.model.predict import uncertainty

NOTE = "run `sparktop twin fit --save-summary`"


def test_the_saved_errors_are_of_the_figures_shipped():
    """A figure, a source's stack or a file added without `sparktop twin fit --save-summary` (or a refit)
    fails here: the per-card errors `predict` states would be of other figures."""
    saved = fit.load_fit_summary()["fit"]
    assert saved["figures_digest"] == fit.figures_digest(), NOTE
    per_card = saved["per_card"]
    assert per_card["gpt-oss-120b"]["figures"] > 0
    assert all(0 <= v["mean_error"] < 1 and v["figures"] > 0 for v in per_card.values())
    assert sum(v["figures"] for v in per_card.values()) <= saved["fitted_cells"]


def test_per_card_is_the_mean_error_of_each_cards_fitted_figures():
    cell = fit.Cell("gpt-oss-120b", "solo", "decode_tps", 1, 50.0)
    rep = fit.Report([(cell, 55.0, True),
                      (fit.Cell("gpt-oss-120b", "solo", "prefill_tps", 1, 2000.0), 1500.0, True),
                      (fit.Cell("gpt-oss-120b", "solo", "ttft_ms", 8, None), None, False),  # an OOM: no error
                      (fit.Cell("gpt-oss-20b", "solo", "decode_tps", 1, 100.0, engine="sglang"), 90.0, True)])
    assert rep.per_card() == {"gpt-oss-120b": {"mean_error": pytest.approx(0.175), "figures": 2,
                                               "decode_tps": 0.1, "prefill_tps": 0.25}}


def test_predict_states_the_saved_error_without_predicting_a_published_cell(monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("predict went through the published figures")

    for name in ("report", "evaluate", "published_cells", "_article_cells", "_more_cells", "load_published"):
        monkeypatch.setattr(fit, name, refuse)
    monkeypatch.setattr(runtimes, "load_published", refuse)
    assert main(["predict", "gpt-oss-120b", "-c", "1,8,64", "--layout", "all", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    saved = fit.load_fit_summary()["fit"]["per_card"]["gpt-oss-120b"]
    assert data["uncertainty"].startswith(
        f"gpt-oss-120b was measured by published sources: the fit is off by {saved['mean_error']:.0%} on average "
        f"on its {saved['figures']} figures (fitted-constants.json); for a model no source measured expect ±")
    assert NOTE not in data["uncertainty"]
    assert {r["topology"] for r in data["rows"]} == {"solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy",
                                                     "2x solo,leastconn"}
    # Another runtime over two nodes: whether its figures span nodes is saved with its factors as well.
    assert main(["predict", "gpt-oss-120b", "-c", "1", "--runtime", "trtllm", "--layout", "cluster-mp", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]


def test_a_card_no_source_measured_gets_the_leave_one_model_out_error():
    text = uncertainty(find_card("llama-3.1-70b"))
    assert text.startswith("no published source measured llama-3.1-70b: ") and "leave-one-model-out" in text


def test_figures_changed_since_the_errors_were_saved_say_what_to_run(monkeypatch):
    assert NOTE not in uncertainty(find_card("gpt-oss-120b"))
    monkeypatch.setattr(fit, "figures_digest", lambda: "0" * 40)
    text = uncertainty(find_card("gpt-oss-120b"))
    assert text.startswith("gpt-oss-120b was measured by published sources") and text.endswith(NOTE)


def test_save_summary_rewrites_only_the_errors_and_the_digest(tmp_path, monkeypatch, capsys):
    from sparktop.model.commands import cmd_fit

    path = tmp_path / "fitted-constants.json"
    before = json.loads(fit.FITTED.read_text())
    stale = {**before, "fit": {**before["fit"], "per_card": {"old": {"mean_error": 0.5, "figures": 1}},
                               "figures_digest": "stale"}}
    path.write_text(json.dumps(stale, indent=2) + "\n")
    rep = fit.Report([(fit.Cell("gpt-oss-120b", "solo", "decode_tps", 1, 50.0), 60.0, True)])
    monkeypatch.setattr(fit, "FITTED", path)
    monkeypatch.setattr(fit, "report", lambda k=None: rep)
    monkeypatch.setattr(fit, "refit", lambda **kw: pytest.fail("--save-summary refitted"))
    args = argparse.Namespace(runs=None, refit=False, stacks=None, cross_validate=False, json=True, iterations=None,
                              save_summary=True)
    assert cmd_fit(args) == 0
    capsys.readouterr()
    after = json.loads(path.read_text())
    assert after["fit"]["per_card"] == {"gpt-oss-120b": {"mean_error": pytest.approx(0.2), "figures": 1,
                                                         "decode_tps": 0.2}}
    assert after["fit"]["figures_digest"] == fit.figures_digest()
    assert {k: v for k, v in after.items() if k != "fit"} == {k: v for k, v in before.items() if k != "fit"}
    assert {k: v for k, v in after["fit"].items() if k not in ("per_card", "figures_digest")} == \
        {k: v for k, v in before["fit"].items() if k not in ("per_card", "figures_digest")}


def test_each_runtimes_saved_over_nodes_is_its_figures():
    for rt, entry in runtimes._stored()["runtimes"].items():
        assert entry["over_nodes"] == any(f.nodes > 1 for f in runtimes.load_figures(rt)), rt
    assert runtimes.fitted_over_nodes("vllm") and runtimes.fitted_over_nodes("trtllm")
    assert not runtimes.fitted_over_nodes("llama-cpp") and not runtimes.fitted_over_nodes("tgi")
