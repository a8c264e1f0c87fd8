"""The twin a plan starts serves what `sparktop predict` predicts for that recipe: the same card (the
recipe's `quantization:`, which is no engine flag, reaches it through the container's labels), the same
stack (its label, else its image) and the same constants, for every shipped recipe in every layout it
allows."""

from __future__ import annotations

import pytest

from sparktop.launch.catalog import discover, find_recipe
from sparktop.launch.prediction import subject_for_plan
from sparktop.launch.topology import make_plan
from sparktop.layouts import parse_layout
from sparktop.model.cards import find_card
from sparktop.model.forecast import labelled_card, resolve
from sparktop.twin.dialects import dialect_for
from sparktop.twin.startup import twin_basis
from tests.helpers.plan_engines import plan_engines
from tests.unit.test_plans import cases, inventory


def without_file_options(argv: list[str]) -> list[str]:
    """TensorRT-LLM's options file is written on the node at launch: its settings are not what is compared."""
    if "--extra_llm_api_options" not in argv:
        return argv
    at = argv.index("--extra_llm_api_options")
    return argv[:at] + argv[at + 2:]


@pytest.mark.parametrize("rid, topology", list(cases()))
def test_the_twin_of_a_plan_resolves_what_predict_resolves(rid, topology):
    recipe = find_recipe(rid)
    inv = inventory(max(2, parse_layout(topology).nodes))
    plan = make_plan(recipe, topology, inv, lid="t")
    predicted = resolve(subject_for_plan(plan, recipe, inv), plan.topology)
    engines = plan_engines(plan)
    assert engines, plan.render()
    for engine in engines:
        dialect = dialect_for(engine.kind)
        args = dialect.parse(without_file_options(engine.argv))
        card = labelled_card(find_card(args.model), engine.labels)
        served = twin_basis(card, dialect.id, engine.labels, engine.image)
        assert (served.card.name, served.card.quant) == (predicted.card.name, predicted.card.quant)
        assert served.stack == predicted.stack
        assert served.cannot == predicted.cannot
        assert repr(served.constants) == repr(predicted.constants)
        if engine.kind == "vllm":
            serving = subject_for_plan(plan, recipe, inv).serving_for(plan.topology)
            assert (args.max_num_seqs, args.gpu_memory_utilization, args.max_model_len) == (
                serving.max_num_seqs, serving.gpu_memory_utilization, serving.max_model_len)


def test_every_shipped_recipe_is_covered():
    recipes, _ = discover()
    assert {rid for rid, _ in cases()} == set(recipes)
