"""A twin server in its own process, as a real engine would be."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from tests.conftest import free_port

# Each dialect's twin started on llama-3.1-8b, in that engine's own words (its model flag, a GGUF for llama.cpp).
DIALECT_ARGV = {
    "vllm": ["llama-3.1-8b"],
    "sglang": ["--model-path", "llama-3.1-8b"],
    "llama.cpp": ["-m", "/models/Llama-3.1-8B-Instruct-Q4_K_M.gguf", "-np", "4", "-c", "4096"],
    "trtllm": ["meta-llama/Llama-3.1-8B-Instruct"],
}


def start_twin_process(model: str, *flags: str, speed: float, cpu: str | None = None, port: int | None = None,
                       log=None) -> tuple[subprocess.Popen, str]:
    """`sparktop twin serve MODEL` on 127.0.0.1, started and healthy; (process, base URL)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "sparktop", "twin", "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--speed", str(speed), "--startup-speed", "1000000", *flags]
    if cpu is not None:
        cmd = ["taskset", "-c", cpu, *cmd]
    proc = subprocess.Popen(cmd, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT if log else
                            subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the twin ({model}) did not start on port {port}")
