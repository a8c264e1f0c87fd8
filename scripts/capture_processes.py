"""Capture the probe's `@@servers` section (vLLM outside Docker) on this machine.

    python scripts/capture_processes.py tests/fixtures/processes

Starts, as plain processes: a twin through the test hosts' `vllm` stand-in
(`vllm serve MODEL ...`, what a lab host runs), a twin as `python -m
sparktop twin serve`, a stand-in `vllm serve` that listens on its --port, one
without --port that has not bound yet, a TP worker (`--headless`), one moved
into a cgroup named like Docker's (`docker/<id>`, needs root and cgroup v1's
pids hierarchy; skipped otherwise), and a stand-in `python -m
vllm.entrypoints.openai.api_server`. Then runs the section exactly as the
probe sends it, with `sh`: as this user (root: every descriptor readable),
again with no `ss` on PATH (the listening sockets from /proc/net/tcp{,6}),
and as `nobody` (another user's descriptors cannot be read), and writes each
output verbatim. Whatever else runs on the machine is in it too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparktop.observe.host_probe import servers_script  # noqa: E402
from sparktop.twin.node import install  # noqa: E402

FAKE = '''#!{python}
"""A stand-in vLLM API server: listens on its --port (not as a --headless worker) and waits."""
import socket, sys, time
args = sys.argv[1:]
if "--port" in args and "--headless" not in args:
    host = args[args.index("--host") + 1] if "--host" in args else "0.0.0.0"
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(args[args.index("--port") + 1])))
    s.listen()
time.sleep(3600)
'''
CGROUP = Path("/sys/fs/cgroup/pids")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="sparktop-capture-"))
    os.chmod(tmp, 0o755)
    fake_bin, twin_bin, pkg = tmp / "bin", tmp / "twin-bin", tmp / "pkg"
    fake_bin.mkdir()
    (fake_bin / "vllm").write_text(FAKE.format(python=sys.executable))
    (fake_bin / "vllm").chmod(0o755)
    install(twin_bin)
    module = pkg / "vllm/entrypoints/openai"
    module.mkdir(parents=True)
    for d in (pkg / "vllm", pkg / "vllm/entrypoints", module):
        (d / "__init__.py").write_text("")
    (module / "api_server.py").write_text(FAKE.format(python=sys.executable))
    ports = {name: free_port() for name in ("stand-in", "twin", "fake", "container", "api_server")}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen] = []
    cgroup: Path | None = None

    def start(argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp, **kw)
        procs.append(proc)
        return proc

    try:
        start([str(twin_bin / "vllm"), "serve", "llama-3.1-8b", "--host", "127.0.0.1", "--port",
               str(ports["stand-in"]), "--startup-speed", "1000"], env=env)
        start([sys.executable, "-m", "sparktop", "twin", "serve", "--model", "llama-3.1-8b", "--host", "127.0.0.1",
               "--port", str(ports["twin"]), "--startup-speed", "1000"], env=env)
        start([str(fake_bin / "vllm"), "serve", "Qwen/Qwen3-1.7B", "--host", "127.0.0.1", "--port",
               str(ports["fake"]), "--gpu-memory-utilization", "0.5"])
        start([str(fake_bin / "vllm"), "serve", "Qwen/Qwen3-1.7B", "--host", "127.0.0.1"])  # not bound yet
        start([str(fake_bin / "vllm"), "serve", "Qwen/Qwen3-1.7B", "-tp", "2", "--distributed-executor-backend",
               "mp", "--nnodes", "2", "--node-rank", "1", "--headless"])
        boxed = start([str(fake_bin / "vllm"), "serve", "Qwen/Qwen3-1.7B", "--host", "127.0.0.1", "--port",
                       str(ports["container"])])
        start([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "tiny-llama", "--host",
               "127.0.0.1", "--port", str(ports["api_server"])], env={**os.environ, "PYTHONPATH": str(pkg)})
        if os.geteuid() == 0 and CGROUP.is_dir():
            cgroup = CGROUP / "docker" / secrets.token_hex(32)
            cgroup.mkdir(parents=True)
            (cgroup / "cgroup.procs").write_text(str(boxed.pid))
        else:
            print("not root or no cgroup v1 pids hierarchy: no process in a container", file=sys.stderr)
        for port in ports.values():
            wait_listening(port)
        script = servers_script()
        runs = {"root": ["sh", "-c", script]}
        # A node without iproute2's `ss`: the listening sockets come from /proc/net/tcp and tcp6.
        no_ss = tmp / "no-ss"
        no_ss.mkdir()
        for tool in ("sh", "grep", "tr", "ls"):
            (no_ss / tool).symlink_to(shutil.which(tool) or tool)
        runs["root_no-ss"] = ["env", f"PATH={no_ss}", "sh", "-c", script]
        if os.geteuid() == 0 and shutil.which("setpriv"):
            runs["nobody"] = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script]
        for who, argv in runs.items():
            out = subprocess.run(argv, capture_output=True, text=True, cwd="/", check=True).stdout
            path = args.out / f"servers-section_{who}.txt"
            path.write_text(out)
            print(f"{path}: {len(out.splitlines())} lines")
        print("pids:", {p.pid: " ".join(p.args[1:4]) for p in procs}, "ports:", ports)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        if cgroup is not None:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
            with contextlib.suppress(OSError):
                cgroup.parent.rmdir()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
