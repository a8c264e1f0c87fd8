"""Pipeline parallel in the performance model: what splitting the layers
over nodes does to memory and time, checked against physics rather than a
table (each node holds 1/(tp x pp) of the weights; a decode step still
reads all of them, stage after stage; prefill is split across the stages)."""

from __future__ import annotations

import pytest

from sparktop.model.cards import find_card
from sparktop.model.perf import PerfModel

MODELS = ["llama-3.1-70b", "gpt-oss-120b", "qwen3-235b-a22b"]


@pytest.mark.parametrize("name", MODELS)
def test_each_stage_holds_its_share_of_weights_and_kv(name):
    card = find_card(name)
    one, pp2, tp2pp2 = PerfModel(card), PerfModel(card, pp=2), PerfModel(card, tp=2, pp=2)
    assert pp2.weights_bytes_per_node == pytest.approx(one.weights_bytes_per_node / 2)
    assert tp2pp2.weights_bytes_per_node == pytest.approx(one.weights_bytes_per_node / 4)
    assert pp2.kv_bytes_per_token == pytest.approx(one.kv_bytes_per_token / 2)
    # So a node of two stages holds twice the tokens of KV a lone node does, and more.
    assert pp2.kv_capacity_tokens(0.8) > 2 * one.kv_capacity_tokens(0.8) or one.kv_capacity_tokens(0.8) == 0


@pytest.mark.parametrize("name", MODELS)
def test_one_user_decodes_no_faster_over_stages_and_slower_than_tensor_parallel(name):
    card = find_card(name)
    one, pp2, tp2 = PerfModel(card), PerfModel(card, pp=2), PerfModel(card, tp=2)
    # Every token reads every stage's weights one stage after the other: one node's speed, less the hops.
    assert pp2.decode_tps(1) <= one.decode_tps(1)
    assert pp2.decode_tps(1) > 0.9 * one.decode_tps(1)
    # Tensor parallel reads the halves at once: faster for one user, on a 200 Gb/s link.
    assert tp2.decode_tps(1) > 1.2 * pp2.decode_tps(1)


@pytest.mark.parametrize("name", MODELS)
def test_micro_batches_split_prefill_across_the_stages(name):
    card = find_card(name)
    one, pp2 = PerfModel(card), PerfModel(card, pp=2)
    prompts = [(2048, 0)] * 8  # eight prompts prefilling together: compute bound
    gain = one.step_time([], prompts) / pp2.step_time([], prompts)
    assert 1.5 < gain <= 2.0


@pytest.mark.parametrize("name", MODELS)
def test_decode_never_beats_the_bandwidth_roofline(name):
    card = find_card(name)
    for perf in (PerfModel(card, pp=2), PerfModel(card, tp=2, pp=2), PerfModel(card, pp=4)):
        for batch in (1, 8, 64):
            assert perf.decode_tps(batch) < perf.roofline_decode_tps(batch)


def test_a_hop_moves_the_activations_over_the_link():
    perf = PerfModel(find_card("llama-3.1-70b"), pp=2)
    # 8192 hidden x 2 bytes x 1000 tokens = 16.4 MB over ~200 Gb/s: well under a ms but not free.
    hop = perf._hop(1000)
    assert 0.5e-3 < hop < 2e-3
    assert perf._hop(1) < 1e-4  # a decode token: the latency, nearly all of it
