"""SVG snapshots of the main screens, from a recorded demo session so the
data is stable (tests/fixtures/recording-demo.jsonl)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparktop.observe.record import Recording, ReplaySource
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from tests.helpers.fanout import fanned_app, settle_fanned

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "recording-demo.jsonl"


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def replay_app() -> SparktopApp:
    source = ReplaySource(Recording.load(RECORDING), speed=1.0)
    source.seek(1e12)  # straight to the end of the recording
    source.pause()
    return SparktopApp(source, replay=True)


async def settle(pilot) -> None:
    app = pilot.app
    for _ in range(50):
        if len(app.state.engines) == 2 and len(list(app.screen.query(EngineCard))) == 2:
            break
        await pilot.pause(0.1)
    await pilot.pause(0.5)


def test_monitor_80x24(snap_compare):
    assert snap_compare(replay_app(), terminal_size=(80, 24), run_before=settle)


def test_monitor_160x48(snap_compare):
    assert snap_compare(replay_app(), terminal_size=(160, 48), run_before=settle)


def test_engine_detail(snap_compare):
    async def open_detail(pilot):
        await settle(pilot)
        next(iter(pilot.app.screen.query(EngineCard))).focus()
        await pilot.press("enter")
        await pilot.pause(0.5)

    assert snap_compare(replay_app(), terminal_size=(120, 40), run_before=open_detail)


@pytest.mark.parametrize("nodes", [4, 8])
@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_monitor_many_nodes(snap_compare, nodes, size):
    """Four and eight Sparks: cards where they fit, a line per node (and per
    engine) where they do not, and the cluster's summary line."""
    async def settle_all(pilot):
        await settle_fanned(pilot, nodes)

    assert snap_compare(fanned_app(RECORDING, nodes), terminal_size=size, run_before=settle_all)
