"""The fit's priors (`fit.PRIORS`): what a constant is known to be before any
fitted figure, from figures the fit does not use. A prior holds a constant
the remaining figures cannot pin (left without its largest source, the fit
keeps no dense model's prefill) and gives way where figures pin it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from sparktop.model import fit
from sparktop.model.cards import find_card
from sparktop.model.hardware import GB10
from sparktop.yamlfile import load_published

J = fit.GLOBAL.index("compute_efficiency")
PRIOR, WEIGHT = fit.PRIORS["compute_efficiency"]


def test_the_dense_gemm_prior_is_what_lmsys_measured_with_sglang():
    """The prior's value is recomputed from the source it names: SGLang's dense FP8 prefill on one Spark
    (LMSYS's review, batch 1), times twice the weights a prompt token multiplies, over the measured FP8 GEMM
    rate. Neither figure is fitted (the fit takes vLLM's figures only)."""
    figures = [f for f in load_published(fit.MORE)["figures"]
               if f["source"] == "lmsys-review" and f.get("engine") == "sglang" and f["quantization"] == "fp8"
               and "Llama-3.1" in f["model"] and f["workload"]["concurrency"] == 1]
    assert len(figures) == 2
    shares = []
    for f in figures:
        a = find_card(f["model"]).arch
        flops = f["prefill_tps"] * 2 * (a.attention_params + a.dense_ffn_params)
        shares.append(flops / (GB10.achieved("fp8") * 1e12))
    assert all(0.5 < s < 0.7 for s in shares)
    assert math.sqrt(shares[0] * shares[1]) == pytest.approx(PRIOR, abs=5e-4)
    assert not any(c.fitted for c in fit.published_cells() if c.source == "lmsys-review" and c.engine == "sglang")


def _solve(residuals, jac, k):
    step = fit.linear_step(*fit.with_priors(residuals, [0.1] * len(residuals), jac, k))
    return k.compute_efficiency * math.exp(step[J])


def test_a_constant_no_figure_pins_goes_to_its_prior():
    """Figures that say nothing of the dense GEMM share (a zero column, as when no dense prefill is left):
    the solve takes it to the prior, where without the prior it would not move at all."""
    k = replace(fit.load_constants(), compute_efficiency=0.35)
    rows = [[0.5 if j == 0 else 0.0 for j in range(len(fit.GLOBAL))] for _ in range(40)]
    residuals = [0.1] * 40
    assert _solve(residuals, rows, k) == pytest.approx(PRIOR, rel=0.05)
    without = fit.linear_step(residuals, [0.1] * 40, rows)
    assert without[J] == 0.0


def test_figures_that_pin_a_constant_outweigh_its_prior():
    """Hundreds of figures that say the share is 20 % above where it stands: the solve goes most of the way
    there, not to the prior."""
    k = replace(fit.load_constants(), compute_efficiency=PRIOR)
    # prefill figures: d log(predicted t/s) / d log(share) = 1, each predicted 20 % under what was measured
    rows = [[1.0 if j == J else 0.0 for j in range(len(fit.GLOBAL))] for _ in range(600)]
    residuals = [math.log(1 / 1.2)] * 600
    landed = _solve(residuals, rows, k)
    assert landed > PRIOR * 1.15


def test_the_loss_counts_a_constant_off_its_prior():
    cell = fit.Cell("gpt-oss-120b", "solo", "decode_tps", 1, 50.0)
    rows = [(cell, 55.0, True)]
    at = replace(fit.load_constants(), compute_efficiency=PRIOR)
    off = replace(at, compute_efficiency=PRIOR / 2)
    assert fit.loss(rows, at) < fit.loss(rows, off)
    assert fit.loss(rows, at) <= fit.loss(rows)  # at its prior a constant adds no cost, only weight
