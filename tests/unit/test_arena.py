"""Spark Arena's profile and submission files (sparktop/bench/arena.py).

The CSV is held to llama-benchy 0.4.0 itself, which has no reader for its
CSV: (1) our file is rebuilt into llama-benchy's own result models
(`BenchmarkRun`, `BenchmarkMetric`) in its venv and written again by its own
`save_report(format="csv")`: the bytes must not change; (2) a CSV the real
llama-benchy wrote against a twin (depth 0 and a small depth, prefix caching
on, two concurrencies) is read by `read_benchy_csv` and written again by
`csv_text`, byte for byte."""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from sparktop import __version__
from sparktop.bench.arena import (
    ARENA_V2,
    CSV_COLUMNS,
    ArenaLevel,
    arena_levels,
    cells,
    csv_text,
    is_arena_dir,
    profile,
    read_arena,
    read_benchy_csv,
    submit_instructions,
    write_arena,
)
from sparktop.bench.request import RequestRecord
from sparktop.bench.run import Run
from sparktop.bench.stats import level_stats
from sparktop.errors import SparktopError
from tests.helpers.venvs import llama_benchy

PP, TG, RUNS, LATENCY = 512, 16, 3, 0.002
HEADER = ",".join(CSV_COLUMNS) + "\r\n"


# -- runs made here ---------------------------------------------------------------------------------------


def _records(depth: int, c: int, t0: float, context_load: bool = False) -> list[RequestRecord]:
    """RUNS complete batches of c requests at a depth, with times that differ request by request."""
    out = []
    for run in range(1, RUNS + 1):
        for i in range(c):
            start = t0 + run * 10 + i * 0.001
            prefill = 0.05 + depth / 40000 + 0.01 * i + 0.003 * run
            first = start + prefill
            step = 0.02 + 0.002 * c + 0.001 * i
            rec = RequestRecord(level=c, run=run, index=i, start=start, first_response=first - 0.0005,
                                first_token=first, end=first + step * TG + 0.001,
                                prompt_tokens=depth if context_load else PP + depth, completion_tokens=TG,
                                token_times=[first + step * k for k in range(TG)], status=200,
                                counted_by="token_ids", depth=depth)
            if context_load:
                rec.context_load = True  # type: ignore[attr-defined]  # how a sweep would mark that phase
            out.append(rec)
    return out


def native_run(cell_list: list[tuple[int, int]], context_loads: bool = True) -> Run:
    """A sweep's run over (depth, concurrency) cells, as it reads back once levels have a depth: each level's
    statistics from its own requests, the context-load phase beside it at a depth."""
    records, levels = [], []
    for n, (depth, c) in enumerate(cell_list):
        recs = _records(depth, c, 1000.0 * n)
        records += recs
        batches = [[r for r in recs if r.run == k] for k in range(1, RUNS + 1)]
        lv = level_stats(c, batches, LATENCY, PP + depth)
        lv.depth = depth  # type: ignore[attr-defined]  # the field the other half of issue 28 adds
        if depth and context_loads:
            loads = _records(depth, c, 1000.0 * n - 500, context_load=True)
            records += loads
            lv.context_load = level_stats(  # type: ignore[attr-defined]
                c, [[r for r in loads if r.run == k] for k in range(1, RUNS + 1)], LATENCY, depth)
        levels.append(lv)
    meta = {"id": "20261125-120000-llama-3.1-8b-tp=2", "model": "llama-3.1-8b", "sparktop_version": __version__,
            "recipe": "llama-3.1-8b", "topology": "tp=2", "nodes": ["spark-a", "spark-b"], "runtime": "vllm",
            "image": "vllm/vllm-openai:v0.11.0", "engine": "vLLM", "endpoint": "http://spark-a:8000",
            "vllm_version": "0.11.0", "started": 1764072000.0, "ended": 1764075600.0, "latency_s": LATENCY,
            "settings": {"pp": PP, "tg": TG, "runs": RUNS, "prefix_cache": True}, "status": "complete"}
    return Run(None, meta, records, {}, levels)


CELLS = [(4096, 2), (0, 1), (512, 1), (0, 2), (4096, 1)]  # the order they "ran" (their records' times)


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# -- the profile ------------------------------------------------------------------------------------------


def test_the_profile_is_spark_arena_v2_as_published():
    assert ARENA_V2.depths == (0, 4096, 8192, 16384, 32768, 65535, 100000)
    assert ARENA_V2.concurrencies == (1, 2, 5, 10)
    assert (ARENA_V2.pp, ARENA_V2.tg, ARENA_V2.runs, ARENA_V2.prefix_caching) == (2048, 128, 3, True)
    order = cells()
    assert len(order) == 28 and len(set(order)) == 28
    assert set(order) == set(itertools.product(ARENA_V2.depths, ARENA_V2.concurrencies))
    assert order[:3] == [(8192, 5), (4096, 5), (8192, 10)] and order[-1] == (100000, 10)
    assert order.index((16384, 1)) == 13  # "d16384 c1 sits at index 13 of 28"
    # Heat-aware: the hottest cells (concurrency 10 at a depth) come every fifth, never two together.
    assert [order[i] for i in range(2, 28, 5)] == [(8192, 10), (65535, 10), (4096, 10), (16384, 10),
                                                     (32768, 10), (100000, 10)]
    assert profile("@official/spark-arena-v2") is ARENA_V2 is profile("spark-arena-v2")
    with pytest.raises(SparktopError, match="unknown profile"):
        profile("spark-arena-v9")


def test_the_profile_sets_a_sweep_and_llama_benchy_per_cell():
    s = ARENA_V2.settings()
    assert s["levels"] == [1, 2, 5, 10] and s["depths"][-1] == 100000
    assert (s["pp"], s["tg"], s["runs"], s["prefix_cache"], s["warmup"]) == (2048, 128, 3, True, True)
    assert s["cells"][0] == [8192, 5] and len(s["cells"]) == 28
    assert ARENA_V2.warmup_first_cell_only
    from sparktop.bench.sweep import SweepSettings

    known = set(SweepSettings.__dataclass_fields__)
    assert {"levels", "pp", "tg", "runs", "prefix_cache", "warmup"} <= known  # "depths", "cells": issue 28's
    first = ARENA_V2.llama_benchy_args(8192, 5, first=True)
    assert first == ["--pp", "2048", "--depth", "8192", "--tg", "128", "--concurrency", "5", "--runs", "3",
                     "--enable-prefix-caching"]
    assert ARENA_V2.llama_benchy_args(4096, 5)[-2:] == ["--no-warmup", "--skip-coherence"]


# -- writing and reading back -----------------------------------------------------------------------------


def test_the_csv_has_llama_benchys_header_rows_and_figures(tmp_path):
    run = native_run(CELLS)
    write_arena(run, tmp_path / "out")
    raw = (tmp_path / "out" / "benchmark.csv").read_bytes()
    assert raw.startswith(HEADER.encode()) and raw.count(b"\r\n") == raw.count(b"\n")  # CRLF, as csv writes
    rows = _rows(tmp_path / "out" / "benchmark.csv")
    assert [r["test_name"] for r in rows] == [
        "ctx_pp @ d4096 (c2)", "ctx_tg @ d4096 (c2)", "pp512 @ d4096 (c2)", "tg16 @ d4096 (c2)",
        "pp512 (c1)", "tg16 (c1)",
        "ctx_pp @ d512 (c1)", "ctx_tg @ d512 (c1)", "pp512 @ d512 (c1)", "tg16 @ d512 (c1)",
        "pp512 (c2)", "tg16 (c2)",
        "ctx_pp @ d4096 (c1)", "ctx_tg @ d4096 (c1)", "pp512 @ d4096 (c1)", "tg16 @ d4096 (c1)"]
    assert {r["model"] for r in rows} == {"llama-3.1-8b"}
    lv = run.levels()[0]  # d4096 c2
    pp, tg = rows[2], rows[3]
    assert float(pp["t_s_mean"]) == lv.pp_tps_total and float(pp["t_s_req_mean"]) == lv.pp_tps_req
    assert float(pp["e2e_ttft_mean"]) == lv.ttft_ms_mean and float(pp["e2e_ttft_std"]) == lv.ttft_ms_std
    assert float(tg["t_s_mean"]) == lv.tg_tps_total_llama_benchy and float(tg["peak_ts_mean"]) == lv.peak_tps
    # What LevelStats does not keep comes from the requests: ttfr, est_ppt (ttfr less the latency).
    assert float(pp["ttfr_mean"]) == pytest.approx(lv.ttft_ms_mean - 0.5)
    assert float(pp["est_ppt_mean"]) == pytest.approx(float(pp["ttfr_mean"]) - LATENCY * 1000)
    # Empty where llama-benchy writes nothing: no peak on a pp row, no latencies on a tg row.
    assert pp["peak_ts_mean"] == pp["peak_ts_req_std"] == "" and tg["ttfr_mean"] == tg["e2e_ttft_std"] == ""
    # At c1 llama-benchy's per-request figure is its total.
    c1 = rows[4]
    assert (c1["t_s_mean"], c1["t_s_std"]) == (c1["t_s_req_mean"], c1["t_s_req_std"])
    for r in rows:
        for col in CSV_COLUMNS[2:]:
            assert r[col] == "" or repr(float(r[col])) == r[col]  # Python's float repr, as llama-benchy's


def test_llama_benchys_own_models_and_writer_give_back_the_same_bytes(tmp_path):
    """Our CSV rebuilt into llama-benchy's BenchmarkRun/BenchmarkMetric (pydantic: every figure a float,
    a mean always with its std) and written by its own save_report: nothing changes."""
    write_arena(native_run(CELLS), tmp_path / "out")
    ours = tmp_path / "out" / "benchmark.csv"
    script = r'''
import csv, re, sys
from llama_benchy.results import BenchmarkMetadata, BenchmarkMetric, BenchmarkResults, BenchmarkRun
src, dst = sys.argv[1:3]
with open(src, newline="") as f:
    rows = list(csv.DictReader(f))
runs, pp, tg = {}, None, None
for r in rows:
    m = re.fullmatch(r"(ctx_)?(pp|tg)(\d*)(?: @ d(\d+))?(?: \(c(\d+)\))?", r["test_name"])
    if m[3]:
        pp, tg = (int(m[3]), tg) if m[2] == "pp" else (pp, int(m[3]))
    run = runs.setdefault((bool(m[1]), int(m[4] or 0), int(m[5] or 1)), {})
    def metric(col):
        if r[col + "_mean"] == "":
            assert r[col + "_std"] == "", (r["test_name"], col)
            return None
        return BenchmarkMetric(mean=float(r[col + "_mean"]), std=float(r[col + "_std"]), values=[])
    if m[2] == "pp":
        run.update(pp_throughput=metric("t_s"), pp_req_throughput=metric("t_s_req"), ttfr=metric("ttfr"),
                   est_ppt=metric("est_ppt"), e2e_ttft=metric("e2e_ttft"))
    else:
        run.update(tg_throughput=metric("t_s"), tg_req_throughput=metric("t_s_req"),
                   peak_throughput=metric("peak_ts"), peak_req_throughput=metric("peak_ts_req"))
res = BenchmarkResults()
res.model_name = rows[0]["model"]
res.runs = [BenchmarkRun(concurrency=c, context_size=d, prompt_size=pp, response_size=tg,
                         is_context_prefill_phase=ctx, **figures) for (ctx, d, c), figures in runs.items()]
top = max(c for (_, _, c) in runs)
res.metadata = BenchmarkMetadata(version="0.4.0", timestamp="", latency_mode="api", latency_ms=0.0,
                                 model=res.model_name, prefix_caching_enabled=True, max_concurrency=top)
res.save_report(dst, "csv", top)
'''
    python = llama_benchy().parent / "python"
    theirs = tmp_path / "theirs.csv"
    r = subprocess.run([str(python), "-c", script, str(ours), str(theirs)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert theirs.read_bytes() == ours.read_bytes()


def test_read_arena_gives_back_the_figures_and_writes_the_same_files(tmp_path):
    run = native_run(CELLS)
    write_arena(run, tmp_path / "a", extra_meta={"recipe": {"registry": "mine"}})
    back = read_arena(tmp_path / "a")
    assert back.meta["status"] == "imported" and back.meta["model"] == "llama-3.1-8b"
    s = back.meta["settings"]
    assert (s["pp"], s["tg"], s["runs"], s["prefix_cache"]) == (PP, TG, RUNS, True)
    assert (s["levels"], s["depths"]) == ([1, 2], [0, 512, 4096])
    assert (back.meta["topology"], back.meta["nodes"], back.meta["image"]) == \
        ("tp=2", ["spark-a", "spark-b"], "vllm/vllm-openai:v0.11.0")
    mine = {(a.depth, a.concurrency): a for a in arena_levels(run)}
    theirs = back.levels()
    assert [(a.depth, a.concurrency) for a in theirs] == CELLS  # file order: the order they ran
    for a in theirs:
        assert isinstance(a, ArenaLevel)
        m = mine[(a.depth, a.concurrency)]
        for name in ("pp_tps_total", "pp_tps_total_std", "pp_tps_req", "pp_tps_req_std", "tg_tps_total",
                     "tg_tps_total_std", "tg_tps_req", "tg_tps_req_std", "peak_tps", "peak_tps_std",
                     "peak_tps_req", "peak_tps_req_std", "ttfr_ms_mean", "ttfr_ms_std", "est_ppt_ms_mean",
                     "est_ppt_ms_std", "ttft_ms_mean", "ttft_ms_std"):
            assert getattr(a, name) == getattr(m, name), (a.depth, a.concurrency, name)  # exact: repr floats
        assert a.tg_tps_total_llama_benchy == a.tg_tps_total
        assert (a.context_load is None) == (a.depth == 0)
        if a.context_load is not None:
            assert m.context_load is not None
            assert a.context_load.pp_tps_total == m.context_load.pp_tps_total
            assert a.context_load.tg_tps_total == m.context_load.tg_tps_total
        assert a.runs == RUNS and a.requests == RUNS * a.concurrency
    # And written again: the same three files, byte for byte.
    write_arena(back, tmp_path / "b")
    for name in ("recipe.yaml", "benchmark.csv", "metadata.json"):
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name


def test_a_run_of_today_without_depths_exports_too(tmp_path):
    """Before levels have a depth: a concurrency sweep's levels straight from its requests, all at depth 0."""
    records = [r for c in (1, 2) for r in _records(0, c, 100.0 * c)]
    meta = {"id": "r", "model": "m", "latency_s": LATENCY, "settings": {"pp": PP, "tg": TG, "runs": RUNS}}
    run = Run(None, meta, records, {})
    write_arena(run, tmp_path / "out")
    rows = _rows(tmp_path / "out" / "benchmark.csv")
    assert [r["test_name"] for r in rows] == ["pp512 (c1)", "tg16 (c1)", "pp512 (c2)", "tg16 (c2)"]
    assert float(rows[2]["t_s_mean"]) == run.levels()[1].pp_tps_total
    assert rows[2]["ttfr_mean"] != ""  # worked out from the requests


def test_metadata_says_what_ran_and_keeps_sparkruns_keys(tmp_path):
    write_arena(native_run(CELLS), tmp_path / "out", recipe_text="model: x\ncontainer: img\n",
                extra_meta={"runtime_info": {"cuda": "13.0"}})
    text = (tmp_path / "out" / "metadata.json").read_text()
    meta = json.loads(text)
    assert not text.endswith("\n")  # json.dumps(metadata, indent=2), as sparkrun writes it
    assert {"recipe", "timing", "cluster", "benchmark", "model", "runtime_info", "sparktop"} <= set(meta)
    ours = meta["sparktop"]
    assert ours["version"] == __version__ and ours["nodes"] == ["spark-a", "spark-b"]
    assert (ours["runtime"], ours["image"], ours["model"], ours["topology"]) == \
        ("vllm", "vllm/vllm-openai:v0.11.0", "llama-3.1-8b", "tp=2")
    assert ours["when"] == "2025-11-25T12:00:00+00:00"
    assert meta["recipe"]["hash"] == hashlib.sha256(b"model: x\ncontainer: img\n").hexdigest()
    assert meta["recipe"]["container"] == "vllm/vllm-openai:v0.11.0" and meta["recipe"]["runtime"] == "vllm"
    assert meta["cluster"] == {"cluster_id": "tp=2", "node_count": 2, "tp": 2}
    assert meta["timing"]["duration"] == 3600.0
    assert meta["runtime_info"] == {"vllm": "0.11.0", "cuda": "13.0"}
    bench = meta["benchmark"]
    assert bench["framework"] == "sparktop" and bench["profile"] is None  # five cells of 28, pp 512
    assert bench["args"] == {"depth": [0, 512, 4096], "pp": [PP], "tg": [TG], "concurrency": [1, 2],
                             "prefix_caching": True, "runs": RUNS}
    assert any("cells missing" in p for p in ours["not_the_profile"])
    assert (tmp_path / "out" / "recipe.yaml").read_text() == "model: x\ncontainer: img\n"
    assert ours["recipe_given"] is True  # and in sparkrun's format: sparkrun can run it as it is
    assert f"  sparkrun arena benchmark {tmp_path / 'out' / 'recipe.yaml'} --hosts spark-a,spark-b" in \
        submit_instructions(tmp_path / "out")


def _full_profile_run() -> Run:
    levels = []
    for i, (d, c) in enumerate(cells()):
        a = ArenaLevel(concurrency=c, runs=3, requests=3 * c, errors=0, timeouts=0, pp_tps_total=3000.0 + i,
                       pp_tps_req=2000.0 + i, tg_tps_total=50.0 * c, tg_tps_req=50.0, ttft_ms_mean=700.0,
                       ttft_ms_p50=None, ttft_ms_p95=None, ttft_ms_std=5.0, peak_tps=55.0 * c,
                       pp_tps_total_std=1.0, tg_tps_total_std=0.5, depth=d, pp_tps_req_std=1.5,
                       tg_tps_req_std=0.25, peak_tps_std=0.1, peak_tps_req=56.0, peak_tps_req_std=0.2,
                       ttfr_ms_mean=690.0, ttfr_ms_std=5.0, est_ppt_ms_mean=689.0, est_ppt_ms_std=5.0)
        if d:
            a.context_load = ArenaLevel(concurrency=c, runs=3, requests=3 * c, errors=0, timeouts=0,
                                        pp_tps_total=2500.0, pp_tps_req=2400.0, tg_tps_total=45.0, tg_tps_req=44.0,
                                        ttft_ms_mean=float(d), ttft_ms_p50=None, ttft_ms_p95=None,
                                        ttft_ms_std=1.0, peak_tps=50.0, pp_tps_total_std=1.0,
                                        tg_tps_total_std=1.0, depth=d)
        levels.append(a)
    meta = {"id": "full", "model": "openai/gpt-oss-120b", "nodes": ["spark-a"], "recipe": "gpt-oss-120b",
            "settings": {"pp": 2048, "tg": 128, "runs": 3, "prefix_cache": True}}
    return Run(None, meta, [], {}, levels)


def test_a_full_profile_run_is_named_as_the_profile_and_in_its_order(tmp_path):
    write_arena(_full_profile_run(), tmp_path / "out")
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["benchmark"]["profile"] == "@official/spark-arena-v2" and meta["sparktop"]["not_the_profile"] == []
    rows = _rows(tmp_path / "out" / "benchmark.csv")
    assert len(rows) == 104  # 6 depths x 4 kinds x 4 concurrencies + depth 0 x 2 kinds x 4
    assert [r["test_name"] for r in rows[:6]] == [
        "ctx_pp @ d8192 (c5)", "ctx_tg @ d8192 (c5)", "pp2048 @ d8192 (c5)", "tg128 @ d8192 (c5)",
        "ctx_pp @ d4096 (c5)", "ctx_tg @ d4096 (c5)"]
    assert "pp2048 (c1)" in [r["test_name"] for r in rows]
    # A context-load phase with no ttfr or spreads: empty fields, as llama-benchy leaves a figure it lacks.
    assert rows[0]["ttfr_mean"] == rows[0]["t_s_req_std"] == ""
    lines = submit_instructions(tmp_path / "out")
    assert not any(line.startswith("Not the spark-arena-v2") for line in lines)


def test_submit_instructions_upload_nothing_and_say_what_to_run(tmp_path):
    write_arena(native_run(CELLS), tmp_path / "out")
    lines = submit_instructions(tmp_path / "out")
    assert lines[0] == "Nothing was uploaded: sparktop sends results nowhere."
    assert "(16 rows in llama-benchy 0.4's CSV)" in lines[1]
    assert any(line.startswith("Not the spark-arena-v2 profile") and "24 of its 28 cells missing" in line
               and "pp 512 tg 16" in line and "cells outside it (d512 c1)" in line for line in lines)
    assert "  sparkrun arena login" in lines
    # No recipe was given: recipe.yaml is a stand-in with the facts known, not one to run.
    assert "  sparkrun arena benchmark <your sparkrun recipe> --hosts spark-a,spark-b" in lines
    assert "the recipe that served it was not given" in (tmp_path / "out" / "recipe.yaml").read_text()
    assert is_arena_dir(tmp_path / "out") and not is_arena_dir(tmp_path)


def test_files_sparkrun_wrote_read_as_a_run(tmp_path):
    """A submission as sparkrun writes it (its metadata keys, its recipe format, no sparktop block)."""
    d = tmp_path / "sub1786493259764"
    d.mkdir()
    full = _full_profile_run()
    (d / "benchmark.csv").write_text(csv_text(arena_levels(full), "openai/gpt-oss-120b", 2048, 128), newline="")
    (d / "recipe.yaml").write_text("recipe_version: '2'\nmodel: openai/gpt-oss-120b\nruntime: vllm\n"
                                   "container: scitrera/dgx-spark-vllm:0.11.0\ndefaults:\n  port: 8000\n")
    (d / "metadata.json").write_text(json.dumps({
        "recipe": {"name": "gpt-oss-120b-vllm", "qualified_name": "@official/gpt-oss-120b-vllm", "type": "sparkrun",
                   "model": "openai/gpt-oss-120b", "hf_model": "openai/gpt-oss-120b", "runtime": "vllm",
                   "container": "scitrera/dgx-spark-vllm:0.11.0", "runtime_full": "vllm-distributed"},
        "timing": {"start": "2026-05-06T10:00:00+00:00", "end": "2026-05-06T12:30:00+00:00", "duration": 9000.0},
        "cluster": {"cluster_id": "sparkrun_abc", "node_count": 1},
        "benchmark": {"framework": "llama-benchy", "profile": "@official/spark-arena-v2",
                      "args": {"depth": list(ARENA_V2.depths), "pp": [2048], "tg": [128], "concurrency": [1, 2, 5, 10],
                               "prefix_caching": True, "runs": 3}},
        "model": {}, "runtime_info": {"vllm": "0.11.0"}, "sparkrun": {"version": "0.2.40"}}, indent=2))
    run = read_arena(d)
    assert (run.meta["runtime"], run.meta["image"], run.meta["recipe"]) == \
        ("vllm", "scitrera/dgx-spark-vllm:0.11.0", "gpt-oss-120b-vllm")
    assert run.meta["tool"] == "llama-benchy (Spark Arena files)" and run.meta["started"] == 1778061600.0
    assert run.meta["settings"]["runs"] == 3 and run.meta["settings"]["profile"] == "@official/spark-arena-v2"
    assert [(a.depth, a.concurrency) for a in run.levels()] == cells()
    lines = submit_instructions(d)
    assert f"  sparkrun arena benchmark {d / 'recipe.yaml'} --hosts <host1,host2>" in lines


# -- bad input: one line, naming the file and where -------------------------------------------------------


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_directory_without_the_files(tmp_path):
    with pytest.raises(SparktopError) as e:
        read_arena(tmp_path)
    assert _one_line(e).startswith(f"{tmp_path / 'recipe.yaml'}: missing")
    (tmp_path / "recipe.yaml").write_text("model: x\n")
    (tmp_path / "metadata.json").write_text("{}")
    with pytest.raises(SparktopError) as e:
        read_arena(tmp_path)
    assert _one_line(e).startswith(f"{tmp_path / 'benchmark.csv'}: missing")
    with pytest.raises(SparktopError) as e:
        read_arena(tmp_path / "recipe.yaml")
    assert "not a directory" in _one_line(e)


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    buf = io.StringIO()
    csv.writer(buf).writerows([header, *rows])
    path.write_text(buf.getvalue(), newline="")


@pytest.fixture
def submission(tmp_path) -> Path:
    write_arena(native_run(CELLS), tmp_path / "sub")
    return tmp_path / "sub"


def test_a_csv_with_a_missing_column(submission):
    f = submission / "benchmark.csv"
    rows = list(csv.reader(io.StringIO(f.read_bytes().decode())))
    drop = CSV_COLUMNS.index("ttfr_mean")
    _write_csv(f, [h for i, h in enumerate(rows[0]) if i != drop], [r[:drop] + r[drop + 1:] for r in rows[1:]])
    with pytest.raises(SparktopError) as e:
        read_arena(submission)
    text = _one_line(e)
    assert text.startswith(f"{f}:1: no column 'ttfr_mean'")


@pytest.mark.parametrize(("line", "column", "value", "says"), [
    (3, "t_s_mean", "fast", "column 't_s_mean': 'fast' is not a number"),
    (2, "test_name", "pp512 at d4096", "column 'test_name': 'pp512 at d4096' is none of llama-benchy's names"),
    (5, "test_name", "pp512 @ d4096 (c2)", "column 'test_name': a second 'pp512 @ d4096 (c2)' row"),
    (6, "test_name", "pp1024 (c1)", "column 'test_name': 'pp1024 (c1)': a second pp size"),
])
def test_a_csv_with_a_bad_field(submission, line, column, value, says):
    f = submission / "benchmark.csv"
    rows = list(csv.reader(io.StringIO(f.read_bytes().decode())))
    rows[line - 1][CSV_COLUMNS.index(column)] = value
    _write_csv(f, rows[0], rows[1:])
    with pytest.raises(SparktopError) as e:
        read_arena(submission)
    assert _one_line(e).startswith(f"{f}:{line}: {says}")


def test_a_short_row_and_bad_metadata(submission):
    f = submission / "benchmark.csv"
    rows = list(csv.reader(io.StringIO(f.read_bytes().decode())))
    _write_csv(f, rows[0], [rows[1], rows[2][:10]])
    with pytest.raises(SparktopError) as e:
        read_benchy_csv(f)
    assert _one_line(e) == f"{f}:3: 10 fields where the header has 16"
    (submission / "metadata.json").write_text('{\n  "recipe": {,\n}')
    with pytest.raises(SparktopError) as e:
        read_arena(submission)
    assert _one_line(e).startswith(f"{submission / 'metadata.json'}:2: not valid JSON")
    f.write_text("")
    with pytest.raises(SparktopError) as e:
        read_benchy_csv(f)
    assert _one_line(e).startswith(f"{f}:1: empty")


# -- the real llama-benchy --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_csv_the_real_llama_benchy_wrote_reads_and_writes_back_byte_for_byte(tmp_path):
    from tests.helpers.benchy import BOOK_URL
    from tests.helpers.tokenizer import book_text, train_tokenizer
    from tests.helpers.twin_process import start_twin_process

    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", book_text())
    home = tmp_path / "home"
    cache = home / ".cache" / "llama-benchy"
    cache.mkdir(parents=True)
    (cache / (hashlib.md5(BOOK_URL.encode()).hexdigest() + ".txt")).write_text(book_text())
    out = tmp_path / "benchy.csv"
    twin, url = start_twin_process("llama-3.1-8b", "--tokenizer", str(tokenizer), speed=50)
    try:
        r = subprocess.run(
            [str(llama_benchy()), "--base-url", url + "/v1", "--model", "llama-3.1-8b", "--tokenizer",
             str(tokenizer), "--book-url", BOOK_URL, "--pp", "256", "--tg", "16", "--depth", "0", "512",
             "--concurrency", "1", "2", "--runs", "2", "--skip-coherence", "--enable-prefix-caching",
             "--format", "csv", "--save-result", str(out)],
            env=dict(os.environ, HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
            capture_output=True, text=True, timeout=600)
    finally:
        twin.terminate()
        twin.wait(10)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    raw = out.read_bytes()
    assert raw.startswith(HEADER.encode())  # the header we write, byte for byte
    table = read_benchy_csv(out)
    assert (table.model, table.pp, table.tg, table.rows, table.prefix_cached) == ("llama-3.1-8b", 256, 16, 12, True)
    assert [(a.depth, a.concurrency, a.context_load is not None) for a in table.levels] == \
        [(0, 1, False), (0, 2, False), (512, 1, True), (512, 2, True)]
    assert csv_text(table.levels, table.model, 256, 16).encode() == raw
