"""Depth sweeps against a twin over real HTTP: each concurrency at each
context depth, the prefix cache reused or not, prefill figures that stay
physical, and the run exported as Spark Arena's files and read back."""

from __future__ import annotations

import csv
import io

import pytest

from sparktop.bench.arena import read_arena, write_arena
from sparktop.bench.compare import table
from sparktop.bench.results import load_run
from sparktop.bench.sweep import Sweep, SweepSettings


def settings(url: str, **kw) -> SweepSettings:
    base = dict(endpoint=url, levels=[1, 2], runs=2, pp=128, tg=16, metrics=False, latency_mode="none")
    base.update(kw)
    return SweepSettings(**base)


@pytest.fixture
async def depth_runs(twin, tmp_path):
    server = await twin("llama-3.1-8b", speed=4)
    cold = await Sweep(settings(server.url, depths=[0, 4096], prefix_cache=False), tmp_path / "cold").run()
    warm = await Sweep(settings(server.url, depths=[0, 4096], prefix_cache=True), tmp_path / "warm").run()
    return load_run(cold.path), load_run(warm.path)


async def test_each_concurrency_runs_at_each_depth(depth_runs):
    cold, _ = depth_runs
    assert [(lv.depth, lv.concurrency) for lv in cold.levels()] == [(0, 1), (0, 2), (4096, 1), (4096, 2)]
    by = {(lv.depth, lv.concurrency): lv for lv in cold.levels()}
    # A cold context is prefilled with the prompt: the first token comes later the deeper it is.
    assert by[(4096, 1)].ttft_ms_mean > 3 * by[(0, 1)].ttft_ms_mean
    # The server counted the context: every request's prompt holds it.
    deep = [r for r in cold.records if r.depth == 4096]
    assert deep and all(r.prompt_tokens >= 4096 + 128 - 16 for r in deep)


async def test_a_reused_context_is_not_counted_as_prefill(depth_runs):
    cold, warm = depth_runs
    c_by = {(lv.depth, lv.concurrency): lv for lv in cold.levels()}
    w_by = {(lv.depth, lv.concurrency): lv for lv in warm.levels()}
    # Loaded first, the context comes from the cache: the measured request's first token is much sooner ...
    assert w_by[(4096, 1)].ttft_ms_mean < 0.5 * c_by[(4096, 1)].ttft_ms_mean
    # ... and its prefill rate is its prompt's, not 4,096 extra tokens over that short time: no faster than
    # the engine prefills a cold context (the "770,000 t/s" a tool that counts cached tokens prints).
    assert w_by[(4096, 1)].pp_tps_req <= 1.3 * c_by[(4096, 1)].pp_tps_req
    assert w_by[(4096, 1)].cached_prompt_tokens == 4096
    # The loads are kept, apart from the level's figures.
    loads = [r for r in warm.records if r.context_load]
    assert len(loads) == 2 * (1 + 2)  # a context per request of each measured batch at depth 4096
    assert w_by[(4096, 2)].context_load is not None and w_by[(4096, 2)].requests == 2 * 2


async def test_depth_levels_compare_and_export_as_arena_files(depth_runs, tmp_path):
    cold, warm = depth_runs
    names, levels, by_run = table([cold, warm])
    assert [f"c{k}" for k in levels] == ["c1", "c2", "c1 @4096", "c2 @4096"]
    out = write_arena(warm, tmp_path / "arena")
    rows = list(csv.DictReader(io.StringIO((out / "benchmark.csv").read_text())))
    names_csv = [r["test_name"] for r in rows]
    assert "pp128 @ d4096 (c2)" in names_csv and "ctx_pp @ d4096 (c2)" in names_csv
    back = read_arena(out)
    again = {(lv.depth, lv.concurrency): lv.tg_tps_total for lv in back.levels()}
    assert again == pytest.approx({(lv.depth, lv.concurrency): lv.tg_tps_total for lv in warm.levels()})


async def test_a_context_holds_exactly_its_depth_in_tokens(twin, tmp_path):
    """`--depth 4096` with a tokenizer: 4,096 tokens of context, as llama-benchy counts a depth (the text's own
    tokens; the system message's template is the engine's). Contexts sized from the prompt's words per token
    came out 8 % long with a vocabulary that splits the prompt words (measured: 6,484-6,562 prompt tokens
    for 2,048 + 4,096)."""
    from sparktop.twin.text import FileTokenizer, chat_prompt_ids
    from tests.helpers.tokenizer import book_text, train_tokenizer

    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", book_text())  # splits sparktop's words: the hard case
    server = await twin("llama-3.1-8b", "--tokenizer", str(tokenizer), speed=8)
    run = await Sweep(settings(server.url, depths=[0, 4096], levels=[1], runs=3, pp=256, tokenizer=str(tokenizer),
                               prefix_cache=True), tmp_path / "run").run()
    records = [r for r in load_run(run.path).records if not r.context_load]
    system = len(chat_prompt_ids([{"role": "system", "content": ""}], FileTokenizer(str(tokenizer)), 0)) - 1
    assert {r.prompt_tokens for r in records if r.depth == 0} == {256}
    assert {r.prompt_tokens for r in records if r.depth == 4096} == {256 + system + 4096}
