"""The model beyond two nodes against what was published for three Sparks
and more (model/data/published-multinode.yaml, never fitted): the cost of
one all-reduce over two and four nodes, one user's decode at tp=4, and how
little the link's speed moves it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sparktop.cli import main
from sparktop.model.cards import find_card
from sparktop.model.fit import load_constants
from sparktop.model.hardware import GB10
from sparktop.model.perf import PerfModel

FIGURES = yaml.safe_load((Path(__file__).resolve().parents[2] / "sparktop/model/data/published-multinode.yaml")
                         .read_text())
DECODE_ERROR = 0.16  # what `sparktop predict` tells a user to expect on decode (leave-one-model-out)


@pytest.mark.parametrize("figure", FIGURES["allreduce"], ids=lambda f: f"{f['nodes']} nodes")
def test_one_all_reduce_costs_what_nccl_measured_on_sparks(figure):
    """Within 25 % of the measured range. The two-node cost is fitted to the
    articles' TP=2 decode (it sits at its 40 us bound) and comes out ~20 %
    above nccl-tests' bare collective: inside vLLM a step's all-reduce also
    waits on its stream; the four-node one is not fitted at all."""
    model = PerfModel(find_card("qwen3-32b"), tp=figure["nodes"], k=load_constants())
    low, high = figure["time_us"]
    predicted = model.allreduce_s(figure.get("bytes", 8192)) * 1e6
    assert 0.75 * low <= predicted <= 1.25 * high, (predicted, figure["source"])


def test_four_nodes_all_reduce_far_less_than_three_times_two_nodes():
    """NCCL's per-call cost dominates a small all-reduce: hops added by
    more nodes cost a few microseconds each, not half of the two-node time."""
    two = PerfModel(find_card("qwen3-32b"), tp=2, k=load_constants()).allreduce_s(8192)
    four = PerfModel(find_card("qwen3-32b"), tp=4, k=load_constants()).allreduce_s(8192)
    eight = PerfModel(find_card("qwen3-32b"), tp=8, k=load_constants()).allreduce_s(8192)
    assert two < four < eight < 2 * two


@pytest.mark.parametrize("figure", FIGURES["decode"], ids=lambda f: f"{f['model']} {f['layout']}")
def test_one_users_decode_over_four_nodes_within_the_stated_error(figure, capsys):
    assert main(["predict", "--model", figure["model"], "--quant", figure["quant"], "--layout", figure["layout"],
                 "-c", "1", "--pp", "1024", "--tg", "128", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    measured = figure["decode_tps_per_request"]
    assert abs(row["decode_tps"] / measured - 1) <= DECODE_ERROR, (row["decode_tps"], measured, figure["source"])


@pytest.mark.parametrize("card", ["qwen3-235b-a22b", "gpt-oss-120b", "llama-3.1-70b"])
def test_halving_the_link_barely_moves_one_users_decode_at_tp4(card):
    """A decode step's all-reduces carry a few KB: latency, not link speed,
    is what they cost (measured: within 3% at 100G and 200G)."""
    figure = FIGURES["link_speed"][0]
    measured = max(abs(a / b - 1) for a, b in zip(figure["decode_tps_100g"], figure["decode_tps_200g"], strict=True))
    fast = PerfModel(find_card(card), tp=4, k=load_constants())
    slow = PerfModel(find_card(card), tp=4, k=load_constants(), hw=replace(GB10, link_gbps=100.0))
    change = 1 - slow.decode_tps(1, ctx=8192) / fast.decode_tps(1, ctx=8192)
    assert 0 < change <= measured
