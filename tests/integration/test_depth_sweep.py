"""Depth sweeps against a twin over real HTTP: each concurrency at each
context depth, the prefix cache reused or not, prefill figures that stay
physical, and the run exported as Spark Arena's files and read back.

The twin and the sweeps run on simulated time (tests/helpers/simulated.py):
a first token comes exactly when the twin's model says, so what a deep or a
reused context costs is asserted as the model's figure for the tokens the
server itself says it prefilled (its request log's prompt and cached
tokens), not as a ratio measured on this machine."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparktop.bench.arena import read_arena, write_arena
from sparktop.bench.compare import table
from sparktop.bench.results import load_run
from sparktop.bench.run import Run
from sparktop.bench.sweep import Sweep, SweepSettings
from sparktop.twin.server import TwinServer
from tests.helpers.simulated import sim_clock, sim_twin, simulated
from tests.helpers.sweep_sim import modeled_ttft


def settings(url: str, **kw) -> SweepSettings:
    base = dict(endpoint=url, levels=[1, 2], runs=2, pp=128, tg=16, metrics=False, latency_mode="none")
    base.update(kw)
    return SweepSettings(**base)


@dataclass
class DepthRuns:
    server: TwinServer
    cold: Run  # contexts sent once, cold
    warm: Run  # each context loaded into the prefix cache first
    served_cold: list[dict]  # the twin's request log during each run
    served_warm: list[dict]


@contextlib.asynccontextmanager
async def depth_runs(tmp_path: Path) -> AsyncIterator[DepthRuns]:
    """c1 and c2 at depths 0 and 4,096, cold then warm, on one twin on simulated time (call it in the test
    body: simulated time runs only there)."""
    clock = sim_clock()
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "served.jsonl"
    async with sim_twin("llama-3.1-8b", "--request-log", str(log), speed=4, clock=clock) as server:
        cold = await Sweep(settings(server.url, depths=[0, 4096], prefix_cache=False), tmp_path / "cold",
                           clock=clock).run()
        served = len(log.read_text().splitlines())
        warm = await Sweep(settings(server.url, depths=[0, 4096], prefix_cache=True), tmp_path / "warm",
                           clock=clock).run()
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        yield DepthRuns(server, load_run(cold.path), load_run(warm.path), lines[:served], lines[served:])


def deep_prompt(run: Run) -> int:
    """The prompt tokens of every measured request at depth 4,096 (one length: the context and the prompt)."""
    (tokens,) = {r.prompt_tokens for r in run.records if r.depth == 4096 and not r.context_load}
    return tokens


@simulated
async def test_each_concurrency_runs_at_each_depth(tmp_path):
    async with depth_runs(tmp_path) as runs:
        cold, server = runs.cold, runs.server
        assert [(lv.depth, lv.concurrency) for lv in cold.levels()] == [(0, 1), (0, 2), (4096, 1), (4096, 2)]
        by = {(lv.depth, lv.concurrency): lv for lv in cold.levels()}
        # The server counted the context: every request's prompt holds it, and none of it came from the cache.
        deep = deep_prompt(cold)
        assert deep >= 4096 + 128 - 16
        assert {x["cached_tokens"] for x in runs.served_cold if x["prompt_tokens"] == deep} == {0}
        # A cold context is prefilled with the prompt: a lone request's first token comes one prefill step of
        # its whole prompt after it arrives, later the deeper it is.
        (shallow,) = {r.prompt_tokens for r in cold.records if r.depth == 0}
        assert by[(0, 1)].ttft_ms_mean == pytest.approx(1000 * modeled_ttft(server, shallow), rel=1e-4)
        assert by[(4096, 1)].ttft_ms_mean == pytest.approx(1000 * modeled_ttft(server, deep), rel=1e-5)
        assert by[(4096, 1)].ttft_ms_mean > 3 * by[(0, 1)].ttft_ms_mean


@simulated
async def test_a_reused_context_is_not_counted_as_prefill(tmp_path):
    async with depth_runs(tmp_path) as runs:
        cold, warm, server = runs.cold, runs.warm, runs.server
        c_by = {(lv.depth, lv.concurrency): lv for lv in cold.levels()}
        w_by = {(lv.depth, lv.concurrency): lv for lv in warm.levels()}
        deep = deep_prompt(warm)
        # Loaded first, the context comes from the cache: the server reused all 4,096 tokens of it for every
        # request that followed its load ...
        assert {x["cached_tokens"] for x in runs.served_warm if x["prompt_tokens"] == deep} == {4096}
        # ... so the measured request's first token is one prefill step of the rest of its prompt away, much
        # sooner than the cold context's ...
        warm_ttft = modeled_ttft(server, deep, cached_tokens=4096)
        assert w_by[(4096, 1)].ttft_ms_mean == pytest.approx(1000 * warm_ttft, rel=1e-4)
        assert w_by[(4096, 1)].ttft_ms_mean < 0.5 * c_by[(4096, 1)].ttft_ms_mean
        # ... and its prefill rate is its prompt's, not 4,096 extra tokens over that short time: no faster than
        # the engine prefills a cold context (the "770,000 t/s" a tool that counts cached tokens prints).
        assert w_by[(4096, 1)].pp_tps_req == pytest.approx((deep - 4096) / warm_ttft, rel=1e-4)
        assert w_by[(4096, 1)].pp_tps_req <= 1.3 * c_by[(4096, 1)].pp_tps_req
        assert w_by[(4096, 1)].cached_prompt_tokens == 4096
        # The loads are kept, apart from the level's figures.
        loads = [r for r in warm.records if r.context_load]
        assert len(loads) == 2 * (1 + 2)  # a context per request of each measured batch at depth 4096
        assert w_by[(4096, 2)].context_load is not None and w_by[(4096, 2)].requests == 2 * 2


@simulated
async def test_depth_levels_compare_and_export_as_arena_files(tmp_path):
    async with depth_runs(tmp_path / "runs") as runs:
        cold, warm = runs.cold, runs.warm
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
