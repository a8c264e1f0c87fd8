"""vLLM started outside Docker, found with no --engine: on a lab host, over
ssh, `vllm serve` (the host's stand-in, a twin) as a plain process; `sparktop
status --json` on the lab inventory lists it with its port and how it was
found, and no longer once it is killed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.lab import Lab, free_port

pytestmark = [pytest.mark.lab]


def ssh(lab: Lab, host: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(lab.ssh_dir / "config"), "-o",
                           f"UserKnownHostsFile={lab.ssh_dir / 'known_hosts'}", "-o", "BatchMode=yes",
                           f"lab-{host}", command], capture_output=True, text=True, timeout=30, check=True)


def status(lab: Lab) -> dict:
    r = subprocess.run([sys.executable, "-m", "sparktop", "status", "--inventory", str(lab.inventory()), "--json"],
                       capture_output=True, text=True, env=lab.env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g}s")
        time.sleep(0.1)


def answers(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_vllm_started_as_a_plain_process_on_a_host_is_found_and_gone_once_it_stops(lab):
    host = lab.hosts[0]
    port = free_port(host.address)
    url = f"http://{host.address}:{port}"
    pid = int(ssh(lab, host.name, f"nohup vllm serve llama-3.1-8b --host {host.address} --port {port} "
                                  "--startup-speed 1000 > plain-vllm.log 2>&1 < /dev/null & echo $!").stdout)
    try:
        wait(lambda: answers(url), "the plain vllm serve answering")
        engines = [e for e in status(lab)["engines"] if e["url"].endswith(f":{port}")]
        # Only the host it is bound to shows it (the lab's hosts share one process table).
        assert [(e["url"], e["node"], e["state"], e["model"]) for e in engines] == [
            (url, host.name, "ready", "llama-3.1-8b")]
        assert engines[0]["found"] == f"process {pid} (vllm serve, port {port})"
        assert engines[0]["container"] is None
    finally:
        ssh(lab, host.name, f"kill {pid}")
    wait(lambda: not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes(),
         "its process gone")
    assert not [e for e in status(lab)["engines"] if e["url"].endswith(f":{port}")]
