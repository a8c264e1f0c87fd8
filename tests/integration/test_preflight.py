"""Preflight against two simulated Sparks: each check passes, warns or fails
for the reason a user would hit on real nodes (image missing or different,
port taken, memory held by something else, fabric port down, weights not
downloaded, a launch of sparktop's already there)."""

from __future__ import annotations

import os
import shlex
import socket

import pytest

from sparktop.launch.catalog import find_recipe
from sparktop.launch.preflight import run_preflight
from sparktop.launch.topology import make_plan
from sparktop.settings import Defaults
from sparktop.twin.cluster import TwinCluster, loopback_aliases_work

IMAGE, ROUTER_IMAGE = Defaults().image, Defaults().router_image

pytestmark = pytest.mark.skipif(not loopback_aliases_work(), reason="needs 127.0.0.2 and 127.0.0.3")


@pytest.fixture
def cluster(tmp_path):
    return TwinCluster(tmp_path / "cluster", images=[IMAGE, ROUTER_IMAGE]).setup()


def put_weights(cluster, model: str, nodes=None) -> None:
    for node in cluster.nodes:
        if nodes is None or node.name in nodes:
            (node.home / ".cache/huggingface/hub" / ("models--" + model.replace("/", "--")) / "snapshots/x").mkdir(
                parents=True, exist_ok=True)


async def preflight(cluster, recipe_id: str, topology: str, port: int | None = None, **overrides):
    recipe = find_recipe(recipe_id)
    inventory = cluster.inventory()
    plan = make_plan(recipe, topology, inventory, overrides=overrides, port=port)
    transports = {n.name: n.transport() for n in cluster.nodes}
    return await run_preflight(plan, recipe, inventory, transports)


def check(result, name: str, node: str):
    found = [c for c in result.checks if c.name == name and c.node == node]
    assert len(found) == 1, result.render()
    return found[0]


async def test_a_ready_pair_of_sparks_passes_every_check(cluster):
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8")
    result = await preflight(cluster, "llama-3.1-8b", "cluster-mp")
    assert result.ok and all(c.status == "pass" for c in result.checks), result.render()
    names = {(c.name, c.node) for c in result.checks}
    for node in ("spark-a", "spark-b"):
        assert {(n, node) for n in ("reachable", "memory", "fit", "image", "weights", "ports", "fabric")} <= names
    assert "enp1s0f1np1 is up" in check(result, "fabric", "spark-b").message


async def test_an_image_missing_on_one_node_fails_and_says_how_to_get_it(cluster):
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8")
    host = cluster.node("spark-b").host
    config = host.config
    config["images"] = [ROUTER_IMAGE]
    (host.home / "config.json").write_text(__import__("json").dumps(config))
    result = await preflight(cluster, "llama-3.1-8b", "cluster-ray")
    assert not result.ok
    c = check(result, "image", "spark-b")
    assert c.status == "fail" and f"docker pull {IMAGE}" in c.message
    assert check(result, "image", "spark-a").status == "pass"


async def test_different_image_ids_fail_a_cluster_and_warn_a_router(cluster):
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8")
    host = cluster.node("spark-b").host
    config = host.config
    config["images"] = [{"name": IMAGE, "id": "sha256:" + "ab" * 32}, ROUTER_IMAGE]
    (host.home / "config.json").write_text(__import__("json").dumps(config))
    cluster_result = await preflight(cluster, "llama-3.1-8b", "cluster-mp")
    differs = check(cluster_result, "image", "all")
    assert differs.status == "fail" and "differs between nodes" in differs.message
    router_result = await preflight(cluster, "llama-3.1-8b", "shuffle")
    assert check(router_result, "image", "all").status == "warn" and router_result.ok


async def test_a_port_in_use_on_the_bind_address_fails(cluster):
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.3", 0))
        s.listen()
        port = s.getsockname()[1]
        result = await preflight(cluster, "llama-3.1-8b", "shuffle", port=port)
        ports_b = check(result, "ports", "spark-b")
        assert ports_b.status == "fail" and f"port {port} already in use on 127.0.0.3" in ports_b.message
        # The same port on the other node's address is free.
        assert check(result, "ports", "spark-a").status == "pass"


async def test_memory_held_by_another_process_fails_with_the_figures(cluster):
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8")
    # Something else on spark-a holds 90 GiB of the unified memory.
    cluster.node("spark-a").host.register(os.getpid(), "python3", 90 * 1024)
    result = await preflight(cluster, "gpt-oss-120b", "solo")
    memory = check(result, "memory", "spark-a")
    assert memory.status == "fail"
    assert "gpu_memory_utilization 0.7 x 119.6 GiB = 83.7 GiB, but only" in memory.message
    assert "lower gpu_memory_utilization or stop what holds memory" in memory.message


async def test_a_share_that_leaves_little_free_warns_before_a_gb10_freezes(cluster):
    put_weights(cluster, "openai/gpt-oss-120b")
    result = await preflight(cluster, "gpt-oss-120b", "solo", gpu_memory_utilization=0.88)
    memory = check(result, "memory", "spark-a")
    assert memory.status == "warn" and "a GB10 freezes when memory runs out" in memory.message
    assert result.ok


async def test_a_fabric_port_that_is_down_fails_cluster_topologies_only(cluster):
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8")
    cluster.node("spark-b").host.set_interface("enp1s0f1np1", "down")
    result = await preflight(cluster, "llama-3.1-8b", "cluster-ray")
    fabric = check(result, "fabric", "spark-b")
    assert fabric.status == "fail" and fabric.message == "enp1s0f1np1 is down: is the QSFP cable in?"
    solo = await preflight(cluster, "llama-3.1-8b", "shuffle")
    assert not [c for c in solo.checks if c.name == "fabric"] and solo.ok


async def test_the_pair_named_in_the_inventory_is_pinged_over_its_interface(cluster):
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8")
    result = await preflight(cluster, "llama-3.1-8b", "cluster-mp")
    worker = check(result, "fabric", "spark-b")
    assert worker.status == "pass"
    head = cluster.node("spark-a").address
    assert worker.message == f"enp1s0f1np1 is up, MTU 1500 (inventory); reaches spark-a {head}"
    # The worker cannot reach the head: the launch would hang at NCCL's first all-reduce.
    cluster.node("spark-b").host.cut_link(cluster.node("spark-a").address)
    result = await preflight(cluster, "llama-3.1-8b", "cluster-mp")
    worker = check(result, "fabric", "spark-b")
    assert not result.ok and worker.status == "fail"
    assert f"does not reach spark-a {cluster.node('spark-a').address} (1 packets transmitted, 0 received" \
           in worker.message and "over enp1s0f1np1" in worker.message
    # A link that fails one way only is found from the other end.
    cluster.node("spark-b").host.cut_link(cluster.node("spark-a").address, cut=False)
    cluster.node("spark-a").host.cut_link(cluster.node("spark-b").address)
    result = await preflight(cluster, "llama-3.1-8b", "cluster-mp")
    assert check(result, "fabric", "spark-a").status == "fail" and check(result, "fabric", "spark-b").status == "pass"


async def test_four_named_nodes_ping_every_pair_and_agree_on_one_mtu(tmp_path):
    cluster = TwinCluster(tmp_path / "four", names=("spark-a", "spark-b", "spark-c", "spark-d"),
                          images=[IMAGE, ROUTER_IMAGE]).setup()
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8")
    address = {n.name: n.address for n in cluster.nodes}
    result = await preflight(cluster, "llama-3.1-8b", "tp=4")
    assert result.ok and [c.status for c in result.checks if c.name == "fabric"] == ["pass"] * 4, result.render()
    assert check(result, "fabric", "spark-d").message.endswith(
        f"reaches spark-a {address['spark-a']}, spark-b {address['spark-b']}, spark-c {address['spark-c']}")
    # spark-c and spark-d reach the head but not each other (a switch port's VLAN, say).
    cluster.node("spark-d").host.cut_link(address["spark-c"])
    cluster.node("spark-c").host.set_interface("enp1s0f1np1", "up", mtu=9000)
    result = await preflight(cluster, "llama-3.1-8b", "tp=4")
    d = check(result, "fabric", "spark-d")
    assert d.status == "fail" and f"does not reach spark-c {address['spark-c']}" in d.message
    assert "every pair of nodes must reach each other" in d.message
    a = check(result, "fabric", "spark-a")
    assert a.status == "warn" and "the MTU differs between nodes (spark-a 1500, spark-b 1500, spark-c 9000, " \
                                  "spark-d 1500)" in a.message
    # Solo engines behind a router need no fabric: nothing is pinged.
    replicas = await preflight(cluster, "llama-3.1-8b", "4x solo,shuffle")
    assert not [c for c in replicas.checks if c.name == "fabric"]


async def test_weights_not_in_the_cache_warn_and_name_the_model(cluster):
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8", nodes={"spark-a"})
    result = await preflight(cluster, "llama-3.1-8b", "shuffle")
    weights = check(result, "weights", "spark-b")
    assert weights.status == "warn"
    assert "nvidia/Llama-3.1-8B-Instruct-FP8 is not in ~/.cache/huggingface" in weights.message
    assert "hf download nvidia/Llama-3.1-8B-Instruct-FP8" in weights.message
    assert check(result, "weights", "spark-a").status == "pass"


async def test_a_launch_already_running_warns_with_the_command_that_stops_it(cluster):
    put_weights(cluster, "nvidia/Llama-3.1-8B-Instruct-FP8")
    node = cluster.node("spark-a")
    # A long-lived container of an earlier launch (an idle shell stands in for its engine).
    argv = ["docker", "run", "-d", "--name", "other", "--label", "sparktop.launch=old-launch", "--entrypoint",
            "sleep", IMAGE, "60"]
    r = await node.transport().run(shlex.join(argv), timeout=30)
    assert r.ok, r.stderr
    try:
        result = await preflight(cluster, "llama-3.1-8b", "solo")
        running = check(result, "running", "spark-a")
        assert running.status == "warn" and "sparktop stop old-launch" in running.message
        assert result.ok
    finally:
        await node.transport().run("docker rm -f other", timeout=30)


async def test_an_unreachable_node_fails_reachable_and_nothing_else_is_tried(cluster):
    from sparktop.remote.ssh import SSHTransport
    from sparktop.settings import Node

    recipe = find_recipe("llama-3.1-8b")
    inventory = cluster.inventory()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    gone = Node("spark-b", "127.0.0.1", port=dead_port)
    inventory.nodes[1] = gone
    plan = make_plan(recipe, "shuffle", inventory)
    transports = {"spark-a": cluster.nodes[0].transport(),
                  "spark-b": SSHTransport("127.0.0.1", port=dead_port, name="spark-b")}
    result = await run_preflight(plan, recipe, inventory, transports)
    b = [c for c in result.checks if c.node == "spark-b"]
    assert [c.name for c in b] == ["reachable"] and b[0].status == "fail"
    assert "refused" in b[0].message


async def test_a_stopped_layouts_ports_are_waited_for_until_released_and_what_holds_one_is_named(cluster):
    """A study's next layout preflights the same ports: once a layout is stopped, the runner waits until its
    engines' ports are free (a last process closing its socket late), and past the bound names what holds one."""
    import asyncio

    from sparktop.launch.preflight import ports_in_use, ports_released

    inventory = cluster.inventory()
    transports = {n.name: n.transport() for n in cluster.nodes}
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.2", 0))
        s.listen()
        port = s.getsockname()[1]
        plan = make_plan(find_recipe("llama-3.1-8b"), "solo", inventory, port=port)
        spark_a = inventory.node("spark-a")
        # Held throughout: the wait ends at its bound and names the port.
        assert await ports_released(plan, inventory, transports, within=1.0) == [f"spark-a:{port}"]
        # Closed a moment after the wait began: the wait outlasts it and the port is free when it returns.
        asyncio.get_running_loop().call_later(1.0, s.close)
        assert await ports_released(plan, inventory, transports, within=60.0) == []
        assert await ports_in_use(spark_a, transports["spark-a"], [port]) == []
