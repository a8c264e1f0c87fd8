"""The twin against the real thing: the same requests to a live vLLM 0.32
(the CPU build) and to a twin claiming that version, and the answers must
have the same status codes, the same shapes (keys and JSON types, chunk by
chunk kind in a stream) and the same `vllm:` metric families with their
types, label names and buckets — less the differences the twin keeps on
purpose, each with its reason, in `sparktop/twin/dialects/vllm_differences.py`.

The offline twin of this test (tests/unit/test_twin_conformance_fixtures.py)
replays what vLLM 0.32 answered once; this one asks the installed vLLM now,
so a vLLM that changes what it says fails here first."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import pytest

from tests.helpers.conformance import compare, histogram_buckets, ignored, json_shape, metric_families, sse_shapes
from tests.helpers.real_vllm import MAX_MODEL_LEN, MODEL_NAME, VLLM_VERSION

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def capture_requests() -> dict[str, tuple[str, dict | None]]:
    """The requests scripts/capture_vllm.py recorded the fixtures with."""
    spec = importlib.util.spec_from_file_location("capture_vllm", ROOT / "scripts" / "capture_vllm.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.requests_for(MODEL_NAME, MAX_MODEL_LEN)


async def ask(client: httpx.AsyncClient, url: str, path: str, body: dict | None) -> httpx.Response:
    if body is None:
        return await client.get(url + path)
    return await client.post(url + path, json=body)


async def test_the_twin_answers_as_vllm_032_does(vllm_server, twin):
    server = await twin("llama-3.1-8b", "--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN),
                        "--enable-mfu-metrics", speed=50)
    twin_url = server.url
    problems: list[str] = []
    async with httpx.AsyncClient(timeout=120) as client:
        for name, (path, body) in capture_requests().items():
            real, mine = await ask(client, vllm_server.url, path, body), await ask(client, twin_url, path, body)
            if real.status_code != mine.status_code:
                problems.append(f"{name}: vLLM answered {real.status_code}, the twin {mine.status_code}")
                continue
            if name.endswith(".sse"):
                problems += compare(sse_shapes(real.content), sse_shapes(mine.content), ignored("sse"), name)
            elif name.endswith(".json"):
                problems += compare(json_shape(real.content), json_shape(mine.content), ignored("json"), name)
        version = (await client.get(twin_url + "/version")).json()["version"]
        real_metrics = (await client.get(vllm_server.url + "/metrics")).text
        twin_metrics = (await client.get(twin_url + "/metrics")).text
    assert version == VLLM_VERSION
    problems += compare(metric_families(real_metrics), metric_families(twin_metrics), ignored("metrics"), "")
    real_buckets, twin_buckets = histogram_buckets(real_metrics), histogram_buckets(twin_metrics)
    for family, bounds in real_buckets.items():
        # The token-count histograms' buckets follow each server's max_model_len (1-2-5 up to it).
        if family in twin_buckets and twin_buckets[family] != bounds:
            problems.append(f"{family}: buckets {bounds} in vLLM, {twin_buckets[family]} in the twin")
    assert not problems, "\n".join(problems)
