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
from sparktop.settings import Inventory, Node

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "plans"


def inventory() -> Inventory:
    return Inventory(nodes=[
        Node("spark-a", "spark-a.lan", fabric_ip="192.168.100.10", eth_if="enp1s0f1np1",
             ib_if=["rocep1s0f1", "roceP2p1s0f1"]),
        Node("spark-b", "spark-b.lan", fabric_ip="192.168.100.11", eth_if="enp1s0f1np1",
             ib_if=["rocep1s0f1", "roceP2p1s0f1"]),
    ])


def cases():
    recipes, _ = discover()
    for rid in sorted(recipes):
        for topology in recipes[rid].allowed_topologies(2):
            yield rid, topology


@pytest.mark.parametrize("rid, topology", list(cases()))
def test_golden_plans(rid, topology, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    plan = make_plan(find_recipe(rid), topology, inventory(), lid=f"{rid}-{topology}-golden")
    text = plan.render()
    path = GOLDEN / f"{rid}__{topology}.txt"
    if os.environ.get("SPARKTOP_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}: run with SPARKTOP_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def test_every_shipped_recipe_and_topology_has_a_golden_file():
    expected = {f"{rid}__{topology}.txt" for rid, topology in cases()}
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
