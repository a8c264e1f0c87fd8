"""Which nodes an engine over several nodes runs on, when sparktop did not
launch it: read from the worker nodes' own command lines (a headless vLLM's
--master-addr, a Ray worker's --address), so two engines on one cluster
each get their own nodes."""

from __future__ import annotations

import time

from sparktop.observe.snapshot import Container, EngineSnapshot, GpuProcess, NodeSnapshot, ServerProcess
from sparktop.observe.state import ClusterState

ADDRESS = {"spark-a": "10.0.0.1", "spark-b": "10.0.0.2", "spark-c": "10.0.0.3", "spark-d": "10.0.0.4"}


def node(name: str, commands: list[str] = (), servers: list[list[str]] = (), gpu: bool = True) -> NodeSnapshot:
    return NodeSnapshot(name=name, t=time.time(), state="ok", docker_status="ok",
                        processes=[GpuProcess(100, "VLLM::Worker_TP0", 60_000)] if gpu else [],
                        containers=[Container(f"c{i}", "vllm/vllm-openai", "running", "Up 1 minute", command=cmd)
                                    for i, cmd in enumerate(commands)],
                        servers=[ServerProcess(200 + i, argv) for i, argv in enumerate(servers)])


def engine(head: str, topology: str = "cluster-mp") -> EngineSnapshot:
    url = f"http://{ADDRESS[head]}:8000"
    return EngineSnapshot(key=url, url=url, t=time.time(), state="ready", node=head, topology=topology,
                          model="llama-3.1-70b", container="c0")


def state_of(*nodes: NodeSnapshot) -> ClusterState:
    state = ClusterState()
    for n in nodes:
        state.nodes[n.name] = n
    return state


def mp(rank: int, master: str, head: bool) -> str:
    return (f"vllm serve meta/llama --tensor-parallel-size 2 --nnodes 2 --node-rank {rank} "
            f"--master-addr {master} --master-port 29501" + ("" if head else " --headless"))


def test_two_tp2_engines_on_four_nodes_each_get_their_own_worker():
    state = state_of(node("spark-a", [mp(0, "192.168.100.1", True)]),
                     node("spark-b", [mp(1, "192.168.100.1", False)]),
                     node("spark-c", [mp(0, "192.168.100.3", True)]),
                     node("spark-d", [mp(1, "192.168.100.3", False)]))
    # The workers name the head's fabric address, not the one its API answers on.
    assert state.engine_nodes(engine("spark-a")) == ["spark-a", "spark-b"]
    assert state.engine_nodes(engine("spark-c")) == ["spark-c", "spark-d"]


def test_ray_workers_join_their_own_head():
    head = ("sh -c 'ray start --head --port 6379 --node-ip-address 192.168.100.1 && "
            "vllm serve meta/llama --tensor-parallel-size 3 --distributed-executor-backend ray'")
    state = state_of(node("spark-a", [head]),
                     node("spark-b", ["ray start --address 192.168.100.1:6379 --block"]),
                     node("spark-c", ["ray start --address=192.168.100.1:6379 --block"]),
                     node("spark-d", ["ray start --address 192.168.100.9:6379 --block"]))  # another cluster's
    assert state.engine_nodes(engine("spark-a", "tp=3,ray")) == ["spark-a", "spark-b", "spark-c"]


def test_a_head_started_outside_docker_is_known_by_its_master_address():
    # vLLM's own API server as a plain process (read from /proc); its worker in a container.
    head = ["vllm", "serve", "meta/llama", "--nnodes", "2", "--master-addr", "192.168.100.1"]
    state = state_of(node("spark-a", servers=[head]), node("spark-b", [mp(1, "192.168.100.1", False)]),
                     node("spark-c"))  # spark-c: GPU work of its own
    assert state.engine_nodes(engine("spark-a")) == ["spark-a", "spark-b"]


def test_a_head_known_by_a_name_keeps_its_workers_but_not_another_engines():
    # The head's URL names it (spark-a.local) and its own command gives no address: its Ray workers'
    # --address cannot be matched, so busy nodes count, except one whose worker serves another head.
    state = state_of(node("spark-a", ["ray start --head --port 6379"]),
                     node("spark-b", ["ray start --address 192.168.100.1:6379 --block"]),
                     node("spark-c", [mp(0, "192.168.100.3", True)]),
                     node("spark-d", [mp(1, "192.168.100.3", False)]))
    named = EngineSnapshot(key="http://spark-a.local:8000", url="http://spark-a.local:8000", t=time.time(),
                           state="ready", node="spark-a", topology="tp=2,ray", model="llama-3.1-70b",
                           container="c0")
    state.engines = {named.key: named, "c": engine("spark-c")}
    assert state.engine_nodes(named) == ["spark-a", "spark-b"]


def test_without_readable_commands_every_busy_node_but_another_head_counts():
    state = state_of(node("spark-a"), node("spark-b"), node("spark-c", gpu=False),
                     node("spark-d", servers=[["vllm", "serve", "other/model", "--port", "8001"]]))
    assert state.engine_nodes(engine("spark-a")) == ["spark-a", "spark-b"]


def launched(name: str, role: str, kind: str | None = None) -> Container:
    labels = {"sparktop.launch": "L1", "sparktop.role": role}
    if kind:
        labels["sparktop.kind"] = kind
    return Container(name, "lmsysorg/sglang:spark", "running", "Up 1 minute", labels=labels)


def test_replicas_of_any_runtime_launched_by_sparktop_each_get_their_own_nodes():
    """`2x pp=2` of llama.cpp (and `2x tp=2` of SGLang): each head's containers are told apart from the other
    replica's by the head's name, whatever the runtime calls its head and workers."""
    for head, worker in (("llama", "rpc1"), ("sglang", "worker1")):
        state = state_of()
        state.nodes = {
            "spark-a": NodeSnapshot("spark-a", time.time(), "ok", containers=[launched("h1", f"{head}-spark-a")]),
            "spark-b": NodeSnapshot("spark-b", time.time(), "ok", containers=[launched("w1", f"{worker}-spark-a")]),
            "spark-c": NodeSnapshot("spark-c", time.time(), "ok", containers=[launched("h2", f"{head}-spark-c")]),
            "spark-d": NodeSnapshot("spark-d", time.time(), "ok", containers=[launched("w2", f"{worker}-spark-c")]),
        }
        a = EngineSnapshot(key="a", url="a", t=time.time(), state="ready", node="spark-a", topology="2x pp=2",
                           container="h1")
        c = EngineSnapshot(key="c", url="c", t=time.time(), state="ready", node="spark-c", topology="2x pp=2",
                           container="h2")
        assert state.engine_nodes(a) == ["spark-a", "spark-b"], head
        assert state.engine_nodes(c) == ["spark-c", "spark-d"], head
