"""Model cards and the roofline model: real configs read right, physics a
Spark owner would sanity-check."""

from __future__ import annotations

import json

import pytest

from sparktop.model.architecture import from_config
from sparktop.model.cards import CARDS, UnknownModel, card_from_config, find_card
from sparktop.model.hardware import GB10
from sparktop.model.perf import PerfModel
from sparktop.model.quant import Quantization

REQUIRED = ["gpt-oss-120b", "gemma4-26b-a4b", "nemotron-3-super-120b-a12b", "qwen3-235b-a22b",
            "nemotron-super-49b-v1.5", "nemotron-nano-9b-v2", "llama-3.1-8b", "llama-3.1-70b",
            # what the predictions issue adds
            "gpt-oss-20b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "llama-3.3-70b", "glm-4.5-air",
            "deepseek-v2-lite"]


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


@pytest.mark.parametrize("card", list(CARDS.values()), ids=lambda c: c.name)
def test_parameters_read_from_the_config_match_what_the_vendor_publishes(card):
    """Nothing is typed in: the totals come from config.json and must agree
    with the model card's own headline figures."""
    if card.published_total_b:
        assert card.total_params_b == pytest.approx(card.published_total_b, rel=0.04)
    if card.published_active_b and card.is_moe:
        assert card.active_params_b == pytest.approx(card.published_active_b, rel=0.25)


@pytest.mark.parametrize("card", [c for c in CARDS.values() if c.measured_weights_gib], ids=lambda c: c.name)
def test_computed_weight_memory_agrees_with_what_sparks_measured(card):
    # Per-part formats x parameter counts against logs and articles (vision
    # towers and MTP heads account for the rest).
    assert card.computed_weights_gib == pytest.approx(card.measured_weights_gib, rel=0.08)


def test_gpt_oss_keeps_attention_and_unembedding_in_bf16_as_its_config_says():
    card = find_card("gpt-oss-120b")
    assert (card.quant.experts.name, card.quant.linear.name, card.quant.lm_head.name) == ("mxfp4", "bf16", "bf16")
    assert card.total_params_b == pytest.approx(116.8, abs=0.1)
    assert card.active_params_b == pytest.approx(5.13, abs=0.02)


def test_architectures_read_from_real_configs():
    gemma = find_card("gemma4-26b-a4b").arch
    local, global_ = sorted(gemma.attention, key=lambda a: a.window, reverse=True)
    assert (local.layers, local.window, local.qk_dim) == (25, 1024, 256)
    assert (global_.layers, global_.window, global_.qk_dim, global_.kv_heads) == (5, 0, 512, 2)
    assert gemma.ffn[0].dense_params > 0 and gemma.ffn[0].experts == 128  # a dense MLP beside the experts

    nano = find_card("nemotron-nano-9b-v2").arch
    assert (nano.attn_layers, nano.recurrent[0].layers, nano.ffn[0].layers) == (4, 27, 25)
    super_ = find_card("nemotron-3-super-120b-a12b").arch
    # Nemotron asks vLLM for a float32 SSM state: 128 heads x 64 x 128 x 4 bytes per Mamba layer.
    assert super_.recurrent[0].state_bytes > 128 * 64 * 128 * 4

    nas = find_card("nemotron-super-49b-v1.5").arch
    assert nas.layers == 80 and nas.attn_layers < 80  # NAS blocks without attention
    assert len({f.dense_params for f in nas.ffn}) > 1  # FFN widths vary by block

    mla = find_card("deepseek-v2-lite").arch.attention[0]
    assert mla.mla and mla.kv_elems == 512 + 64  # one latent + the rotary key, whatever the head count

    nxt = find_card("qwen3-next-80b-a3b").arch
    assert nxt.attn_layers == 12 and nxt.recurrent[0].kind == "gated-delta" and nxt.recurrent[0].layers == 36


def test_any_config_json_describes_a_model(tmp_path):
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
           "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    path = tmp_path / "my-model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    card = find_card(str(path.parent))
    assert card.name == "my-model" and card.quant.linear.name == "fp8"
    assert card.total_params_b == pytest.approx(32.8, rel=0.03)
    assert card_from_config(path, quant="nvfp4").quant.linear.name == "nvfp4"


def test_a_config_without_the_keys_is_refused_with_the_key_named():
    with pytest.raises(Exception, match="num_hidden_layers"):
        from_config({"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 1000}, "x/config.json")


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


def test_no_prediction_breaks_physics():
    """Decode never above the bandwidth roofline; prefill never above the
    tensor peak of the precision each part computes in."""
    for card in CARDS.values():
        for tp in (1, 2):
            m = PerfModel(card, tp=tp)
            for b in (1, 16, 256):
                assert m.decode_tps(b) <= m.roofline_decode_tps(b) * 1.0001
            flops = 2 * (card.active_params_b - card.arch.lm_head_params / 1e9) * 1e9 / tp
            tps = 8192 / m.step_time([], [(8192, 0)])
            assert tps * flops < GB10.peak_tflops("fp4") * 1e12, card.name


def test_the_roofline_counts_bytes_in_each_parts_own_format():
    # gpt-oss as published: attention and lm_head in BF16 (~3.1 GB a token) plus
    # four MXFP4 experts per layer (~1.9 GB); the community image stores them all in MXFP4.
    card = find_card("gpt-oss-120b")
    stock = PerfModel(card).decode_bytes(1, 0)
    assert stock == pytest.approx(4.97e9, rel=0.03)
    import dataclasses

    spark = PerfModel(dataclasses.replace(card, quant=Quantization.of("mxfp4-spark"))).decode_bytes(1, 0)
    assert spark == pytest.approx(2.72e9, rel=0.05)


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


def test_sliding_window_layers_do_not_grow_with_the_context():
    # gpt-oss: only its 18 full-attention layers grow per token (8 KV heads x 64 x K,V x 2 bytes each).
    m = PerfModel(find_card("gpt-oss-120b"))
    assert m.kv_bytes_per_token == 18 * 8 * 64 * 2 * 2
    assert m.seq_state_bytes == 18 * 8 * 64 * 2 * 2 * 128  # a window's worth, once per sequence


def test_fp8_kv_cache_holds_twice_the_tokens():
    card = find_card("gemma4-26b-a4b")
    assert PerfModel(card, kv_dtype_bytes=1).kv_bytes_per_token * 2 == PerfModel(card).kv_bytes_per_token


def test_prefill_reads_the_weights_once_per_chunk_then_is_compute_bound():
    m = PerfModel(find_card("gemma4-26b-a4b"))
    ttft = m.prefill_seconds(1034)
    assert 0.05 < ttft < 0.5  # published solo c1 TTFT: 223 ms
    # A longer chunk shares the expert reads: the rate grows, then flattens.
    r1, r4, r8 = (n / m.prefill_seconds(n) for n in (1034, 4096, 8192))
    assert r4 > r1 and r8 == pytest.approx(r4, rel=0.35)
    assert m.prefill_seconds(32768) > 3 * m.prefill_seconds(8192)
