"""`sparktop predict --layout`: every layout four (or eight) Sparks allow,
ranked, with the physics a user can check by hand."""

from __future__ import annotations

import json

import pytest

from sparktop.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture
def inventory4(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n" + "".join(f"  - name: spark-{c}\n    host: spark-{c}.lan\n" for c in "abcd"))
    return path


def rows(capsys, *args) -> dict:
    assert main(["predict", *args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    return data


def test_all_ranks_every_layout_four_nodes_allow(capsys, inventory4):
    data = rows(capsys, "gpt-oss-120b", "--layout", "all", "-c", "1,64", "--inventory", str(inventory4))
    by = {(r["topology"], r["concurrency"]): r for r in data["rows"]}
    names = {t for t, _ in by}
    assert {"solo", "cluster-mp", "shuffle", "tp=4", "tp=4,ray", "pp=2", "tp=2,pp=2", "pp=4", "2x tp=2,least-busy",
            "4x solo,shuffle", "4x solo,least-busy", "tp=4,ep"} <= names  # gpt-oss is a MoE model: ep too
    # A MoE model reads little per token: the step's fixed costs and two all-reduces a layer stay while
    # the reading is split, so one user gains far less than the 2x that halving the reads would give.
    assert by[("tp=4", 1)]["decode_tps"] < 1.35 * by[("cluster-mp", 1)]["decode_tps"]
    # Pipeline stages read the weights one after another: one user gains nothing from them;
    # 64 users' prompts split over two stages' micro-batches prefill faster (a layout is its own
    # prediction, never another's remembered one).
    assert by[("pp=2", 1)]["decode_tps"] <= by[("solo", 1)]["decode_tps"]
    assert by[("pp=2", 64)]["prefill_tps"] > 1.3 * by[("solo", 64)]["prefill_tps"]
    assert by[("tp=2,pp=2", 64)]["prefill_tps"] > 1.3 * by[("cluster-mp", 64)]["prefill_tps"]
    # Four engines behind the router serve many users more than one engine can.
    assert by[("4x solo,shuffle", 64)]["decode_tps"] > 1.5 * by[("solo", 64)]["decode_tps"]
    # The recommendation names one of these layouts.
    assert {r["topology"] for r in data["recommendation"]} <= names


def test_layouts_predicted_without_the_nodes_and_bad_ones_refused(capsys):
    data = rows(capsys, "llama-3.1-70b", "--layout", "tp=4,2x tp=2", "-c", "1")
    assert [r["topology"] for r in data["rows"]] == ["tp=4", "2x tp=2,leastconn"]
    assert main(["predict", "llama-3.1-70b", "--layout", "tp=4,ep"]) == 2
    assert "dense model" in capsys.readouterr().err
    assert main(["predict", "llama-3.1-70b", "--layout", "tp=x"]) == 2
    assert "tp= takes a whole number" in capsys.readouterr().err


def test_no_layout_breaks_the_bandwidth_roofline(capsys, inventory4):
    from sparktop.layouts import parse_layout
    from sparktop.model.cards import find_card
    from sparktop.model.perf import PerfModel

    data = rows(capsys, "llama-3.1-70b", "--layout", "all", "-c", "1", "--tg", "64", "--inventory",
                str(inventory4))
    card = find_card("llama-3.1-70b")
    by = {r["topology"]: r for r in data["rows"]}
    # A dense 70B reads 67 GiB a token: splitting that over four nodes outweighs the all-reduces.
    assert by["tp=4"]["decode_tps"] > 1.6 * by["cluster-mp"]["decode_tps"]
    assert by["cluster-mp"]["decode_tps"] > by["solo"]["decode_tps"]
    for r in data["rows"]:
        layout = parse_layout(r["topology"])
        roof = PerfModel(card, tp=layout.tp, pp=layout.pp).roofline_decode_tps(1, ctx=1024 + 64)
        assert r["decode_tps"] < roof * (1.0 if layout.replicas == 1 else layout.replicas), r
