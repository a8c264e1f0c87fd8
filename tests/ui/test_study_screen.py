"""The study screen as a user drives it: on two simulated Sparks, `b` in the
launcher plans a study of a recipe, Enter starts it, the matrix fills in,
the study goes on while the user is elsewhere, `y` shows it again with
everything so far, Esc (confirmed) cancels it and nothing is left running.
Also a study attached from its files (`sparktop --study ID`), and snapshots
at the common sizes from a study on disk."""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Static

from sparktop.bench.levels import parse_levels
from sparktop.bench.request import RequestRecord
from sparktop.bench.results import RunWriter, load_run
from sparktop.bench.stats import EngineWatch
from sparktop.observe.record import Recording, ReplaySource
from sparktop.twin.cluster import loopback_aliases_work
from sparktop.ui.app import SparktopApp
from sparktop.ui.screens import MonitorScreen
from sparktop.ui.study import ConfirmCancelStudy, StudyPlanScreen, StudyScreen, compact
from tests.conftest import free_port
from tests.helpers.pilot import until as _until
from tests.helpers.wait import eventually
from tests.ui.test_launcher import app_for, containers, open_launcher, type_into

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "recording-demo.jsonl"
T0 = 1_760_000_000.0  # a fixed clock for studies written by hand
twins = pytest.mark.skipif(not loopback_aliases_work(), reason="needs 127.0.0.2 and 127.0.0.3")
until = partial(_until, timeout=30.0)


# -- a study on disk, written by hand -------------------------------------------------


def _records(c: int, run: int, rate: float, t0: float) -> list[RequestRecord]:
    times = [t0 + 0.4 + k / rate for k in range(128)]
    return [RequestRecord(level=c, run=run, index=i, start=t0, first_response=t0 + 0.4, first_token=t0 + 0.4,
                          end=times[-1], prompt_tokens=1024, completion_tokens=128, token_times=times, status=200)
            for i in range(c)]


def _write_run(study_dir: Path, topology: str, rates: dict[int, float], runs: int, contaminated=()) -> str:
    run_id = f"run-{topology}"
    w = RunWriter(study_dir / "runs", run_id, {"model": "llama-3.1-8b", "topology": topology,
                                                "settings": {"pp": 1024, "tg": 128}})
    t = T0
    for c, rate in rates.items():
        for r in range(1, runs + 1):
            for rec in _records(c, r, rate, t):
                w.append(rec)
            t += 10
        w.engine_level(c, EngineWatch(kv_cache_usage_max=0.02 * c, running_max=c, waiting_max=0, preemptions=0,
                                      contaminated=c in contaminated))
    w.close("done")
    return run_id


def write_study(root: Path, sid: str, topologies: list[dict], *, status: str, levels=(1, 2, 4, 8), runs: int = 2,
                pid: int | None = None) -> Path:
    d = root / sid
    d.mkdir(parents=True)
    tops = []
    for spec in topologies:
        t = {"name": spec["name"], "status": spec.get("status", "pending"), "stage": spec.get("stage", ""),
             "reason": spec.get("reason"), "lines": spec.get("lines", []),
             "contaminated": list(spec.get("contaminated", [])), "started": spec.get("started"),
             "ended": spec.get("ended"),
             "predicted": {str(c): {"tg_tps_total": p} for c, p in spec.get("predicted", {}).items()}}
        if spec.get("rates"):
            t["run"] = _write_run(d, spec["name"], spec["rates"], runs, spec.get("contaminated", ()))
        tops.append(t)
    study = {"id": sid, "recipe": "llama-3.1-8b", "model": "llama-3.1-8b", "topologies": tops,
             "levels": list(levels), "runs": runs, "pp": 1024, "tg": 128, "status": status,
             "stage": "" if status == "done" else status, "estimate_s": 1800.0, "created": T0,
             "ended": None if status == "running" else T0 + 1923, "pid": pid}
    (d / "study.json").write_text(json.dumps(study, indent=2))
    return d


def every_kind_of_cell(root: Path) -> Path:
    """A cancelled study: two topologies measured (one level contaminated), one
    failed at preflight, one cut short after two levels, one never started."""
    return write_study(root, "20251009-090000-llama-3.1-8b", [
        {"name": "solo", "status": "done", "stage": "done", "rates": {1: 41.0, 2: 39.5, 4: 36.0, 8: 30.5},
         "started": T0 + 5, "ended": T0 + 512, "predicted": {1: 40.1, 2: 77.9, 4: 141.2, 8: 240.3}},
        {"name": "cluster-ray", "status": "done", "stage": "done", "rates": {1: 55.0, 2: 53.0, 4: 50.0, 8: 44.0},
         "contaminated": [8], "started": T0 + 512, "ended": T0 + 1180},
        {"name": "cluster-mp", "status": "failed", "stage": "failed", "started": T0 + 1180, "ended": T0 + 1201,
         "reason": "preflight failed on spark-b: ports: port 8000 already in use on 127.0.0.3",
         "lines": ["[FAIL] spark-b  ports     port 8000 already in use on 127.0.0.3"]},
        {"name": "shuffle", "status": "stopping", "stage": "interrupted", "rates": {1: 40.0, 2: 39.0},
         "started": T0 + 1201},
        {"name": "least-busy"},
    ], status="cancelled")


def attached_app(study_dir: Path) -> SparktopApp:
    """The monitor (a paused replay: no nodes needed) with the study attached."""
    source = ReplaySource(Recording.load(RECORDING), speed=1.0)
    source.seek(1e12)
    source.pause()
    return SparktopApp(source, replay=True, study_dir=study_dir)


def shown(screen: StudyScreen) -> bool:
    return screen.is_mounted and not screen.run.running and screen._chart_key is not None


def cell(screen: StudyScreen, topology: str, column: str) -> str:
    return str(screen.query_one("#study-matrix", DataTable).get_cell(topology, column))


def head_of(screen: StudyScreen) -> str:
    return str(screen.query_one("#study-head", Static).content)


def status_line(app: SparktopApp) -> str:
    return str(app.screen.query_one("#status", Static).content)


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


# -- attached -----------------------------------------------------------------------


async def test_an_attached_study_shows_what_its_files_say(tmp_path):
    d = write_study(tmp_path, "20251010-120000-llama-3.1-8b", [
        {"name": "solo", "status": "done", "rates": {1: 41.0, 2: 39.5}, "started": T0, "ended": T0 + 300},
        {"name": "cluster-mp", "status": "done", "rates": {1: 60.0, 2: 57.0}, "started": T0 + 300,
         "ended": T0 + 700},
    ], status="done", levels=(1, 2))
    app = attached_app(d)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, StudyScreen) and shown(app.screen))
        screen = app.screen
        for name in ("solo", "cluster-mp"):
            levels = {lv.concurrency: lv for lv in load_run(d / "runs" / f"run-{name}").levels()}
            for c in (1, 2):
                assert cell(screen, name, f"c{c}") == compact(levels[c].tg_tps_total)
            assert cell(screen, name, "topology") == f"✓ {name}"
        assert cell(screen, "solo", "time") == "5m 00s"
        head = str(screen.query_one("#study-head", Static).content)
        assert "attached" in head and "done in 32m 03s: 2 measured, 0 failed" in head
        chart = str(screen.query_one("#study-chart", Static).content)
        assert "solo" in chart and "cluster-mp" in chart and "c2" in chart
        assert not screen.query_one("#study-live").display  # nothing runs: no live sweep
        await pilot.press("escape")  # a finished study: Esc just leaves
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
        await pilot.press("y")  # and y shows it again
        await until(pilot, lambda: isinstance(app.screen, StudyScreen) and shown(app.screen))
        assert cell(app.screen, "cluster-mp", "c1") == compact(levels[1].tg_tps_total)


async def test_attached_to_a_running_study_esc_only_leaves(tmp_path):
    d = write_study(tmp_path, "20251010-130000-llama-3.1-8b", [
        {"name": "solo", "status": "done", "rates": {1: 41.0}, "started": T0, "ended": T0 + 300},
        {"name": "cluster-mp", "status": "sweeping", "stage": "sweeping c2", "started": T0 + 300},
    ], status="running", levels=(1, 2), runs=1, pid=os.getpid())  # "another process": alive, not this app
    before = (d / "study.json").read_text()
    app = attached_app(d)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, StudyScreen) and app.screen.run.current == "cluster-mp")
        screen = app.screen
        await until(pilot, lambda: "2/2 cluster-mp: sweeping c2" in head_of(screen), what=lambda: head_of(screen))
        head = head_of(screen)
        assert f"attached: running in pid {os.getpid()}" in head and "2/2 cluster-mp: sweeping c2" in head
        assert cell(screen, "cluster-mp", "c2") == "▶" and cell(screen, "cluster-mp", "c1") == "·"
        assert cell(screen, "solo", "c1") != "·"
        assert "study (pid" in str(app.status_text())
        await pilot.press("escape")  # it does not own the study: no question, nothing cancelled
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
    assert (d / "study.json").read_text() == before


# -- snapshots --------------------------------------------------------------------------


def _snapshot(snap_compare, tmp_path, size: tuple[int, int]) -> bool:
    async def settle(pilot):
        app = pilot.app
        await _until(pilot, lambda: isinstance(app.screen, StudyScreen) and shown(app.screen)
                     and len(app.state.engines) == 2)  # the replay at its end, as in test_snapshots
        await pilot.pause(1.5)  # and the status line repainted from it

    return snap_compare(attached_app(every_kind_of_cell(tmp_path)), terminal_size=size, run_before=settle)


def test_study_80x24(snap_compare, tmp_path, utc):
    assert _snapshot(snap_compare, tmp_path, (80, 24))


def test_study_120x40(snap_compare, tmp_path, utc):
    assert _snapshot(snap_compare, tmp_path, (120, 40))


def test_study_160x48(snap_compare, tmp_path, utc):
    assert _snapshot(snap_compare, tmp_path, (160, 48))


# -- run from the app, on twins ------------------------------------------------------------


async def start_study(pilot, levels: str = "1,2") -> StudyScreen:
    """`l`, the recipe, a free port, `b`, small settings in the dialog, Enter."""
    app = pilot.app
    await until(pilot, lambda: len(app.state.nodes) == 2)
    launcher = await open_launcher(pilot, "llama-3.1-8b")
    await type_into(pilot, launcher, "port", str(free_port("127.0.0.2")))  # not the port a lab run may hold
    await pilot.press("b")
    await until(pilot, lambda: isinstance(app.screen, StudyPlanScreen))
    plan = app.screen
    assert plan.query_one("#plan-topologies", Input).value == "solo,cluster-ray,cluster-mp,shuffle,least-busy"
    assert plan.query_one("#plan-levels", Input).value == "1,2,4,8,16,32,64"
    plan.query_one("#plan-levels", Input).value = levels
    plan.query_one("#plan-runs", Input).value = "1"
    await until(pilot, lambda: plan.estimated is not None and plan.estimated.levels == parse_levels(levels)
                and plan.estimated.runs == 1)
    assert plan.estimated.estimate_s  # the model has a card for it: an estimate in minutes
    plan.query_one("#plan-runs", Input).focus()
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, StudyScreen))
    screen = app.screen
    saved = json.loads((screen.run.study.dir / "study.json").read_text())
    assert (saved["levels"], saved["runs"], saved["status"]) == (parse_levels(levels), 1, "running")
    return screen


@pytest.mark.slow
@twins
async def test_a_study_from_the_launcher_goes_on_unwatched_and_cancels_clean(cluster):
    """A study started from the app on twin nodes, two of its topologies launched and swept while the screen
    is closed and opened again, then cancelled: each topology is a launch and a sweep."""
    app, poller = app_for(cluster)
    async with app.run_test(size=(160, 48)) as pilot:
        first = await start_study(pilot)
        run = first.run

        # The matrix fills in.
        await eventually(lambda: run.rows["solo"].status == "done", timeout=60, what="solo measured")
        await until(pilot, lambda: cell(first, "solo", "topology") == "✓ solo", what="solo drawn as measured")
        assert all(any(ch.isdigit() for ch in cell(first, "solo", f"c{c}")) for c in (1, 2))
        solo = [cell(first, "solo", f"c{c}") for c in (1, 2)]

        # Leaving the screen does not stop it: the next topology starts meanwhile (three more are to come
        # after it, each a launch and a sweep: the study cannot end while the test looks).
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
        await eventually(lambda: run.rows["cluster-ray"].status != "pending", timeout=30, what="the next topology")
        await until(pilot, lambda: "study 2/5 cluster-ray" in status_line(app), what=lambda: status_line(app))

        # `y` shows it again, with everything so far: solo's figures, and cluster-ray as far as it has got
        # (under way; measured, should it be quicker than the test).
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, StudyScreen))
        back = app.screen
        assert back is not first
        await until(pilot, lambda: [cell(back, "solo", f"c{c}") for c in (1, 2)] == solo,
                    what=lambda: f"solo's figures again, {solo}: {[cell(back, 'solo', f'c{c}') for c in (1, 2)]}")
        assert cell(back, "cluster-ray", "topology") in ("▶ cluster-ray", "✓ cluster-ray")
        assert run.running, "the study ended before the test could cancel it"

        # Esc asks; y cancels: what runs is removed on every node, the study says `cancelled`.
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ConfirmCancelStudy))
        await pilot.press("y")
        await eventually(lambda: not run.running, timeout=60, what="the study cancelled")
        assert run.status == "cancelled"
        await until(pilot, lambda: "cancelled after" in head_of(back), what=lambda: head_of(back))
        assert isinstance(app.screen, StudyScreen)
        assert cell(back, "solo", "c2") != "·"  # what was measured stays
        assert containers(cluster, 0) == [] and containers(cluster, 1) == []
    await poller.close()
    saved = json.loads((run.study.dir / "study.json").read_text())
    assert saved["status"] == "cancelled" and saved["pid"] is None
    assert saved["topologies"][0]["status"] == "done"
    assert containers(cluster, 0) == [] and containers(cluster, 1) == []



@pytest.mark.slow
@twins
async def test_quitting_mid_study_asks_then_cancels_it_and_leaves_nothing(cluster):
    app, poller = app_for(cluster)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await start_study(pilot, levels="1")
        run = screen.run
        await eventually(lambda: run.rows["solo"].status in ("launching", "sweeping"), timeout=60, what="a launch")
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, ConfirmCancelStudy))
        await pilot.press("n")  # no: it goes on
        await until(pilot, lambda: isinstance(app.screen, StudyScreen))
        assert run.running and app.is_running
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, ConfirmCancelStudy))
        await pilot.press("y")  # yes: cancelled, and the app ends once its containers are gone
        await eventually(lambda: not app.is_running, timeout=60, what="the app quit")
    await poller.close()
    saved = json.loads((run.study.dir / "study.json").read_text())
    assert saved["status"] == "cancelled"
    assert containers(cluster, 0) == [] and containers(cluster, 1) == []


@pytest.mark.slow
@twins
async def test_the_app_ending_mid_study_removes_what_it_started(cluster):
    """SIGTERM or a closed terminal (`app.exit()`, no question): the study is
    interrupted, resumable, and nothing of it is left running."""
    app, poller = app_for(cluster)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await start_study(pilot, levels="1")
        run = screen.run
        await eventually(lambda: run.rows["solo"].status == "sweeping", timeout=60, what="the sweep")
        app.exit()
    await poller.close()
    saved = json.loads((run.study.dir / "study.json").read_text())
    assert saved["status"] == "interrupted" and saved["pid"] is None
    assert containers(cluster, 0) == [] and containers(cluster, 1) == []
