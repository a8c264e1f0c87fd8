"""What a new user sees at 80x24 (and the usual bigger sizes), issue 37: the
footer's keys, the sweep form's labels and its table, empty charts, the help's
layout, and `sparktop recipes` in an 80-column terminal. The app is a paused
replay of tests/fixtures/recording-demo.jsonl (tests/helpers/layouts.py), so
what is on screen is the same on any machine."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import DataTable, Input, Select, Static

from sparktop.bench.events import SweepStarted
from sparktop.bench.results import list_runs, load_run
from sparktop.bench.sweep import SweepSettings
from sparktop.launch.catalog import discover
from sparktop.launch.commands import cmd_recipes
from sparktop.ui import charts
from sparktop.ui.cards import EngineCard
from sparktop.ui.footer import KeyFooter
from sparktop.ui.launcher import LaunchScreen
from sparktop.ui.messages import SweepProgress
from sparktop.ui.screens import HelpScreen, MonitorScreen
from sparktop.ui.sweep import SweepScreen, level_chart
from tests.helpers import layouts
from tests.helpers.pilot import until

SIZES = [(80, 24), (100, 30), (120, 40), (160, 48)]


@pytest.fixture(autouse=True)
def stable(utc_own_dirs):
    yield


def screen_lines(app) -> list[str]:
    """The screen as the terminal shows it, a string per row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


async def monitor(pilot) -> None:
    """Until the replay's two engines are on screen as cards."""
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, MonitorScreen) and len(app.screen.query(EngineCard)) == 2,
                what="the two engines' cards")


def footer_keys(app) -> dict[str, str]:
    """The footer's keys that are whole on screen: {key: description}."""
    footer = app.screen.query_one(KeyFooter)
    screen = app.screen.region
    return {key.key: key.description for key in footer.query("FooterKey")
            if key.region.area and screen.contains_region(key.region)
            and not any(other is not key and other.region.overlaps(key.region) for other in footer.query("FooterKey"))}


# -- 1. the footer ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_monitor_footer_shows_every_key_a_user_needs(size):
    """At 80 columns the footer stopped after "l Launch": x, s and h were never shown."""
    app = layouts.replay_app()
    async with app.run_test(size=size) as pilot:
        await monitor(pilot)
        await until(pilot, lambda: "q" in footer_keys(app), what="the footer's keys")
        keys = footer_keys(app)
        assert {"enter", "q", "question_mark", "l", "x", "s", "h", "p", "plus", "minus"} <= set(keys), keys
        assert keys["h"] == "History" and keys["x"] == "Stop" and keys["s"] == "Sweep"
        footer = screen_lines(app)[-1]
        assert "Speed" in footer  # + and - as one group
        # The command palette's key only where it leaves the others their room (ctrl+p opens it anyway).
        assert ("palette" in footer) == (size[0] >= 100)


async def test_the_sweep_footer_keeps_its_own_keys_first_at_80_columns(tmp_path):
    results = layouts.write_runs(tmp_path / "results")
    app = layouts.replay_app(results_root=results)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_sweep(pilot, results)
        await until(pilot, lambda: "escape" in footer_keys(app), what=lambda: f"the sweep's keys: {footer_keys(app)}")
        keys = footer_keys(app)
        assert {"escape", "ctrl+r", "q", "question_mark"} <= set(keys), keys


# -- 2. the sweep form and its table -------------------------------------------------------------------------------


async def open_sweep(pilot, results: Path) -> SweepScreen:
    """The sweep screen on the replay's engines (`s` says a replay cannot sweep: opened as `s` opens it)."""
    app = pilot.app
    await monitor(pilot)
    screen = SweepScreen(app.state.ordered_engines(), results)
    app.push_screen(screen)
    await until(pilot, lambda: app.screen is screen and screen.is_mounted)
    await until(pilot, lambda: screen.query_one("#pp", Input).border_title, what="the boxes' labels")
    await pilot.pause()
    return screen


def form_lines(app) -> str:
    """The rows of the sweep's form (under the status line, above the progress line)."""
    return "\n".join(screen_lines(app)[1:7])


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 48)], ids=["80x24", "120x40", "160x48"])
async def test_every_box_of_the_sweep_form_says_what_it_holds_when_filled(size, tmp_path):
    """Filled, the boxes read "5", "1024", "128": each has a label that stays, not only a placeholder."""
    app = layouts.replay_app(results_root=tmp_path / "results")
    async with app.run_test(size=size) as pilot:
        screen = await open_sweep(pilot, tmp_path / "results")
        for box in screen.query("#sweep-form Input").results(Input):
            if box.display:
                assert box.value or box.id == "extra", box.id  # the defaults are filled in
        text = form_lines(app)
        for label in ("endpoint", "mode", "concurrency", "runs", "prompt", "output", "extra"):
            assert label in text, (label, text)
        for value in ("1,2,4,8,16,32,64", "5", "1024", "128"):
            assert value in text
        # The endpoint on one line, its address first: at 80 columns the rest is left out (it read
        # "127.0.0.2:8000 · …"), not wrapped under the box.
        label = screen.query_one("#sweep-engine", Select).query_one("SelectCurrent #label", Static)
        assert label.region.height == 1
        assert re.search(r"127\.0\.0\.[23]:8000", text) and "· …" not in text
        if size[0] >= 120:
            assert re.search(r"127\.0\.0\.[23]:8000 · ", text)
        # A rate sweep's boxes: seconds per level and the SLO, labelled too.
        screen.query_one("#sweep-mode", Select).value = "poisson"
        await until(pilot, lambda: screen.query_one("#slo", Input).display and "SLO" in form_lines(app),
                    what=lambda: f"the rate boxes' labels in {form_lines(app)!r}")
        text = form_lines(app)
        assert "rates" in text and ("s/level" in text or "seconds per level" in text), text
        for box in screen.query("#sweep-form Input").results(Input):
            if box.display:  # every label whole where it is drawn
                assert box.border_title and len(str(box.border_title)) <= box.outer_size.width - 6, box.id
                assert str(box.border_title) in text


def heads(table: DataTable) -> list[str]:
    return [str(c.label) for c in table.columns.values()]


async def test_the_sweep_table_leaves_columns_out_rather_than_cut_them(tmp_path):
    """At 80x24 the lockstep table ran off the screen's edge (J/tok, the prediction and the errors out of
    sight, a scrollbar under it): the columns it has no room for go, the least needed first."""
    results = layouts.write_runs(tmp_path / "results")
    app = layouts.replay_app(results_root=results)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_sweep(pilot, results)
        layouts.finish_sweep(screen, results)
        table = screen.query_one("#levels-table", DataTable)
        await until(pilot, lambda: table.row_count == 5)
        await pilot.pause()

        def fits() -> bool:
            return sum(c.get_render_width(table) for c in table.columns.values()) \
                <= table.scrollable_content_region.width

        assert fits(), heads(table)
        narrow = heads(table)
        assert narrow[:3] == ["c", "pp t/s", "tg t/s"]
        assert {"TTFT", "p95", "err", "pred tg", "J/tok"} <= set(narrow)
        assert not {"p50", "peak"} & set(narrow)
        assert [table.get_row_at(i)[0] for i in range(5)] == ["c1", "c2", "c4", "c8", "c16"]
        # Wide, every column again (the table beside the charts); narrow again, the same few.
        await pilot.resize_terminal(160, 48)
        await until(pilot, lambda: len(heads(table)) == 14, what=lambda: f"every column at 160: {heads(table)}")
        assert fits() and table.row_count == 5
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: heads(table) == narrow, what=lambda: f"the 80-column table: {heads(table)}")


# -- 3. empty charts --------------------------------------------------------------------------------------------


def test_a_chart_with_nothing_to_draw_says_so_without_axes():
    for chart in (charts.line_chart("generation tokens/s", [("generation", [], [])], 60, 12),
                  level_chart("decode t/s (total)", "tg_tps_total", [("this run", [])], 60, 12)):
        text = chart.plain
        assert "no data yet" in text or "no level measured yet" in text
        assert "-1.00" not in text and "1.00" not in text and "0.00" not in text
        lines = text.split("\n")
        assert len(lines) == 12 and max(len(line) for line in lines) <= 60  # the room a drawn chart takes


async def test_the_sweep_charts_say_no_level_yet_until_one_is_measured(tmp_path):
    results = layouts.write_runs(tmp_path / "results")
    app = layouts.replay_app(results_root=results)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_sweep(pilot, results)
        run = load_run(list_runs(results)[-1].path)
        settings = SweepSettings(screen.engines[0].url, levels=[1, 2], runs=2, pp=1024, tg=64)
        screen.on_sweep_progress(SweepProgress(SweepStarted("x", run.path, "a-model-never-swept", settings, 8, 0)))
        boxes = list(screen.query("#sweep-charts .chart").results(Static))
        await until(pilot, lambda: all("no level measured yet" in str(box.content) for box in boxes),
                    what=lambda: f"the empty charts: {[str(box.content)[:200] for box in boxes]}")
        text = "\n".join(screen_lines(app))
        assert "no level measured yet" in text and "-1.00" not in text


# -- 4. the help -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_help_wraps_each_description_under_itself(size):
    """"refresh)" came back to the left edge under the h line, at every size: a description's second line
    now starts where its first did."""
    app = layouts.replay_app()
    async with app.run_test(size=size) as pilot:
        await monitor(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        box = app.screen.query_one("#help")
        while not any("refresh)" in line for line in screen_lines(app)):
            assert box.scroll_y < box.max_scroll_y, "the h line is in the help"
            box.scroll_relative(y=1, animate=False)  # a short terminal: down to it, as a user scrolls
            await pilot.pause()
        lines = screen_lines(app)
        h_line = next(line for line in lines if "history: the last 24 hours" in line)
        column = h_line.index("history:")
        wrapped = [line for line in lines if "refresh)" in line and "history:" not in line]
        assert wrapped, "the h line's description fits one line"
        for line in wrapped:
            assert re.search(r"\w", line).start() == column, (h_line, line)


# -- 5. sparktop recipes -----------------------------------------------------------------------------------------


def recipes_table(width: int) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    assert cmd_recipes(None, False, console=console) == 0
    return out.getvalue().splitlines()


def quant_column(lines: list[str], ids: list[str]) -> dict[str, str]:
    """{recipe: quant} from the table's rows (recipe, runtime, quant, ... apart by two spaces or more)."""
    out = {}
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] in ids:
            out[cells[0]] = cells[2]
    return out


@pytest.mark.parametrize("width", [80, 120])
def test_recipes_keeps_every_recipe_id_whole(width):
    """At 80 columns `sparktop recipes` printed "gpt-oss…" five times: the columns it has no room for go
    (the model's full name, the file: --json has them), the recipe stays whole."""
    recipes, _ = discover(None)
    lines = recipes_table(width)
    assert all(len(line.rstrip()) <= width for line in lines)
    assert "…" not in "\n".join(lines)
    starts = [line.split()[0] for line in lines if line.strip()]
    for rid in recipes:
        assert rid in starts, rid
    assert any("left out" in line and "--json" in line for line in lines)


async def test_recipes_and_the_launcher_show_the_same_quant(tmp_path):
    """`recipes` said "—" for the llama.cpp, SGLang and TensorRT-LLM recipes where the launcher said mxfp4."""
    recipes, _ = discover(None)
    ids = sorted(recipes)
    printed = quant_column(recipes_table(120), ids)
    assert set(printed) == set(ids)
    assert {printed[rid] for rid in ("gpt-oss-120b-llama-cpp", "gpt-oss-120b-sglang", "gpt-oss-120b-trtllm")
            if rid in printed} == {"mxfp4"}
    app = layouts.replay_app(inventory=layouts.inventory())
    async with app.run_test(size=(120, 40)) as pilot:
        await monitor(pilot)
        app.push_screen(LaunchScreen(app.launcher))
        await until(pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen.recipes)
        table = app.screen.query_one("#recipes", DataTable)
        shown = {rid: str(table.get_cell(rid, "quant")) for rid in ids}
    assert shown == printed
