"""The cache screen (`c`): a node's Hugging Face cache and docker images read for real (a local node whose HOME
holds a generated snapshot, and the twin's docker on its PATH), shown at the common sizes; in a replay it says
there are no nodes to read."""

from __future__ import annotations

import os

import pytest
from textual.widgets import Static

from sparktop.remote import LocalTransport
from sparktop.settings import Inventory, Node
from sparktop.sync.cached import cluster_cache
from sparktop.twin.host import TwinHost
from sparktop.twin.node import install
from sparktop.ui.cache import CacheScreen
from tests.helpers import layouts
from tests.helpers.hfsnapshot import REVISION, write_snapshot
from tests.helpers.pilot import until
from tests.ui.test_at_80_columns import monitor, screen_lines

SIZES = [(80, 24), (120, 40), (160, 48)]


@pytest.fixture
def node(tmp_path) -> tuple[Inventory, dict]:
    home = tmp_path / "home"
    write_snapshot(home / ".cache/huggingface/hub", "lab-org/tiny-model", {"model.safetensors": 2_500_000})
    partial = home / ".cache/huggingface/hub/models--lab-org--half-model/blobs"
    partial.mkdir(parents=True)
    (partial / "0123.incomplete").write_bytes(b"x" * 100)
    twin = TwinHost(tmp_path / "twin")
    twin.setup("spark-a", images=[{"name": "lab/sync-test:1", "size": 12_000_000}])
    bin_dir = install(tmp_path / "bin")
    env = {**twin.env(bin_dir), "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    inventory = Inventory(nodes=[Node(name="spark-a", host="localhost", env=env)])
    return inventory, {"spark-a": LocalTransport("spark-a", env=env)}


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_the_cache_screen_lists_models_and_images(node, size):
    inventory, transports = node
    app = layouts.replay_app()
    async with app.run_test(size=size) as pilot:
        await monitor(pilot)
        screen = CacheScreen(lambda: cluster_cache(inventory, transports))
        app.push_screen(screen)
        await until(pilot, lambda: screen.reads == 1, what="the nodes read")
        await pilot.pause()
        text = "\n".join(screen_lines(app))
        assert "1 node: 2 models, 1 image" in text, text
        assert "lab-org/tiny-model" in text and "2.5 MB" in text, text
        assert "lab-org/half-model" in text and "incomplete" in text, text
        assert "lab/sync-test:1" in text and "12.0 MB" in text, text
        if size[0] >= 120:
            assert f"complete, revision {REVISION[:12]}" in text, text
        await pilot.press("r")
        await until(pilot, lambda: screen.reads == 2, what="read again")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, CacheScreen), what="back to the monitor")


async def test_in_a_replay_c_says_there_are_no_nodes_to_read():
    app = layouts.replay_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await monitor(pilot)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, CacheScreen), what="the cache screen")
        await pilot.pause()
        head = str(app.screen.query_one("#cache-head", Static).render())
        assert "No nodes to read: a replay reads no nodes." in head



def test_at_80_columns_a_row_says_less_and_fits():
    from sparktop.ui.cache import _narrow

    assert _narrow("complete, revision 0123456789ab") == "complete"
    assert _narrow("sha256:3fb13f876e10aa") == "3fb13f876e10"
    assert _narrow("incomplete: a blob still downloading") == "incomplete: a blob still downloading"
