"""Fabric detection on real outputs of DGX Sparks (tests/fixtures/SOURCES.md
and captures/INDEX.md say where each came from), and the plan made with
what was detected."""

from __future__ import annotations

import io
import ipaddress
from pathlib import Path

from sparktop.launch.catalog import find_recipe
from sparktop.launch.topology import make_plan
from sparktop.observe import fabric
from sparktop.observe.fabric import Fabric, Port
from sparktop.settings import Inventory, Node, inventory_from_hosts

FIX = Path(__file__).resolve().parents[1] / "fixtures"
NVIDIA_IBDEV = "captures/ibdev2netdev_dgx-spark_roceP2p-first_nvidia-playbooks-connect-two-sparks.txt"
EUGR_IBDEV = "captures/ibdev2netdev_dgx-spark_rocep1-first_eugr-spark-vllm-docker.txt"
STARSKY = "fabric/ip-br-addr_dgx-spark-starsky_code-monkeys.txt"
HUTCH = "fabric/ip-br-addr_dgx-spark-hutch_code-monkeys.txt"


def fix(name: str) -> str:
    return (FIX / name).read_text()


def detected(ibdev: str, addr: str, net: str = "") -> fabric.NodeFabric:
    """What DETECT_SCRIPT prints on a Spark, from real captures."""
    return fabric.parse_detect(f"@@ibdev2netdev\n{fix(ibdev)}\n@@sysib\n@@addr\n{fix(addr)}\n@@net\n{net}\n@@end\n")


# -- parsers --------------------------------------------------------------------


def test_ibdev2netdev_in_either_order():
    # NVIDIA's playbook lists roceP2p first, eugr's rocep1 first: the same Spark, the same answer.
    for name in (NVIDIA_IBDEV, EUGR_IBDEV):
        links = fabric.parse_ibdev2netdev(fix(name))
        assert {(lk.ibdev, lk.netdev, lk.up) for lk in links} == {
            ("rocep1s0f0", "enp1s0f0np0", False), ("rocep1s0f1", "enp1s0f1np1", True),
            ("roceP2p1s0f0", "enP2p1s0f0np0", False), ("roceP2p1s0f1", "enP2p1s0f1np1", True)}
        assert all(lk.port == 1 for lk in links)


def test_ip_br_addr_of_a_cabled_spark():
    ifaces = fabric.parse_ip_br_addr(fix(STARSKY))
    assert list(ifaces) == ["lo", "enP7s7", "enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1",
                            "wlP9s9", "docker0"]
    cx7 = ifaces["enp1s0f1np1"]
    assert cx7.state == "UP" and [str(a) for a in cx7.ipv4] == ["169.254.44.136/16"]
    assert ifaces["enP2p1s0f1np1"].state == "UP" and ifaces["enP2p1s0f1np1"].ipv4 == []  # IPv6 link-local only
    assert ifaces["enp1s0f0np0"].state == "DOWN" and ifaces["enp1s0f0np0"].addresses == ()
    assert fabric.parse_ip_br_addr("veth1@if4        UP             10.0.0.1/24\n")["veth1"].state == "UP"


def test_sys_infiniband_listing_when_ibdev2netdev_is_missing():
    listing = ("/sys/class/infiniband/rocep1s0f1/device/net/enp1s0f1np1\n"
               "/sys/class/infiniband/roceP2p1s0f1/device/net/enP2p1s0f1np1\n")
    text = f"@@ibdev2netdev\n@@sysib\n{listing}@@addr\n{fix(STARSKY)}\n@@net\n@@end\n"
    node = fabric.parse_detect(text)
    assert node.source == "/sys/class/infiniband"
    assert [(lk.ibdev, lk.netdev, lk.up) for lk in node.links] == [("rocep1s0f1", "enp1s0f1np1", None),
                                                                 ("roceP2p1s0f1", "enP2p1s0f1np1", None)]
    # Up or not then comes from `ip -br addr`.
    assert node.up_cx7 == ["enp1s0f1np1", "enP2p1s0f1np1"] and node.roce == ("rocep1s0f1", "roceP2p1s0f1")


def test_ping_reply_no_reply_and_no_device():
    ok = fabric.parse_ping(fix("fabric/ping_iputils-20221126_reply.txt"), 0)
    assert ok.ok and ok.rtt_ms == 0.194 and ok.error is None
    lost = fabric.parse_ping(fix("fabric/ping_iputils-20221126_no-reply.txt"), 1)
    assert not lost.ok and lost.rtt_ms is None
    assert lost.summary == "1 packets transmitted, 0 received, 100% packet loss, time 0ms"
    nodev = fabric.parse_ping(fix("fabric/ping_iputils-20221126_no-such-device.txt"), 2)
    assert not nodev.ok and nodev.error == "ping: SO_BINDTODEVICE nosuchif0: No such device"


def test_sys_net_mtu_and_state():
    assert fabric.parse_sys_net("enp1s0f1np1 9000 up\nlo 65536 unknown\nenp1s0f0np0 - down\n") == {
        "enp1s0f1np1": (9000, "up"), "lo": (65536, "unknown"), "enp1s0f0np0": (None, "down")}


# -- the choice -------------------------------------------------------------------


def test_a_cabled_spark_offers_its_addressed_port_and_both_roce_halves():
    node = detected(EUGR_IBDEV, STARSKY, "enp1s0f1np1 1500 up\nenP2p1s0f1np1 1500 up\n")
    assert node.source == "ibdev2netdev"
    assert node.up_cx7 == ["enp1s0f1np1", "enP2p1s0f1np1"]  # the primary half first
    assert node.roce == ("rocep1s0f1", "roceP2p1s0f1")  # NCCL_IB_HCA: both halves of the cabled port
    assert [(p.netdev, str(p.address), p.mtu) for p in node.ports()] == [("enp1s0f1np1", "169.254.44.136/16", 1500)]
    assert node.holding("169.254.44.136") == "enp1s0f1np1" and node.holding("10.9.9.9") is None


def test_the_two_sparks_pair_over_the_link_local_subnet():
    a = detected(EUGR_IBDEV, STARSKY).ports()
    b = detected(NVIDIA_IBDEV, HUTCH).ports()
    ((h, w),) = fabric.pairs(a, b)
    assert (h.netdev, str(h.address.ip), w.netdev, str(w.address.ip)) == (
        "enp1s0f1np1", "169.254.44.136", "enp1s0f1np1", "169.254.127.30")


def test_pairs_prefer_the_same_port_then_the_primary_half():
    def port(name, text):
        return Port(name, ipaddress.IPv4Interface(text))
    head = [port("enP2p1s0f1np1", "192.168.101.10/24"), port("enp1s0f1np1", "192.168.100.10/24")]
    worker = [port("enp1s0f1np1", "192.168.100.11/24"), port("enP2p1s0f1np1", "192.168.101.11/24")]
    assert [(h.netdev, w.netdev) for h, w in fabric.pairs(head, worker)] == [
        ("enp1s0f1np1", "enp1s0f1np1"), ("enP2p1s0f1np1", "enP2p1s0f1np1")]
    assert fabric.pairs([port("enp1s0f1np1", "10.0.0.1/24")], [port("enp1s0f1np1", "10.0.1.1/24")]) == []
    # An inventory's fabric_ip has no prefix: the other side's subnet decides.
    given = Port("enp1s0f1np1", ipaddress.IPv4Interface("192.168.100.10/32"), prefix_known=False)
    assert fabric.pairs([given], worker)[0][1].netdev == "enp1s0f1np1"


def test_a_spark_without_cable_or_address_offers_nothing_and_says_what_it_saw():
    down = fabric.parse_detect(f"@@ibdev2netdev\n{fix(NVIDIA_IBDEV).replace('(Up)', '(Down)')}\n@@addr\n"
                               f"{fix(STARSKY)}\n@@end\n")
    assert down.ports() == [] and down.roce == ()
    assert down.describe() == ("enp1s0f0np0 down; enp1s0f1np1 down; enP2p1s0f0np0 down; enP2p1s0f1np1 down")
    bare = fabric.parse_detect("@@ibdev2netdev\n@@sysib\n@@addr\nlo UNKNOWN 127.0.0.1/8\n@@net\n@@end\n")
    assert bare.ports() == [] and "no ConnectX-7" in bare.describe()


# -- the plan ---------------------------------------------------------------------


def argv_of(step) -> list[str]:
    return [str(a) for a in step.argv]


def env_of(step) -> dict[str, str]:
    argv = argv_of(step)
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-e")


DETECTED = {"spark-a": Fabric("enp1s0f1np1", "169.254.44.136", ("rocep1s0f1", "roceP2p1s0f1"), 1500),
            "spark-b": Fabric("enp1s0f1np1", "169.254.127.30", ("rocep1s0f1", "roceP2p1s0f1"), 1500)}


def test_a_one_off_cluster_plan_says_the_fabric_is_detected_at_launch():
    # `sparktop launch R -t cluster-mp --nodes spark-a,spark-b --dry-run`: nothing is known yet.
    plan = make_plan(find_recipe("llama-3.1-8b"), "cluster-mp", inventory_from_hosts(["spark-a", "spark-b"]),
                     lid="t")
    assert len(plan.notes) == 2 and all("detected at launch" in n for n in plan.notes)
    assert "in place of 'spark-b' below and adds the NCCL, Gloo and UCX interface settings" in plan.notes[1]
    worker = env_of(plan.steps[0])
    assert worker["VLLM_HOST_IP"] == "spark-b" and "NCCL_SOCKET_IFNAME" not in worker


def test_the_plan_uses_what_preflight_detected():
    inventory = inventory_from_hosts(["spark-a", "spark-b"])
    plan = make_plan(find_recipe("llama-3.1-8b"), "cluster-mp", inventory, lid="t", fabric=DETECTED)
    worker, head = plan.steps[0], plan.steps[1]
    for step, ip in ((worker, "169.254.127.30"), (head, "169.254.44.136")):
        env = env_of(step)
        assert env["VLLM_HOST_IP"] == ip and env["MASTER_ADDR"] == "169.254.44.136"
        for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES"):
            assert env[key] == "enp1s0f1np1"
        assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        argv = argv_of(step)
        assert argv[argv.index("--master-addr") + 1] == "169.254.44.136"
    # The endpoint stays where sparktop reaches the head; the link-local address is between the nodes.
    assert plan.endpoints[0].url == "http://spark-a:8000"
    assert plan.notes[0] == ("fabric on spark-a: enp1s0f1np1 169.254.44.136, RoCE rocep1s0f1,roceP2p1s0f1, MTU 1500 "
                             "(what the inventory does not give was detected by preflight)")


def test_ray_nodes_join_over_the_detected_fabric():
    plan = make_plan(find_recipe("qwen3-235b-a22b"), "cluster-ray", inventory_from_hosts(["spark-a", "spark-b"]),
                     lid="t", fabric=DETECTED)
    head, worker = plan.steps[0], plan.steps[1]
    assert "--node-ip-address 169.254.44.136" in argv_of(head)[-1]
    argv = argv_of(worker)
    assert argv[argv.index("--address") + 1] == "169.254.44.136:6379"
    assert argv[argv.index("--node-ip-address") + 1] == "169.254.127.30"


def test_the_inventory_wins_over_what_was_detected():
    inventory = Inventory(nodes=[Node("spark-a", "spark-a.lan", fabric_ip="192.168.100.10", eth_if="enp1s0f1np1",
                                      ib_if=["rocep1s0f1"]),
                                 Node("spark-b", "spark-b.lan", eth_if="enP2p1s0f1np1")])
    plan = make_plan(find_recipe("llama-3.1-8b"), "cluster-mp", inventory, lid="t", fabric=DETECTED)
    head, worker = env_of(plan.steps[1]), env_of(plan.steps[0])
    assert head["VLLM_HOST_IP"] == "192.168.100.10" and head["NCCL_IB_HCA"] == "rocep1s0f1"
    assert worker["VLLM_HOST_IP"] == "169.254.127.30" and worker["NCCL_SOCKET_IFNAME"] == "enP2p1s0f1np1"
    assert worker["MASTER_ADDR"] == "192.168.100.10"
    assert [n.split(":")[0] for n in plan.notes] == ["fabric on spark-b"]


async def test_sparktop_launch_makes_the_plan_again_with_the_detected_fabric(monkeypatch):
    from rich.console import Console

    from sparktop.launch import commands
    from sparktop.launch.preflight import Check, Preflight

    launched = []

    class Transport:
        async def close(self):
            pass

    class Executor:
        def __init__(self, plan, transports, state, timeout):
            launched.append(plan)

        async def run(self):
            return
            yield

    async def preflight(plan, recipe, inventory, transports):
        return Preflight([Check("fabric", "spark-b", "pass", "enp1s0f1np1 169.254.127.30 ↔ spark-a ...")], DETECTED)

    monkeypatch.setattr(commands, "run_preflight", preflight)
    monkeypatch.setattr(commands, "Executor", Executor)
    monkeypatch.setattr(commands, "transports_for", lambda inventory, names: {n: Transport() for n in names})
    monkeypatch.setattr(commands, "LaunchState", lambda inventory: None)
    inventory = inventory_from_hosts(["spark-a", "spark-b"])
    code = await commands._launch(find_recipe("llama-3.1-8b"), "cluster-mp", inventory, None, {}, None, False, True,
                                  60.0, Console(file=io.StringIO()))
    assert code == 0
    (plan,) = launched
    assert env_of(plan.steps[0])["VLLM_HOST_IP"] == "169.254.127.30"
    assert plan.notes[0].startswith("fabric on spark-a: enp1s0f1np1 169.254.44.136")
