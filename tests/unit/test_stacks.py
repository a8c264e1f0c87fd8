"""The software stack as an input of the model: which stack each published
source ran (data/stacks.yaml, every claim quoted), which stack a recipe's
image is, per-stack factors that move only their own stack's predictions,
and the published figures their own source refutes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from sparktop.cli import main
from sparktop.model import fit
from sparktop.model.stacks import DEFAULT_STACK, STACKS_FILE, UNKNOWN, load_stacks


def test_every_vllm_source_names_its_stack_with_a_quote():
    stacks = load_stacks()
    raw = yaml.safe_load(STACKS_FILE.read_text())
    more = yaml.safe_load(fit.MORE.read_text())
    vllm_sources = {name for name, s in more["sources"].items() if str(s.get("engine", "vllm")).lower() == "vllm"}
    articles = {str(run["source"]) for run in yaml.safe_load(fit.PUBLISHED.read_text())["runs"] if "source" in run}
    for source in vllm_sources | articles:
        assert source in stacks.sources, f"{source}: no stack recorded in {STACKS_FILE.name}"
        entry = raw["sources"][source]
        assert entry.get("quote"), f"{source}: its stack has no quote"
        assert stacks.sources[source].stack in {*stacks.stacks, UNKNOWN}, source
        assert 0.0 <= stacks.sources[source].documented <= 1.0
    # Every stack is identified by what a user can see: at least one image pattern or a source's image.
    for sid, stack in stacks.stacks.items():
        assert stack.name and (stack.images or any(s.stack == sid for s in stacks.sources.values())), sid


def test_the_articles_cells_carry_their_stack_and_what_it_ran():
    cells = [c for c in fit.published_cells(more=False)]
    by_model = {c.model: c for c in cells}
    gpt = by_model["gpt-oss-120b"]
    assert gpt.stack == "eugr-vllm-node-mxfp4" and gpt.serving.kv_cache_dtype == "fp8"  # the image's FP8 KV cache
    assert not gpt.serving.enforce_eager  # claimed elsewhere, refuted by its own c1 figure (stacks.yaml says why)
    assert by_model["gemma4-26b-a4b"].stack == "eugr-vllm-node"
    assert by_model["nemotron-3-super-120b-a12b"].stack == "vllm-sm121-cutlass-patched"


@pytest.mark.parametrize("image, stack", [
    ("nvcr.io/nvidia/vllm:25.11-py3", "ngc-vllm"),
    ("nvcr.io/nvidia/vllm:26.04-py3", "ngc-vllm"),
    ("vllm-node-mxfp4", "eugr-vllm-node-mxfp4"),
    ("vllm-node-20260405", "eugr-vllm-node"),
    ("vllm/vllm-openai:v0.26.0-aarch64-cu129-ubuntu2404", "vllm-openai"),
])
def test_a_recipes_image_chooses_its_stack(image, stack):
    assert load_stacks().for_image(image) == (stack, None)


def test_an_unknown_image_is_predicted_as_the_default_stack_and_says_so():
    stack, note = load_stacks().for_image("registry.example.com/team/vllm-custom:7")
    assert stack == DEFAULT_STACK
    assert "registry.example.com/team/vllm-custom:7" in note and DEFAULT_STACK in note and "--stack" in note


def test_predict_for_a_recipe_whose_image_is_unknown_names_the_stack_it_assumed(tmp_path, capsys):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("name: mine\nmodel: openai/gpt-oss-120b\nimage: registry.example.com/team/vllm-custom:7\n"
                      "vllm:\n  gpu_memory_utilization: 0.7\n")
    assert main(["predict", str(recipe), "--topology", "solo", "-c", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stack"]["id"] == DEFAULT_STACK
    assert "registry.example.com/team/vllm-custom:7" in data["stack"]["assumed"]
    assert main(["predict", str(recipe), "--topology", "solo", "-c", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"stack {DEFAULT_STACK}" in out and "is not a known vLLM build" in out


def test_predict_stack_changes_the_prediction_and_an_unknown_stack_is_one_line(capsys):
    assert main(["predict", "gpt-oss-120b", "--topology", "solo", "-c", "1", "--json",
                 "--stack", "eugr-vllm-node-mxfp4"]) == 0
    assert json.loads(capsys.readouterr().out)["stack"] == {"id": "eugr-vllm-node-mxfp4", "assumed": None}
    assert main(["predict", "gpt-oss-120b", "--topology", "solo", "-c", "1", "--stack", "vllm-8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown stack 'vllm-8'" in err and "eugr-vllm-node" in err


def test_a_source_with_a_new_stack_moves_only_its_own_factor():
    """A synthetic source on a new stack whose decode runs 30 % slower than
    the model says for the same cells: fitting it gives its stack a factor
    below 1 and changes no other stack's prediction."""
    k = fit.load_constants()
    cells = [c for c in fit.published_cells(more=False) if c.model == "gemma4-26b-a4b" and c.topology == "solo"
             and c.metric == "decode_tps" and c.concurrency <= 16]
    truth = fit.evaluate(k, cells)
    synthetic = [replace(c, source="synthetic", stack="synthetic-stack", published=p * 0.7, documented=1.0)
                 for c, p, _ in truth]
    others = [c for c in fit.published_cells(more=False) if c.model == "gemma4-26b-a4b"]
    before = [p for _, p, _ in fit.evaluate(k, others)]
    entry = fit.fit_stack("synthetic-stack", synthetic + others, k, iterations=40)
    assert entry["cells"] == len(synthetic) and entry["sources"] == ["synthetic"]
    assert entry["factors"]["bandwidth"] < 0.9 or entry["factors"]["overhead"] > 1.1, entry["factors"]
    assert entry["after"]["decode_tps"] < 0.05 < entry["before"]["decode_tps"], entry
    moved = replace(k, stack_factors=fit.stack_table({**{s: dict(f) for s, f in k.stack_factors},
                                                      "synthetic-stack": entry["factors"]}))
    assert [p for _, p, _ in fit.evaluate(moved, others)] == before  # nobody else's prediction moved
    slower = fit.evaluate(moved, synthetic)
    assert all(p < t for (_, p, _), (_, t, _) in zip(slower, truth, strict=True))


def test_a_ttft_its_own_prefill_figure_refutes_is_listed_and_left_out():
    base = fit.Cell("gemma4-26b-a4b", "solo", "prefill_tps", 8, 4000.0, source="s")
    fine = replace(base, metric="ttft_ms", published=1500.0)  # 8 x 1024 at 4,000 t/s: 1.0-2.0 s expected
    refuted = replace(base, metric="ttft_ms", published=9000.0, concurrency=8)
    assert fit.inconsistent([base, fine]) == []
    (found,) = fit.inconsistent([base, refuted])
    assert found[0] is refuted and "TTFT 9,000 ms" in found[1] and "4,000 t/s" in found[1]
    published = fit.published_cells()
    key = lambda c: (c.source, c.model, c.quant, c.topology, c.concurrency, c.metric, c.workload)  # noqa: E731
    left_out = {key(c) for c in published if c.weight == 0.0}
    assert left_out == {key(c) for c, _ in fit.inconsistent(published)}
    assert left_out, "the published files hold refuted TTFTs (djangodevreng's 03-long-output at c5)"


def test_a_level_that_cannot_have_had_its_concurrency_in_flight_is_listed_and_left_out():
    """Aggregate decode no higher at c64 than at c32 on one engine, where the model with all 64 in flight has it
    grow: every figure of that level is out of the fit, named once; a router's level, and a flat level the model
    says is flat too, are not."""
    base = fit.Cell("gemma4-26b-a4b", "solo", "decode_tps", 32, 280.0, source="s")
    flat = replace(base, concurrency=64, published=279.0)
    grows = replace(flat, published=350.0)
    same_level = [replace(flat, metric="prefill_tps", published=7000.0), replace(flat, metric="ttft_ms",
                                                                                  published=6000.0)]
    found = fit.inconsistent([base, flat, *same_level])
    assert [c for c, _ in found] == [flat, *same_level]
    assert "c64" in found[0][1] and "at most 32 at a time" in found[0][1]
    assert fit.inconsistent([base, grows]) == []
    router = [replace(base, topology="shuffle"), replace(flat, topology="shuffle")]
    assert fit.inconsistent(router) == []
    # Where the model itself has c64 no faster (a batch capped at 32 by the server's own flag), flat is physics.
    capped = [replace(c, serving=replace(c.serving, max_num_seqs=32)) for c in (base, flat)]
    assert fit.inconsistent(capped) == []
    cells, why = fit.without_refuted([base, flat, *same_level])
    assert [c.weight for c in cells] == [1.0, 0.0, 0.0, 0.0] and len(why) == 1
    published = {(c.model, c.topology, c.concurrency) for c, _ in fit.inconsistent(fit.published_cells(more=False))}
    assert published == {("gpt-oss-120b", "solo", 64), ("gpt-oss-120b", "cluster-ray", 64)}


@pytest.mark.parametrize("card", ["gpt-oss-120b", "gemma4-26b-a4b", "llama-3.1-8b", "qwen3-235b-a22b"])
def test_no_stack_decodes_above_the_bandwidth_roofline(card):
    from sparktop.model.cards import find_card
    from sparktop.model.perf import PerfModel

    k = fit.load_constants()
    assert k.stack_factors, "the shipped constants carry the stacks' fitted factors"
    for stack, _ in k.stack_factors:
        perf = PerfModel(find_card(card), k=k.for_stack(stack))
        assert perf.k.bandwidth_efficiency <= 1.0
        for batch in (1, 8, 64):
            assert perf.decode_tps(batch) < perf.roofline_decode_tps(batch), (stack, batch)


@pytest.fixture(scope="module")
def articles():
    cells = fit.published_cells(more=False)
    return fit.Report(fit.evaluate(fit.load_constants(), cells, 2))


def test_the_articles_headline_comes_out_the_right_way_round(articles):
    """gpt-oss-120b at c64: two solo engines behind the shuffle router beat TP=2 over Ray (567.9 vs 471.8 t/s
    in the article, its own stack)."""
    pred = {(c.topology, c.concurrency): p for c, p, _ in articles.rows
            if c.model == "gpt-oss-120b" and c.metric == "decode_tps"}
    assert pred[("shuffle", 64)] > pred[("cluster-ray", 64)]


def test_the_articles_prefill_and_ttft_are_within_their_targets(articles):
    assert articles.mape("prefill_tps") <= fit.TARGET["prefill_tps"]
    assert articles.mape("ttft_ms") <= fit.TARGET["ttft_ms"]


def test_the_articles_winners_are_the_model_s_in_nine_cells_of_ten(articles):
    same, total, misses = articles.winners()
    assert same >= 0.9 * total, misses


@pytest.mark.xfail(strict=True, reason="not met: decode 8.2 % against 8 %; gpt-oss-120b's routing, which no shared "
                                       "constant gives (README, Predictions)")
def test_the_articles_decode_is_within_its_target(articles):
    assert articles.mape("decode_tps") <= fit.TARGET["decode_tps"]
