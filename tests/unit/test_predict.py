"""`sparktop predict` and the fit report, as a user reads them."""

from __future__ import annotations

import json

import pytest

from sparktop.cli import main
from sparktop.model import fit
from sparktop.model.cards import find_card
from sparktop.model.simulate import predict

pytestmark = pytest.mark.slow


def test_predict_json_rows_for_every_topology_the_recipe_allows(capsys):
    assert main(["predict", "gpt-oss-120b", "--topology", "all", "-c", "1,8,64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["rows"]
    keys = {"model", "topology", "concurrency", "pp", "tg", "decode_tps", "per_request_tps", "prefill_tps", "band",
            "ttft_ms", "kv_cache_usage", "fits", "e2e_tps_total", "e2e_tps_req", "wall_s_mean", "preempted"}
    assert all(set(r) == keys for r in rows)
    # The five two-node names, and two solo replicas behind the default router (HAProxy leastconn).
    assert {r["topology"] for r in rows} == {"solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy",
                                             "2x solo,leastconn"}
    by = {(r["topology"], r["concurrency"]): r for r in rows}
    # Physics a user can check: TP=2 beats one node at c1; batching raises the total; TTFT grows with c.
    assert by[("cluster-mp", 1)]["decode_tps"] > by[("solo", 1)]["decode_tps"]
    assert by[("solo", 64)]["decode_tps"] > 2 * by[("solo", 1)]["decode_tps"]
    assert by[("solo", 64)]["ttft_ms"] > by[("solo", 8)]["ttft_ms"] > by[("solo", 1)]["ttft_ms"]
    # The LiteLLM sparktop launches splits a lockstep batch of 64 close to evenly with least-busy: at least as
    # fast as shuffle's random split (the articles' least-busy, which starved a node, is theirs: test_routers).
    assert by[("least-busy", 64)]["decode_tps"] >= 0.99 * by[("shuffle", 64)]["decode_tps"]
    assert data["router"]["least-busy"]["strategy"] == "least-busy"
    assert data["router"]["least-busy"]["product"].startswith("LiteLLM 1.106.2")
    assert set(data["router"]) == {"shuffle", "least-busy", "2x solo,leastconn"}
    # HAProxy's exact split: no slower than least-busy's near-even one at c64, nor at c8 where least-busy races.
    for c in (8, 64):
        assert by[("2x solo,leastconn", c)]["decode_tps"] >= 0.99 * by[("least-busy", c)]["decode_tps"]
    assert data["router"]["2x solo,leastconn"]["product"] == "HAProxy 3.2.24"
    workloads = [r["workload"] for r in data["recommendation"]]
    assert workloads == ["single user", "agents at c8-c16", "high concurrency", "prefill-heavy", "latency at scale"]
    assert "measured by published sources" in data["uncertainty"]
    # What pipeline owners quote: c x tg over the batch's wall time.
    r = by[("solo", 64)]
    assert r["e2e_tps_total"] == pytest.approx(64 * 128 / r["wall_s_mean"], rel=0.02)


def test_predict_a_model_no_article_measured_says_how_unsure_it_is(capsys):
    assert main(["predict", "--model", "llama-3.1-70b", "-c", "1,4"]) == 0
    out = capsys.readouterr().out
    assert "no published source measured llama-3.1-70b" in out and "solo" in out


def test_predict_errors_are_one_line(capsys):
    assert main(["predict", "gpt-oss-120b", "--topology", "mesh"]) == 2
    assert "layout 'mesh': unknown 'mesh'" in capsys.readouterr().err
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
    """`twin fit --report` as a user runs it: the model evaluated on every published cell (some 1,300, in a
    process pool), which is 10-20 s of CPU on two cores; what it prints is checked, not how fast."""
    assert main(["twin", "fit", "--report"]) == 0
    out = capsys.readouterr().out
    cells = fit.published_cells()
    assert len(cells) > 150
    for metric in ("decode_tps", "prefill_tps", "ttft_ms"):
        assert f"MAPE {metric}" in out
    assert "same winner as published:" in out and "cells that miss most:" in out
    assert any(line.split()[:6] == ["nemotron-3-super-120b-a12b", "solo", "decode_tps", "64", "OOM", "does"]
               for line in out.splitlines())


def test_predict_works_for_every_shipped_recipe(capsys):
    from sparktop.launch.catalog import discover

    recipes, errors = discover()
    assert recipes and not errors
    for rid in sorted(recipes):
        assert main(["predict", rid, "--topology", "all", "-c", "1,8", "--json"]) == 0, rid
        data = json.loads(capsys.readouterr().out)
        allowed = set(recipes[rid].allowed_topologies(2))
        allowed |= {"2x solo,leastconn"} if "shuffle" in allowed else set()  # behind the default router too
        assert {r["topology"] for r in data["rows"]} == allowed, rid
        assert all(r["decode_tps"] and r["decode_tps"] > 0 for r in data["rows"]), rid
        assert data["recommendation"], rid


def _row(capsys, *argv) -> dict:
    assert main(["predict", *argv, "--json"]) == 0
    return {(r["topology"], r["concurrency"]): r for r in json.loads(capsys.readouterr().out)["rows"]}


def test_engine_limits_are_simulated_not_flagged(capsys):
    """--max-num-seqs caps the batch: past it throughput plateaus and the rest
    of a lockstep batch queues (its TTFT grows by whole generations)."""
    free = _row(capsys, "--model", "llama-3.1-8b", "-c", "8,32")
    capped = _row(capsys, "--model", "llama-3.1-8b", "-c", "8,32", "--set", "max_num_seqs=8")
    assert capped[("solo", 8)]["decode_tps"] == pytest.approx(free[("solo", 8)]["decode_tps"], rel=0.01)
    assert capped[("solo", 32)]["decode_tps"] < 0.6 * free[("solo", 32)]["decode_tps"]
    assert capped[("solo", 32)]["ttft_ms"] > 3 * free[("solo", 32)]["ttft_ms"]
    eager = _row(capsys, "--model", "llama-3.1-8b", "-c", "8", "--set", "enforce_eager=true")
    assert eager[("solo", 8)]["decode_tps"] < free[("solo", 8)]["decode_tps"]


def test_past_the_kv_cache_the_engine_preempts_and_throughput_falls(capsys):
    # A 70B dense model at a small memory share: c128 of 1024+128 tokens needs
    # more cache than there is. vLLM preempts and recomputes; so does the model.
    rows = _row(capsys, "--model", "llama-3.3-70b", "-c", "16,128", "--set", "gpu_memory_utilization=0.45")
    small, big = rows[("solo", 16)], rows[("solo", 128)]
    assert small["fits"] and not big["fits"] and big["preempted"]
    assert big["decode_tps"] and big["decode_tps"] > 0  # simulated, not refused
    per_seq_small = small["decode_tps"] / 16
    per_seq_big = big["decode_tps"] / 128
    assert per_seq_big < 0.5 * per_seq_small
    more = _row(capsys, "--model", "llama-3.3-70b", "-c", "128", "--set", "gpu_memory_utilization=0.45",
                "--set", "kv_cache_dtype=fp8")
    assert more[("solo", 128)]["kv_cache_usage"] == pytest.approx(big["kv_cache_usage"] / 2, rel=0.01)


def test_predict_takes_a_checkpoint_format_and_any_config(capsys, tmp_path):
    fp8 = _row(capsys, "--model", "llama-3.3-70b", "-c", "1", "--quant", "fp8")
    fp4 = _row(capsys, "--model", "llama-3.3-70b", "-c", "1", "--quant", "nvfp4")
    # Decode reads the weights: 4.5-bit weights decode faster than 8-bit ones.
    assert fp4[("solo", 1)]["decode_tps"] > 1.4 * fp8[("solo", 1)]["decode_tps"]
    assert main(["predict", "--model", "llama-3.3-70b", "--set", "max_num_seqs=lots"]) == 2
    assert "max_num_seqs" in capsys.readouterr().err


def test_every_card_predicts_with_an_expected_error(capsys):
    from sparktop.model.cards import CARDS

    for name in CARDS:
        assert main(["predict", "--model", name, "-c", "1,8", "--json"]) == 0, name
        data = json.loads(capsys.readouterr().out)
        assert all(r["decode_tps"] > 0 and r["prefill_tps"] > 0 for r in data["rows"]), name
        assert "expect ±" in data["uncertainty"] or "off by" in data["uncertainty"], name
