"""Runs on disk, llama-benchy imports, and the compare tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparktop.bench import compare, export
from sparktop.bench.request import RequestRecord
from sparktop.bench.results import RunWriter, import_llama_benchy, load_run
from sparktop.bench.stats import EngineWatch, LevelStats
from sparktop.cli import main

FIXTURE = Path(__file__).parents[1] / "fixtures" / "llama-benchy" / "twin-llama-3.1-8b-c1-8.json"


def record(level, run, index, attempt=1, rate=10.0, t0=0.0):
    times = [t0 + 0.5 + i / rate for i in range(11)]
    return RequestRecord(level=level, run=run, index=index, attempt=attempt, start=t0, first_response=t0 + 0.5,
                         first_token=t0 + 0.5, end=times[-1], prompt_tokens=100, completion_tokens=11,
                         token_times=times)


def write_run(root, run_id, rates: dict[int, float], topology=None):
    w = RunWriter(root, run_id, {"model": "m", "topology": topology, "settings": {"pp": 100, "tg": 11}})
    for c, rate in rates.items():
        for i in range(c):
            w.append(record(c, 1, i, rate=rate))
        w.engine_level(c, EngineWatch(kv_cache_usage_max=0.5, running_max=c, waiting_max=0, preemptions=0))
    w.close("done")
    return w.dir


def test_a_cut_short_batch_is_kept_on_disk_but_not_counted(tmp_path):
    w = RunWriter(tmp_path, "r", {"settings": {"pp": 100}})
    for i in range(3):
        w.append(record(4, 1, i, attempt=1, rate=5.0))  # killed before the 4th finished
    for i in range(4):
        w.append(record(4, 1, i, attempt=2, rate=10.0))  # the resumed session redid it
    w._requests.write('{"level": 4, "run": 2, "ind')  # the line being written when it died
    w.close("done")
    run = load_run(w.dir)
    assert len(run.records) == 7
    assert run.incomplete() == 3
    (lv,) = run.levels()
    assert (lv.concurrency, lv.runs, lv.requests) == (4, 1, 4)
    assert lv.tg_tps_req == pytest.approx(10.0)


def test_compare_names_winners_with_margins_and_crossovers(tmp_path):
    a = write_run(tmp_path, "a", {1: 20.0, 2: 20.0, 4: 20.0}, topology="cluster-mp")
    b = write_run(tmp_path, "b", {1: 10.0, 2: 19.9, 4: 40.0}, topology="shuffle")
    runs = [load_run(a), load_run(b)]
    md = compare.markdown(runs)
    assert "| Concurrency | cluster-mp | shuffle | Winner |" in md
    assert "| c1 | 20.00 | 10.00 | cluster-mp (+100%) |" in md  # c1 is per request at c=1
    assert "| c2 |" in md and "Tie |" in md
    assert "shuffle overtakes cluster-mp for decode at c4 (+100%)" in md
    data = compare.as_json(runs)
    w = next(x for x in data["winners"] if x["metric"] == "tg_tps_total" and x["concurrency"] == 4)
    assert w["winner"] == "shuffle" and w["margin"] == pytest.approx(1.0)


def test_llama_benchy_json_reads_as_a_run_and_compares():
    run = import_llama_benchy(FIXTURE)
    levels = {lv.concurrency: lv for lv in run.levels()}
    raw = json.loads(FIXTURE.read_text())["benchmarks"]
    assert sorted(levels) == [1, 2, 4, 8]
    assert levels[8].tg_tps_total == pytest.approx(raw[3]["tg_throughput"]["mean"])
    assert levels[1].ttft_ms_mean == pytest.approx(raw[0]["e2e_ttft"]["mean"])
    assert run.meta["tool"] == "llama-benchy 0.4.0"


def test_cli_compare_and_import(tmp_path, capsys):
    a = write_run(tmp_path, "a", {1: 20.0, 2: 20.0}, topology="solo")
    assert main(["compare", str(a), str(FIXTURE), "--md"]) == 0
    out = capsys.readouterr().out
    assert "| Concurrency | solo | twin-llama-3.1-8b-c1-8 | Winner |" in out
    assert main(["runs", "--import", str(FIXTURE), "--label", "old-solo"]) == 0
    assert main(["runs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert [r["id"] for r in listed] == ["old-solo"]
    assert main(["compare", "old-solo", str(a), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in data["runs"]] == ["old-solo", "solo"]


def test_exports_carry_what_the_issue_lists(tmp_path):
    run = load_run(write_run(tmp_path, "a", {1: 20.0, 2: 20.0}, topology="solo"))
    d = export.as_json(run)
    keys = {"concurrency", "requests", "errors", "pp_tps_total", "pp_tps_req", "tg_tps_total", "tg_tps_req",
            "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p95", "peak_tps", "kv_cache_usage_max"}
    assert keys <= set(d["levels"][0])
    assert d["levels"][1]["kv_cache_usage_max"] == 0.5
    csv_text = export.csv_text([run])
    assert csv_text.splitlines()[0].startswith("run,label,model,topology,concurrency")
    assert len(csv_text.splitlines()) == 3
    assert "| c2 |" in export.markdown(run)
    assert isinstance(run.levels()[0], LevelStats)
