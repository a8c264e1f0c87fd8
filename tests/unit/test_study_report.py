"""The study report: tables, winners (the same as `sparktop compare`), ties
under noise, failures, prediction error, charts, Markdown and HTML.

`make_study` writes a realistic study to disk: five topologies of a
gpt-oss-120b-like model swept c1–c64 with three batches per level, real
`RequestRecord`s through `RunWriter` (requests staggered through prefill,
decoding at a per-request rate that falls with concurrency, a little noise
per batch), one topology that failed half-way, one contaminated level and
predictions that are a few per cent off. The browser test and
`scripts/report_screenshot.py` use it too.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest

from sparktop.bench import compare
from sparktop.bench.request import RequestRecord
from sparktop.bench.results import RunWriter, load_run
from sparktop.study import report
from sparktop.study.state import DONE, FAILED, Study, TopologyState, load_study

LEVELS = [1, 2, 4, 8, 16, 32, 64]
PP, TG, RUNS = 1024, 64, 3

# (decode t/s of one request alone, how it falls with concurrency, prefill t/s at c1, its growth, its ceiling)
SHAPE = {
    "solo": (57.0, 0.55, 2900.0, 0.35, 6000.0),
    "cluster-ray": (66.0, 0.50, 4300.0, 0.20, 7000.0),
    "cluster-mp": (69.0, 0.47, 4440.0, 0.20, 8800.0),
    "shuffle": (57.7, 0.38, 2920.0, 0.42, 12000.0),
    "least-busy": (57.5, 0.385, 2900.0, 0.415, 11800.0),
}
BIAS = {"tg_tps_total": 0.93, "tg_tps_req": 0.95, "pp_tps_total": 1.10, "ttft_ms_mean": 0.90}


def rates(topology: str, c: int) -> tuple[float, float]:
    """(per-request decode t/s, prefill t/s total) at concurrency c."""
    r1, fall, pp1, grow, cap = SHAPE[topology]
    return r1 * c ** -fall, min(pp1 * c ** grow, cap)


def batch(c: int, run: int, t0: float, rate: float, pp_total: float, rng: random.Random,
          noise: float, jitter: float | None = None) -> list[RequestRecord]:
    """One batch of c requests that start together: first tokens spread over
    the prefill of all of them, then `TG` tokens each at `rate` (the batch
    `jitter` times faster or slower; random with `noise` unless given)."""
    exact = jitter is not None
    jitter = jitter if jitter is not None else 1 + rng.gauss(0, noise)
    span = c * PP / (pp_total * jitter)
    out = []
    for i in range(c):
        first = t0 + span * (i + 1) / c
        r = rate * jitter * (1 if exact else 1 + rng.gauss(0, noise / 3))
        times = [first + k / r for k in range(TG)]
        out.append(RequestRecord(level=c, run=run, index=i, start=t0, first_response=first, first_token=first,
                                 end=times[-1] + 0.001, prompt_tokens=PP, completion_tokens=TG, token_times=times))
    return out


def write_sweep(root: Path, run_id: str, topology: str, levels: list[int], *, noise: float = 0.02, runs: int = RUNS,
                seed: int = 1, t0: float = 1.75e9, rate_of=rates,
                jitters: list[float] | None = None) -> tuple[Path, float]:
    rng = random.Random(f"{seed}-{topology}")
    w = RunWriter(root, run_id, {"model": "openai/gpt-oss-120b", "topology": topology, "label": topology,
                                 "recipe": "gpt-oss-120b", "settings": {"pp": PP, "tg": TG, "levels": levels,
                                                                        "runs": runs},
                                 "started": t0, "tool": "sparktop 0.1.0"})
    t = t0
    for c in levels:
        rate, pp_total = rate_of(topology, c)
        for run in range(1, runs + 1):
            recs = batch(c, run, t, rate, pp_total, rng, noise, jitters[run - 1] if jitters else None)
            for r in recs:
                w.append(r)
            t = max(r.end or t for r in recs) + 0.5
    w.close("done")
    return w.dir, t - t0


def predicted(topology: str, levels: list[int]) -> dict:
    out = {}
    for c in levels:
        rate, pp_total = rates(topology, c)
        span = c * PP / pp_total
        ttft = span * (c + 1) / (2 * c) * 1000
        tg_total = c * (TG - 1) / (span * (1 - 1 / c) + (TG - 1) / rate) if c > 1 else rate
        out[str(c)] = {"tg_tps_total": tg_total * BIAS["tg_tps_total"], "tg_tps_req": rate * BIAS["tg_tps_req"],
                       "pp_tps_total": (pp_total if c > 1 else PP / span) * BIAS["pp_tps_total"],
                       "ttft_ms_mean": ttft * BIAS["ttft_ms_mean"]}
    return out


COMMANDS = {
    "solo": ["docker run -d --name sparktop-solo --gpus all --network host -e HF_TOKEN=hf_abcdefghijklmnopqrstuv "
             "vllm/vllm-openai:v0.11.0 vllm serve openai/gpt-oss-120b --port 8000 --api-key sk-live-123456 "
             "--max-num-seqs 64 --gpu-memory-utilization 0.85"],
    "cluster-ray": ["ray start --head --port 6379", "ray start --address spark-a:6379",
                    "vllm serve openai/gpt-oss-120b --tensor-parallel-size 2 --distributed-executor-backend ray"],
    "cluster-mp": ["vllm serve openai/gpt-oss-120b --tensor-parallel-size 2 --nnodes 2 --node-rank 0 "
                   "--master-addr spark-a", "vllm serve openai/gpt-oss-120b --tensor-parallel-size 2 --nnodes 2 "
                   "--node-rank 1 --master-addr spark-a --headless"],
    "shuffle": ["vllm serve openai/gpt-oss-120b --port 8001", "vllm serve openai/gpt-oss-120b --port 8001",
                "litellm --config router.yaml --port 8000  # routing_strategy: simple-shuffle, OPENAI_API_KEY=abc123"],
    "least-busy": ["vllm serve openai/gpt-oss-120b --port 8001", "vllm serve openai/gpt-oss-120b --port 8001",
                   "litellm --config router.yaml --port 8000  # routing_strategy: least-busy"],
}


def make_study(root: Path) -> Study:
    """A finished study on disk (see the module's doc)."""
    created = 1.75e9
    study = Study(id="20250601-120000-gpt-oss-120b", recipe="gpt-oss-120b", model="openai/gpt-oss-120b",
                  topologies=[TopologyState(n) for n in SHAPE], levels=LEVELS, runs=RUNS, pp=PP, tg=TG,
                  overrides={"max_num_seqs": 64}, recipe_path="recipes/gpt-oss-120b.yaml", card="gpt-oss-120b",
                  nodes=["spark-a", "spark-b"], image="vllm/vllm-openai:v0.11.0", status="done",
                  created=created, sparktop_version="0.1.0", path=root / "20250601-120000-gpt-oss-120b")
    study.runs_dir.mkdir(parents=True, exist_ok=True)
    clock = created
    for t in study.topologies:
        levels = LEVELS[:5] if t.name == "cluster-ray" else LEVELS
        run_dir, took = write_sweep(study.runs_dir, f"run-{t.name}", t.name, levels, t0=clock + 300)
        t.run = run_dir.name
        t.status = DONE
        t.commands = list(COMMANDS[t.name])
        t.nodes = ["spark-a"] if t.name == "solo" else ["spark-a", "spark-b"]
        t.vllm_version = "0.11.0"
        t.startup_s, t.sweep_s = 290.0, took
        t.started, t.ended = clock, clock + 300 + took + 20
        t.predicted = predicted(t.name, LEVELS)
        clock = t.ended + 5
    ray = study.topology("cluster-ray")
    ray.status = FAILED
    ray.reason = "the engine died during c32: CUDA out of memory (spark-b)"
    ray.lines = ["(RayWorkerWrapper pid=812) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                 "ERROR 06-01 12:41:07 engine.py:412] Engine core died unexpectedly"]
    study.topology("shuffle").contaminated = [16]
    study.ended = clock
    study.save()
    return load_study(study.dir)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Study:
    return make_study(tmp_path_factory.mktemp("studies"))


@pytest.fixture(scope="module")
def data(study) -> dict:
    return report.build(study)


def table(data: dict, key: str) -> dict:
    return next(t for t in data["tables"] if t["key"] == key)


def row(data: dict, key: str, c: int) -> dict:
    return next(r for r in table(data, key)["rows"] if r["concurrency"] == c)


# -- tables and winners ----------------------------------------------------------


def test_a_table_per_metric_a_row_per_level_a_column_per_topology(data):
    assert [t["key"] for t in data["tables"]] == ["tg_tps_total", "tg_tps_req", "pp_tps_total", "ttft_ms_mean",
                                                  "ttft_ms_p95"]
    assert data["columns"] == ["solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy"]
    for t in data["tables"]:
        assert [r["concurrency"] for r in t["rows"]] == LEVELS
    # The failed topology's column stops where it stopped.
    assert row(data, "tg_tps_total", 32)["values"]["cluster-ray"]["measured"] is None
    assert row(data, "tg_tps_total", 16)["values"]["cluster-ray"]["measured"] > 0
    c1 = row(data, "tg_tps_total", 1)["values"]["cluster-mp"]
    assert c1["measured"] == pytest.approx(69.0, rel=0.05)
    assert c1["error"] == pytest.approx(c1["predicted"] / c1["measured"] - 1)
    assert c1["batches"] == RUNS and c1["std"] > 0


def test_winners_follow_the_data_with_margins(data):
    w1 = row(data, "tg_tps_total", 1)["winner"]
    assert w1["name"] == "cluster-mp" and w1["runner_up"] == "cluster-ray" and w1["margin"] > 0.02
    w64 = row(data, "pp_tps_total", 64)["winner"]
    assert w64["best"] == "shuffle"
    ttft = row(data, "ttft_ms_mean", 1)["winner"]
    assert ttft["name"] == "cluster-mp" and ttft["margin"] < 0  # lower is better: the margin is negative


def test_the_reports_winners_are_compares_winners(study, data):
    runs = [load_run(study.run_dir(t)) for t in study.topologies]
    by_compare = {(w["metric"], w["concurrency"]): (w["winner"], w["tie"]) for w in compare.as_json(runs)["winners"]}
    checked = 0
    for t in data["tables"]:
        for r in t["rows"]:
            assert (r["winner"]["name"], r["winner"]["tie"]) == by_compare[(t["key"], r["concurrency"])], \
                (t["key"], r["concurrency"])
            checked += 1
    assert checked == 5 * len(LEVELS)
    # Names and ties both happen in this study: the comparison is not vacuous.
    outcomes = {v for v in by_compare.values()}
    assert any(tie for _, tie in outcomes) and any(name for name, _ in outcomes)
    # And compare's Markdown shows the same cells.
    md = compare.markdown(runs)
    r1 = row(data, "tg_tps_total", 1)["winner"]
    assert f"{r1['name']} ({r1['margin']:+.0%}) |" in md


def test_shuffle_and_least_busy_tie_within_their_noise(data):
    """The two routers are ~1-3 % apart: with 2 % batch noise that is a tie,
    where a fixed 1 % rule would have named a winner."""
    ties = [(t["key"], r["concurrency"]) for t in data["tables"] for r in t["rows"] if r["winner"]["tie"]]
    assert ties
    gaps = []
    for key, c in ties:
        w = row(data, key, c)["winner"]
        assert {w["best"], w["runner_up"]} <= set(data["columns"])
        gaps.append(abs(w["margin"]))
    assert max(gaps) > compare.TIE  # some ties are wider than 1 %: the spread decided them


def test_the_tie_rule_uses_the_batches_spread(tmp_path):
    """3 % apart: a tie when the batches scatter by 8 %, a win when they agree
    to 0.2 %; one batch each knows no spread and falls back to the 1 % floor."""
    def flat(scale):
        return lambda topology, c: (50.0 * scale, 3000.0 * scale)

    def runs_for(noise, runs):
        jitters = [1 + noise * (-1) ** i for i in range(runs)] if runs > 1 else [1.0]
        a, _ = write_sweep(tmp_path / f"{noise}-{runs}", "a", "solo", [4], runs=runs, rate_of=flat(1.0),
                           jitters=jitters)
        b, _ = write_sweep(tmp_path / f"{noise}-{runs}", "b", "shuffle", [4], runs=runs, rate_of=flat(1.03),
                           jitters=jitters[::-1])
        return [load_run(a), load_run(b)]

    m = compare.METRICS[0]

    def decide(runs):
        names, _, by_run = compare.table(runs)
        sp = compare.spread_table(runs)
        return compare.winner({n: by_run[n][4].tg_tps_total for n in names}, m, compare.level_spreads(sp, 4, m.key))

    noisy = decide(runs_for(0.08, 5))
    assert noisy.tie and noisy.noise is not None and noisy.noise > abs(noisy.margin)
    tight = decide(runs_for(0.002, 5))
    assert not tight.tie and tight.name == "shuffle"
    single = decide(runs_for(0.08, 1))
    assert single.noise is None and not single.tie and single.name == "shuffle"  # 3 % > the 1 % floor
    # The same figures without spreads use the floor only.
    assert compare.winner({"a": 100.0, "b": 103.0}, m).name == "b"
    assert compare.winner({"a": 100.0, "b": 100.5}, m).tie


def test_a_spread_from_an_import_uses_its_level_deviations():
    from sparktop.bench.results import import_llama_benchy

    run = import_llama_benchy(Path(__file__).parents[1] / "fixtures" / "llama-benchy" / "twin-llama-3.1-8b-c1-8.json")
    sp = compare.spreads(run)
    assert sp[1] == {}  # c1 keeps no batch count
    lv8 = next(lv for lv in run.levels() if lv.concurrency == 8)
    if lv8.runs >= 2 and lv8.tg_tps_total_std is not None:
        assert sp[8]["tg_tps_total"].std == lv8.tg_tps_total_std


# -- words: crossovers, recommendations, predictions ------------------------------


def test_crossovers_and_recommendations_in_words(data):
    assert any("shuffle overtakes cluster-mp for decode" in s for s in data["crossovers"])
    assert any(s.startswith("Decode:") and "cluster-mp" in s for s in data["summary"])
    recs = {r["workload"]: r for r in data["recommendations"]}
    assert list(recs) == ["single user", "agents at c8–c16", "high concurrency", "prefill-heavy",
                          "latency at scale"]
    assert recs["single user"]["topology"] == "cluster-mp" and recs["single user"]["levels"] == [1]
    assert recs["agents at c8–c16"]["levels"] == [8, 16]
    assert recs["high concurrency"]["levels"] == [64]
    assert recs["high concurrency"]["best"] in ("shuffle", "least-busy")
    assert recs["prefill-heavy"]["best"] in ("shuffle", "least-busy")
    assert recs["latency at scale"]["metric"] == "ttft_ms_p95"
    assert "over" in recs["single user"]["why"] and "c1" in recs["single user"]["why"]
    assert recs["single user"]["predicted"]["topology"] == "cluster-mp"
    assert set(data["knees"]) == set(data["columns"])


def test_prediction_error_per_topology_and_overall(data):
    pe = data["prediction_error"]
    # The predictions were made 7 % low on decode, 10 % high on prefill, 10 % low on TTFT.
    solo = pe["per_topology"]["solo"]
    assert solo["tg_tps_total"] == pytest.approx(0.07, abs=0.05)
    assert solo["pp_tps_total"] == pytest.approx(0.10, abs=0.05)
    assert solo["ttft_ms_mean"] == pytest.approx(0.10, abs=0.05)
    assert solo["levels"] == len(LEVELS)
    assert pe["per_topology"]["shuffle"]["levels"] == len(LEVELS) - 1  # its contaminated c16 left out
    assert pe["overall"]["all"] == pytest.approx(0.09, abs=0.05)


def test_contaminated_levels_are_marked_with_a_footnote(study, data):
    cell = row(data, "tg_tps_total", 16)["values"]["shuffle"]
    assert cell["contaminated"]
    assert data["contamination"] == [{"topology": "shuffle", "concurrency": 16,
                                      "note": "other traffic reached the engine during the level"}]
    md = report.markdown(study, study.report_dir, data)
    assert re.search(r"\| c16 \|[^\n]*†", md)
    assert "† shuffle c16: contaminated" in md


def test_a_level_stats_contamination_flag_counts_too(study, monkeypatch):
    from sparktop.bench.run import Run

    real = Run.levels

    def levels(self):
        out = real(self)
        if self.meta.get("topology") == "solo":
            for lv in out:
                if lv.concurrency == 4:
                    lv.contaminated = True  # type: ignore[attr-defined]
                    lv.contamination = "12 requests from another client"  # type: ignore[attr-defined]
        return out

    monkeypatch.setattr(Run, "levels", levels)
    d = report.build(study)
    assert {"topology": "solo", "concurrency": 4, "note": "12 requests from another client"} in d["contamination"]


def test_the_failed_topology_has_its_section(study, data):
    (f,) = data["failed"]
    assert f["name"] == "cluster-ray" and f["status"] == FAILED
    assert "CUDA out of memory" in f["reason"] and f["levels_measured"] == LEVELS[:5]
    md = report.markdown(study, study.report_dir, data)
    section = md.split("## What did not finish", 1)[1].split("\n## ", 1)[0]
    assert "### cluster-ray: failed — measured c1–c16 before it stopped" in section
    assert "Engine core died unexpectedly" in section and "```" in section


# -- what ran -------------------------------------------------------------------


def test_what_ran_is_enough_to_reproduce_and_hides_secrets(study, data):
    md = report.markdown(study, study.report_dir, data)
    ran = md.split("## What ran", 1)[1]
    for needle in ("vllm/vllm-openai:v0.11.0", "0.11.0", "spark-a", "spark-b", "gpt-oss-120b", "max_num_seqs=64",
                   "--tensor-parallel-size 2", "4m 50s", "pp 1024, tg 64"):
        assert needle in ran, needle
    for secret in ("hf_abcdefghijklmnopqrstuv", "sk-live-123456", "abc123"):
        assert secret not in md and secret not in report.html(study, data)
    assert "HF_TOKEN=***" in ran and "--api-key ***" in ran and "OPENAI_API_KEY=***" in ran
    assert data["reproduce"].startswith("sparktop study recipes/gpt-oss-120b.yaml --topologies solo,cluster-ray,")
    assert "-c 1,2,4,8,16,32,64 --runs 3 --pp 1024 --tg 64 --set max_num_seqs=64" in data["reproduce"]


@pytest.mark.parametrize(("line", "masked"), [
    ("vllm serve m --api-key s3cret --port 1", "vllm serve m --api-key *** --port 1"),
    ("vllm serve m --api-key=s3cret", "vllm serve m --api-key=***"),
    ("docker run -e HF_TOKEN=hf_x -e MY_API_KEY='a b' img", "docker run -e HF_TOKEN=*** -e MY_API_KEY=*** img"),
    ("vllm serve m --max-num-batched-tokens=8192", "vllm serve m --max-num-batched-tokens=8192"),
    ("curl -H 'Authorization: Bearer abc.def'", "curl -H 'Authorization: Bearer ***'"),
    ("already HF_TOKEN=*** masked", "already HF_TOKEN=*** masked"),
])
def test_mask(line, masked):
    assert report.mask(line) == masked


# -- files ------------------------------------------------------------------------


def test_markdown_refers_to_charts_that_exist_as_svg_and_png(study, data, tmp_path):
    md = report.markdown(study, tmp_path, data)
    refs = re.findall(r"\]\(([^)]+)\)", md)
    assert {Path(r).suffix for r in refs} == {".png", ".svg"}
    assert len(refs) == 6
    for r in refs:
        p = tmp_path / r
        assert p.exists() and p.stat().st_size > 5000, r
    for svg in tmp_path.glob("charts/*.svg"):
        text = svg.read_text()
        assert text.lstrip().startswith("<?xml") and "<svg" in text
    for png in tmp_path.glob("charts/*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| Concurrency | solo | cluster-ray | cluster-mp | shuffle | least-busy | Winner |" in md
    assert re.search(r"\| c1 \| [\d.]+ \(pred [\d.]+, [−+]\d+(\.\d)? %\) \|", md)


def test_chart_titles_axes_and_legend(data):
    from sparktop.study import charts

    fig = charts.figure(data, charts.CHARTS[0])
    (ax,) = fig.axes
    title = ax.get_title(loc="left")
    assert "Decode throughput" in title and "higher is better" in title
    assert "concurrent requests" in ax.get_xlabel() and "tokens / s" in ax.get_ylabel()
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:5] == data["columns"] and "predicted (dashed, same colour)" in labels
    assert "contaminated level" in labels
    assert [int(t) for t in ax.get_xticks()] == LEVELS


def test_html_is_self_contained_and_embeds_the_charts(study, data):
    page = report.html(study, data)
    assert page.startswith("<!doctype html>")
    assert "http" not in page.lower()
    assert not re.search(r"""\b(?:src|href)\s*=\s*["'](?!#)""", page)  # only in-page anchors
    assert "<script" not in page and "@import" not in page
    assert not re.search(r"url\((?!#)", page)  # the charts' clip paths point inside the page only
    assert page.count("<svg") == 3 and 'class="chart"' in page
    assert "<table" in page and "Tie" in page and "cluster-ray: failed" in page
    for key in ("tg_tps_total", "pp_tps_total", "ttft_ms_mean", "failed", "what-ran", "recommendations"):
        assert f'id="{key}"' in page


def test_write_and_json(study, tmp_path):
    import json

    md = report.write(study, "md", tmp_path)
    assert md == tmp_path / "report.md" and (tmp_path / "charts" / "decode-throughput.svg").exists()
    page = report.write(study, "html", tmp_path)
    assert page.read_text().count("<svg") == 3
    js = json.loads(report.write(study, "json", tmp_path).read_text())
    assert js["columns"] and js["recommendations"]
    assert [p.name for p in report.write_all(study, tmp_path / "all")] == ["report.md", "report.html"]


def test_an_empty_study_still_reports(tmp_path):
    study = Study(id="s", recipe="r", model="m", topologies=[TopologyState("solo")], levels=[1, 2],
                  created=time.time(), path=tmp_path / "s")
    study.save()
    d = report.build(study)
    assert d["columns"] == [] and d["tables"] == []
    md = report.markdown(study, tmp_path / "out", d)
    assert "Nothing was measured" in md and "the study ended before it ran" in md
    assert "<svg" not in report.html(study, d)


def test_a_rate_study_is_reproduced_as_a_rate_study(study):
    """The command under "What ran" of a study that searched for the max rate runs that search again, not the
    lockstep levels it never ran."""
    from dataclasses import replace

    rated = replace(study, rates=[8.0], slo="ttft_p95=500ms,itl_p95=100ms", find_max_rate=True, duration=4.0,
                    arrivals="constant")
    cmd = report.reproduce(rated)
    assert "--rate 8 --slo ttft_p95=500ms,itl_p95=100ms --find-max-rate --arrivals constant --duration 4" in cmd
    assert " -c " not in cmd and "--runs" not in cmd and "--pp 1024 --tg 64" in cmd
    depth = report.reproduce(replace(study, depths=[0, 4096], prefix_cache=True))
    assert "-c 1,2,4,8,16,32,64 --runs 3 --depth 0,4096 --prefix-cache on --pp 1024" in depth
