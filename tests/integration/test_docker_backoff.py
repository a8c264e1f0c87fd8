"""A node whose docker fails (its daemon down) is asked less and less often,
and at once again when something calls for it; a docker that answers is
read every DOCKER_EVERY_S. The `docker` here is a real executable on the
node's PATH that fails the way the CLI does without a daemon, and counts
its calls; the clock the probe reads is moved by hand."""

from __future__ import annotations

import stat

from sparktop.observe import host_probe
from sparktop.observe.host_probe import DOCKER_EVERY_S, DOCKER_RETRY_MAX_S, DOCKER_RETRY_S, HostProbe
from sparktop.remote.local import LocalTransport

FAILING = """#!/bin/sh
echo call >> "$(dirname "$0")/calls"
if [ -e "$(dirname "$0")/up" ]; then exit 0; fi
echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
exit 1
"""


async def test_a_failing_docker_is_asked_less_often_until_it_answers(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAILING)
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    calls = bin_dir / "calls"
    now = [1000.0]
    monkeypatch.setattr(host_probe.time, "monotonic", lambda: now[0])
    probe = HostProbe("here", LocalTransport("here", env={"PATH": f"{bin_dir}:/usr/bin:/bin"}))

    def count() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    asked_at = []
    for _ in range(900):  # 900 s, a poll a second
        before = count()
        snap = await probe.poll()
        if count() > before:
            asked_at.append(now[0] - 1000.0)
        now[0] += 1.0
    assert snap.docker_status == "not running"  # the CLI's sentence, in the words a card has room for
    gaps = [b - a for a, b in zip(asked_at, asked_at[1:], strict=False)]
    assert gaps[0] == DOCKER_EVERY_S  # one failure may be a hiccup: asked again at the usual pace
    assert gaps[1:5] == [min(DOCKER_RETRY_MAX_S, DOCKER_RETRY_S * 2**i) for i in range(4)]  # 60 ... 300
    assert max(gaps) == DOCKER_RETRY_MAX_S  # and no longer
    # An engine stopped answering: the list is read on the next poll, whatever the wait.
    (bin_dir / "up").touch()
    probe.refresh_docker()
    before = count()
    snap = await probe.poll()
    assert count() == before + 1 and snap.docker_status == "ok"
    # Answering again: read every few seconds, as before it failed.
    asked_at = []
    for _ in range(int(DOCKER_EVERY_S) * 3 + 1):
        now[0] += 1.0
        before = count()
        await probe.poll()
        if count() > before:
            asked_at.append(now[0])
    assert [b - a for a, b in zip(asked_at, asked_at[1:], strict=False)] == [DOCKER_EVERY_S] * (len(asked_at) - 1)
    assert len(asked_at) >= 3


LISTING = """#!/bin/sh
cat "$(dirname "$0")/containers" 2>/dev/null
exit 0
"""


async def test_a_launch_on_a_node_has_its_containers_read_at_the_next_poll(tmp_path):
    """The slow tier waits DOCKER_EVERY_S between reads, except when told that
    something changed: the app tells the poller when a launch starts or
    removes containers, and the new container shows at the next poll."""
    import asyncio
    import json
    import time

    from sparktop.observe.poller import NodeTarget, Poller
    from sparktop.observe.snapshot import NodeSnapshot

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(LISTING)
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    transport = LocalTransport("here", env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    poller = Poller([NodeTarget("here", transport)], interval=0.5, discover=False, default_port=None)
    await poller.start()
    seen: list[tuple[float, list[str]]] = []

    async def until(names: list[str], limit: float) -> float | None:
        began = time.monotonic()
        async for event in poller.events():
            if isinstance(event, NodeSnapshot):
                seen.append((time.monotonic(), [c.name for c in event.containers]))
                if seen[-1][1] == names:
                    return time.monotonic() - began
            if time.monotonic() - began > limit:
                return None
        return None

    try:
        assert await asyncio.wait_for(until([], 5), 10) is not None
        row = {"Names": "vllm_node", "Image": "vllm", "State": "running", "Status": "Up 1 second", "ID": "abc",
               "Command": "vllm serve", "Labels": "sparktop.launch=l1"}
        (bin_dir / "containers").write_text(json.dumps(row) + "\n")
        # Untold, the new container waits for the slow tier: not on the next polls.
        assert await asyncio.wait_for(until(["vllm_node"], 1.6), 10) is None
        poller.refresh(["here"])
        took = await asyncio.wait_for(until(["vllm_node"], DOCKER_EVERY_S), DOCKER_EVERY_S + 5)
        assert took is not None and took < 1.5, seen[-5:]
        (bin_dir / "containers").write_text("")
        poller.refresh()  # a stop: every node
        took = await asyncio.wait_for(until([], DOCKER_EVERY_S), DOCKER_EVERY_S + 5)
        assert took is not None and took < 1.5, seen[-5:]
    finally:
        await poller.close()
