"""The history screen as a user reads it: a simulated week of two Sparks
(an engine restarted, a night of low memory, a KV spike, an engine down for
an hour) written through the real writer, then shown for the last 24 hours
and the last 7 days; an empty file and history turned off say so in words.
Snapshots at the common sizes, on the same week and a fixed clock."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console
from textual.app import App
from textual.widgets import DataTable, Static

from sparktop.history.query import HistoryReader
from sparktop.history.store import HistoryStore
from sparktop.history.writer import HistoryWriter
from sparktop.settings import Preferences
from sparktop.ui.history import EMPTY, HistoryScreen
from tests.helpers.history_sim import Scenario, run

DAY = 86400.0
START = 1_763_078_400.0  # Fri 2025-11-14 00:00 UTC
NOW = START + 7 * DAY  # the end of the simulated week: Fri 2025-11-21 00:00 UTC
CSS = Path(__file__).resolve().parents[2] / "sparktop" / "ui" / "sparktop.tcss"


def week() -> Scenario:
    """The last day holds the restart, the low memory and the KV spike (the
    24 hours show them); the engine down for an hour is on the third day
    (only the 7 days show it)."""
    return Scenario(start=START, days=7, step=30.0,  # 30 s: the writer counts energy only over polls <= 30 s apart
                    restart_at=START + 6 * DAY + 10 * 3600,
                    memory_low=(START + 6 * DAY + 2 * 3600, START + 6 * DAY + 3 * 3600),
                    kv_spike=(START + 6 * DAY + 14 * 3600, START + 6 * DAY + 14 * 3600 + 1200),
                    idle_gap=(START + 2 * DAY + 12 * 3600, START + 2 * DAY + 13 * 3600))


def write_week(path: Path) -> Path:
    store = HistoryStore.open(path)
    writer = HistoryWriter(store)
    run(week(), writer.observe)
    writer.close()
    return path


@pytest.fixture(scope="module")
def history_file(tmp_path_factory) -> Path:
    # The day's bounds and the charts' ticks are local time: the data is written and read in UTC.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TZ", "UTC")
        time.tzset()
        path = write_week(tmp_path_factory.mktemp("history") / "h.sqlite")
    time.tzset()
    return path


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def reader(history_file):
    store = HistoryStore.open(history_file, write=False)
    yield HistoryReader(store)
    store.close()


class Host(App):
    """A bare app that opens the history screen over an empty one."""

    CSS_PATH = str(CSS)

    def __init__(self, screen: HistoryScreen):
        super().__init__()
        self.history_screen = screen

    def on_mount(self) -> None:
        self.push_screen(self.history_screen)


def host(reader: HistoryReader | None, note: str | None = None, price: float | None = 0.30) -> Host:
    return Host(HistoryScreen(reader, Preferences(energy_price_per_kwh=price, currency="EUR"), now=NOW, note=note))


def text_of(screen: HistoryScreen, selector: str) -> str:
    """A box's words as printed (a chart, a line, or the events' grid)."""
    console = Console(width=200, file=io.StringIO(), record=True, color_system=None)
    console.print(screen.query_one(selector, Static).content)
    return console.export_text()


def column(table: DataTable, key: str) -> list[str]:
    return [str(table.get_cell(row.key, key)) for row in table.ordered_rows]


async def test_the_last_day_shows_the_restart_the_low_memory_and_the_spike(reader, utc):
    app = host(reader)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.history_screen
        sessions = screen.query_one("#history-sessions", DataTable)
        assert [c.key.value for c in sessions.ordered_columns] == [
            "engine", "model", "node", "started", "ended", "how", "tokens", "requests", "kv", "energy"]
        # spark-a's engine restarted at 10:00 on the last day: its first session ended "restarted"; the new one
        # and spark-b's (serving since before the window) ended with the watch that recorded them.
        rows = {row.key.value: [str(c) for c in sessions.get_row(row.key)] for row in sessions.ordered_rows}
        restarted = [r for r in rows.values() if r[5] == "restarted"]
        assert len(restarted) == 1 and restarted[0][0] == "spark-a:8000" and restarted[0][4] == "11-20 09:59"
        assert column(sessions, "how").count("watch ended") == 2
        assert "97%" in column(sessions, "kv")  # spark-b's KV spike
        events = text_of(screen, "#history-events")
        assert "memory low: 7.1 GiB available" in events
        assert "engine restarted" in events and "KV cache above 90%" in events
        assert "engine down" not in events  # on the third day: not in the last 24 hours
        lines = events.splitlines()
        assert "KV cache" in lines[0] and "memory low" in lines[-1]  # newest first
        assert "last 24 hours" in text_of(screen, "#history-head")
        summary = text_of(screen, "#history-summary")
        assert "sessions 0 serving · 3 ended" in summary and "1 error · 2 warnings" in summary


async def test_seven_days_widen_the_charts_and_add_the_outage(reader, utc):
    app = host(reader)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.history_screen
        day_chart = text_of(screen, "#history-gen")
        assert "12:00" in day_chart and "18:00" in day_chart and "now" in day_chart and "Thu 20" not in day_chart
        await pilot.press("7")
        await pilot.pause()
        assert "last 7 days · 11-14 00:00 to 11-21 00:00" in text_of(screen, "#history-head")
        week_chart = text_of(screen, "#history-gen")
        assert "12:00" not in week_chart  # the clock of a day gives way to the days' names, at local midnight
        assert all(day in week_chart for day in ("Fri 14", "Sun 16", "Thu 20", "now"))
        assert "engine down: connection refused" in text_of(screen, "#history-events")
        sessions = screen.query_one("#history-sessions", DataTable)
        assert "unreachable" in column(sessions, "how")
        days = screen.query_one("#history-days", DataTable)
        assert column(days, "day") == ["Thu 11-20", "Wed 11-19", "Tue 11-18", "Mon 11-17", "Sun 11-16",
                                       "Sat 11-15", "Fri 11-14"]
        assert all(cost.endswith(" EUR") for cost in column(days, "cost"))
        await pilot.press("w")
        await pilot.pause()
        assert "18:00" in text_of(screen, "#history-gen") and "last 24 hours" in text_of(screen, "#history-head")
        assert screen.reads == 3  # on open and on each switch: resizes and repaints read nothing
        await pilot.resize_terminal(160, 48)
        await pilot.pause()
        assert screen.reads == 3
        await pilot.press("r")
        assert screen.reads == 4
        # At 80 columns a session takes two lines, every figure still in view.
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert [c.key.value for c in sessions.ordered_columns] == ["engine", "when", "how", "tokens", "kv", "energy"]
        assert sessions.virtual_size.width <= sessions.size.width
        assert str(sessions.get_cell("session-1", "when")) == "11-13 23:00\n11-20 09:59"


async def test_escape_closes_it(reader):
    app = host(reader)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.screen is app.history_screen
        await pilot.press("escape")
        assert app.screen is not app.history_screen


async def test_an_empty_history_says_so(tmp_path):
    store = HistoryStore.open(tmp_path / "h.sqlite")  # created, not a row yet
    app = host(HistoryReader(store))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = app.history_screen
        assert EMPTY in text_of(screen, "#history-note")
        assert not screen.query_one("#history-charts").display
    store.close()


async def test_history_off_says_why():
    app = host(None, note="history is off (history: false in settings.yaml)")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "history: false in settings.yaml" in text_of(app.history_screen, "#history-note")
        await pilot.press("7", "r")  # nothing to read: nothing breaks


# -- snapshots ------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_history_snapshot(snap_compare, reader, utc, size):
    async def settle(pilot):
        await pilot.pause(0.3)  # the charts are drawn after the first layout

    assert snap_compare(host(reader), terminal_size=size, run_before=settle)


# -- from the app: `h` ---------------------------------------------------------------------------


async def test_h_in_the_monitor_opens_the_history_it_writes_and_h_closes_it(tmp_path):
    from sparktop.observe.record import Recording, ReplaySource
    from sparktop.ui.app import SparktopApp

    recording = Recording.load(Path(__file__).parents[1] / "fixtures" / "recording-demo.jsonl")
    writer = HistoryWriter(HistoryStore.open(tmp_path / "history.sqlite"))
    run(Scenario(start=time.time() - DAY / 2, days=0.5, step=60.0), writer.observe)  # the last twelve hours
    app = SparktopApp(ReplaySource(recording, speed=1.0), replay=True, history=writer)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("h")
        await pilot.pause(0.5)
        assert isinstance(app.screen, HistoryScreen)
        table = app.screen.query_one(DataTable)
        assert table.row_count > 0  # the sessions of the week in the file
        await pilot.press("h")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, HistoryScreen)


async def test_h_without_history_says_why(tmp_path):
    from sparktop.observe.record import Recording, ReplaySource
    from sparktop.ui.app import SparktopApp

    recording = Recording.load(Path(__file__).parents[1] / "fixtures" / "recording-demo.jsonl")
    app = SparktopApp(ReplaySource(recording, speed=1.0), replay=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("h")
        await pilot.pause(0.5)
        assert isinstance(app.screen, HistoryScreen)
        shown = " ".join(str(s.content) for s in app.screen.query(Static))
        assert "a replay keeps no history" in shown


async def test_a_file_damaged_under_the_screen_is_one_line_that_says_to_move_it_aside(history_file, tmp_path, utc):
    """The file goes bad while the app has it open (a failing disk): the screen says so in the line the CLI
    gives, with the command that moves it aside, and raises nothing."""
    import shutil

    from tests.helpers.history_sim import damage

    path = tmp_path / "h.sqlite"
    shutil.copyfile(history_file, path)
    store = HistoryStore.open(path, write=False)
    try:
        damage(path, pages=8)
        app = host(HistoryReader(store))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            note = text_of(app.history_screen, "#history-note")
            assert "could not be read" in note and "is damaged" in note and "move it aside: mv " in note, note
            assert not app.history_screen.query_one("#history-summary").display
    finally:
        store.close()
