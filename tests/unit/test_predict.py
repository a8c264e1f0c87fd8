"""`sparktop predict` and the fit report, as a user reads them."""

from __future__ import annotations

import json

import pytest

from sparktop.cli import main
from sparktop.twin import fit
from sparktop.twin.cards import find_card
from sparktop.twin.simulate import predict

pytestmark = pytest.mark.slow


def test_predict_json_rows_for_every_topology_the_recipe_allows(capsys):
    assert main(["predict", "gpt-oss-120b", "--topology", "all", "-c", "1,8,64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["rows"]
    keys = {"model", "topology", "concurrency", "pp", "tg", "decode_tps", "per_request_tps", "prefill_tps",
            "ttft_ms", "kv_cache_usage", "fits"}
    assert all(set(r) == keys for r in rows)
    assert {r["topology"] for r in rows} == {"solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy"}
    by = {(r["topology"], r["concurrency"]): r for r in rows}
    # Physics a user can check: TP=2 beats one node at c1; batching raises the total; TTFT grows with c.
    assert by[("cluster-mp", 1)]["decode_tps"] > by[("solo", 1)]["decode_tps"]
    assert by[("solo", 64)]["decode_tps"] > 2 * by[("solo", 1)]["decode_tps"]
    assert by[("solo", 64)]["ttft_ms"] > by[("solo", 8)]["ttft_ms"] > by[("solo", 1)]["ttft_ms"]
    # least-busy starves a node in lockstep: it measures like solo, not like shuffle.
    assert by[("least-busy", 64)]["decode_tps"] < 0.8 * by[("shuffle", 64)]["decode_tps"]
    workloads = [r["workload"] for r in data["recommendation"]]
    assert workloads == ["single user", "agents at c8-c16", "high concurrency", "prefill-heavy", "latency at scale"]
    assert "measured in the articles" in data["uncertainty"]


def test_predict_a_model_no_article_measured_says_how_unsure_it_is(capsys):
    assert main(["predict", "--model", "llama-3.1-70b", "-c", "1,4"]) == 0
    out = capsys.readouterr().out
    assert "no article measured llama-3.1-70b" in out and "solo" in out


def test_predict_errors_are_one_line(capsys):
    assert main(["predict", "gpt-oss-120b", "--topology", "mesh"]) == 2
    assert "--topology 'mesh'" in capsys.readouterr().err
    assert main(["predict"]) == 2
    assert "give a RECIPE or --model CARD" in capsys.readouterr().err


def test_the_published_out_of_memory_case_does_not_fit_and_the_others_do():
    card = find_card("nemotron-3-super-120b-a12b")
    k = fit.load_constants()
    serving = fit.SERVING[card.name]
    assert not predict(card, "solo", 64, k=k, serving=serving).fits
    assert predict(card, "solo", 32, k=k, serving=serving).fits
    assert predict(card, "cluster-ray", 64, k=k, serving=serving).fits


def test_fit_report_lists_every_published_cell_and_the_error_per_metric(capsys):
    assert main(["twin", "fit", "--report"]) == 0
    out = capsys.readouterr().out
    cells = fit.published_cells()
    assert len(cells) > 150
    for metric in ("decode_tps", "prefill_tps", "ttft_ms"):
        assert f"MAPE {metric}" in out
    assert "same winner as published:" in out and "cells that miss most:" in out
    assert "nemotron-3-super-120b-a12b   solo         decode_tps    64        OOM" in out


def test_predict_works_for_every_shipped_recipe(capsys):
    from sparktop.launch.recipe import discover

    recipes, errors = discover()
    assert recipes and not errors
    for rid in sorted(recipes):
        assert main(["predict", rid, "--topology", "all", "-c", "1,8", "--json"]) == 0, rid
        data = json.loads(capsys.readouterr().out)
        allowed = set(recipes[rid].allowed_topologies(2))
        assert {r["topology"] for r in data["rows"]} == allowed, rid
        assert all(r["decode_tps"] and r["decode_tps"] > 0 for r in data["rows"]), rid
        assert data["recommendation"], rid
