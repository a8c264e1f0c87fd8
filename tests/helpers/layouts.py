"""Deterministic set-ups of every screen, for the layout snapshots
(tests/ui/test_layouts.py) and the 120x40 screenshots (scripts/screenshots.py):
a paused replay of tests/fixtures/recording-demo.jsonl, a sweep run and a
study written from files, a canned preflight and a finished launch."""

from __future__ import annotations

from pathlib import Path

from sparktop.bench.events import SweepFinished, SweepStarted
from sparktop.bench.results import RunWriter, list_runs, load_run
from sparktop.bench.sweep import SweepSettings
from sparktop.launch.events import LogLine, Ready, Stage, StepDone, StepStarted
from sparktop.launch.preflight import Check, Preflight
from sparktop.launch.session import LaunchRun
from sparktop.observe.record import Recording, ReplaySource
from sparktop.settings import Inventory, Node
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from sparktop.ui.messages import SweepProgress

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "fixtures" / "recording-demo.jsonl"
T0 = 1_760_000_000.0
RECIPE = "nemotron-nano-9b-v2"


def inventory() -> Inventory:
    return Inventory(nodes=[Node(name=name, host="localhost", fabric_ip=ip, eth_if="enp1s0f1np1",
                                 ib_if=["rocep1s0f1", "roceP2p1s0f1"], bind=ip)
                            for name, ip in (("spark-a", "127.0.0.2"), ("spark-b", "127.0.0.3"))])


def replay_app(**kw) -> SparktopApp:
    source = ReplaySource(Recording.load(RECORDING), speed=1.0)
    source.seek(1e12)  # straight to the end of the recording
    source.pause()
    return SparktopApp(source, replay=True, **kw)


async def painted(pilot) -> None:
    """Until the screen just pushed has drawn its status line (the app repaints it on the screen's
    resume: on a busy machine that can take longer than a fixed pause)."""
    from sparktop.ui.screens import StatusLine

    for _ in range(100):
        await pilot.pause(0.1)
        lines = pilot.app.screen.query(StatusLine)
        if lines and str(lines.first().content).strip():
            break
    await pilot.pause(0.3)


async def settle(pilot) -> None:
    app = pilot.app
    for _ in range(50):
        if len(app.state.engines) == 2 and len(list(app.screen.query(EngineCard))) == 2:
            break
        await pilot.pause(0.1)
    await pilot.pause(0.5)


# -- sweep runs on disk ------------------------------------------------------------------


def _records(c: int, run: int, rate: float, t0: float):
    from sparktop.bench.request import RequestRecord

    times = [t0 + 0.2 * c ** 0.5 + k / rate for k in range(64)]
    return [RequestRecord(level=c, run=run, index=i, start=t0, first_response=times[0], first_token=times[0],
                          end=times[-1], prompt_tokens=1024, completion_tokens=64, token_times=times, status=200)
            for i in range(c)]


def write_run(root: Path, run_id: str, label: str, rates: dict[int, float], runs: int = 2) -> Path:
    from sparktop.bench.stats import EngineWatch

    w = RunWriter(root, run_id, {"model": "gpt-oss-120b", "topology": "solo", "label": label,
                                 "settings": {"pp": 1024, "tg": 64}})
    t = T0
    for c, rate in rates.items():
        for r in range(1, runs + 1):
            for rec in _records(c, r, rate, t):
                w.append(rec)
            t += 10
        w.engine_level(c, EngineWatch(kv_cache_usage_max=0.02 * c, running_max=c, waiting_max=0, preemptions=0))
    w.close("done")
    return root / run_id


def write_runs(root: Path) -> Path:
    write_run(root, "20251009-090000-gpt-oss-120b", "solo on spark-b", {1: 52.0, 2: 48.0, 4: 42.0, 8: 33.0, 16: 24.0})
    write_run(root, "20251009-100000-gpt-oss-120b", "20251009-100000-gpt-oss-120b",
              {1: 55.0, 2: 51.0, 4: 45.0, 8: 36.0, 16: 27.0})
    return root


def finish_sweep(screen, root: Path) -> None:
    """Show the newest run on `root` as a sweep that just finished, the older one overlaid."""
    runs = list_runs(root)
    run = load_run(runs[-1].path)
    levels = run.levels()
    settings = SweepSettings(screen.engines[0].url if screen.engines else "http://127.0.0.1:8000",
                             levels=[lv.concurrency for lv in levels], runs=2, pp=1024, tg=64)
    screen.on_sweep_progress(SweepProgress(SweepStarted("x", run.path, "gpt-oss-120b", settings, 20, 20)))
    screen.earlier = [("solo on spark-b", load_run(runs[0].path).levels())]
    for lv in levels:
        screen._level_done(lv)
    screen.on_sweep_progress(SweepProgress(SweepFinished("done", None, levels, Path("/results") / run.id)))


# -- a launch -------------------------------------------------------------------------------


def canned_preflight(plan, recipe) -> Preflight:
    checks = [Check("reach", n, "pass", "ssh ok, docker 28.3") for n in plan.nodes]
    checks += [Check("memory", n, "pass", "112.4 GiB available of 119.6 GiB") for n in plan.nodes]
    checks += [Check("image", n, "pass", "vllm-node:latest present") for n in plan.nodes]
    checks += [Check("weights", n, "warn", "not in the HF cache: the first start downloads ~9 GiB")
               for n in plan.nodes[:1]]
    checks += [Check("ports", n, "pass", "8000 free") for n in plan.nodes]
    return Preflight(checks)


def ready_run(plan) -> LaunchRun:
    run = LaunchRun.for_plan(plan)
    for i, step in enumerate(plan.steps):
        run.apply(StepStarted(i, step))
        run.apply(StepDone(i, step, 0.4 + i * 0.3))
    for e in plan.endpoints:
        node = plan.nodes[0]
        for stage in ("loading weights", "compiling", "ready"):
            run.apply(Stage(node, e.container, stage))
        for k in range(30):
            run.apply(LogLine(node, e.container, f"INFO 10-09 09:00:{k:02d} [gpu_model_runner.py:1234] "
                                                  f"step {k}: Model loading took 8.61 GiB and 12.3 seconds"))
    run.apply(Ready(plan, 42.0))
    return run


# -- every screen, one after another, in one app ---------------------------------------------


def stable_launcher(app: SparktopApp) -> None:
    """The app's launcher with a canned preflight and recipe paths that do not
    depend on where the checkout is."""
    import dataclasses

    launcher = app.launcher
    found = launcher.recipes

    def recipes():
        recipes, errors = found()
        return {rid: dataclasses.replace(r, path=Path("recipes") / r.path.name) for rid, r in recipes.items()}, errors

    async def preflight(plan, recipe):
        return canned_preflight(plan, recipe)

    launcher.recipes = recipes  # type: ignore[method-assign]
    launcher.preflight = preflight  # type: ignore[method-assign]


async def every_screen(pilot, results: Path, shoot) -> None:
    """Drive an app made by `replay_app(results_root=..., study_dir=..., inventory=inventory())`
    through every screen; `shoot(name)` is called on each once it has settled."""
    from textual.widgets import DataTable

    from sparktop.bench.results import list_runs, load_run
    from sparktop.ui.launcher import LaunchScreen, ProgressScreen
    from sparktop.ui.study import StudyScreen
    from sparktop.ui.sweep import CompareScreen, RunsScreen, SweepScreen

    app = pilot.app
    for _ in range(100):  # the attached study, shown, and the replay at its end
        screen = app.screen
        if isinstance(screen, StudyScreen) and screen.is_mounted and not screen.run.running \
                and screen._chart_key is not None and len(app.state.engines) == 2:
            break
        await pilot.pause(0.1)
    await pilot.pause(1.0)
    await shoot("study")
    app.pop_screen()
    await settle(pilot)
    await shoot("monitor")
    next(iter(app.screen.query(EngineCard))).focus()
    await pilot.press("enter")
    await pilot.pause(0.5)
    await shoot("detail")
    await pilot.press("escape", "question_mark")
    await pilot.pause(0.3)
    await shoot("help")
    await pilot.press("escape")
    stable_launcher(app)
    launcher = LaunchScreen(app.launcher)
    app.push_screen(launcher)
    await pilot.pause(0.3)
    table = launcher.query_one("#recipes", DataTable)
    table.move_cursor(row=[row.key.value for row in table.ordered_rows].index(RECIPE))
    for _ in range(100):
        await pilot.pause(0.1)
        if launcher.plan is not None and "predicted" in str(launcher.query_one("#preflight").content):
            break
    await pilot.pause(0.3)
    await shoot("launcher")
    plan = launcher.plan
    app.pop_screen()
    app.push_screen(ProgressScreen(app.launcher, ready_run(plan)))
    await painted(pilot)
    await shoot("launch-progress")
    app.pop_screen()
    sweep = SweepScreen(list(app.state.engines.values()), results)
    app.push_screen(sweep)
    await pilot.pause(0.3)
    finish_sweep(sweep, results)
    await pilot.pause(0.8)
    for worker in [w for w in app.workers if w.group == "predict"]:  # each level's prediction, beside it
        await worker.wait()
    await pilot.pause(0.2)
    await shoot("sweep")
    app.push_screen(RunsScreen(results))
    await pilot.pause(0.3)
    await pilot.press("space", "down", "space")
    await pilot.pause(0.2)
    await shoot("runs")
    compare = CompareScreen([load_run(r.path) for r in list_runs(results)])
    app.push_screen(compare)
    for _ in range(100):  # until its text is laid out (a busy machine takes longer than a fixed pause)
        await pilot.pause(0.1)
        if app.screen is compare and compare.query("#compare-text") \
                and compare.query_one("#compare-text").region.height > 1:
            break
    await pilot.pause(0.5)
    await shoot("compare")
