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
        ["tp=4", "2x tp=2,least-busy", "4x solo,shuffle"]
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
