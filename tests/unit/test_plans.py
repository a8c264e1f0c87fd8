"""Launch plans: golden files pin the exact commands for every shipped
recipe in every topology it allows, and the structure a Spark needs is
checked directly. Regenerate the goldens after an intended change with
SPARKTOP_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparktop.launch.catalog import discover, find_recipe
from sparktop.launch.plan import Home, render
from sparktop.launch.topology import PlanError, make_plan
from sparktop.layouts import parse_layout
from sparktop.settings import Inventory, Node

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "plans"


def inventory(nodes: int = 2) -> Inventory:
    return Inventory(nodes=[
        Node(f"spark-{c}", f"spark-{c}.lan", fabric_ip=f"192.168.100.{10 + i}", eth_if="enp1s0f1np1",
             ib_if=["rocep1s0f1", "roceP2p1s0f1"])
        for i, c in enumerate("abcdefgh"[:nodes])
    ])


# The layouts four Sparks on a switch add to the five two-node ones.
FOUR_NODE_LAYOUTS = ("tp=4", "tp=4,ray", "tp=2,pp=2", "2x tp=2", "2x tp=2,ray", "4x solo,shuffle", "tp=4,ep")


def cases():
    recipes, _ = discover()
    for rid in sorted(recipes):
        for topology in recipes[rid].allowed_topologies(2):
            yield rid, topology
        for layout in FOUR_NODE_LAYOUTS:
            if recipes[rid].why_not_layout(parse_layout(layout), 4) is None:
                yield rid, layout


def golden_name(rid: str, topology: str) -> str:
    return f"{rid}__{topology.replace(' ', '_').replace(',', '+').replace('=', '')}.txt"


@pytest.mark.parametrize("rid, topology", list(cases()))
def test_golden_plans(rid, topology, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    nodes = parse_layout(topology).nodes
    lid = f"{rid}-{parse_layout(topology).slug}-golden"
    plan = make_plan(find_recipe(rid), topology, inventory(max(2, nodes)), lid=lid)
    text = plan.render()
    path = GOLDEN / golden_name(rid, topology)
    if os.environ.get("SPARKTOP_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}: run with SPARKTOP_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def test_every_shipped_recipe_and_topology_has_a_golden_file():
    expected = {golden_name(rid, topology) for rid, topology in cases()}
    assert expected == {p.name for p in GOLDEN.glob("*.txt")}


def argv_of(step) -> list[str]:
    return [str(a) for a in step.argv]


def test_cluster_mp_starts_workers_before_the_head_with_the_network_env():
    plan = make_plan(find_recipe("gpt-oss-120b"), "cluster-mp", inventory(), lid="t")
    roles = [(s.role, s.node) for s in plan.steps]
    assert roles == [("worker", "spark-b"), ("engine", "spark-a")]
    worker, head = (argv_of(s) for s in plan.steps)
    for flag in ("--nnodes", "--master-addr", "--master-port"):
        assert flag in worker and flag in head
    assert "--headless" in worker and "--headless" not in head
    assert worker[worker.index("--node-rank") + 1] == "1" and head[head.index("--node-rank") + 1] == "0"
    assert head[head.index("--master-addr") + 1] == "192.168.100.10"
    for env in ("VLLM_HOST_IP=192.168.100.11", "NCCL_SOCKET_IFNAME=enp1s0f1np1", "GLOO_SOCKET_IFNAME=enp1s0f1np1",
                "TP_SOCKET_IFNAME=enp1s0f1np1", "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1"):
        assert env in worker
    assert "VLLM_HOST_IP=192.168.100.10" in head
    for flag in ("--gpus", "--ipc=host", "--network"):
        assert flag in head
    assert plan.endpoints[0].url == "http://192.168.100.10:8000"


def test_cluster_ray_starts_the_head_before_the_workers_and_serves_on_the_head():
    plan = make_plan(find_recipe("qwen3-235b-a22b"), "cluster-ray", inventory(), lid="t")
    assert [s.role for s in plan.steps] == ["ray-head", "ray-worker", "wait"]
    head_script = argv_of(plan.steps[0])[-1]
    assert head_script.index("ray start --head") < head_script.index("exec vllm serve")
    assert "--distributed-executor-backend ray" in head_script and "--tensor-parallel-size 2" in head_script
    worker = argv_of(plan.steps[1])
    assert worker[worker.index("--address") + 1] == "192.168.100.10:6379" and "--block" in worker
    assert plan.steps[1].wait.kind == "ray-nodes" and plan.steps[1].wait.count == 2


def test_router_topologies_run_solo_on_each_node_and_litellm_on_the_head():
    for topology, strategy in (("shuffle", "simple-shuffle"), ("least-busy", "least-busy")):
        plan = make_plan(find_recipe("gemma4-26b-a4b"), topology, inventory(), lid="t")
        engines = [s for s in plan.steps if s.role == "engine"]
        assert [s.node for s in engines] == ["spark-a", "spark-b"]
        config = next(s for s in plan.steps if s.stdin_text).stdin_text
        assert f"routing_strategy: {strategy}" in config and config.count("api_base:") == 2
        assert "http://192.168.100.11:8000/v1" in config
        assert "master_key: os.environ/LITELLM_MASTER_KEY" in config
        router = next(s for s in plan.steps if s.role == "router")
        assert "LITELLM_LOCAL_MODEL_COST_MAP=True" in argv_of(router)
        assert "LITELLM_MASTER_KEY" in plan.secrets
        assert "LITELLM_MASTER_KEY=<generated at launch>" in plan.render()
        assert [e.kind for e in plan.endpoints] == ["vllm", "vllm", "router"]


def test_secrets_are_passed_by_name_never_by_value(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_SuperSecretValue")
    plan = make_plan(find_recipe("gpt-oss-120b"), "shuffle", inventory(), lid="t")
    text = plan.render()
    assert "hf_SuperSecretValue" not in text
    assert "HF_TOKEN" in plan.secrets and "--env-file" in text
    assert all("hf_SuperSecretValue" not in step.command for step in plan.steps)


def test_topologies_a_recipe_forbids_are_refused():
    with pytest.raises(PlanError, match="cluster only"):
        make_plan(find_recipe("qwen3-235b-a22b"), "solo", inventory())
    with pytest.raises(PlanError, match="solo only"):
        make_plan(find_recipe("nemotron-nano-9b-v2"), "cluster-mp", inventory())
    one = Inventory(nodes=[inventory().nodes[0]])
    with pytest.raises(PlanError, match="needs two nodes"):
        make_plan(find_recipe("llama-3.1-8b"), "shuffle", one)


def test_overrides_and_port_reach_the_command():
    plan = make_plan(find_recipe("llama-3.1-8b"), "solo", inventory(), overrides={"max_num_seqs": 8}, port=9001,
                     lid="t")
    argv = argv_of(plan.steps[0])
    assert argv[argv.index("--max-num-seqs") + 1] == "8" and argv[argv.index("--port") + 1] == "9001"
    assert plan.endpoints[0].url.endswith(":9001")


def test_home_paths_expand_on_the_node_and_nothing_else_does():
    assert render(["ls", Home("~/a b/$(x)")]) == "ls \"$HOME\"/'a b/$(x)'"
    assert render(["echo", "$HOME"]) == "echo '$HOME'"


def test_tp4_without_ray_starts_three_ranked_workers_then_the_head():
    plan = make_plan(find_recipe("llama-3.1-8b"), "tp=4", inventory(4), lid="t")
    assert plan.topology == "tp=4" and plan.nodes == ["spark-a", "spark-b", "spark-c", "spark-d"]
    engines = [s for s in plan.steps if s.argv and s.role in ("worker", "engine")]
    assert [(s.role, s.node) for s in engines] == [("worker", "spark-b"), ("worker", "spark-c"),
                                                    ("worker", "spark-d"), ("engine", "spark-a")]
    for rank, step in enumerate([*engines[3:], *engines[:3]]):
        argv = argv_of(step)
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--nnodes") + 1] == "4" and argv[argv.index("--tensor-parallel-size") + 1] == "4"
        assert argv[argv.index("--master-addr") + 1] == "192.168.100.10"  # every rank meets at the head
    assert [e.url for e in plan.endpoints] == ["http://192.168.100.10:8000"]
    assert engines[-1].wait.kind == "http"


def test_tp4_over_ray_waits_for_four_members_before_serving():
    plan = make_plan(find_recipe("llama-3.1-8b"), "tp=4,ray", inventory(4), lid="t")
    head, *joins, serve = [s for s in plan.steps if s.role in ("ray-head", "ray-worker", "wait")]
    script = argv_of(head)[-1]
    assert "-ge 4 ]" in script and "--tensor-parallel-size 4" in script and "--distributed-executor-backend ray" \
        in script
    assert [(s.node, s.wait.count) for s in joins] == [("spark-b", 2), ("spark-c", 3), ("spark-d", 4)]
    assert serve.wait.kind == "http" and serve.wait.url == "http://192.168.100.10:8000"


def test_pipeline_and_expert_parallel_reach_vllm_once():
    plan = make_plan(find_recipe("llama-3.1-8b"), "tp=2,pp=2", inventory(4), lid="t")
    head = next(s for s in plan.steps if s.role == "engine")
    argv = argv_of(head)
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--nnodes") + 1] == "4"
    # The recipe asks for expert parallel already: the layout's ep does not repeat it.
    qwen = make_plan(find_recipe("qwen3-235b-a22b"), "tp=4,ep", inventory(4), lid="t")
    for step in qwen.steps:
        if step.argv and step.role in ("worker", "engine"):
            assert argv_of(step).count("--enable-expert-parallel") == 1
    with pytest.raises(PlanError, match="dense model"):
        make_plan(find_recipe("llama-3.1-8b"), "tp=4,ep", inventory(4))


def test_two_engines_of_two_nodes_behind_the_router():
    plan = make_plan(find_recipe("gpt-oss-120b"), "2x tp=2", inventory(4), lid="t")
    assert plan.topology == "2x tp=2,leastconn"  # HAProxy, unless the layout names a LiteLLM strategy
    engines = [e for e in plan.endpoints if e.kind == "vllm"]
    assert [(e.node, e.url) for e in engines] == [("spark-a", "http://192.168.100.10:8000"),
                                                  ("spark-c", "http://192.168.100.12:8000")]
    names = [n for names in plan.containers.values() for n in names]
    assert len(names) == len(set(names)) == 5  # two heads, two workers, the router
    assert plan.containers["spark-b"] == ["sparktop-t-worker1-spark-a"]
    assert plan.containers["spark-d"] == ["sparktop-t-worker1-spark-c"]
    config = next(s for s in plan.steps if "HAProxy config" in s.title).stdin_text
    assert '"192.168.100.10:8000"' in config and '"192.168.100.12:8000"' in config and "leastconn" in config
    # The second engine's workers meet at their own head, not the first's.
    worker = next(s for s in plan.steps if s.node == "spark-d")
    assert argv_of(worker)[argv_of(worker).index("--master-addr") + 1] == "192.168.100.12"


def test_layout_names_stay_the_same_in_plan_launch_id_and_labels():
    from sparktop.launch.topology import launch_id

    recipe = find_recipe("llama-3.1-8b")
    lid = launch_id(recipe, "2x tp=2", ["spark-a", "spark-b", "spark-c", "spark-d"], 8000)
    assert lid.startswith("llama-3.1-8b-2x-tp2-leastconn-")  # a container name may hold no = or ,
    plan = make_plan(recipe, "cluster-mp", inventory(4), lid="t")
    assert plan.topology == "cluster-mp" and plan.nodes == ["spark-a", "spark-b"]  # the alias takes two nodes
    assert "sparktop.topology=cluster-mp" in plan.steps[-1].command or any(
        "sparktop.topology=cluster-mp" in s.command for s in plan.steps)


def test_a_layout_that_does_not_fit_the_inventory_or_the_recipe_is_refused():
    with pytest.raises(PlanError, match="tp=4 needs 4 nodes; the inventory has 2"):
        make_plan(find_recipe("llama-3.1-8b"), "tp=4", inventory(2))
    with pytest.raises(PlanError, match="runs on at most 1 node"):
        make_plan(find_recipe("nemotron-nano-9b-v2"), "4x solo", inventory(4))
    with pytest.raises(PlanError, match="cluster only"):
        make_plan(find_recipe("qwen3-235b-a22b"), "4x solo", inventory(4))
    with pytest.raises(PlanError, match="pp= takes a whole number"):
        make_plan(find_recipe("llama-3.1-8b"), "pp=two", inventory(4))
