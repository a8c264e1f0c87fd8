"""The sweep screen says what its clean-measurement guard is doing: while it waits for the engine to go idle
(what runs, how long of how long, what happens then), when a level saw other traffic, and what the table's ⚠
means once the sweep is over."""

from __future__ import annotations

import dataclasses

from sparktop.bench.events import LevelContaminated, SweepFinished, SweepStarted, WaitingForIdle
from sparktop.bench.results import list_runs, load_run
from sparktop.bench.sweep import SweepSettings
from sparktop.ui.messages import SweepProgress
from tests.helpers import layouts
from tests.helpers.pilot import until
from tests.ui.test_at_80_columns import open_sweep, screen_lines


async def test_the_guard_says_what_it_waits_for_and_what_the_warning_means(tmp_path):
    results = layouts.write_runs(tmp_path / "results")
    app = layouts.replay_app(results_root=results)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_sweep(pilot, results)
        run = load_run(list_runs(results)[-1].path)
        settings = SweepSettings(screen.engines[0].url, levels=[1, 2], runs=2, pp=1024, tg=64)
        app.label = "demo: twin cluster serving gpt-oss-120b"  # the demo's app, whose load steps aside
        screen.on_sweep_progress(SweepProgress(SweepStarted("x", run.path, "gpt-oss-120b", settings, 8, 0)))
        await until(pilot, lambda: "steps aside" in "\n".join(screen_lines(app)), what="the demo's load's word")
        assert "the demo's load steps aside from this node until the sweep ends" in "\n".join(screen_lines(app))
        screen.on_sweep_progress(SweepProgress(WaitingForIdle(2, 3.0, 1.0, 12.4, 60.0)))
        await until(pilot, lambda: "waiting for the engine" in "\n".join(screen_lines(app)), what="the wait")
        text = "\n".join(screen_lines(app))
        assert "c2 waiting for the engine to finish what it serves (3 running, 1 waiting) · 12 of 60 s" in text
        screen.on_sweep_progress(SweepProgress(LevelContaminated(2, 1, 4, "4 foreign requests during the level",
                                                                 True)))
        await until(pilot, lambda: "measuring it again" in "\n".join(screen_lines(app)), what="the re-measure")
        assert "c2 ⚠ 4 foreign requests during the level · measuring it again" in "\n".join(screen_lines(app))
        # Finished with a contaminated level: the summary says what its ⚠ means.
        spoiled = dataclasses.replace(run.levels()[0], contaminated=True,
                                      contamination="4 foreign requests during the level")
        screen.on_sweep_progress(SweepProgress(SweepFinished("done", None, [spoiled], run.path)))
        await until(pilot, lambda: "not the engine's alone" in "\n".join(screen_lines(app)), what="the summary")
        assert (f"⚠ c{spoiled.concurrency}: measured with other traffic on the engine (4 foreign requests during "
                "the level)") in "\n".join(screen_lines(app))
