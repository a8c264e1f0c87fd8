"""Cards laid out again when engines come and go (issue 37): with an engine
gone, the cards left fill the row, as they do after a resize, instead of
keeping the narrow columns of the cards that were (about 80 columns left
blank at 160 until the terminal was resized). The events come from a feed
the test fills from tests/fixtures/recording-demo.jsonl, one step at a
time."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path

import pytest

from sparktop.observe.record import Recording
from sparktop.observe.snapshot import EngineGone, EngineSnapshot, NodeSnapshot
from sparktop.ui.app import SparktopApp
from sparktop.ui.cards import EngineCard
from tests.helpers.pilot import until

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "recording-demo.jsonl"


class Feed:
    """A source whose events are what the test puts in."""

    interval = 1.0
    paused = False

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, *events) -> None:
        for event in events:
            self.queue.put_nowait(event)

    async def events(self):
        while True:
            yield await self.queue.get()


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def last_snapshots() -> tuple[list[NodeSnapshot], list[EngineSnapshot]]:
    """Each node's and engine's last snapshot in the recording."""
    nodes: dict[str, NodeSnapshot] = {}
    engines: dict[str, EngineSnapshot] = {}
    for _, event in Recording.load(RECORDING).rows:
        if isinstance(event, NodeSnapshot):
            nodes[event.name] = event
        elif isinstance(event, EngineSnapshot):
            engines[event.key] = event
    return list(nodes.values()), list(engines.values())


def another(engine: EngineSnapshot, port: int) -> EngineSnapshot:
    """A second engine on the same node, on `port`."""
    copied = copy.deepcopy(engine)
    copied.url = engine.url.replace(":8000", f":{port}")
    copied.key = engine.key.replace(":8000", f":{port}")
    return copied


def cards(app) -> list[EngineCard]:
    return list(app.screen.query_one("#engines").query(EngineCard))


def widths(app) -> list[int]:
    return [card.region.width for card in cards(app)]


def fill_the_row(app, count: int) -> bool:
    """`count` cards side by side, as wide as the row allows: the grid's width shared, one gutter between two."""
    grid = app.screen.query_one("#engines")
    found = cards(app)
    if len(found) != count or any(card.region.y != found[0].region.y for card in found):
        return False
    return sum(card.region.width for card in found) + (count - 1) == grid.region.width \
        and max(widths(app)) - min(widths(app)) <= 1


@pytest.mark.parametrize("extra", [1, 2])
async def test_the_cards_left_fill_the_row_when_an_engine_goes(extra):
    nodes, engines = last_snapshots()
    assert len(engines) == 2
    added = [another(engines[0], 8001 + i) for i in range(extra)]
    feed = Feed()
    app = SparktopApp(feed)
    async with app.run_test(size=(160, 48)) as pilot:
        feed.put(*nodes, *engines)
        await until(pilot, lambda: fill_the_row(app, 2), what=lambda: f"two cards filling the row: {widths(app)}")
        two = widths(app)
        feed.put(*added)
        await until(pilot, lambda: fill_the_row(app, 2 + extra),
                    what=lambda: f"{2 + extra} cards filling the row: {widths(app)}")
        assert max(widths(app)) < min(two)  # narrower, to make room
        feed.put(*(EngineGone(engine.key) for engine in added))
        await until(pilot, lambda: [card.key for card in cards(app)] == [engine.key for engine in engines],
                    what="the added engines' cards gone")
        await until(pilot, lambda: fill_the_row(app, 2),
                    what=lambda: f"the two cards left filling the row again: {widths(app)}")
        assert widths(app) == two  # as before the engines came, without a resize
