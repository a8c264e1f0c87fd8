"""A twin started by hand (`sparktop twin serve`) listens on 127.0.0.1 unless told, so no other address of
this machine (a demo node's 127.0.0.2) serves it."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from sparktop.twin.cluster import loopback_aliases_work
from tests.conftest import free_port


@pytest.mark.skipif(not loopback_aliases_work(), reason="needs 127.0.0.2")
def test_a_twin_started_by_hand_listens_on_loopback_only():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sparktop", "twin", "serve", "llama-3.1-8b", "--port", str(port),
                             "--speed", "4", "--startup-speed", "1000000"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the twin did not start"
            time.sleep(0.1)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.2:{port}/health", timeout=2)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"Starting vLLM API server 0 on http://127.0.0.1:{port}" in out
