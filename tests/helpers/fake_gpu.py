"""A PATH whose `nvidia-smi` answers the power query as a GB10 does, with
the watts read from a file the test changes: the twin stands in for the GPU
where a test must know exactly what power was read when."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def fake_gpu(tmp_path: Path, watts: float = 30.0) -> tuple[dict[str, str], Path]:
    """(env for a LocalTransport, the file holding the watts)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    power = tmp_path / "power"
    power.write_text(f"{watts}")
    script = bin_dir / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$*" in
  *query-gpu=power.draw*) cat {power}; echo ;;
  *clocks_event_reasons*) echo "NVIDIA GB10, 90, 61, $(cat {power}), 2405, P0, 0x0000000000000000" ;;
  *query-gpu*) echo "NVIDIA GB10, 90, 61, $(cat {power}), 2405, P0" ;;
  *query-compute-apps*) echo "4242, VLLM::EngineCore, 90000" ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, power
