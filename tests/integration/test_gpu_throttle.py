"""Why a GPU's clocks are held down, read with the rest of the GPU's figures: NVML's clock event reasons
in words on the node, and a driver that does not know the field (before 535, which refuses the whole
query) asked without it from then on, rather than shown as an error every second."""

from __future__ import annotations

import stat

from sparktop.observe.host_probe import HostProbe
from sparktop.remote.local import LocalTransport

# nvidia-smi as a driver before 535 answers a query naming a field it does not know, else a GB10's row.
OLD_DRIVER = """#!/bin/sh
case "$*" in
  *clocks_event_reasons*) echo 'Field "clocks_event_reasons.active" is not a valid field to query.'; exit 2 ;;
  *query-gpu*) echo 'NVIDIA GB10, 96, 67, 48.10, 2405, P0' ;;
  *query-compute-apps*) echo '4242, VLLM::EngineCore, 89093' ;;
esac
"""

CAPPED = OLD_DRIVER.replace(
    """  *clocks_event_reasons*) echo 'Field "clocks_event_reasons.active" is not a valid field to query.'; exit 2 ;;
""", """  *clocks_event_reasons*) echo 'NVIDIA GB10, 96, 67, 48.10, 2405, P0, 0x0000000000000024' ;;
""")


def probe_with(tmp_path, script: str) -> HostProbe:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(script)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return HostProbe("n", LocalTransport("n", env={"PATH": f"{bin_dir}:/usr/bin:/bin"}))


async def test_a_gpu_held_down_by_its_power_cap_and_heat_says_so(tmp_path):
    probe = probe_with(tmp_path, CAPPED)
    snap = await probe.poll()
    assert snap.gpu_status == "ok" and snap.gpu is not None
    assert snap.gpu.throttle == ["power cap", "thermal (software)"]
    assert snap.gpu.util == 96 and snap.gpu.sm_clock == 2405


async def test_a_driver_that_does_not_know_the_field_is_asked_without_it(tmp_path):
    probe = probe_with(tmp_path, OLD_DRIVER)
    first = await probe.poll()
    assert first.gpu_status != "ok" or first.gpu is None  # the refusal, once
    assert "not a valid field" not in first.gpu_status
    for _ in range(3):
        snap = await probe.poll()
        assert snap.gpu_status == "ok" and snap.gpu is not None
        assert snap.gpu.util == 96 and snap.gpu.throttle is None  # not read, not "none"
