"""Two silent faults of issue 38 as alerts: the GPU held at a low clock with no reason given (a Spark on bad USB-C
power delivery) and a node's disk filling up. The parsers on what df and nvidia-smi print, each rule firing once
after it has held and resolving once, and the figures as Prometheus gauges.

No `df -P` output of a Spark was found published (its `df -h` was: `/dev/nvme0n1p2 3.7T 123G 3.4T 4% /` beside a
512M `/boot/efi`), so the df rows here are POSIX's format (`df -P`: name, total, used and available blocks,
capacity, mount point) in that layout, and one read is this machine's own df running the probe's own script."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparktop.observe import hostparse
from sparktop.observe.alerts import DISK_FULL_B, DISK_LOW_B, FIRE, RESOLVE, AlertWatch
from sparktop.observe.host_probe import _SCRIPT_DISK, split_sections
from sparktop.observe.machine import throttle_reasons
from sparktop.observe.snapshot import Disk, Gpu, Memory, NodeSnapshot, node_from_dict, to_dict
from sparktop.observe.state import ClusterState
from sparktop.ui.cards import NodeCard

GIB = 2**30

# `df -Pk -- / ~/.cache/huggingface /var/lib/docker` as the probe runs it on a Spark whose HF cache is on its root
# filesystem and whose Docker root was moved to a second drive (`data-root`), preceded by the roles the script prints.
SPARK_DF = """\
root /
hf_cache /home/nvidia/.cache/huggingface
docker /mnt/data/docker
Filesystem     1024-blocks      Used  Available Capacity Mounted on
/dev/nvme0n1p2  3872070312 125829120 3549245440       4% /
/dev/nvme0n1p2  3872070312 125829120 3549245440       4% /
/dev/nvme1n1p1   976284672 951468032   24816640      98% /mnt/data
"""


def test_one_disk_per_filesystem_with_what_it_holds_in_bytes():
    disks = hostparse.parse_disks(SPARK_DF)
    assert disks == [
        Disk(mount="/", total=3872070312 * 1024, free=3549245440 * 1024, holds=["root", "hf_cache"],
             device="/dev/nvme0n1p2"),
        Disk(mount="/mnt/data", total=976284672 * 1024, free=24816640 * 1024, holds=["docker"],
             device="/dev/nvme1n1p1")]


def test_df_in_512_byte_blocks_a_mount_with_spaces_and_a_path_df_could_not_read():
    # POSIXLY_CORRECT without -k: 512-byte blocks. The HF cache's path is not there: df says so, and no filesystem
    # holds it (the card would otherwise name a cache that does not exist); the others keep their rows' order.
    text = """\
root /
hf_cache /media/big disk/hf
docker /var/lib/docker
Filesystem      512-blocks      Used  Available Capacity Mounted on
/dev/nvme0n1p2  7744140624 251658240 7098490880       4% /
df: '/media/big disk/hf': No such file or directory
/dev/nvme0n1p2  7744140624 251658240 7098490880       4% /
"""
    (disk,) = hostparse.parse_disks(text)
    assert (disk.mount, disk.total, disk.free, disk.holds) == ("/", 7744140624 * 512, 7098490880 * 512,
                                                               ["root", "docker"])
    spaced = hostparse.parse_disks("root /\nhf_cache /media/big disk/hf\n"
                                   "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                                   "/dev/sda1 100 60 40 60% /\n/dev/sdb1 2000 1000 1000 50% /media/big disk\n")
    assert [(d.mount, d.holds, d.device) for d in spaced] == [("/", ["root"], "/dev/sda1"),
                                                            ("/media/big disk", ["hf_cache"], "/dev/sdb1")]
    assert hostparse.parse_disks("root /\ndf: /: Permission denied\n") == []


def test_the_probes_own_script_through_this_machines_df(tmp_path):
    """The script as a node runs it (here, in sh): `/` always, the HF cache where it exists, one row per path;
    Docker's root, absent here, held by no filesystem (df says it cannot read it, and exits 1 for it)."""
    hf = tmp_path / "hf"
    hf.mkdir()
    out = subprocess.run(["sh", "-c", _SCRIPT_DISK], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(hf)}).stdout
    body, rc, _ = split_sections(out)["disk"]
    assert rc == (0 if Path("/var/lib/docker").exists() else 1)
    assert body.splitlines()[:3] == ["root /", f"hf_cache {hf}", "docker /var/lib/docker"]
    disks = hostparse.parse_disks(body)
    assert len({(d.device, d.mount) for d in disks}) == len(disks) >= 1
    docker = ["docker"] if Path("/var/lib/docker").exists() else []
    assert sorted(role for d in disks for role in d.holds) == sorted(["hf_cache", "root", *docker])
    assert all(0 <= d.free <= d.total and d.total > 0 for d in disks)


def test_the_gpus_top_clock_as_nvidia_smi_prints_it():
    # GB10's, as the colonel-otto capture's clocks.max.graphics shows it (tests/fixtures/nvidia-smi).
    assert hostparse.parse_max_clock("3003\n") == 3003.0
    assert hostparse.parse_max_clock("clocks.max.sm [MHz]\n3003 MHz\n") == 3003.0
    assert hostparse.parse_max_clock("[N/A]\n") is None
    assert hostparse.parse_max_clock("") is None


def test_a_snapshot_keeps_its_disks_and_top_clock_through_a_recording():
    snap = spark(0, disks=[Disk("/", 4 * 10**12, 10 * 10**9, ["root", "hf_cache"], "/dev/nvme0n1p2")])
    assert node_from_dict(to_dict(snap)) == snap


# -- the rules ------------------------------------------------------------------------------------------------


def spark(t: float, clock: float = 2405, util: float = 96, power: float = 48, reasons: str | None = "0x0",
          max_clock: float | None = 3003, free_gb: float | None = None, disks: list[Disk] | None = None) \
        -> NodeSnapshot:
    if disks is None and free_gb is not None:
        disks = [Disk("/", 3_965 * 10**9, int(free_gb * 1e9), ["root", "hf_cache"], "/dev/nvme0n1p2")]
    return NodeSnapshot(name="spark-a", t=t, state="ok", memory=Memory(total=120 * GIB, available=60 * GIB),
                        gpu=Gpu(util=util, power=power, sm_clock=clock, max_sm_clock=max_clock,
                                throttle=None if reasons is None else throttle_reasons(reasons)),
                        disks=disks or [])


def run(events):
    """Every alert notice the events raise, as (t, kind, rule)."""
    state, watch = ClusterState(), AlertWatch()
    out = []
    for event in events:
        state.apply(event)
        out += [(n.t, n.kind, n.text.split(" ")[0]) for n in watch.check(state)]
    return out


def test_a_busy_gpu_held_low_with_no_reason_fires_once_after_a_minute_and_resolves_once():
    # Healthy for 10 s, then 800 MHz of 3003 on 15 W at 96 % busy for two minutes (hovering either side of 45 %
    # for the second), then healthy again: one alert, one resolution.
    events = [spark(t) for t in range(0, 10)] + [spark(t, clock=800, power=15) for t in range(10, 80)] \
        + [spark(t, clock=1300 if t % 4 else 1400, power=15) for t in range(80, 130)] \
        + [spark(t) for t in range(130, 200)]
    assert run(events) == [(70, FIRE, "gpu_low_clock"), (160, RESOLVE, "gpu_low_clock")]


def test_a_low_clock_with_a_reason_or_idle_or_on_full_power_or_unread_reasons_is_not_the_silent_fault():
    low = {"clock": 800, "power": 15}
    assert run([spark(t, **low, reasons="0x4") for t in range(0, 120)]) == \
        [(60, FIRE, "gpu_throttled")]  # its power cap holds it: that alert, not this one
    assert run([spark(t, **low, util=20) for t in range(0, 120)]) == []  # a light load clocks down
    assert run([spark(t, clock=800, power=40) for t in range(0, 120)]) == []
    assert run([spark(t, **low, reasons=None) for t in range(0, 120)]) == []  # a driver before 535
    assert run([spark(t, **low, max_clock=None) for t in range(0, 120)]) == []  # top clock unknown
    # An idle GPU (NVML's idle reason) at its idle clock is not held down either.
    assert run([spark(t, clock=208, util=0, power=2, reasons="0x1") for t in range(0, 120)]) == []


def test_a_disk_filling_up_warns_then_goes_critical_then_both_resolve_once():
    events = [spark(t, free_gb=500) for t in range(0, 10)] + [spark(t, free_gb=100) for t in range(10, 40)] \
        + [spark(t, free_gb=12) for t in range(40, 100)] + [spark(t, free_gb=400) for t in range(100, 200)]
    assert run(events) == [(70, FIRE, "disk_low"), (70, FIRE, "disk_full"),
                           (130, RESOLVE, "disk_low"), (130, RESOLVE, "disk_full")]


def test_a_small_filesystem_is_not_low_for_ever_only_full():
    """A 100 GB partition (Docker's, say) reads under 130 GB free even empty: no disk_low from it, only disk_full
    once it is under 20 GB."""
    def node(t: float, free_gb: float) -> NodeSnapshot:
        snap = spark(t)
        snap.disks = [Disk("/var/lib/docker", 100 * 10**9, int(free_gb * 1e9), ["docker"], "/dev/sdb1")]
        return snap

    assert run([node(t, 95) for t in range(0, 200)]) == []
    assert run([node(t, 10) for t in range(0, 100)]) == [(30, FIRE, "disk_full")]


def test_a_disk_hovering_at_the_threshold_sends_one_message_and_says_where():
    """Under 130 GB for 70 s, then above it for 20 s in every 40 (a download's files come and go) for five minutes."""
    state, watch = ClusterState(), AlertWatch()
    notices = []
    for t in range(0, 400):
        state.apply(spark(t, free_gb=125 if t < 70 or t % 40 < 20 else 135))
        notices += watch.check(state)
    assert [(n.t, n.kind) for n in notices] == [(60, FIRE)]
    assert notices[0].text == ("disk_low [warning]: spark-a: 125.0 GB free of 3965 GB on / (root, hf_cache), "
                               "under 130 GB (for 60 s)")
    assert DISK_FULL_B < DISK_LOW_B


# -- where they show ------------------------------------------------------------------------------------------


def test_the_card_says_a_short_disk_only_once_it_is_short():
    card = NodeCard("spark-a")
    text = "\n".join(line.plain for line in card._lines(spark(0, free_gb=3000), None, 60))
    assert "disk" not in text
    text = "\n".join(line.plain for line in card._lines(spark(0, free_gb=12), None, 60))
    assert "disk 12 GB free on /" in text


def exported(snap: NodeSnapshot) -> str:
    from prometheus_client import generate_latest

    from sparktop.history.exporter import registry_for

    state = ClusterState()
    state.apply(snap)
    return generate_latest(registry_for(state)).decode()


def test_the_top_clock_and_the_disks_are_gauges_in_base_units():
    from prometheus_client.parser import text_string_to_metric_families

    snap = spark(0, clock=800, power=15, disks=[
        Disk("/", 3_965 * 10**9, 12 * 10**9, ["root", "hf_cache"], "/dev/nvme0n1p2"),
        Disk("/mnt/data", 10**12, 5 * 10**11, ["docker"], "/dev/nvme1n1p1")])
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(exported(snap)) for s in f.samples}
    assert samples[("sparktop_gpu_sm_clock_max_hertz", (("node", "spark-a"),))] == 3003e6
    assert samples[("sparktop_node_disk_free_bytes", (("mount", "/"), ("node", "spark-a")))] == 12e9
    assert samples[("sparktop_node_disk_total_bytes", (("mount", "/mnt/data"), ("node", "spark-a")))] == 1e12
    assert samples[("sparktop_node_disk_info", (("device", "/dev/nvme1n1p1"), ("holds", "docker"),
                                                ("mount", "/mnt/data"), ("node", "spark-a")))] == 1.0


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian's `prometheus`)")
def test_promtool_finds_nothing_to_fix_in_the_new_gauges():
    snap = spark(0, disks=[Disk("/", 3_965 * 10**9, 12 * 10**9, ["root", "hf_cache"], "/dev/nvme0n1p2")])
    checked = subprocess.run(["promtool", "check", "metrics"], input=exported(snap), capture_output=True, text=True,
                             timeout=60)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")
