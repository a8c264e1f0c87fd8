"""`sparktop twin fit --runs STUDY`: the model learns from the user's own
measurements, kept per inventory, and `predict` uses them there only.

The study is written the way the study runner writes one (study.json and a
sweep run per topology, through `RunWriter`), with figures 1.3 times faster
than the shipped model predicts: a systematic offset of the user's nodes
the fit has to find."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from sparktop.bench.results import RunWriter
from sparktop.errors import SparktopError
from sparktop.model import fit
from sparktop.model.cards import find_card
from sparktop.model.constants import Constants
from sparktop.model.serving import Serving
from sparktop.model.simulate import ROUTED, _engine, _records, perf_for
from sparktop.settings import Inventory, Node, data_dir

CARD = "qwen3-8b"
TOPOLOGIES = ("solo", "cluster-mp")
LEVELS = (1, 4, 8)
PP, TG = 512, 64
FASTER = 1.3  # the user's nodes run 1.3x faster than the shipped constants say
HOSTS = ("spark-a", "spark-b")


def inventory(hosts=HOSTS) -> Inventory:
    return Inventory(nodes=[Node(name=h, host=h) for h in hosts])


def write_inventory(path: Path, hosts=HOSTS) -> Path:
    path.write_text("nodes:\n" + "".join(f"  - name: {h}\n    host: {h}\n" for h in hosts))
    return path


def measured_records(topology: str, c: int, k: Constants, serving: Serving, faster: float):
    """What the sweep would write for one level on nodes `faster` times as fast."""
    perf = perf_for(find_card(CARD), topology, k, serving)
    router = k.request_overhead_s + (k.router_overhead_s if topology in ROUTED else 0.0)
    recs = _records(_engine(perf, serving, c, PP, TG), c, PP, router)
    for r in recs:
        r.token_times = [t / faster for t in r.token_times]
        r.first_token = r.first_response = r.token_times[0]
        r.end = r.token_times[-1]
    return recs


def make_study(root: Path, sid: str = "20260101-000000-qwen3-8b", card: str = CARD, key: str | None = None,
               status: str = "done", faster: float = FASTER, contaminated: tuple[int, ...] = ()) -> Path:
    d = root / sid
    k = fit.load_constants()
    serving = Serving(max_num_seqs=64)
    tops = []
    for topology in TOPOLOGIES:
        run_id = f"run-{topology}"
        w = RunWriter(d / "runs", run_id, {"model": card, "topology": topology, "settings": {"pp": PP, "tg": TG}})
        for c in LEVELS:
            for r in measured_records(topology, c, k, serving, faster):
                w.append(r)
        w.close("done")
        tops.append({"name": topology, "status": status, "run": run_id, "serving": dataclasses.asdict(serving),
                     "contaminated": list(contaminated)})
    study = {"id": sid, "recipe": "qwen3-8b", "model": "Qwen/Qwen3-8B", "card": card, "pp": PP, "tg": TG,
             "levels": list(LEVELS), "inventory_key": key or fit.inventory_key(inventory()), "topologies": tops,
             "status": "done"}
    (d / "study.json").write_text(json.dumps(study, indent=2))
    return d


@pytest.fixture
def few_published(monkeypatch):
    """The published anchor cut to one article table, so a fit runs in seconds."""
    cells = [c for c in fit.published_cells(more=False) if c.model == "gpt-oss-120b" and c.concurrency <= 8]
    monkeypatch.setattr(fit, "published_cells", lambda more=True: cells)
    return cells


def fit_args(runs, inventory=None, iterations=20) -> argparse.Namespace:
    return argparse.Namespace(runs=runs, inventory=inventory, iterations=iterations, refit=False, report=False,
                              cross_validate=False, json=False)


def test_inventory_key_is_short_and_stable():
    a = fit.inventory_key(inventory(("spark-a", "spark-b")))
    assert a == fit.inventory_key(inventory(("spark-b", "spark-a")))
    assert len(a) == 12 and int(a, 16) >= 0
    assert a != fit.inventory_key(inventory(("spark-a", "spark-c")))


def test_study_cells_skip_contaminated_levels(tmp_path):
    d = make_study(tmp_path, contaminated=(8,))
    cells = fit.study_cells([d])
    assert {c.concurrency for c in cells} == {1, 4}
    assert {c.topology for c in cells} == set(TOPOLOGIES)
    assert {c.metric for c in cells} >= {"decode_tps", "prefill_tps", "ttft_ms"}
    assert all(c.model == CARD and c.workload == ("llama-benchy", PP, TG, 0) for c in cells)
    assert all(c.serving.max_num_seqs == 64 for c in cells)
    # Measured 1.3x faster than predicted: the shipped constants are off by about that.
    err = fit.prediction_error(d, fit.load_constants())
    assert err["cells"] == len(cells)
    assert 0.15 < err["decode_tps"] < 0.35


def test_fit_learns_the_offset_per_inventory(tmp_path, few_published, capsys):
    from sparktop.model.commands import cmd_fit

    d = make_study(data_dir() / "studies")
    key = fit.inventory_key(inventory())
    before = fit.prediction_error(d, fit.inventory_constants(key))
    assert cmd_fit(fit_args([d.name])) == 0  # by id, under the data dir
    out = capsys.readouterr().out
    assert "your measurements decode" in out and "published figures decode" in out
    path = fit.fitted_path(key)
    assert path.exists()
    saved = json.loads(path.read_text())
    assert saved["sources"] == [d.name] and saved["inventory_key"] == key
    assert set(fit.GLOBAL) <= set(saved)

    k = fit.inventory_constants(key)
    assert k != fit.load_constants()
    assert fit.inventory_constants("someone-else") == fit.load_constants()
    assert fit.inventory_constants(None) == fit.load_constants()
    after = fit.prediction_error(d, k)
    print("before", before, "after", after)
    assert after["decode_tps"] < 0.6 * before["decode_tps"]
    assert sum(after[m] for m in fit.HEADLINE) < 0.6 * sum(before[m] for m in fit.HEADLINE)
    assert saved["fit"]["after"]["yours"]["decode_tps"] == pytest.approx(after["decode_tps"], abs=1e-3)


def test_predict_uses_the_inventory_fit(tmp_path, few_published, capsys):
    from sparktop.launch.commands import cmd_predict
    from sparktop.model.commands import cmd_fit

    d = make_study(tmp_path / "studies")
    inv = write_inventory(tmp_path / "cluster.yaml")
    other = write_inventory(tmp_path / "other.yaml", ("spark-x", "spark-y"))
    assert cmd_fit(fit_args([str(d)], inventory=str(inv), iterations=10)) == 0
    capsys.readouterr()

    def predicted(path: Path, as_json: bool) -> str:
        args = argparse.Namespace(recipe=None, model=CARD, recipes=None, quant=None, set=None, inventory=str(path),
                                  topology="solo", concurrency="1,8", pp=PP, tg=TG, json=as_json)
        assert cmd_predict(args) == 0
        return capsys.readouterr().out

    mine, theirs = json.loads(predicted(inv, True)), json.loads(predicted(other, True))
    assert [r["decode_tps"] for r in mine["rows"]] != [r["decode_tps"] for r in theirs["rows"]]
    assert mine["constants"]["sources"] == [d.name] and theirs["constants"]["sources"] == []
    assert "fitted to your measurements (study " + d.name in predicted(inv, False)
    assert "published" in predicted(other, False)


def test_bad_inputs_are_one_line_errors(tmp_path, few_published):
    from sparktop.model.commands import cmd_fit

    def error(args) -> str:
        with pytest.raises(SparktopError) as e:
            cmd_fit(args)
        text = str(e.value)
        assert "\n" not in text and "Traceback" not in text
        return text

    assert "no such study" in error(fit_args([str(tmp_path / "nowhere")]))
    pending = make_study(tmp_path, "pending", status="pending")
    assert "no finished topology" in error(fit_args([str(pending)]))
    unknown = make_study(tmp_path, "unknown", card=CARD)
    data = json.loads((unknown / "study.json").read_text())
    data["card"] = "no-such-model-card"
    (unknown / "study.json").write_text(json.dumps(data))
    assert "no-such-model-card" in error(fit_args([str(unknown)]))
    other = make_study(tmp_path, "other", key="0123456789ab")
    good = make_study(tmp_path, "good")
    assert "different inventories" in error(fit_args([str(other), str(good)]))
    assert not (data_dir() / "fitted").exists()


def test_the_report_says_how_far_off_the_prediction_was_before_and_after(tmp_path, few_published, capsys):
    from sparktop.model.commands import cmd_fit
    from sparktop.study import report
    from sparktop.study.state import load_study

    d = make_study(data_dir() / "studies", sid="20260101-000000-learned")
    assert report.build(load_study(d))["learned"] is None  # nothing learned yet
    assert cmd_fit(fit_args([d.name])) == 0
    learned = report.build(load_study(d))["learned"]
    assert learned["sources"] == [d.name]
    assert learned["after"]["decode_tps"] < learned["before"]["decode_tps"]
    text = report.markdown(load_study(d), tmp_path / "out")
    assert "published constants → fitted ones" in text
