"""`status` at 80 columns: whole cells in the columns that matter most, the rest named as left out."""

from __future__ import annotations

import io

from rich.console import Console

from sparktop.observe.snapshot import EngineSnapshot, Memory, NodeSnapshot
from sparktop.observe.state import ClusterState
from sparktop.status import print_tables


def _state() -> ClusterState:
    state = ClusterState()
    for name in ("spark-a", "spark-b"):
        state.apply(NodeSnapshot(name=name, t=0, state="ok", memory=Memory(total=128 << 30, available=38 << 30)))
    state.apply(EngineSnapshot(key="http://127.0.0.2:8000", url="http://127.0.0.2:8000", t=0, state="ready",
                               kind="vllm", engine="vLLM", version="0.32.0", model="openai/gpt-oss-120b",
                               running=3, waiting=0, gen_tps=212.5, prompt_tps=2855.3, kv_usage=0.015,
                               ttft_p50=0.1, itl_p50=0.006))
    return state


def _printed(width: int) -> str:
    out = io.StringIO()
    print_tables(_state(), Console(file=out, width=width, color_system=None))
    return out.getvalue()


def test_at_80_columns_every_cell_shown_is_whole_and_what_is_left_out_is_named():
    text = _printed(80)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for whole in ("127.0.0.2:8000", "vLLM 0.32.0", "gpt-oss-120b", "ready", "212.5", "spark-a", "90.0 / 128.0 GiB"):
        assert whole in text
    assert "left out at 80 columns: KV, wait, prompt t/s, TTFT p50, ITL p50" in text


def test_at_160_columns_nothing_is_left_out():
    text = _printed(160)
    assert "left out" not in text and "2855.3" in text and "6 ms" in text
