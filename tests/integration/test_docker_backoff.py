"""A node whose docker fails (its daemon down) is asked less and less often,
and at once again when something calls for it; a docker that answers is
read every DOCKER_EVERY_S. The `docker` here is a real executable on the
node's PATH that fails the way the CLI does without a daemon (or lists the
containers the test wrote), and counts its calls; the clock the probe and
the poller are given is moved by hand, so every assertion is a count of
polls and calls."""

from __future__ import annotations

import json
import stat

from sparktop.observe.host_probe import DOCKER_EVERY_S, DOCKER_RETRY_MAX_S, DOCKER_RETRY_S, HostProbe
from sparktop.observe.poller import NodeTarget, Poller
from sparktop.remote.local import LocalTransport
from tests.helpers.monitor_sim import HandClock, next_nodes

FAILING = """#!/bin/sh
echo call >> "$(dirname "$0")/calls"
if [ -e "$(dirname "$0")/up" ]; then exit 0; fi
echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
exit 1
"""


def fake_docker(tmp_path, script: str):
    """A `docker` that logs each call: its directory (for PATH), and how many calls so far."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(script)
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    calls = bin_dir / "calls"

    def count() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    return bin_dir, count


async def test_a_failing_docker_is_asked_less_often_until_it_answers(tmp_path):
    bin_dir, count = fake_docker(tmp_path, FAILING)
    hand = HandClock()
    probe = HostProbe("here", LocalTransport("here", env={"PATH": f"{bin_dir}:/usr/bin:/bin"}), clock=hand.clock)

    asked_at = []
    for _ in range(900):  # 900 s, a poll a second
        before = count()
        snap = await probe.poll()
        if count() > before:
            asked_at.append(hand.now() - 1000.0)
        hand.advance(1.0)
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
        hand.advance(1.0)
        before = count()
        await probe.poll()
        if count() > before:
            asked_at.append(hand.now())
    assert [b - a for a, b in zip(asked_at, asked_at[1:], strict=False)] == [DOCKER_EVERY_S] * (len(asked_at) - 1)
    assert len(asked_at) >= 3


LISTING = """#!/bin/sh
echo call >> "$(dirname "$0")/calls"
cat "$(dirname "$0")/containers" 2>/dev/null
exit 0
"""
ROW = {"Names": "vllm_node", "Image": "vllm", "State": "running", "Status": "Up 1 second", "ID": "abc",
       "Command": "vllm serve", "Labels": "sparktop.launch=l1"}


async def test_a_launch_on_a_node_has_its_containers_read_at_the_next_poll(tmp_path):
    """The slow tier waits DOCKER_EVERY_S between reads, except when told that
    something changed: the app tells the poller when a launch starts or
    removes containers, and the new container shows at the next poll. The
    poller's clock stands still unless the test moves it, so "waits" is a
    count of polls that did not read docker, not a time."""
    bin_dir, count = fake_docker(tmp_path, LISTING)
    containers = bin_dir / "containers"
    hand = HandClock()
    transport = LocalTransport("here", env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    poller = Poller([NodeTarget("here", transport)], interval=0.2, discover=False, default_port=None,
                    clock=hand.clock)

    def names(snaps) -> list[list[str]]:
        return [[c.name for c in s.containers] for s in snaps]

    await poller.start()
    try:
        (first,) = await next_nodes(poller, 1)
        assert names([first]) == [[]] and count() == 1  # the first poll reads the slow tier
        containers.write_text(json.dumps(ROW) + "\n")
        # Untold, the new container waits for the slow tier: five polls later docker is still not asked.
        untold = await next_nodes(poller, 5)
        assert names(untold) == [[]] * 5 and count() == 1
        poller.refresh(["here"])
        # Told: the next poll to start reads it (one poll may have been under way when it was told).
        told = await next_nodes(poller, 2)
        assert ["vllm_node"] in names(told) and count() == 2, names(told)
        containers.write_text("")
        poller.refresh()  # a stop: every node
        stopped = await next_nodes(poller, 2)
        assert names(stopped)[-1] == [] and count() == 3, names(stopped)
        # Untold again, the slow tier comes round on its own once DOCKER_EVERY_S has passed on the clock.
        containers.write_text(json.dumps(ROW) + "\n")
        hand.advance(DOCKER_EVERY_S - 1.0)
        assert names(await next_nodes(poller, 3)) == [[]] * 3 and count() == 3
        hand.advance(1.0)
        due = await next_nodes(poller, 2)
        assert ["vllm_node"] in names(due) and count() == 4, names(due)
    finally:
        await poller.close()
