"""Make a shell on this machine behave like a Spark node.

`install(bin_dir)` writes `vllm`, `docker`, `ray`, `nvidia-smi` and `ping` commands
into `bin_dir`; a test host puts that directory first on its PATH and sets
`$SPARKTOP_TWIN_HOME` to its own state directory (`TwinHost.env()` gives
both). sparktop's real launch and monitor commands then run unchanged and
start, list and stop twins instead of containers on a GPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TOOLS = ("vllm", "docker", "ray", "nvidia-smi", "ping")
# In a container's environment (an image's ENV): the python of a real vLLM
# install; `vllm serve` then runs it instead of the twin.
REAL_VLLM = "SPARKTOP_REAL_VLLM"


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
