"""Issue 37, "every screen readable at 80x24": what a new user sees of the idle guard and the demo's load
stepping aside, every screen's footer at 80 columns (its own keys whole, no label cut mid-word), the sweep
form's endpoint and placeholders, and the sweep's progress line (what its counts count, an ETA that says how
sure it is). Text on the rendered screen at a given size; the app is a paused replay (tests/helpers/layouts.py)."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Input, Select, Static

from sparktop.bench.events import RequestDone, SweepStarted, WaitingForIdle
from sparktop.bench.request import RequestRecord
from sparktop.bench.results import list_runs, load_run
from sparktop.bench.sweep import SweepSettings
from sparktop.ui.footer import KeyFooter
from sparktop.ui.messages import SweepProgress
from sparktop.ui.sweep import eta_words, remaining_seconds
from tests.helpers import layouts
from tests.helpers.pilot import until
from tests.ui.test_at_80_columns import footer_keys, monitor, open_sweep, screen_lines

SIZES = [(80, 24), (120, 40), (160, 48)]
IDS = [f"{w}x{h}" for w, h in SIZES]


@pytest.fixture(autouse=True)
def stable(utc_own_dirs):
    yield


def shown(app, widget) -> str:
    """What `widget` shows on screen, its rows joined by a space (a line wrapped over two rows reads as one)."""
    lines = screen_lines(app)
    r = widget.content_region
    return " ".join(" ".join(lines[y][r.x:r.right].split()) for y in range(r.y, r.bottom))


def start(screen, app, settings=None) -> None:
    results = screen.results_root
    run = load_run(list_runs(results)[-1].path)
    settings = settings or SweepSettings(screen.engines[0].url, levels=[1, 2], runs=2, pp=1024, tg=64)
    screen.on_sweep_progress(SweepProgress(SweepStarted("x", run.path, "gpt-oss-120b", settings, 8, 0)))


# -- 1. the idle guard and the demo's load -------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_guard_line_fits_and_the_demo_note_stays(size, tmp_path):
    """The guard's line overwrote "the demo's load steps aside…" a second after the start; at 160 columns it
    was cut before it said what ⚠ means, at 80 before the running count and the timer."""
    results = layouts.write_runs(tmp_path / "results")
    app = layouts.replay_app(results_root=results)
    async with app.run_test(size=size) as pilot:
        screen = await open_sweep(pilot, results)
        app.label = "demo: twin cluster serving gpt-oss-120b"  # the demo's app, whose load steps aside
        start(screen, app)
        screen.on_sweep_progress(SweepProgress(WaitingForIdle(1, 4.0, 0.0, 1.0, 60.0)))
        line = screen.query_one("#sweep-progress", Static)
        await until(pilot, lambda: "waiting" in shown(app, line), what=lambda: shown(app, line))
        await pilot.pause()
        text = shown(app, line)
        assert text.startswith("c1 waiting") and "4 running" in text and "1 of 60 s" in text, text
        assert "⚠" in text and "anyway" in text, text  # what happens after the wait, whole
        if size[0] >= 120:
            assert "a level with other traffic is marked ⚠" in text, text
        # The note has its own place, beside the live chart, while the guard's line is shown.
        note = shown(app, screen.query_one("#engine-line", Static))
        assert "the demo's load steps aside from this node until the sweep ends" in note, note


# -- 2. the footers ------------------------------------------------------------------------------------------


def whole_and_cut(app) -> tuple[dict[str, str], list[str]]:
    """The footer's keys shown whole, and any shown only in part (a label cut at the screen's edge)."""
    footer = app.screen.query_one(KeyFooter)
    whole = footer_keys(app)
    cut = [key.key for key in footer.query("FooterKey") if key.display and key.region.area
           and key.key not in whole]
    return whole, cut


async def test_the_history_footer_shows_its_keys_whole_at_80_columns():
    """The history screen's footer ended "s Sweep p Pau"."""
    app = layouts.replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await monitor(pilot)
        await pilot.press("h")
        await until(pilot, lambda: type(app.screen).__name__ == "HistoryScreen")
        await until(pilot, lambda: "w" in footer_keys(app), what=lambda: f"the history keys: {footer_keys(app)}")
        await pilot.pause()
        whole, cut = whole_and_cut(app)
        assert not cut, (cut, screen_lines(app)[-1])
        assert {"escape", "1", "7", "w", "r", "question_mark"} <= set(whole), whole
        footer = screen_lines(app)[-1]
        assert "Pau" not in footer or "Pause" in footer, footer


async def test_a_finished_sweep_shows_the_app_keys_at_80_columns(tmp_path):
    """A finished sweep's footer said only "esc Cancel / back ^r Past runs + - Speed": the cursor was still in
    a box of the form, which takes q, s, h... as typing. Once a sweep ends the table has the focus."""
    results = layouts.write_runs(tmp_path / "results")
    app = layouts.replay_app(results_root=results)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_sweep(pilot, results)
        screen.query_one("#levels", Input).focus()
        await pilot.pause()
        layouts.finish_sweep(screen, results)
        await until(pilot, lambda: "q" in footer_keys(app), what=lambda: f"the keys: {footer_keys(app)}")
        await pilot.pause()
        whole, cut = whole_and_cut(app)
        assert not cut, (cut, screen_lines(app)[-1])
        assert {"escape", "ctrl+r", "q", "question_mark", "l", "x", "s", "h"} <= set(whole), whole
        assert whole["escape"] == "Back" and whole["ctrl+r"] == "Runs"  # compact labels, true to what they do
        assert isinstance(app.screen.focused, DataTable)


@pytest.mark.parametrize("size", [(80, 24), (100, 30)], ids=["80x24", "100x30"])
async def test_no_screen_cuts_a_key_in_its_footer(size, tmp_path):
    """Every screen (the study, the monitor, a detail, the launcher, a launch, the sweep, past runs and their
    comparison): each footer key shown whole, the screen's own first."""
    from tests.ui.test_study_screen import every_kind_of_cell

    results = layouts.write_runs(tmp_path / "results")
    app = layouts.replay_app(results_root=results, study_dir=every_kind_of_cell(tmp_path / "studies"),
                             inventory=layouts.inventory())
    seen: dict[str, dict[str, str]] = {}

    async def shoot(name: str) -> None:
        if not app.screen.query(KeyFooter):
            return  # the help has no footer
        await pilot.pause(0.2)
        whole, cut = whole_and_cut(app)
        assert not cut, (name, cut, screen_lines(app)[-1])
        seen[name] = whole

    async with app.run_test(size=size) as pilot:
        await layouts.every_screen(pilot, results, shoot)
    assert {"escape", "m"} <= set(seen["study"]), seen["study"]
    assert {"escape", "ctrl+r"} <= set(seen["sweep"]), seen["sweep"]
    assert {"escape", "space"} <= set(seen["runs"]), seen["runs"]
    assert "escape" in seen["compare"] and "escape" in seen["detail"]


# -- 2b. the sweep form at 80 columns ------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_endpoint_and_the_placeholders_read_whole(size, tmp_path):
    """At 80 columns the endpoint read "127.0.0.2:8000 · …" and the extra body's placeholder "e.g."."""
    app = layouts.replay_app(results_root=tmp_path / "results")
    async with app.run_test(size=size) as pilot:
        screen = await open_sweep(pilot, tmp_path / "results")
        await pilot.pause()
        endpoint = shown(app, screen.query_one("#sweep-engine", Select).query_one("SelectCurrent #label"))
        assert "127.0.0.2:8000" in endpoint or "127.0.0.3:8000" in endpoint, endpoint
        assert "…" not in endpoint, endpoint
        if size[0] >= 120:
            assert "gpt-oss-120b" in endpoint, endpoint
        extra = screen.query_one("#extra", Input)
        assert "=" in extra.placeholder and "…" not in shown(app, extra), shown(app, extra)
        assert extra.placeholder in shown(app, extra), (extra.placeholder, shown(app, extra))
        if size[0] >= 120:
            assert "e.g. reasoning_effort=low" in shown(app, extra)


# -- 3. the progress line: what it counts, and the ETA ---------------------------------------------------------


def record(c: int, run: int, index: int, start: float, end: float) -> RequestRecord:
    return RequestRecord(level=c, run=run, index=index, start=start, first_token=start + 0.5, end=end,
                         completion_tokens=64, status=200)


async def test_the_progress_line_says_what_it_counts_and_an_honest_eta(tmp_path):
    """"level 16/40" counted the requests within a level; the ETA came from the sweep's guess that a bigger
    level grows as the square root of its concurrency, and stayed minutes short."""
    results = layouts.write_runs(tmp_path / "results")
    app = layouts.replay_app(results_root=results)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_sweep(pilot, results)
        settings = SweepSettings(screen.engines[0].url, levels=[1, 2, 4, 8], runs=2, pp=1024, tg=64)
        screen.sweep = type("S", (), {"s": settings})()  # the settings the line reads, as a started sweep has
        start(screen, app, settings)
        line = screen.query_one("#sweep-progress", Static)
        screen.on_sweep_progress(SweepProgress(RequestDone(record(1, 1, 0, 0.0, 10.0), 1, 30, 1, 2, None, 99.0)))
        await until(pilot, lambda: "requests" in shown(app, line), what=lambda: shown(app, line))
        text = shown(app, line)
        assert "requests 1/2 of c1" in text and "batch 1/2" in text, text
        assert "ETA ~" in text and "1m39s" not in text, text  # a range of its own, not the sweep's 99 s
        assert "–" in text, text  # one level measured: how the next ones grow is a range
        screen.on_sweep_progress(SweepProgress(RequestDone(record(2, 1, 0, 30.0, 45.0), 4, 30, 1, 4, None, 9.0)))
        screen.on_sweep_progress(SweepProgress(RequestDone(record(2, 1, 1, 30.0, 50.0), 5, 30, 2, 4, None, 9.0)))
        await until(pilot, lambda: "of c2" in shown(app, line), what=lambda: shown(app, line))
        text = shown(app, line)
        assert "requests 2/4 of c2" in text, text
        assert "ETA ~" in text and "–" not in text, text  # two levels measured: their growth, one figure


def test_the_eta_is_a_range_until_two_levels_are_measured():
    cells = [(0, 1), (0, 2), (0, 4), (0, 8)]
    assert remaining_seconds(cells, 2, True, 0, 2, {}) is None
    assert eta_words(None) == "ETA …"
    low, high = remaining_seconds(cells, 2, True, 0, 1, {(0, 1): 10.0})
    # c1 measured at 10 s a batch; c2, c4, c8 three batches each, growing as √c at best and as c at worst
    assert low == pytest.approx(10 + 3 * 10 * (2 ** 0.5 + 2 + 8 ** 0.5))
    assert high == pytest.approx(10 + 3 * 10 * (2 + 4 + 8))
    assert eta_words((low, high)).startswith("ETA ~") and "–" in eta_words((low, high))
    # c2 took twice c1's time: the levels after it grow as c (k = 1), one figure
    low, high = remaining_seconds(cells, 2, True, 1, 0, {(0, 1): 10.0, (0, 2): 20.0})
    assert low == high == pytest.approx(3 * 40 + 3 * 80)
    assert eta_words((low, high)) == "ETA ~6m00s"
    assert eta_words((400.0, 1200.0)) == "ETA ~7m–20m"  # a range to the minute
