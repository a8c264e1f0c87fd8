"""A study over layouts: which ones `--layouts` picks, and what it refuses."""

from __future__ import annotations

import pytest

from sparktop.errors import SparktopError
from sparktop.launch.catalog import find_recipe
from sparktop.study.planning import choose_topologies


def test_all_is_the_five_names_the_recipe_allows_whatever_the_node_count():
    recipe = find_recipe("llama-3.1-8b")
    five = ["solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy"]
    assert choose_topologies(recipe, "all", 2) == five
    assert choose_topologies(recipe, "all", 4) == five
    assert choose_topologies(find_recipe("qwen3-235b-a22b"), "all", 4) == ["cluster-ray", "cluster-mp"]


def test_a_list_of_layouts_is_named_as_everywhere_else():
    recipe = find_recipe("llama-3.1-8b")
    assert choose_topologies(recipe, "tp=4,2x tp=2,4x solo,shuffle", 4) == \
        ["tp=4", "2x tp=2,leastconn", "4x solo,shuffle"]
    assert choose_topologies(recipe, "tp=2,solo,cluster-mp", 2) == ["cluster-mp", "solo"]  # tp=2 is cluster-mp


@pytest.mark.parametrize(("recipe", "text", "nodes", "says"), [
    ("llama-3.1-8b", "tp=4", 2, "tp=4 needs 4 nodes; the inventory has 2"),
    ("llama-3.1-8b", "tp=4,ep", 4, "dense model"),
    ("nemotron-nano-9b-v2", "2x solo", 2, "runs on at most 1 node"),
    ("llama-3.1-8b", "mesh", 2, "unknown 'mesh'"),
])
def test_a_layout_that_cannot_run_is_refused_before_anything_starts(recipe, text, nodes, says):
    with pytest.raises(SparktopError, match=says):
        choose_topologies(find_recipe(recipe), text, nodes)


def test_across_runtimes_each_runs_the_layouts_it_can():
    """`--runtimes vllm,llama-cpp`: "all" gives llama.cpp its own two-node layout (it splits layers, pp=2, where
    vLLM splits tensors); a list gives each runtime the layouts of it that it can run, and a layout no runtime
    of the study can run is refused in a line."""
    from sparktop.launch.catalog import runtime_recipes
    from sparktop.study.planning import study_entries

    recipes = runtime_recipes(find_recipe("gpt-oss-120b"), "vllm,llama-cpp")
    every = [t.name for t in study_entries(recipes, "all", 2)]
    assert every == ["vLLM solo", "vLLM cluster-ray", "vLLM cluster-mp", "vLLM shuffle", "vLLM least-busy",
                     "llama.cpp solo", "llama.cpp pp=2", "llama.cpp shuffle", "llama.cpp least-busy"]
    mixed = study_entries(recipes, "solo,cluster-mp,pp=2", 2)
    assert [t.name for t in mixed] == ["vLLM solo", "vLLM cluster-mp", "vLLM pp=2", "llama.cpp solo",
                                       "llama.cpp pp=2"]
    with pytest.raises(SparktopError, match=r"^--topologies tp=4: no runtime of the study runs it \(gpt-oss-120b: "
                                             r"tp=4 needs 4 nodes"):
        study_entries(recipes, "solo,tp=4", 2)
