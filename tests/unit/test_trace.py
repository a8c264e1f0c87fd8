"""Traces to replay (bench/trace.py): the Mooncake lines AIPerf and GuideLLM
read, bad lines named by file and line, shared blocks the same text."""

from __future__ import annotations

import json

import pytest

from sparktop.bench.trace import BLOCK_TOKENS, TracePrompts, TraceRequest, load_trace
from sparktop.errors import SparktopError


def write(tmp_path, lines) -> str:
    p = tmp_path / "trace.jsonl"
    p.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines) + "\n")
    return str(p)


def test_a_mooncake_trace_reads_in_arrival_order_from_its_first_request(tmp_path):
    trace = load_trace(write(tmp_path, [
        {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]},
        {"timestamp": 27000, "input_length": 100, "output_length": 10},
        {"timestamp": 30000, "input_length": 7000, "output_length": 20, "hash_ids": [46, 47]},
    ]))
    assert [r.line for r in trace.requests] == [2, 1, 3]
    assert [r.offset_s for r in trace.requests] == pytest.approx([0.0, 0.482, 3.0])
    assert trace.requests[1].hash_ids == (46, 47, 48)
    assert trace.rate == pytest.approx(2 / 3.0)


@pytest.mark.parametrize("line, says", [
    ({"timestamp": 0, "input_length": 10}, ":2: missing output_length"),
    ({"input_length": 10, "output_length": 5}, ":2: missing timestamp"),
    ({"timestamp": -5, "input_length": 10, "output_length": 5}, ":2: timestamp must be"),
    ({"timestamp": 0, "input_length": 0, "output_length": 5}, ":2: input_length must be"),
    ({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": "abc"}, ":2: hash_ids must be"),
    ("{not json", ":2: not a JSON object"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, says):
    path = write(tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 5}, line])
    with pytest.raises(SparktopError) as exc:
        load_trace(path)
    assert str(exc.value).startswith(path) and says in str(exc.value) and "\n" not in str(exc.value)


def test_an_empty_or_missing_trace_says_so(tmp_path):
    with pytest.raises(SparktopError, match="no requests"):
        load_trace(write(tmp_path, [""]))
    with pytest.raises(SparktopError, match="--trace"):
        load_trace(tmp_path / "none.jsonl")


def test_requests_that_share_blocks_share_their_text():
    prompts = TracePrompts(words_per_token=1.0, seed=3)
    a = prompts.text(TraceRequest(1, 0.0, 2 * BLOCK_TOKENS + 100, 10, hash_ids=(5, 6, 7)))
    b = prompts.text(TraceRequest(2, 1.0, 2 * BLOCK_TOKENS + 40, 10, hash_ids=(5, 6, 9)))
    c = prompts.text(TraceRequest(3, 2.0, 2 * BLOCK_TOKENS, 10, hash_ids=(8, 6)))
    whole = " ".join(a.split()[: 2 * BLOCK_TOKENS])
    assert " ".join(b.split()[: 2 * BLOCK_TOKENS]) == whole  # the same two leading blocks
    assert a.split()[2 * BLOCK_TOKENS:] != b.split()[2 * BLOCK_TOKENS:]  # their own tails
    assert c.split()[:BLOCK_TOKENS] != a.split()[:BLOCK_TOKENS]  # another first block: nothing shared
    assert len(a.split()) == 2 * BLOCK_TOKENS + 100
