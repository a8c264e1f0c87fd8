"""The sweep screen as a user drives it: `s`, the settings, Enter, the live
table and charts, Esc to cancel, past runs and compare."""

from __future__ import annotations

import io

import pytest
from textual.widgets import Static

from sparktop.bench.results import list_runs
from sparktop.observe.poller import EngineTarget, Poller
from sparktop.twin.args import parse_serve_args
from sparktop.twin.server import TwinServer
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from sparktop.ui.screens import MonitorScreen
from sparktop.ui.sweep import CompareScreen, RunsScreen, SweepScreen
from tests.conftest import free_port
from tests.helpers.pilot import until
from tests.ui.test_monitor_app import cards

pytestmark = pytest.mark.slow


@pytest.fixture
async def engine():
    port = free_port()
    server = TwinServer(parse_serve_args(["llama-3.1-8b", "--host", "127.0.0.1", "--port", str(port),
                                          "--startup-speed", "1e6", "--speed", "3"]),  # slow enough to watch
                        log=io.StringIO())
    await server.start()
    poller = Poller([], [EngineTarget(server.url)], interval=0.3, down_after=3.0, default_port=None)
    await poller.start()
    yield server, poller
    await poller.close()
    await server.stop()


async def open_sweep(app, pilot) -> SweepScreen:
    """Wait for the engine to be ready, press `s`."""
    await until(pilot, lambda: any("● ready" in c.text for c in cards(app, EngineCard)))
    await pilot.press("s")
    await until(pilot, lambda: isinstance(app.screen, SweepScreen))
    return app.screen


def fill(screen, **values):
    for wid, value in values.items():
        screen.query_one(f"#{wid}").value = value


async def test_sweep_runs_live_and_fills_the_table_and_charts(engine, tmp_path):
    server, poller = engine
    app = SparktopApp(poller, results_root=tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_sweep(app, pilot)
        assert screen.query_one("#sweep-engine").value == server.url  # pre-filled with the running engine
        fill(screen, levels="1,2,4", runs="2", pp="256", tg="32")
        await pilot.press("enter")
        await until(pilot, lambda: screen.query_one("#levels-table").row_count >= 1, timeout=30)
        assert screen.running  # the first level is in while the others still run
        await until(pilot, lambda: screen.finished is not None, timeout=60)
        table = screen.query_one("#levels-table")
        assert table.row_count == 3
        assert [table.get_row_at(i)[0] for i in range(3)] == ["c1", "c2", "c4"]
        charts = " ".join(str(chart.content) for chart in screen.query("#sweep-charts .chart").results(Static))
        assert "decode t/s" in charts and "TTFT" in charts
        summary = str(screen.query_one("#sweep-summary").content)
        assert "done" in summary and str(tmp_path) in summary
        assert len(screen.query_one("#live-tps").data) > 3
        # Past runs and compare.
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen))
        assert app.screen.query_one("#runs-table").row_count == 1
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen))
        await pilot.press("escape", "escape", "escape")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
    (run,) = list_runs(tmp_path)
    assert run.meta["status"] == "done" and len(run.records) == 2 * (1 + 2 + 4)


async def test_escape_cancels_and_keeps_what_finished(engine, tmp_path):
    server, poller = engine
    app = SparktopApp(poller, results_root=tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_sweep(app, pilot)
        fill(screen, levels="1,64", runs="3", pp="256", tg="64")
        await pilot.press("enter")
        await until(pilot, lambda: screen.query_one("#levels-table").row_count == 1, timeout=30)
        await pilot.press("escape")
        await until(pilot, lambda: not screen.running, timeout=10)
        assert isinstance(app.screen, SweepScreen)  # cancelling does not close the screen
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
        assert app.is_running
    (run,) = list_runs(tmp_path)
    assert run.meta["status"] == "cancelled"
    assert [lv.concurrency for lv in run.levels()] == [1] and len(run.records) >= 3


async def test_a_server_dying_mid_sweep_is_reported_and_the_app_carries_on(engine, tmp_path):
    server, poller = engine
    app = SparktopApp(poller, results_root=tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_sweep(app, pilot)
        fill(screen, levels="1,16", runs="3", pp="256", tg="128")
        await pilot.press("enter")
        await until(pilot, lambda: screen.query_one("#levels-table").row_count == 1, timeout=30)
        await pilot.pause(0.5)
        await server.stop()
        await until(pilot, lambda: screen.finished is not None, timeout=60)
        summary = str(screen.query_one("#sweep-summary").content)
        assert "stopped at c16" in summary
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
        assert app.is_running
    (run,) = list_runs(tmp_path)
    assert run.meta["status"] == "stopped" and any(r.error for r in run.records if r.level == 16)
    assert len([r for r in run.records if r.level == 1]) == 3


async def test_a_rate_sweep_from_the_screen_fills_goodput_and_finds_the_max_rate(engine, tmp_path):
    """Issue 28 on screen: the mode select turns the levels into request rates; each level's row shows what
    was served and whether it met the SLO, the charts draw against the rate offered, and the search's answer
    closes the summary, as `sparktop sweep --find-max-rate` prints it."""
    server, poller = engine
    app = SparktopApp(poller, results_root=tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_sweep(app, pilot)
        assert not screen.query_one("#slo").display and screen.query_one("#runs").display
        screen.query_one("#sweep-mode").value = "max-rate"
        await pilot.pause()
        # The form a rate sweep needs: seconds per level and the SLO in, runs out, the levels a starting rate.
        assert screen.query_one("#slo").display and screen.query_one("#seconds").display
        assert not screen.query_one("#runs").display
        assert screen.query_one("#levels").value == "1"
        await pilot.press("enter")  # no SLO: the search has nothing to meet, and nothing starts
        await pilot.pause()
        assert not screen.running and list_runs(tmp_path) == []
        fill(screen, levels="2", seconds="2", pp="256", tg="16", slo="ttft_p95=300ms")
        await pilot.pause(0.3)  # the Start button ignores a second press while it still shows the first
        await pilot.press("enter")
        await until(pilot, lambda: screen.query_one("#levels-table").row_count >= 1, timeout=30)
        table = screen.query_one("#levels-table")
        assert [str(c.label) for c in table.columns.values()][:4] == ["rate", "sent/s", "req/s", "tok/s"]
        await until(pilot, lambda: screen.finished is not None, timeout=240)
        run = list_runs(tmp_path)[0]
        levels = run.rate_levels()
        assert len(levels) == table.row_count >= 2  # doubled until a rate missed the SLO
        rows = {str(table.get_row_at(i)[0]).rstrip(" ⚠"): table.get_row_at(i) for i in range(table.row_count)}
        for lv in levels:
            row = rows[lv.label]
            assert row[3] == f"{lv.output_tps:,.0f}" and row[10] == f"{lv.slo_share:.0%}"
            assert str(row[11]) == ("yes" if lv.meets_slo and not lv.saturated and not lv.behind else "no")
        assert any(str(table.get_row_at(i)[11]) == "no" for i in range(table.row_count))
        summary = str(screen.query_one("#sweep-summary").content)
        assert "meets the SLO" in summary or "no rate met the SLO" in summary
        assert run.meta["max_rate"] is not None and str(tmp_path) in summary
        charts = " ".join(str(chart.content) for chart in screen.query("#sweep-charts .chart").results(Static))
        assert "goodput req/s" in charts and "TTFT p95" in charts and "requests/s offered" in charts
        assert len(screen.query_one("#live-tps").data) > 3
        # At 80 columns the client's own figures go and the verdict stays in view, on every row, uncut.
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.3)
        heads = [str(c.label) for c in table.columns.values()]
        assert "sent/s" not in heads and "busy" not in heads and heads[-2:] == ["met", "SLO"]
        assert table.row_count == len(levels)
        verdicts = {str(table.get_row_at(i)[0]).rstrip(" ⚠"): str(table.get_row_at(i)[-1])
                    for i in range(table.row_count)}
        assert verdicts == {lv.label: "yes" if lv.passes else "no" for lv in levels}
        assert sum(c.get_render_width(table) for c in table.columns.values()) <= table.scrollable_content_region.width
