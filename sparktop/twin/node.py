"""Make a shell on this machine behave like a Spark node.

`install(bin_dir)` writes the machine's commands into `bin_dir` (`docker`,
`ray`, `nvidia-smi` and `ping`, and `ethtool`, a shell script: the monitor
runs `ethtool -S` every second per RDMA port, so it starts no Python: it
prints what link.py keeps; `df`, a shell script too, the host's one disk as
its `disk` file says; `ip` and `ib_write_bw`, the fabric's, in
`fabric_tools.py`) and every program an engine's image runs that
the twin speaks: each dialect's programs (`dialects.PROGRAMS`: its
`engine_ids` row's, such as `vllm`, `sglang`, `llama-server` and
`rpc-server`, and the helpers its images run beside the server, such as
TensorRT-LLM's `trtllm-llmapi-launch`, `mpirun` and `sshd`). An engine's
program runs its dialect's `tool_main` (`vllm serve`, and `python -m
sglang.launch_server`, which the twin's docker runs as `sglang serve`). A
test host puts that directory first on its PATH and sets
`$SPARKTOP_TWIN_HOME` to its own state directory (`TwinHost.env()` gives
both). sparktop's real launch and monitor commands then run unchanged and
start, list and stop twins instead of containers on a GPU.

An image's environment may name a real engine instead (`SPARKTOP_REAL_VLLM`:
a python with vLLM's CPU build; `SPARKTOP_REAL_LLAMA_CPP`: a folder holding a
real `llama-server` and `ggml-rpc-server`): the dialect's stand-in then runs
it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from sparktop.twin.dialects import PROGRAMS

# The machine's own commands (`ethtool` is a shell script, written apart).
MACHINE_TOOLS = ("docker", "ray", "nvidia-smi", "ping")
FABRIC_TOOLS = ("ib_write_bw",)  # twin/fabric_tools.py: the RDMA test (its `ip` is a shell script, written apart)
TOOLS = (*MACHINE_TOOLS, *FABRIC_TOOLS, *PROGRAMS)


def main(tool: str, argv: list[str]) -> int:
    # Imports are per tool: `docker ps` every second must not load aiohttp, nor any dialect.
    if tool == "docker":
        from sparktop.twin.docker import main as run
    elif tool == "nvidia-smi":
        from sparktop.twin.nvidia_smi import main as run
    elif tool == "ray":
        from sparktop.twin.ray import main as run
    elif tool == "ping":
        from sparktop.twin.ping import main as run
    elif tool in FABRIC_TOOLS:
        from sparktop.twin.fabric_tools import main as fabric

        return fabric(tool, argv)
    elif tool in PROGRAMS:
        # An engine's program: its dialect's module is imported only now, when it runs.
        from sparktop.twin.dialects import dialect_for

        engine = PROGRAMS[tool]
        return dialect_for(engine).tool_main(tool, argv, _serve(engine))
    else:
        print(f"unknown twin tool {tool!r}", file=sys.stderr)
        return 2
    return run(argv)


def _serve(engine: str) -> Callable[[list[str]], int]:
    """What a dialect's `tool_main` runs its server with: `serve_main` for its engine, loaded when it serves."""

    def serve(argv: list[str]) -> int:
        from sparktop.twin.server import serve_main

        return serve_main(argv, engine=engine)

    return serve


# `ethtool IFACE`, `ethtool -S IFACE` (the counters link.py writes, in the
# driver's names) and `ethtool -i IFACE`, from the host's files; messages and
# exit codes as ethtool's.
ETHTOOL = r"""#!/bin/sh
# sparktop twin: ethtool [-S|-i] IFACE, from the simulated host's files
home=${SPARKTOP_TWIN_HOME:?SPARKTOP_TWIN_HOME is not set}
case $1 in
  -S|--statistics|-i|--driver) opt=$1; dev=$2 ;;
  -*) echo "ethtool: bad command line argument(s)" >&2; echo "For more information run ethtool -h" >&2; exit 1 ;;
  *) opt=; dev=$1 ;;
esac
net=$home/sys/class/net/$dev
if [ -z "$dev" ] || [ ! -e "$net/operstate" ]; then
  case $opt in
    -S|--statistics) echo "Cannot get stats strings information: No such device" >&2; exit 94 ;;
    -i|--driver) echo "Cannot get driver information: No such device" >&2; exit 71 ;;
    *) echo "netlink error: no device matches name (offset 24)" >&2; echo "netlink error: No such device" >&2
       exit 1 ;;
  esac
fi
case $dev in
  enp1s0f0np0) bus=0000:01:00.0 ;; enp1s0f1np1) bus=0000:01:00.1 ;;
  enP2p1s0f0np0) bus=0002:01:00.0 ;; enP2p1s0f1np1) bus=0002:01:00.1 ;;
  enP7s7) bus=0007:01:00.0 ;; *) bus= ;;
esac
case $dev in en[pP]*np[01]) driver=mlx5_core; fw="28.45.4028 (NVD0000000087)" ;; *) driver=r8127; fw= ;; esac
case $opt in
  -S|--statistics)
    if [ -r "$home/net/$dev.ethtool" ]; then exec cat "$home/net/$dev.ethtool"; fi
    echo "no stats available" >&2; exit 94 ;;
  -i|--driver)
    [ -n "$bus" ] || { echo "Cannot get driver information: Operation not supported" >&2; exit 71; }
    printf 'driver: %s
version: 6.17.0-1014-nvidia
firmware-version: %s
expansion-rom-version: 
' "$driver" "$fw"
    printf 'bus-info: %s
supports-statistics: yes
supports-test: yes
supports-eeprom-access: no
' "$bus"
    printf 'supports-register-dump: no
supports-priv-flags: yes
'
    exit 0 ;;
esac
read -r state < "$net/operstate"
speed=-1; [ -r "$net/speed" ] && read -r speed < "$net/speed"
echo "Settings for $dev:"
if [ "$state" = up ] && [ "$speed" -gt 0 ] 2>/dev/null; then
  printf '	Speed: %sMb/s
	Duplex: Full
	Auto-negotiation: on
	Link detected: yes
' "$speed"
else
  printf '	Speed: Unknown!
	Duplex: Unknown! (255)
	Auto-negotiation: on
	Link detected: no
'
fi
"""


# `df [-P] [-k] [PATH...]`: every path on the host's one disk (`TwinHost.set_disk`), in POSIX's format and 1024-byte
# blocks as GNU df prints it, the capacity used rounded up; a path that does not exist is an error, as df's.
DF = r"""#!/bin/sh
# sparktop twin: df [-P] [-k] [PATH...], for the simulated host's one disk
home=${SPARKTOP_TWIN_HOME:?SPARKTOP_TWIN_HOME is not set}
read -r total free < "$home/disk" || { echo "df: cannot read $home/disk" >&2; exit 1; }
k=$((total / 1024)); a=$((free / 1024)); u=$((k - a)); c=0
[ "$k" -gt 0 ] && c=$(( (u * 100 + k - 1) / k ))
echo "Filesystem     1024-blocks       Used  Available Capacity Mounted on"
row() { printf '%-14s %11s %10s %10s %7s%% /
' /dev/nvme0n1p2 "$k" "$u" "$a" "$c"; }
rc=0; paths=0
for p in "$@"; do
  case $p in -*) continue ;; esac
  paths=1
  if [ -e "$p" ]; then row; else echo "df: $p: No such file or directory" >&2; rc=1; fi
done
[ "$paths" = 1 ] || row
exit $rc
"""


def install(bin_dir: str | Path) -> Path:
    """Write the stand-in commands into `bin_dir` (created if needed)."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("ethtool", ETHTOOL), ("df", DF)):
        (bin_dir / name).write_text(text)
        os.chmod(bin_dir / name, 0o755)
    src = Path(__file__).resolve().parents[2]
    for tool in TOOLS:
        script = bin_dir / tool
        script.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"sys.path.insert(0, {str(src)!r})\n"
            "from sparktop.twin.node import main\n"
            f"sys.exit(main({tool!r}, sys.argv[1:]))\n"
        )
        os.chmod(script, 0o755)
    from sparktop.twin.fabric_tools import ip_script  # here, not on top: every run of a tool imports node.py

    (bin_dir / "ip").write_text(ip_script(sys.executable, str(src)))
    os.chmod(bin_dir / "ip", 0o755)
    return bin_dir
