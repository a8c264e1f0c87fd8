"""Parallel layouts (sparktop/layouts.py): how they are written, what
they need and what they pass vLLM; the five two-node names are aliases of
their layouts and stay the names runs and reports use."""

from __future__ import annotations

import pytest

from sparktop.layouts import ALIASES, MAX_NODES, Layout, LayoutError, layouts_for, parse_layout, split_layouts


@pytest.mark.parametrize(("text", "canonical", "nodes", "flags"), [
    ("solo", "solo", 1, {}),
    ("tp=4", "tp=4", 4, {"tensor-parallel-size": 4, "distributed-executor-backend": "mp"}),
    ("TP=4, Ray", "tp=4,ray", 4, {"tensor-parallel-size": 4, "distributed-executor-backend": "ray"}),
    ("pp=2", "pp=2", 2, {"pipeline-parallel-size": 2, "distributed-executor-backend": "mp"}),
    ("tp=2,pp=2", "tp=2,pp=2", 4, {"tensor-parallel-size": 2, "pipeline-parallel-size": 2,
                                   "distributed-executor-backend": "mp"}),
    ("tp=2,ep", "tp=2,ep", 2, {"tensor-parallel-size": 2, "enable-expert-parallel": True,
                               "distributed-executor-backend": "mp"}),
    ("2x tp=2", "2x tp=2,leastconn", 4, {"tensor-parallel-size": 2, "distributed-executor-backend": "mp"}),
    ("2xtp=2,ray", "2x tp=2,ray,leastconn", 4, {"tensor-parallel-size": 2, "distributed-executor-backend": "ray"}),
    ("4x solo,shuffle", "4x solo,shuffle", 4, {}),
    ("4x shuffle", "4x solo,shuffle", 4, {}),
    ("8x solo", "8x solo,leastconn", 8, {}),
    ("2x solo,least-busy", "2x solo,least-busy", 2, {}),  # LiteLLM where the layout names it
])
def test_a_layout_reads_as_written_and_says_what_it_needs(text, canonical, nodes, flags):
    layout = parse_layout(text)
    assert layout.text == canonical
    assert layout.nodes == nodes
    assert layout.vllm_flags() == flags
    assert parse_layout(layout.text) == layout  # the canonical spelling reads back the same


def test_the_five_two_node_names_are_aliases_and_stay_the_names():
    expected = {"solo": Layout(), "cluster-ray": Layout(tp=2, backend="ray"), "cluster-mp": Layout(tp=2),
                "shuffle": Layout(replicas=2, router="shuffle"), "least-busy": Layout(replicas=2, router="least-busy")}
    for alias, layout in expected.items():
        assert parse_layout(alias) == layout
        assert layout.name == alias  # runs, reports and the app keep calling it this
        assert parse_layout(ALIASES[alias]).name == alias  # however it was written
        assert layout.nodes <= 2
    assert parse_layout("tp=4").name == "tp=4"


def test_engines_take_the_nodes_in_order_head_first():
    assert parse_layout("2x tp=2").engines(["a", "b", "c", "d"]) == [["a", "b"], ["c", "d"]]
    assert parse_layout("tp=2,pp=2").engines(["a", "b", "c", "d"]) == [["a", "b", "c", "d"]]
    assert parse_layout("4x solo").engines(["a", "b", "c", "d"]) == [["a"], ["b"], ["c"], ["d"]]
    with pytest.raises(LayoutError, match=r"tp=4 runs on 4 nodes; 3 given \(a, b, c\)"):
        parse_layout("tp=4").engines(["a", "b", "c"])
    with pytest.raises(LayoutError, match="node b given twice"):
        parse_layout("tp=2").engines(["b", "b"])


def test_weights_are_split_over_an_engines_ranks():
    assert parse_layout("tp=2,pp=2").weights_per_node_gib(240.0) == 60.0
    assert parse_layout("2x tp=2").weights_per_node_gib(240.0) == 120.0  # each replica holds a whole copy


@pytest.mark.parametrize(("text", "says"), [
    ("", "empty"),
    ("tp=3x", "tp= takes a whole number of nodes, not '3x'"),
    ("tp=0", "tp= takes a whole number of nodes"),
    ("solo,tp=2", "solo is one node"),
    ("tp=2,shuffle", "shuffle routes between replicas; write e.g. 2x tp=2,shuffle"),
    ("solo,ray", "ray joins the nodes of one engine"),
    ("dp=2", "unknown 'dp'"),
    ("tp=2,fast", "unknown 'fast'"),
    ("tp=16", f"needs 16 nodes; sparktop runs layouts of up to {MAX_NODES}"),
    ("ep", "add tp=N"),
    ("pp=2,ep", "add tp=N"),
    ("0x solo", "at least one replica"),
])
def test_a_bad_layout_is_one_line_that_says_what_was_expected(text, says):
    with pytest.raises(LayoutError) as err:
        parse_layout(text)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert repr(text) in str(err.value)


def test_every_layout_a_four_node_inventory_allows():
    found = {layout.text for layout in layouts_for(4)}
    for text in ("solo", "tp=2", "tp=2,ray", "tp=4", "tp=4,ray", "pp=2", "pp=4", "tp=2,pp=2", "2x tp=2,leastconn",
                 "4x solo,leastconn", "3x solo,leastconn"):
        assert text in found
    assert all(layout.nodes <= 4 for layout in layouts_for(4))
    assert not any(layout.ep for layout in layouts_for(4))  # ep only for MoE models
    assert {layout.text for layout in layouts_for(4, moe=True)} >= {"tp=2,ep", "tp=4,ep,ray"}
    # A model that fits no fewer than two nodes: no solo engines; a recipe of at most two nodes.
    assert all(layout.nodes_per_engine >= 2 for layout in layouts_for(8, min_nodes_per_engine=2))
    assert {layout.nodes for layout in layouts_for(8, max_nodes=2)} == {1, 2}
    assert max(layout.nodes for layout in layouts_for(8)) == 8


@pytest.mark.parametrize(("text", "expected"), [
    ("solo,cluster-mp,shuffle", ["solo", "cluster-mp", "shuffle"]),
    ("tp=2,pp=2", ["tp=2,pp=2"]),
    ("tp=4,2x tp=2,ray", ["tp=4", "2x tp=2,ray"]),
    ("4x solo,shuffle", ["4x solo,shuffle"]),
    ("solo,shuffle", ["solo", "shuffle"]),
    ("tp=4,ray,tp=2,ep", ["tp=4,ray", "tp=2,ep"]),
    ("2x solo,least-busy,4x solo,shuffle", ["2x solo,least-busy", "4x solo,shuffle"]),
    ("2x solo,leastconn,tp=2", ["2x solo,leastconn", "tp=2"]),
    ("tp=2,pp=2;pp=4", ["tp=2,pp=2", "pp=4"]),
])
def test_a_list_of_layouts_splits_where_a_person_would(text, expected):
    assert split_layouts(text) == expected


def test_layouts_for_both_routers():
    names = {layout.name for layout in layouts_for(4, routers=("shuffle", "least-busy"))}
    assert {"4x solo,shuffle", "4x solo,least-busy", "2x tp=2,shuffle", "2x tp=2,ray,least-busy", "tp=2,pp=2",
            "pp=4,ray", "solo", "cluster-mp", "shuffle", "least-busy"} <= names
