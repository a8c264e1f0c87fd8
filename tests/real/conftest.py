"""One real vLLM 0.32 server (the CPU build, a tiny Llama with dummy weights)
shared by every test in this package: it takes about a minute to start on
two cores and 3 GB to run, so it starts once, when the first test needs it.

These tests are marked `realvllm` (and `slow`): `pytest -m "not realvllm"`
leaves them out of a fast loop; the README's test command and CI run them.
When vLLM cannot be installed or does not start, every test here fails with
the reason — they are never skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import real_vllm

_failure: list[str] = []


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """The running server (url, model directory, log); stopped at the end."""
    reuse = os.environ.get("SPARKTOP_TEST_VLLM")  # URL,WORKDIR of a server left running while writing tests
    if reuse:
        url, workdir = reuse.split(",", 1)
        yield real_vllm.attach(url, Path(workdir))
        return
    if _failure:  # started once and failed: say so again, do not retry a minute each time
        pytest.fail(_failure[0], pytrace=False)
    try:
        server = real_vllm.start(tmp_path_factory.mktemp("real-vllm"))
    except RuntimeError as exc:
        _failure.append(str(exc))
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()
