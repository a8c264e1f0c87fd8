"""When the watchdog acts, on a hand clock: an engine's states as the monitor would report them, fed to a
watchdog whose restarts are real (`docker stop` and `docker start` through a twin node's docker, of a
container labelled with its launch). Dead only after `dead_after` seconds and only once it had served;
starting up is never dead; quiet for the backoff after a restart, doubled with each; past the cap it gives
up once and for good; a removed container is never brought back; one watchdog per launch."""

from __future__ import annotations

import os
import shlex

import pytest

from sparktop.launch.state import LaunchRecord, LaunchState
from sparktop.launch.watchdog import ELSEWHERE, GAVE_UP, RESTART, Policy, Watchdog, WatchdogAction
from sparktop.observe.snapshot import EngineGone, EngineSnapshot
from sparktop.twin.cluster import DEFAULT_IMAGE, TwinCluster
from tests.helpers.monitor_sim import HandClock

LID = "llama-3.1-8b-solo-0a0b0c"
URL = "http://127.0.0.2:8000"
NAME = f"sparktop-{LID}-vllm"


@pytest.fixture
async def node(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    cluster = TwinCluster(tmp_path / "lab", names=("spark-a",)).setup()
    a = cluster.nodes[0]
    run = ["docker", "run", "-d", "--name", NAME, "--label", f"sparktop.launch={LID}", "--entrypoint", "sleep",
           DEFAULT_IMAGE, "600"]
    assert (await a.transport().run(shlex.join(run))).ok
    LaunchState(cluster.inventory()).save(LaunchRecord(
        id=LID, recipe="llama-3.1-8b", topology="solo", nodes=["spark-a"], containers={"spark-a": [NAME]},
        status="ready", endpoints=[{"url": URL, "kind": "vllm", "node": "spark-a", "model": "llama-3.1-8b",
                                    "topology": "solo", "container": NAME, "members": [["spark-a", NAME]]}]))
    yield cluster
    await cluster.stop_all(NAME)


def snap(t: float, state: str, **kw) -> EngineSnapshot:
    return EngineSnapshot(key=URL, url=URL, t=t, state=state, **kw)


async def started(cluster) -> str:
    r = await cluster.nodes[0].transport().run(shlex.join(["docker", "inspect", "--format",
                                                           "{{.State.StartedAt}}", NAME]))
    return r.stdout.strip()


async def test_dead_after_its_time_then_quiet_for_a_doubling_backoff_then_given_up(node):
    hand = HandClock()
    actions: list[WatchdogAction] = []
    state = LaunchState(node.inventory())
    dog = Watchdog(state, {"spark-a": node.nodes[0].transport()}, Policy(max_restarts=2, dead_after=10, backoff=30),
                   hand.clock, actions.append)

    async def feed(seconds: float, state_name: str, step: float = 1.0, **kw) -> None:
        end = hand.t + seconds
        while hand.t < end:
            dog.observe(snap(hand.wall(), state_name, **kw))
            await dog.settle()
            hand.advance(step)

    try:
        await feed(30, "unreachable", reason="connection refused")  # never served while watched: not its to mend
        await feed(2, "ready")
        await feed(9, "unreachable", reason="connection refused")
        await feed(5, "starting", stage="loading weights")  # starting up is not dead, however long
        await feed(9, "unreachable", reason="connection refused")
        assert actions == []
        first = await started(node)
        await feed(2, "unreachable", reason="connection refused")  # 10 s dead: restarted
        assert [a.kind for a in actions] == [RESTART]
        assert actions[0].text.startswith(f"watchdog: restarting {NAME} (restart 1, at most 2 restarts in 30 min): "
                                          "down for 10 s: connection refused")
        assert actions[0].containers == (("spark-a", NAME),) and await started(node) > first
        # Quiet for the backoff (30 s), dead all the while; then restarted again, and quiet for twice as long.
        await feed(29, "unreachable", reason="connection refused")
        assert len(actions) == 1
        await feed(2, "failed", error="EngineCore encountered a fatal error.")
        assert [a.kind for a in actions] == [RESTART, RESTART]
        # Dead since the restart (the quiet did not stop the count): 29 s of it when the backoff ended.
        assert actions[1].text.endswith("(restart 2, at most 2 restarts in 30 min): failed for 29 s: "
                                        "EngineCore encountered a fatal error.")
        await feed(58, "hung", reason="no tokens for 30 s with 1 request waiting")  # 1 + 58 s of its 60
        assert len(actions) == 2
        # Two restarts in the window: the cap. The third call gives up, says so once, and touches nothing.
        second = await started(node)
        await feed(5, "hung", reason="no tokens for 30 s with 1 request waiting")
        assert [a.kind for a in actions] == [RESTART, RESTART, GAVE_UP]
        assert actions[2].text == (f"watchdog gave up on {LID} after 2 restarts in 30 min: hung: no tokens for 30 s "
                                   f"with 1 request waiting; {URL} is left as it is")
        assert await started(node) == second
        record = state.get(LID)
        assert len(record.restarts) == 2 and record.gave_up == actions[2].text.removeprefix("watchdog ")
        # Another watchdog later (`collect --watchdog` after `launch --watchdog`) counts the same restarts: it
        # has given up already, and says nothing new.
        await dog.close()
        again: list[WatchdogAction] = []
        later = Watchdog(state, {"spark-a": node.nodes[0].transport()}, Policy(max_restarts=2), hand.clock,
                         again.append)
        later.observe(snap(hand.wall(), "ready"))
        hand.advance(5000)
        later.observe(snap(hand.wall(), "hung", reason="no tokens for 30 s with 1 request waiting"))
        await later.close()
        assert again == [] and await started(node) == second
    finally:
        await dog.close()


async def test_a_removed_container_is_never_brought_back_and_one_watchdog_guards_a_launch(node):
    hand = HandClock()
    transports = {"spark-a": node.nodes[0].transport()}
    state = LaunchState(node.inventory())
    actions: list[WatchdogAction] = []
    dog = Watchdog(state, transports, Policy(dead_after=5), hand.clock, actions.append)
    other: list[WatchdogAction] = []
    second = Watchdog(state, transports, Policy(dead_after=5), hand.clock, other.append)
    try:
        for w in (dog, second):
            w.observe(snap(hand.wall(), "ready"))
        assert URL in dog.guarded and URL not in second.guarded and second.elsewhere == {LID}
        dog.observe(EngineGone(URL))
        for _ in range(20):
            hand.advance(1)
            for w in (dog, second):
                w.observe(snap(hand.wall(), "unreachable", reason="container exited (137)"))
        await dog.settle()
        await second.settle()
        assert actions == []
        # The second says, once, whose the launch is, and does nothing else.
        assert [(a.kind, a.text) for a in other] == [
            (ELSEWHERE, f"watchdog: {LID} is guarded by pid {os.getpid()}'s watchdog; this one leaves it to that one")]
    finally:
        await dog.close()
        await second.close()
    # Its lock let go, the launch is another watchdog's to guard.
    third = Watchdog(state, transports, Policy(dead_after=5), hand.clock)
    third.observe(snap(hand.wall(), "ready"))
    assert URL in third.guarded
    await third.close()
