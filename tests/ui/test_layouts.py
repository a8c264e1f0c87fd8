"""Every screen at every common terminal size, as SVG snapshots, plus what
must hold whatever the size: the buttons on screen, the sweep's charts
drawn no wider than their boxes (never wrapped). One app per size goes
through every screen (tests/helpers/layouts.py): a paused replay of
tests/fixtures/recording-demo.jsonl, a study and sweep runs written from
files, a canned preflight, a finished launch."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from pytest_textual_snapshot import SVGImageExtension
from textual.widgets import Button, Static

from sparktop.launch import topology
from tests.helpers import layouts
from tests.ui.test_study_screen import every_kind_of_cell

SIZES = [(80, 24), (100, 30), (120, 40), (160, 48), (200, 60)]
SCREENS = ["study", "monitor", "detail", "help", "launcher", "launch-progress", "sweep", "runs", "compare"]


@pytest.fixture
def stable(monkeypatch, tmp_path):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # no fitted constants of the user's
    monkeypatch.setattr(topology, "time", SimpleNamespace(time=lambda: layouts.T0))  # launch ids
    yield
    monkeypatch.undo()
    time.tzset()


def visible(screen, widget) -> bool:
    return widget.region.area > 0 and screen.region.contains_region(widget.region)


def check(name: str, screen) -> None:
    """What must hold at any size."""
    if name == "sweep":
        assert visible(screen, screen.query_one("#start", Button))
        for box in screen.query("#sweep-charts .chart").results(Static):
            lines = str(box.content).splitlines()
            assert lines, box.id
            assert max(len(line) for line in lines) <= box.content_size.width, box.id  # drawn to fit, no wrap
    if name == "launcher":
        go = screen.query_one("#go", Button)
        screen.scroll_to_widget(go, animate=False)  # below 90 columns the launcher scrolls
        assert visible(screen, go) or go.region.area > 0
    if name == "help":
        assert screen.query_one("#help").region.height <= screen.region.height


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_every_screen(size, snapshot, stable, tmp_path):
    snapshot = snapshot.use_extension(SVGImageExtension)
    results = layouts.write_runs(tmp_path / "results")
    app = layouts.replay_app(results_root=results, study_dir=every_kind_of_cell(tmp_path / "studies"),
                             inventory=layouts.inventory())
    shots: dict[str, str] = {}

    async def shoot(name: str) -> None:
        check(name, app.screen)
        shots[name] = app.export_screenshot()

    async with app.run_test(size=size) as pilot:
        await layouts.every_screen(pilot, results, shoot)
    assert list(shots) == SCREENS
    mismatched = [name for name, svg in shots.items() if snapshot(name=name) != svg]
    assert not mismatched, f"changed at {size[0]}x{size[1]}: {mismatched}"
