"""Fabric detection through preflight, as it runs on nodes: each simulated
Spark gets `ibdev2netdev`, `ip` and `ping` stand-ins that print real outputs
of cabled DGX Sparks (tests/fixtures/SOURCES.md), and preflight finds each
node's ConnectX-7 port, its address, RoCE devices and MTU, pings the head
from the worker over it, and hands the plan what it found."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from sparktop.launch.catalog import find_recipe
from sparktop.launch.preflight import run_preflight
from sparktop.launch.session import Launcher, LaunchRequest
from sparktop.launch.topology import make_plan
from sparktop.remote import LocalTransport
from sparktop.settings import Defaults, Inventory, Node
from sparktop.twin.cluster import TwinCluster, loopback_aliases_work

FIX = Path(__file__).resolve().parents[1] / "fixtures"
IBDEV = {"spark-a": FIX / "captures/ibdev2netdev_dgx-spark_rocep1-first_eugr-spark-vllm-docker.txt",
         "spark-b": FIX / "captures/ibdev2netdev_dgx-spark_roceP2p-first_nvidia-playbooks-connect-two-sparks.txt"}
ADDR = {"spark-a": FIX / "fabric/ip-br-addr_dgx-spark-starsky_code-monkeys.txt",
        "spark-b": FIX / "fabric/ip-br-addr_dgx-spark-hutch_code-monkeys.txt"}
PING = {"reply": (FIX / "fabric/ping_iputils-20221126_reply.txt", 0),
        "no-reply": (FIX / "fabric/ping_iputils-20221126_no-reply.txt", 1),
        "no-device": (FIX / "fabric/ping_iputils-20221126_no-such-device.txt", 2)}
HEAD_IP, WORKER_IP = "169.254.44.136", "169.254.127.30"


def standins(bin_dir: Path, name: str, reachable: dict[tuple[str, str], str] | None = None) -> Path:
    """`ibdev2netdev`, `ip` and `ping` for node `name`. `ping -I IFACE ADDR`
    answers with the real reply capture for the pairs in `reachable`, the
    real no-reply capture otherwise (no such device for an unknown IFACE)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {
        "ibdev2netdev": f"cat {shlex.quote(str(IBDEV[name]))}\n",
        "ip": f'[ "$*" = "-br addr" ] && exec cat {shlex.quote(str(ADDR[name]))}\necho "ip: $*" >&2; exit 1\n',
    }
    for tool, body in scripts.items():
        (bin_dir / tool).write_text("#!/bin/sh\n" + body)
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "ping").write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"reachable = {dict(reachable or {})!r}\n"
        f"captures = {({k: (str(p), c) for k, (p, c) in PING.items()})!r}\n"
        "args = sys.argv[1:]\n"
        "iface, addr = args[args.index('-I') + 1], args[-1]\n"
        "kind = reachable.get(f'{iface} {addr}') or ('no-reply' if iface.startswith('en') else 'no-device')\n"
        "path, code = captures[kind]\n"
        "sys.stdout.write(open(path).read())\n"
        "sys.exit(code)\n")
    (bin_dir / "ping").chmod(0o755)
    return bin_dir


def sys_root(root: Path, mtu: int = 1500) -> Path:
    """/sys/class/net as the Spark shows it: operstate and MTU per interface."""
    states = {"lo": "unknown", "enP7s7": "up", "enp1s0f0np0": "down", "enp1s0f1np1": "up", "enP2p1s0f0np0": "down",
              "enP2p1s0f1np1": "up"}
    for name, state in states.items():
        d = root / "class/net" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "operstate").write_text(state + "\n")
        (d / "mtu").write_text(f"{65536 if name == 'lo' else mtu}\n")
    return root


def local_node(tmp: Path, name: str, reachable=None, mtu: int = 1500, **node) -> Node:
    bin_dir = standins(tmp / name / "bin", name, reachable)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "SPARKTOP_SYS_ROOT": str(sys_root(tmp / name / "sys", mtu))}
    return Node(name, "localhost", env=env, **node)


async def fabric_preflight(inventory: Inventory, topology: str = "cluster-mp"):
    recipe = find_recipe("llama-3.1-8b")
    plan = make_plan(recipe, topology, inventory)
    transports = {n.name: LocalTransport(n.name, env=n.env) for n in inventory.nodes}
    return plan, await run_preflight(plan, recipe, inventory, transports)


def fabric_check(result, node: str):
    found = [c for c in result.checks if c.name == "fabric" and c.node == node]
    assert len(found) == 1, result.render()
    return found[0]


# -- on plain local shells -----------------------------------------------------------


async def test_two_cabled_sparks_are_found_and_pinged_over_the_fabric(tmp_path):
    inventory = Inventory(nodes=[local_node(tmp_path, "spark-a"),
                                 local_node(tmp_path, "spark-b", {f"enp1s0f1np1 {HEAD_IP}": "reply"})])
    _, result = await fabric_preflight(inventory)
    head, worker = fabric_check(result, "spark-a"), fabric_check(result, "spark-b")
    assert head.status == "pass" and head.message == (
        "enp1s0f1np1 169.254.44.136/16, RoCE rocep1s0f1,roceP2p1s0f1, MTU 1500 (detected: ibdev2netdev, ip -br addr)")
    assert worker.status == "pass" and worker.message == (
        "enp1s0f1np1 169.254.127.30 ↔ spark-a 169.254.44.136, ping ok (0.194 ms), MTU 1500, RoCE "
        "rocep1s0f1,roceP2p1s0f1 (detected: ibdev2netdev, ip -br addr)")
    assert {n: (f.eth_if, f.ip, f.ib_if, f.mtu) for n, f in result.fabric.items()} == {
        "spark-a": ("enp1s0f1np1", HEAD_IP, ("rocep1s0f1", "roceP2p1s0f1"), 1500),
        "spark-b": ("enp1s0f1np1", WORKER_IP, ("rocep1s0f1", "roceP2p1s0f1"), 1500)}
    # The fabric check sits with the node's other checks, before what already runs there.
    names = [c.name for c in result.checks if c.node == "spark-a"]
    assert names.index("fabric") == names.index("ports") + 1


async def test_nodes_that_do_not_reach_each_other_fail_clearly(tmp_path):
    inventory = Inventory(nodes=[local_node(tmp_path, "spark-a"), local_node(tmp_path, "spark-b")])
    _, result = await fabric_preflight(inventory)
    worker = fabric_check(result, "spark-b")
    assert worker.status == "fail" and not result.ok and result.fabric == {}
    assert worker.message == (
        "does not reach spark-a over the fabric (ping -I enp1s0f1np1 169.254.44.136: 1 packets transmitted, "
        "0 received, 100% packet loss, time 0ms): check the QSFP cable, that both ports are up and addressed in "
        "one subnet, or set eth_if and fabric_ip in the inventory")
    assert fabric_check(result, "spark-a").status == "pass"


def four_nodes(tmp_path, reachable: dict[str, dict[str, str]]) -> Inventory:
    """spark-a and spark-b as captured; spark-c and spark-d as spark-b's
    capture with the fabric address moved to .31 and .32 (a switch's worth of
    Sparks in one link-local subnet)."""
    for name, ip in (("spark-c", "169.254.127.31"), ("spark-d", "169.254.127.32")):
        path = tmp_path / f"ip-br-addr-{name}.txt"
        path.write_text(ADDR["spark-b"].read_text().replace(WORKER_IP + "/16", ip + "/16"))
        ADDR[name], IBDEV[name] = path, IBDEV["spark-b"]
    return Inventory(nodes=[local_node(tmp_path, n, reachable.get(n)) for n in ("spark-a", "spark-b", "spark-c",
                                                                                 "spark-d")])


async def test_four_nodes_must_reach_each_other_not_only_the_head(tmp_path):
    head = {f"enp1s0f1np1 {HEAD_IP}": "reply"}
    every = {n: {**head, **{f"enp1s0f1np1 169.254.127.{i}": "reply" for i in (30, 31, 32)}}
             for n in ("spark-b", "spark-c", "spark-d")}
    try:
        _, result = await fabric_preflight(four_nodes(tmp_path, every), "tp=4")
        assert [fabric_check(result, n).status for n in ("spark-a", "spark-b", "spark-c", "spark-d")] == \
            ["pass"] * 4, result.render()
        assert sorted(result.fabric) == ["spark-a", "spark-b", "spark-c", "spark-d"]
        # spark-c's port cannot reach spark-d's (a switch port in the wrong VLAN): the ring would hang.
        broken = {**every, "spark-c": {**head, "enp1s0f1np1 169.254.127.30": "reply"}}
        _, result = await fabric_preflight(four_nodes(tmp_path, broken), "tp=4")
        c = fabric_check(result, "spark-c")
        assert c.status == "fail" and result.fabric == {}
        assert "does not reach spark-d 169.254.127.32" in c.message and "every pair of nodes" in c.message
        assert fabric_check(result, "spark-b").status == "pass"
    finally:
        for name in ("spark-c", "spark-d"):
            ADDR.pop(name, None)
            IBDEV.pop(name, None)


async def test_different_mtus_warn(tmp_path):
    inventory = Inventory(nodes=[local_node(tmp_path, "spark-a", mtu=9000),
                                 local_node(tmp_path, "spark-b", {f"enp1s0f1np1 {HEAD_IP}": "reply"})])
    _, result = await fabric_preflight(inventory)
    worker = fabric_check(result, "spark-b")
    assert worker.status == "warn" and "MTU 1500 here but 9000 on spark-a: set the same MTU on both ends" in \
        worker.message
    assert result.fabric["spark-a"].mtu == 9000


async def test_the_inventory_values_are_kept_and_the_rest_detected(tmp_path):
    # spark-a is fully given in the inventory; spark-b names its interface only.
    head = local_node(tmp_path, "spark-a", fabric_ip="169.254.44.136", eth_if="enp1s0f1np1", ib_if=["rocep1s0f1"])
    worker = local_node(tmp_path, "spark-b", {f"enp1s0f1np1 {HEAD_IP}": "reply"}, eth_if="enp1s0f1np1")
    _, result = await fabric_preflight(Inventory(nodes=[head, worker]))
    assert fabric_check(result, "spark-a").message == (
        "enp1s0f1np1 169.254.44.136/16, RoCE rocep1s0f1, MTU 1500 (inventory)")
    assert list(result.fabric) == ["spark-b"] and result.fabric["spark-b"].ip == WORKER_IP


async def test_a_fabric_ip_the_node_does_not_have_fails(tmp_path):
    worker = local_node(tmp_path, "spark-b", fabric_ip="192.168.100.11")
    _, result = await fabric_preflight(Inventory(nodes=[local_node(tmp_path, "spark-a"), worker]))
    assert fabric_check(result, "spark-b").message == (
        "fabric_ip 192.168.100.11 (inventory) is on no interface of this node: check fabric_ip in the inventory")
    assert not result.ok and result.fabric == {}


async def test_an_interface_named_in_the_inventory_that_is_down_fails(tmp_path):
    worker = local_node(tmp_path, "spark-b", eth_if="enp1s0f0np0")
    _, result = await fabric_preflight(Inventory(nodes=[local_node(tmp_path, "spark-a"), worker]))
    assert fabric_check(result, "spark-b").message == "enp1s0f0np0 is down: is the QSFP cable in?"
    assert not result.ok


async def test_a_node_without_an_addressed_port_warns_and_nothing_is_detected(tmp_path):
    worker = local_node(tmp_path, "spark-b")
    (Path(worker.env["PATH"].split(os.pathsep)[0]) / "ip").write_text("#!/bin/sh\nexit 0\n")  # no addresses
    _, result = await fabric_preflight(Inventory(nodes=[local_node(tmp_path, "spark-a"), worker]))
    warn = fabric_check(result, "spark-b")
    assert warn.status == "warn" and warn.message.startswith(
        "no ConnectX-7 port is up with an IPv4 address (enp1s0f0np0 down; enp1s0f1np1 up, no IPv4 address; "
        "enP2p1s0f0np0 down; enP2p1s0f1np1 up, no IPv4 address): NCCL and Gloo will pick an interface themselves")
    assert "not used: spark-b has none" in fabric_check(result, "spark-a").message
    assert result.fabric == {}


async def test_solo_and_router_topologies_detect_nothing(tmp_path):
    inventory = Inventory(nodes=[local_node(tmp_path, "spark-a"), local_node(tmp_path, "spark-b")])
    _, result = await fabric_preflight(inventory, "shuffle")
    assert not [c for c in result.checks if c.name == "fabric"] and result.fabric == {}


# -- on simulated Sparks: everything else passes too ------------------------------------


pytestmark_twin = pytest.mark.skipif(not loopback_aliases_work(), reason="needs 127.0.0.2 and 127.0.0.3")


@pytestmark_twin
async def test_a_ready_pair_without_fabric_in_the_inventory_passes_and_launches_with_it(tmp_path):
    cluster = TwinCluster(tmp_path / "cluster", images=[Defaults().image, Defaults().router_image]).setup()
    nodes = []
    for twin in cluster.nodes:
        bin_dir = standins(tmp_path / twin.name / "bin", twin.name,
                           {f"enp1s0f1np1 {HEAD_IP}": "reply"} if twin.name == "spark-b" else None)
        env = twin.env
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        for name in ("enp1s0f1np1", "enP2p1s0f1np1"):
            (twin.host.home / "sys/class/net" / name / "mtu").write_text("1500\n")
        nodes.append(Node(twin.name, "localhost", env=env, bind=twin.address))
        snap = twin.home / ".cache/huggingface/hub/models--nvidia--Llama-3.1-8B-Instruct-FP8/snapshots/x"
        snap.mkdir(parents=True)
    inventory = Inventory(nodes=nodes)
    launcher = Launcher(inventory)
    try:
        request = LaunchRequest(find_recipe("llama-3.1-8b"), "cluster-mp")
        plan = launcher.plan(request)
        assert any("detected at launch" in n for n in plan.notes)
        result = await launcher.preflight(plan, request.recipe)
        assert result.ok and all(c.status == "pass" for c in result.checks), result.render()
        # What begin() launches: the same launch, planned again with the detected fabric.
        launched = launcher.with_fabric(plan)
        assert launched.launch_id == plan.launch_id and launched is not plan
        worker = [str(a) for a in launched.steps[0].argv]
        assert "VLLM_HOST_IP=169.254.127.30" in worker and "NCCL_SOCKET_IFNAME=enp1s0f1np1" in worker
        assert worker[worker.index("--master-addr") + 1] == HEAD_IP
        assert launched.endpoints[0].url == plan.endpoints[0].url
    finally:
        await launcher.close()
