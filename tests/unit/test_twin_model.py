"""Model cards and the roofline model: lookups, physics, and the numbers a
Spark owner would sanity-check."""

from __future__ import annotations

import pytest

from sparktop.twin.cards import CARDS, UnknownModel, find_card
from sparktop.twin.perf import PerfModel

REQUIRED = ["gpt-oss-120b", "gemma4-26b-a4b", "nemotron-3-super-120b-a12b", "qwen3-235b-a22b",
            "nemotron-super-49b-v1.5", "nemotron-nano-9b-v2", "llama-3.1-8b", "llama-3.1-70b"]


@pytest.mark.parametrize("name", REQUIRED)
def test_every_required_card_is_found_by_short_name_and_hf_id(name):
    card = find_card(name)
    assert find_card(card.hf_id) is card
    assert find_card(card.hf_id.upper()) is card
    assert card.total_params_b >= card.active_params_b > 0
    assert card.weights_gib > 0 and card.attn_layers <= card.layers


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(UnknownModel, match="gpt-oss-120b"):
        find_card("gpt-5")


def test_published_facts_are_kept():
    card = find_card("gpt-oss-120b")
    assert (card.total_params_b, card.active_params_b, card.bits_per_weight, card.weights_gib) == (117, 5.1, 4, 61)
    assert find_card("google/gemma-4-26B-A4B-it").weights_gib == 25.67
    assert find_card("nemotron-3-super-120b-a12b").weights_gib == 69.5


def test_expert_split_adds_up():
    for card in CARDS.values():
        if card.is_moe:
            total = card.dense_params_b + card.experts * card.expert_params_b
            active = card.dense_params_b + card.experts_active * card.expert_params_b
            assert total == pytest.approx(card.total_params_b)
            assert active == pytest.approx(card.active_params_b)


def test_touched_experts_follows_the_occupancy_formula():
    card = find_card("gpt-oss-120b")  # 128 experts, 4 active
    assert card.touched_experts(1) == pytest.approx(4)
    assert card.touched_experts(64) == pytest.approx(128 * (1 - (1 - 4 / 128) ** 64))
    assert card.touched_experts(10_000) == pytest.approx(128, rel=1e-6)


def test_decode_is_bandwidth_bound_and_below_the_roofline():
    for card in CARDS.values():
        m = PerfModel(card)
        assert m.decode_tps(1) < m.roofline_decode_tps(1)
        assert m.decode_tps(8) > m.decode_tps(1)


def test_gpt_oss_c1_decode_is_in_the_range_sparks_report():
    # Published solo c1 decode: 57.5 t/s; the roofline at 273 GB/s for
    # 5.1B active x 4 bits is ~107 t/s.
    m = PerfModel(find_card("gpt-oss-120b"))
    assert 45 < m.decode_tps(1, 1100) < 75
    assert 100 < m.roofline_decode_tps(1, 0) < 110


def test_tp2_is_faster_at_c1_but_pays_for_the_link():
    card = find_card("gemma4-26b-a4b")
    solo, tp2 = PerfModel(card), PerfModel(card, tp=2)
    assert tp2.decode_tps(1) > solo.decode_tps(1)
    assert tp2.decode_tps(1) < 2 * solo.decode_tps(1)
    assert PerfModel(card, tp=2, ray=True).decode_tps(1) < tp2.decode_tps(1)


def test_kv_capacity_is_what_the_memory_leaves():
    card = find_card("gpt-oss-120b")
    m = PerfModel(card)
    low, high = m.kv_capacity_tokens(0.6), m.kv_capacity_tokens(0.8)
    assert 0 < low < high
    per_token = m.kv_bytes_per_token
    assert (high - low) * per_token == pytest.approx(0.2 * m.hw.memory_gib * 1024**3, rel=1e-3)
    assert PerfModel(find_card("qwen3-235b-a22b")).kv_capacity_tokens(0.9) == 0
    assert PerfModel(find_card("qwen3-235b-a22b"), tp=2).kv_capacity_tokens(0.9) > 100_000


def test_fp8_kv_cache_holds_twice_the_tokens():
    card = find_card("gemma4-26b-a4b")
    assert PerfModel(card, kv_dtype_bytes=1).kv_bytes_per_token * 2 == PerfModel(card).kv_bytes_per_token


def test_prefill_is_compute_bound_and_ttft_plausible():
    m = PerfModel(find_card("gemma4-26b-a4b"))
    ttft = m.prefill_seconds(1034)
    assert 0.1 < ttft < 0.5  # published solo c1 TTFT: 223 ms
    assert m.prefill_seconds(4096) > 3 * ttft
