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
# Mixed engines on twin nodes (scripts/screenshots.py --only engines --record-dir tests/fixtures):
# vLLM beside llama.cpp on two nodes; vLLM, llama.cpp, SGLang and TensorRT-LLM on four.
ENGINES_RECORDING = {n: RECORDING.with_name(f"recording-engines-{n}.jsonl") for n in (2, 4)}


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def replay_app(recording: Path = RECORDING) -> SparktopApp:
    source = ReplaySource(Recording.load(recording), speed=1.0)
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


@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_monitor_mixed_engines(snap_compare, nodes, size):
    """Engines of every kind side by side: each card (or row) names its
    engine and says what that engine does not export."""
    async def settle_engines(pilot):
        await settle_fanned(pilot, nodes)  # every node and engine on screen, not only in the state

    assert snap_compare(replay_app(ENGINES_RECORDING[nodes]), terminal_size=size, run_before=settle_engines)
