"""Fixtures shared by the UI tests."""

from __future__ import annotations

import time

import pytest

from sparktop.settings import Defaults
from sparktop.twin.cluster import TwinCluster

MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"


@pytest.fixture
async def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # launch records
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # the study and its runs
    d = Defaults()
    c = TwinCluster(tmp_path / "cluster", speed=4.0, startup_speed=300, images=[d.image, d.router_image]).setup()
    for node in c.nodes:
        (node.home / ".cache/huggingface/hub" / ("models--" + MODEL.replace("/", "--")) / "snapshots/x").mkdir(
            parents=True)
    yield c
    for node in c.nodes:
        await node.transport().run("docker ps -aq | xargs -r docker rm -f", timeout=30)


@pytest.fixture
def utc_own_dirs(monkeypatch, tmp_path):
    """Times shown in UTC, and the state and data directories this test's own (no launch records, runs or
    fitted constants of the user's)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    yield
    monkeypatch.undo()
    time.tzset()
