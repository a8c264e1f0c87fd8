"""A node's link as the monitor shows it: rates from the counters a node's /sys holds (read by the probe
over a fake /sys, moved between polls), the totals and capacity, and the two warnings an engine spread
over nodes makes worth giving, each only once it has held for a few polls."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparktop.observe.host_probe import HostProbe
from sparktop.observe.link import HOLD_POLLS, LinkWatch, view
from sparktop.observe.linkparse import LinkRate
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot
from sparktop.observe.state import ClusterState
from sparktop.remote.local import LocalTransport
from tests.helpers.monitor_sim import HandClock

# A Spark cabled on its outer port: both halves of it up, the inner port's halves down.
DEVICES = {"rocep1s0f1": "enp1s0f1np1", "roceP2p1s0f1": "enP2p1s0f1np1", "rocep1s0f0": "enp1s0f0np0"}


def fake_sys(root: Path, words: dict[str, tuple[int, int]], kernel: dict[str, tuple[int, int]]) -> None:
    """Counters as mlx5 leaves them: port_xmit_data / port_rcv_data in 4-byte words, the kernel's bytes."""
    for dev, net in DEVICES.items():
        port = root / "class/infiniband" / dev / "ports/1"
        (port / "counters").mkdir(parents=True, exist_ok=True)
        (port / "state").write_text("4: ACTIVE\n" if dev != "rocep1s0f0" else "1: DOWN\n")
        xmit, rcv = words.get(dev, (0, 0))
        (port / "counters/port_xmit_data").write_text(f"{xmit}\n")
        (port / "counters/port_rcv_data").write_text(f"{rcv}\n")
        (root / "class/infiniband" / dev / "device/net" / net).mkdir(parents=True, exist_ok=True)
        stats = root / "class/net" / net / "statistics"
        stats.mkdir(parents=True, exist_ok=True)
        rx, tx = kernel.get(net, (0, 0))
        (stats / "rx_bytes").write_text(f"{rx}\n")
        (stats / "tx_bytes").write_text(f"{tx}\n")
        (root / "class/net" / net / "speed").write_text("200000\n")
    dmi = root / "class/dmi/id"
    dmi.mkdir(parents=True, exist_ok=True)
    (dmi / "sys_vendor").write_text("ASUSTeK COMPUTER INC.\n")
    (dmi / "product_name").write_text("GX10\n")
    (dmi / "product_family").write_text("DGX Spark\n")


@pytest.mark.parametrize("through", ["in-process read", "node script"])
async def test_the_probe_rates_the_link_from_its_counters_over_the_measured_interval(tmp_path, through):
    fake_sys(tmp_path, {}, {})
    env = {"SPARKTOP_SYS_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"}  # no ethtool: the port counters
    transport = LocalTransport("n", env=env)
    hand = HandClock()  # the probe's clock: the interval between its reads is what the test says it is
    probe = HostProbe("n", transport, clock=hand.clock)
    if through == "node script":
        from tests.integration.test_process_discovery import ShellTransport

        shell = ShellTransport("n")
        shell._local = transport
        probe = HostProbe("n", shell, clock=hand.clock)
    first = await probe.poll()
    assert first.links == [] and first.machine is not None and first.machine.variant == "ASUS Ascent GX10"
    # 1.25 GB out and 1 GB in on one half, half that on the other, a little kernel traffic, over 2.5 s.
    fake_sys(tmp_path, {"rocep1s0f1": (1_250_000_000 // 4, 1_000_000_000 // 4),
                        "roceP2p1s0f1": (625_000_000 // 4, 500_000_000 // 4)},
             {"enp1s0f1np1": (1_000_000, 2_000_000)})
    hand.advance(2.5)
    second = await probe.poll()
    by_dev = {p.rdma_device: p for p in second.links}
    assert set(by_dev) == set(DEVICES) and not by_dev["rocep1s0f0"].up
    half = by_dev["rocep1s0f1"]
    assert half.source == "port counters"
    # Bytes over the interval the probe measured between its two reads (not the 1 s it was asked for).
    assert half.seconds == 2.5
    assert half.rdma_tx_gbps == pytest.approx(1.25 * 8 / 2.5)
    assert half.rdma_rx_gbps == pytest.approx(1.0 * 8 / 2.5)
    assert half.kernel_tx_gbps == pytest.approx(2_000_000 * 8 / 2.5 / 1e9)
    assert second.machine is not None and second.machine.variant == "ASUS Ascent GX10"  # read once, kept
    state = ClusterState()
    state.apply(second)
    link = state.links["n"]
    assert {p.rdma_device for p in link.ports} == {"rocep1s0f1", "roceP2p1s0f1"}  # the ports that are up
    assert link.rdma_tx_gbps == pytest.approx(1.875 * 8 / 2.5)
    assert link.capacity_gbps == 200  # two halves of ~100 Gb/s each, whatever each port's speed says


def rate(dev: str, rdma: tuple[float, float], kernel: tuple[float, float], up: bool = True) -> LinkRate:
    return LinkRate(dev, None, up, 200000, "ethtool", rdma[0], rdma[1], kernel[0], kernel[1], 1.0)


def node(*links: LinkRate) -> NodeSnapshot:
    return NodeSnapshot(name="spark-a", t=time.time(), state="ok", links=list(links))


BUSY = EngineSnapshot(key="http://a:8000", url="http://a:8000", t=0.0, state="ready", gen_tps=900.0)
IDLE = EngineSnapshot(key="http://a:8000", url="http://a:8000", t=0.0, state="ready", gen_tps=0.0)


def test_nccl_on_sockets_is_said_once_it_has_held_and_not_while_idle():
    watch = LinkWatch()
    sockets = node(rate("rocep1s0f1", (0.0, 0.0), (2.0, 2.1)), rate("roceP2p1s0f1", (0.0, 0.0), (0.0, 0.0)))
    warnings = [watch.update(view(sockets, [BUSY])).warning for _ in range(HOLD_POLLS)]
    assert warnings[:-1] == [None] * (HOLD_POLLS - 1)  # one poll can fall between NCCL's bursts
    assert warnings[-1] is not None and "TCP sockets" in warnings[-1] and "NCCL_IB_DISABLE" in warnings[-1]
    # The same counters with the engine idle: nothing to say. And a poll with RDMA moving clears it.
    assert view(sockets, [IDLE]).suspect is None
    rdma = node(rate("rocep1s0f1", (3.0, 3.0), (0.0, 0.0)), rate("roceP2p1s0f1", (3.0, 3.0), (0.0, 0.0)))
    assert watch.update(view(rdma, [BUSY])).warning is None
    assert watch.update(view(sockets, [BUSY])).warning is None  # counting again from one


def test_one_half_of_the_cable_carrying_everything_is_flagged():
    watch = LinkWatch()
    one_half = node(rate("rocep1s0f1", (6.0, 6.0), (0.0, 0.0)), rate("roceP2p1s0f1", (0.0, 0.0), (0.0, 0.0)))
    for _ in range(HOLD_POLLS):
        v = watch.update(view(one_half, [BUSY]))
    assert v.warning is not None and v.warning.startswith("only rocep1s0f1 carries") and "NCCL_IB_HCA" in v.warning
    both = node(rate("rocep1s0f1", (3.0, 3.0), (0.0, 0.0)), rate("roceP2p1s0f1", (3.1, 2.9), (0.0, 0.0)))
    assert view(both, [BUSY]).suspect is None
    # No engine spread over this node: its link is somebody else's business, nothing flagged.
    assert view(one_half, []).suspect is None


# -- which port reaches which node ---------------------------------------------------------------------

FABRIC = Path(__file__).parent.parent / "fixtures" / "fabric"
HALVES = {"enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}


def spark(name: str, capture: str, sends: dict[str, tuple[float, float]]) -> NodeSnapshot:
    """A node as the probe reads it: `ip -br addr` (a real Spark's, fixtures/fabric: starsky and hutch,
    jeffersonjhunt/code-monkeys @ 13c0b55) and its halves' RDMA Gb/s (rx, tx)."""
    from sparktop.observe.fabric import parse_ip_br_addr

    interfaces = parse_ip_br_addr((FABRIC / capture).read_text())
    links = [LinkRate(dev, net, True, 200000, "ethtool", *sends.get(net, (0.0, 0.0)), 0.0, 0.0, 1.0)
             for net, dev in HALVES.items()]
    return NodeSnapshot(name=name, t=time.time(), state="ok", links=links,
                        addresses={net: interfaces[net].addresses for net in HALVES})


def test_two_cabled_sparks_pair_their_ports_by_address_and_traffic_verifies_them():
    from sparktop.observe.link import pair_ports

    starsky = spark("starsky", "ip-br-addr_dgx-spark-starsky_code-monkeys.txt",
                    {"enp1s0f1np1": (4.0, 5.0), "enP2p1s0f1np1": (4.1, 5.1)})
    hutch = spark("hutch", "ip-br-addr_dgx-spark-hutch_code-monkeys.txt",
                  {"enp1s0f1np1": (5.1, 4.0), "enP2p1s0f1np1": (5.0, 4.1)})
    pairs, notes = pair_ports([starsky, hutch])
    assert notes == []
    found = {(p.a_device, p.b_device, p.how, p.verified) for p in pairs}
    # The halves with NVIDIA's link-local IPv4 share 169.254.0.0/16; the others have only IPv6 link-local
    # addresses: the same port on both, as a QSFP cable joins them.
    assert found == {("rocep1s0f1", "rocep1s0f1", "169.254.0.0/16", True),
                     ("roceP2p1s0f1", "roceP2p1s0f1", "same port, IPv6 link-local only", True)}
    # What one half sends, the other node's half of the same name does not receive: flagged.
    crossed = spark("hutch", "ip-br-addr_dgx-spark-hutch_code-monkeys.txt",
                    {"enp1s0f1np1": (0.2, 4.0), "enP2p1s0f1np1": (5.0, 4.1)})
    (first, *_), _ = pair_ports([starsky, crossed])
    assert first.verified is False and "sends 5.00 Gb/s" in (first.note or "")
    # No traffic yet: paired by address, not verified.
    quiet = [spark("starsky", "ip-br-addr_dgx-spark-starsky_code-monkeys.txt", {}),
             spark("hutch", "ip-br-addr_dgx-spark-hutch_code-monkeys.txt", {})]
    assert {p.verified for p in pair_ports(quiet)[0]} == {None}


def test_on_a_switch_no_pair_is_invented():
    from sparktop.observe.link import pair_ports

    nodes = []
    for i, name in enumerate(("spark-a", "spark-b", "spark-c")):
        links = [LinkRate("rocep1s0f1", "enp1s0f1np1", True, 200000, "ethtool", 1.0, 1.0, 0.0, 0.0, 1.0)]
        nodes.append(NodeSnapshot(name=name, t=time.time(), state="ok", links=links,
                                  addresses={"enp1s0f1np1": (f"192.168.100.{10 + i}/24",)}))
    pairs, notes = pair_ports(nodes)
    assert pairs == [] and notes == ["3 nodes share 192.168.100.0/24 (a switch): traffic per peer cannot be "
                                     "attributed"]
