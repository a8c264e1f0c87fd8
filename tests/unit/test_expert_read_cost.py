"""The fixed memory-side cost of each expert a step reads (`Constants.expert_read_s`):
what it adds to a decode step, that tensor parallelism does not halve it, and
that a compute-bound prefill hides it — the physics the README states for it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparktop.model import fit
from sparktop.model.cards import find_card
from sparktop.model.perf import PerfModel

K = fit.load_constants()


def _touched(perf: PerfModel, tokens: int) -> float:
    return perf.card.touched_experts(tokens ** perf.k.expert_batch_exponent)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_decode_step_pays_it_once_per_expert_read_per_moe_layer_on_every_node(tp):
    card = find_card("nemotron-3-super-120b-a12b")
    with_cost = PerfModel(card, tp=tp, k=K)
    without = PerfModel(card, tp=tp, k=replace(K, expert_read_s=0.0))
    batch = 8
    extra = with_cost.step_time([1100] * batch) - without.step_time([1100] * batch)
    layers = sum(f.layers for f in card.arch.ffn if f.experts)
    # Not divided by TP: each node still streams every touched expert, half as wide.
    assert extra == pytest.approx(_touched(with_cost, batch) * layers * K.expert_read_s, rel=1e-6)


def test_it_weighs_on_small_experts_more_than_on_large_ones():
    """Per byte read, Nemotron 3 Super's 3 MB experts pay several times what gpt-oss-120b's 13 MB ones do."""
    shares = {}
    for name in ("nemotron-3-super-120b-a12b", "gpt-oss-120b"):
        perf = PerfModel(find_card(name), k=K)
        per_expert_layer = perf._expert_bytes / perf._moe_layers  # noqa: SLF001 - the model's own account
        shares[name] = K.expert_read_s / (per_expert_layer / perf._bw)  # noqa: SLF001
    assert shares["nemotron-3-super-120b-a12b"] > 3 * shares["gpt-oss-120b"]


def test_a_compute_bound_prefill_hides_it():
    card = find_card("gpt-oss-120b")
    with_cost = PerfModel(card, k=K)
    without = PerfModel(card, k=replace(K, expert_read_s=0.0))
    chunk = [(8192, 0)]
    assert with_cost.step_time([], chunk) == pytest.approx(without.step_time([], chunk), rel=1e-9)
