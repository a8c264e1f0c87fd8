"""RoCE link counters: ethtool and sysfs parsing, LINK_SCRIPT run for real, rates.

Captures (tests/fixtures/SOURCES.md has their origin):
- link/ethtool-S_mlx5-connectx4lx_ethq-tests.txt: `ethtool -S` of an mlx5
  ConnectX-4 Lx (isc-projects/ethq tests/mlx5_core, from ethq issue #8);
- link/sys-class-infiniband-ttar_mlx5_0-connectx4_prometheus-procfs.txt: an
  mlx5 device's sysfs files (prometheus/procfs testdata/fixtures.ttar).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparktop.observe.linkparse import (
    LINK_SCRIPT,
    LinkCounters,
    link_rates,
    parse_ethtool_stats,
    parse_link_section,
    rdma_bytes,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "link"
ETHTOOL_MLX5 = FIXTURES / "ethtool-S_mlx5-connectx4lx_ethq-tests.txt"
PROCFS_TTAR = FIXTURES / "sys-class-infiniband-ttar_mlx5_0-connectx4_prometheus-procfs.txt"
SH = shutil.which("sh") or "/bin/sh"


def ttar_values(path: Path) -> dict[str, str]:
    """`Path:` -> its one-line value, from a ttar excerpt (paths relative to the device)."""
    lines = path.read_text().splitlines()
    out = {}
    for i, line in enumerate(lines):
        if line.startswith("Path: ") and lines[i + 1] == "Lines: 1":
            out[line.split("/mlx5_0/", 1)[1]] = lines[i + 2]
    return out


# -- ethtool -S ------------------------------------------------------------------


def test_ethtool_capture_parses_every_counter_including_per_queue_lines():
    stats = parse_ethtool_stats(ETHTOOL_MLX5.read_text())
    assert len(stats) == 751  # one counter a line, none lost
    assert stats["rx_bytes"] == 2195783498134
    assert stats["tx_vport_unicast_bytes"] == 2658838156693
    assert stats["tx15_xmit_more"] == 5530  # per-queue lines kept under their own names


def test_rdma_bytes_of_a_host_without_roce_traffic_are_zero_not_missing():
    stats = parse_ethtool_stats(ETHTOOL_MLX5.read_text())
    # That host moved terabytes over the kernel path and nothing over RDMA.
    assert rdma_bytes(stats) == (0, 0)


def test_ethtool_header_blank_lines_and_junk_are_skipped():
    text = (
        "NIC statistics:\n"
        "     rx_vport_rdma_unicast_bytes: 343918719286\n"
        "\n"
        "     rx_vport_rdma_multicast_bytes: 10\n"
        "     tx_vport_rdma_unicast_bytes: 147370719852\n"
        "     rx_pci_signal_integrity: N/A\n"
        "     [0]: rx_bytes: 7\n"
        "garbage without a colon\n"
    )
    stats = parse_ethtool_stats(text)
    assert "NIC statistics" not in stats
    assert "rx_pci_signal_integrity" not in stats
    assert stats["[0]: rx_bytes"] == 7
    # Multicast is RDMA traffic too; tx has no multicast line and is unicast only.
    assert rdma_bytes(stats) == (343918719296, 147370719852)


def test_rdma_bytes_absent_when_the_driver_has_no_vport_counters():
    assert rdma_bytes(parse_ethtool_stats("NIC statistics:\n     rx_bytes: 1\n")) == (None, None)


# -- LINK_SCRIPT on a fake /sys ----------------------------------------------------------


def make_sys(root: Path) -> dict[str, str]:
    """Two RDMA devices as a Spark names them: one up (the procfs capture's
    counters), one down. Returns the capture's values."""
    cap = ttar_values(PROCFS_TTAR)
    up = root / "class/infiniband/rocep1s0f1"
    (up / "ports/1/counters").mkdir(parents=True)
    (up / "ports/1/state").write_text(cap["ports/1/state"] + "\n")
    # sysfs ends values with a newline; this one has none, which `read` must still take.
    (up / "ports/1/counters/port_xmit_data").write_text(cap["ports/1/counters/port_xmit_data"])
    (up / "ports/1/counters/port_rcv_data").write_text(cap["ports/1/counters/port_rcv_data"] + "\n")
    (up / "device/net/enp1s0f1np1").mkdir(parents=True)
    net = root / "class/net/enp1s0f1np1"
    (net / "statistics").mkdir(parents=True)
    (net / "statistics/rx_bytes").write_text("5647020\n")
    (net / "statistics/tx_bytes").write_text("37496464\n")
    (net / "speed").write_text("200000\n")

    down = root / "class/infiniband/roceP2p1s0f0"
    (down / "ports/1/counters").mkdir(parents=True)
    (down / "ports/1/state").write_text("1: DOWN\n")
    (down / "ports/1/counters/port_xmit_data").write_text("0\n")
    (down / "ports/1/counters/port_rcv_data").write_text("0\n")
    (down / "device/net/enP2p1s0f0np0").mkdir(parents=True)
    net = root / "class/net/enP2p1s0f0np0"
    (net / "statistics").mkdir(parents=True)
    (net / "statistics/rx_bytes").write_text("0\n")
    (net / "statistics/tx_bytes").write_text("0\n")
    (net / "speed").write_text("-1\n")  # what a link without carrier reports
    return cap


def fake_ethtool(bindir: Path) -> Path:
    """An `ethtool` that logs its arguments and prints the mlx5 capture the way
    ethtool prints it (header, five-space indent, which ethq's copy dropped)."""
    bindir.mkdir()
    log = bindir / "calls.log"
    script = bindir / "ethtool"
    script.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$*\" >> '{log}'\n"
        "printf 'NIC statistics:\\n'\n"
        f"while IFS= read -r l; do printf '     %s\\n' \"$l\"; done < '{ETHTOOL_MLX5}'\n"
    )
    script.chmod(0o755)
    return log


def run_link_script(sys_root: Path, path: Path, before: str = "") -> str:
    # PATH holds nothing but (maybe) ethtool: a `cat` or `grep` slipped into
    # the script would fail here and the values would go missing.
    result = subprocess.run(
        [SH, "-c", before + LINK_SCRIPT],
        env={"SPARKTOP_SYS_ROOT": str(sys_root), "PATH": str(path)},
        capture_output=True, text=True, timeout=10, check=True,
    )
    assert result.stderr == ""
    return result.stdout


def test_link_script_with_ethtool_reads_vport_counters_for_the_port_that_is_up(tmp_path):
    make_sys(tmp_path / "sys")
    log = fake_ethtool(tmp_path / "bin")
    out = run_link_script(tmp_path / "sys", tmp_path / "bin")
    assert out.splitlines()[0] == "@@link"
    links = {c.rdma_device: c for c in parse_link_section(out)}
    assert set(links) == {"rocep1s0f1", "roceP2p1s0f0"}

    up = links["rocep1s0f1"]
    assert up.netdev == "enp1s0f1np1" and up.up and up.speed_mbps == 200000
    assert up.source == "ethtool"
    assert (up.rdma_rx_bytes, up.rdma_tx_bytes) == (0, 0)  # the capture's vport RDMA counters
    assert (up.kernel_rx_bytes, up.kernel_tx_bytes) == (5647020, 37496464)
    # ethtool ran once, for the netdev whose port is up; a down port's counters cannot move.
    assert log.read_text() == "-S enp1s0f1np1\n"
    # Only the RDMA lines of ethtool's 751 cross the wire.
    assert sum(line.startswith("eth ") for line in out.splitlines()) == 8

    down = links["roceP2p1s0f0"]
    assert not down.up and down.speed_mbps is None
    assert down.source == "port counters" and (down.rdma_rx_bytes, down.rdma_tx_bytes) == (0, 0)


def test_link_script_without_ethtool_falls_back_to_port_counters_in_4_byte_words(tmp_path):
    cap = make_sys(tmp_path / "sys")
    (tmp_path / "empty").mkdir()
    out = run_link_script(tmp_path / "sys", tmp_path / "empty")
    assert "eth " not in out
    up = {c.rdma_device: c for c in parse_link_section(out)}["rocep1s0f1"]
    assert up.source == "port counters"
    assert up.rdma_tx_bytes == int(cap["ports/1/counters/port_xmit_data"]) * 4  # the file without a newline
    assert up.rdma_rx_bytes == int(cap["ports/1/counters/port_rcv_data"]) * 4
    assert up.up and up.netdev == "enp1s0f1np1"
    # Pasted into a probe that runs under `set -eu`, the `read` that fails on
    # the counter file without a final newline must not end it early.
    assert run_link_script(tmp_path / "sys", tmp_path / "empty", before="set -eu\n") == out


def test_link_script_on_a_node_without_rdma_prints_an_empty_section(tmp_path):
    (tmp_path / "empty").mkdir()
    out = run_link_script(tmp_path / "nothing", tmp_path / "empty")
    assert out == "@@link\n"
    assert parse_link_section(out) == []


def test_link_section_with_missing_values_gives_none_not_zero():
    text = "@@link\njunk before any device\ndev mlx5_0\nstate \nxmit \nrcv x\nnetdev eth1\nrx_bytes\nspeed 25000\n"
    (c,) = parse_link_section(text)
    assert c.rdma_device == "mlx5_0" and c.netdev == "eth1" and not c.up
    assert c.rdma_rx_bytes is None and c.rdma_tx_bytes is None
    assert c.kernel_rx_bytes is None and c.kernel_tx_bytes is None
    assert c.speed_mbps == 25000


# -- rates ------------------------------------------------------------------------


def counters(dev: str, rx: int | None, tx: int | None, *, source="ethtool", krx=0, ktx=0) -> LinkCounters:
    return LinkCounters(dev, "en" + dev, True, 200000, rx, tx, source, krx, ktx)


def test_link_rates_are_gbps_over_the_measured_interval():
    prev = [counters("a", 0, 1_000_000_000, krx=1000, ktx=0)]
    cur = [counters("a", 25_000_000_000, 1_000_000_000, krx=1000 + 250_000_000, ktx=0)]
    (r,) = link_rates(prev, 100.0, cur, 102.0)  # polled "every second", measured 2 s
    assert r.seconds == 2.0
    assert r.rdma_rx_gbps == pytest.approx(100.0)  # 25 GB in 2 s
    assert r.rdma_tx_gbps == 0.0
    assert r.kernel_rx_gbps == pytest.approx(1.0)


def test_a_counter_reset_gives_no_rate_for_that_interval_only():
    prev = [counters("a", 9_000_000_000, 5_000)]
    reset = [counters("a", 1_000, 6_000)]  # driver reloaded: rx back near zero
    (r,) = link_rates(prev, 0.0, reset, 1.0)
    assert r.rdma_rx_gbps is None  # not negative, not a wrapped huge number
    assert r.rdma_tx_gbps == pytest.approx(8e-6)
    later = [counters("a", 1_000 + 12_500_000_000, 6_000)]
    (r,) = link_rates(reset, 1.0, later, 2.0)
    assert r.rdma_rx_gbps == pytest.approx(100.0)


def test_no_rate_for_a_new_device_a_source_change_or_a_clock_that_did_not_advance():
    prev = [counters("a", 0, 0)]
    cur = [counters("a", 10, 10, source="port counters"), counters("b", 10, 10)]
    a, b = link_rates(prev, 0.0, cur, 1.0)
    assert (a.rdma_rx_gbps, a.rdma_tx_gbps) == (None, None)  # different counters: no delta
    assert a.kernel_rx_gbps == 0.0
    assert (b.rdma_rx_gbps, b.kernel_rx_gbps) == (None, None)  # nothing to compare with
    (a,) = link_rates(prev, 5.0, [counters("a", 10, 10)], 5.0)
    assert a.rdma_rx_gbps is None
