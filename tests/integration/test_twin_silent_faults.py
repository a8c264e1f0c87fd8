"""A twin node read the way a Spark is (the probe's one script through the node's shell, the twin's nvidia-smi and df
answering) shows the two silent faults of issue 38 as alerts: its GPU capped at 800 MHz with no reason given, as
bad USB-C power delivery leaves a Spark, and its disk filled to 12 GB free. Lifted, both resolve. And a driver that
does not know the GPU's top clock: asked once, its other figures read as before.

The node's GPU is kept busy by a process of the test's own registered on it (no engine to start); the alerts' time
is the snapshots', stepped 30 s a poll on the probe's clock, so a few polls cover the rules' minute of holding."""

from __future__ import annotations

import os
import time

from sparktop.clock import Clock
from sparktop.observe.alerts import FIRE, RESOLVE, AlertWatch
from sparktop.observe.host_probe import HostProbe
from sparktop.observe.snapshot import NodeSnapshot
from sparktop.observe.state import ClusterState
from sparktop.remote.local import LocalTransport
from sparktop.twin.cluster import TwinCluster
from sparktop.twin.host import DISK_FREE_B, DISK_TOTAL_B

STEP_S = 30.0


async def test_a_twin_node_capped_and_filled_raises_both_alerts_once_and_resolves_them(tmp_path):
    cluster = TwinCluster(tmp_path / "lab", names=("spark-a",)).setup()
    node = cluster.nodes[0]
    wall = [1_800_000_000.0]
    clock = Clock(now=time.monotonic, wall=lambda: wall[0], stamp=lambda: wall[0])
    probe = HostProbe(node.name, node.transport(), timeout=30, clock=clock)
    state, watch = ClusterState(), AlertWatch()
    alerts: list[tuple[int, str, str]] = []  # (the poll, counted from 0, fire or resolve, the rule)
    polls = [0]

    async def poll() -> NodeSnapshot:
        node.host.update_util(os.getpid(), 0.96)  # still busy (a process that stops reporting is idle)
        snap = await probe.poll()
        state.apply(snap)
        alerts.extend((polls[0], n.kind, n.text.split(" ")[0]) for n in watch.check(state))
        wall[0] += STEP_S
        polls[0] += 1
        return snap

    (node.home / ".cache" / "huggingface").mkdir(parents=True)  # the node user's HF cache, on its one disk
    node.host.register(os.getpid(), "VLLM::EngineCore", 60_000, util=0.96)
    try:
        healthy = await poll()
        assert healthy.gpu is not None and healthy.gpu_status == "ok"
        assert (healthy.gpu.sm_clock, healthy.gpu.max_sm_clock, healthy.gpu.util) == (2405, 3003, 96)
        # One filesystem (Docker's root too, where this machine has /var/lib/docker).
        assert [(d.mount, d.holds[:2], d.total, d.free) for d in healthy.disks] == [
            ("/", ["root", "hf_cache"], DISK_TOTAL_B // 1024 * 1024, DISK_FREE_B // 1024 * 1024)]

        node.host.set_clock_cap(800)
        node.host.set_disk(12 * 10**9)
        probe.refresh_docker()  # the slow tier (and the disks with it) at the next poll, as after a launch
        capped = [await poll() for _ in range(3)]
        gpu = capped[-1].gpu
        assert gpu is not None and (gpu.sm_clock, gpu.max_sm_clock, gpu.throttle) == (800, 3003, [])
        assert gpu.power is not None and gpu.power < 35
        assert [round(d.free / 1e9) for d in capped[-1].disks] == [12]
        # Each once: disk_full after its 30 s (the second capped poll), the other two after their minute (the third).
        assert alerts == [(2, FIRE, "disk_full"), (3, FIRE, "gpu_low_clock"), (3, FIRE, "disk_low")]

        node.host.set_clock_cap(None)
        node.host.set_disk(DISK_FREE_B)
        probe.refresh_docker()
        for _ in range(2):
            await poll()
        # Gone for 30 s: each resolves once, at the second poll after it was lifted.
        assert alerts[3:] == [(5, RESOLVE, "gpu_low_clock"), (5, RESOLVE, "disk_low"), (5, RESOLVE, "disk_full")]
    finally:
        node.host.unregister(os.getpid())


# nvidia-smi of a driver that does not know `clocks.max.sm` (a field unknown to it makes it refuse the query, as
# drivers before 535 refuse clocks_event_reasons.active), logging every call.
NO_MAX_CLOCK = """#!/bin/sh
echo "$*" >> {log}
case "$*" in
  *clocks.max.sm*) echo 'Field "clocks.max.sm" is not a valid field to query.'; exit 2 ;;
  *clocks_event_reasons*) echo 'NVIDIA GB10, 96, 67, 48.10, 2405, P0, 0x0000000000000000' ;;
  *query-compute-apps*) echo '4242, VLLM::EngineCore, 89093' ;;
esac
"""


async def test_a_driver_that_does_not_know_the_top_clock_is_asked_once_and_its_gpu_still_read(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    smi = bin_dir / "nvidia-smi"
    smi.write_text(NO_MAX_CLOCK.format(log=log))
    smi.chmod(0o755)
    probe = HostProbe("n", LocalTransport("n", env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}))
    for _ in range(3):
        snap = await probe.poll()
        probe.refresh_docker()  # every poll a slow one: the top clock would be asked each time until answered
        assert snap.gpu_status == "ok" and snap.gpu is not None
        assert (snap.gpu.sm_clock, snap.gpu.throttle, snap.gpu.max_sm_clock) == (2405, [], None)
        assert snap.disks and snap.disks[0].holds[0] == "root"
    assert sum("clocks.max.sm" in call for call in log.read_text().splitlines()) == 1
