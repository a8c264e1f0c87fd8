"""The monitor's poller against a real SSH server (asyncssh, in the test)
that answers like a GB10 node, with outputs built from real captures: what
it reads, and how it notices a node dying and coming back. Every test waits
for what it needs to see (so many polls, a state), never a fixed time."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sparktop.observe.poller import NodeTarget, Poller
from sparktop.observe.snapshot import NodeSnapshot
from sparktop.remote import SSHTransport
from tests.helpers import gb10
from tests.helpers.sshd import SSHServerFixture
from tests.helpers.wait import eventually


class Spark:
    """Plays a GB10 node: answers the probe and counts polls."""

    def __init__(self, smi=True, docker=gb10.DOCKER_JSON):
        self.polls = 0
        self.smi = smi
        self.docker = docker

    def __call__(self, command: str):
        if "@@meminfo" not in command:
            return 127, "", f"sh: not expected here: {command}\n"
        self.polls += 1
        return 0, gb10.probe_answer(self.polls * 100, docker=self.docker, smi=self.smi), ""


@pytest.fixture
async def spark(tmp_path):
    player = Spark()
    server = SSHServerFixture(tmp_path / "ssh", handler=player)
    await server.start()
    server.player = player
    yield server
    await server.stop()


@contextlib.asynccontextmanager
async def gathering(poller: Poller):
    """The poller started, and every event it yields gathered into the list this gives."""
    events: list = []

    async def run():
        async for event in poller.events():
            events.append(event)

    await poller.start()
    task = asyncio.create_task(run())
    try:
        yield events
    finally:
        task.cancel()
        await poller.close()


def node_events(events, name="spark-a") -> list[NodeSnapshot]:
    return [e for e in events if isinstance(e, NodeSnapshot) and e.name == name]


def answered(events, name="spark-a") -> list[NodeSnapshot]:
    """One per poll that answered (between polls the watchdog may say a node is stale: that is no poll)."""
    return [e for e in node_events(events, name) if e.state == "ok"]


def transport(server) -> SSHTransport:
    return SSHTransport(server.alias, config=[server.config], connect_timeout=2)


async def test_reads_a_gb10_node_over_ssh(spark):
    poller = Poller([NodeTarget("spark-a", transport(spark))], interval=0.3, default_port=None)
    async with gathering(poller) as events:
        # Four polls answered: the CPU figure needs two /proc/stat readings, and the connection is reused.
        await eventually(lambda: len(answered(events)) >= 4, timeout=30, what="four polls answered")
    snap = answered(events)[-1]
    assert snap.memory.total == gb10.TOTAL_B and snap.memory.available == gb10.AVAILABLE_B
    assert round(snap.memory.used / 1024**3, 1) == 6.0
    assert (snap.gpu.name, snap.gpu.util, snap.gpu.temp, snap.gpu.power, snap.gpu.sm_clock) == (
        "NVIDIA GB10", 96, 46, 10.45, 2405)
    assert [(p.name, p.used_mib) for p in snap.processes] == [("VLLM::EngineCore", 89093)]
    assert snap.containers[0].name == "boring_keldysh"
    # Per poll the canned /proc/stat adds 100 user + 100 system and 300 idle jiffies.
    assert snap.cpu_pct == pytest.approx(40.0)
    assert spark.connections == 1  # one connection, reused for every poll
    assert spark.player.polls >= len(answered(events))  # each was a poll of the node


async def test_missing_tools_are_a_state_not_an_error(tmp_path):
    player = Spark(smi=False, docker=None)
    server = await SSHServerFixture(tmp_path / "ssh", handler=player).start()
    poller = Poller([NodeTarget("bare", transport(server))], interval=0.3, default_port=None)
    try:
        async with gathering(poller) as events:
            await eventually(lambda: answered(events, "bare"), timeout=30, what="a poll answered")
    finally:
        await server.stop()
    snap = answered(events, "bare")[0]
    assert snap.gpu is None
    assert snap.gpu_status == "missing" and snap.docker_status == "missing"
    assert snap.memory is not None


class SlowLink(SSHTransport):
    """An SSH transport whose every command takes `delay` s more (as a busy node's would), counting the
    commands under way at once."""

    delay = 0.5
    in_flight = 0
    most = 0
    started = 0

    async def run(self, *args, **kw):
        self.started += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(self.delay)  # on the loop: the poller is free to start another meanwhile
            return await super().run(*args, **kw)
        finally:
            self.in_flight -= 1


async def test_polls_never_pile_up_on_a_slow_node(spark):
    link = SlowLink(spark.alias, config=[spark.config], connect_timeout=2)
    # Each poll takes five intervals: a poller that kept time instead of waiting would have five under way.
    poller = Poller([NodeTarget("spark-a", link)], interval=0.1, default_port=None)

    async with gathering(poller) as events:
        await eventually(lambda: len(answered(events)) >= 4, timeout=30, what="four slow polls answered")
        assert link.most == 1, f"{link.most} polls of one node under way at once"
        # And as the node saw it: every poll started but one (the one under way) has reached it.
        assert link.started - spark.player.polls in (0, 1), (link.started, spark.player.polls)


async def test_a_dead_node_goes_stale_then_down_and_comes_back_by_itself(spark):
    """The order a user sees: ok, stale, down (with the reason), ok again, with
    nothing done by hand. How fast each comes is measured by
    tests/benchmarks/node_death.py, not asserted on a shared machine."""
    interval = 0.5
    poller = Poller([NodeTarget("spark-a", transport(spark))], interval=interval, down_after=3.0,
                    default_port=None)
    await poller.start()
    events: list[tuple[int, str, str | None]] = []
    phase = 0  # 0 alive, 1 killed, 2 restarted

    async def run():
        async for event in poller.events():
            if isinstance(event, NodeSnapshot):
                events.append((phase, event.state, event.reason))

    def seen(in_phase: int, state: str) -> bool:
        return any(p == in_phase and st == state for p, st, _ in events)

    task = asyncio.create_task(run())
    try:
        await eventually(lambda: seen(0, "ok"), what="the node answering")
        phase = 1
        await spark.stop()
        await eventually(lambda: seen(1, "down"), timeout=30, what="the node marked down")
        states = [st for p, st, _ in events if p == 1]
        assert states.index("stale") < states.index("down")  # stale first, then down
        reason = next(r for p, st, r in events if p == 1 and st == "down") or ""
        assert "connect" in reason.lower() or "connection" in reason.lower()
        phase = 2
        await spark.start()
        await eventually(lambda: seen(2, "ok"), timeout=30, what="the node back")
    finally:
        task.cancel()
        await poller.close()


async def test_an_engine_not_reachable_from_here_is_read_through_an_ssh_forward(tmp_path, twin):
    # The engine listens on 127.0.0.1 "on the node"; from here its address
    # (a TEST-NET-3 address that routes nowhere) cannot be reached, so the
    # poller forwards the port through the node's SSH connection.
    server = await twin("llama-3.1-8b", speed=20)
    shell = await SSHServerFixture(tmp_path / "ssh").start()
    from sparktop.observe.poller import EngineTarget
    from sparktop.observe.snapshot import EngineSnapshot

    url = f"http://203.0.113.7:{server.port}"
    poller = Poller([NodeTarget("spark-a", transport(shell), "203.0.113.7")], [EngineTarget(url, node="spark-a")],
                    interval=0.5, default_port=None, discover=False)

    def ready(events) -> list:
        return [e for e in events if isinstance(e, EngineSnapshot) and e.state == "ready"]

    try:
        async with gathering(poller) as events:
            await eventually(lambda: ready(events), timeout=30, what="the engine read ready")
    finally:
        await shell.stop()
    assert ready(events)[0].model == "llama-3.1-8b" and ready(events)[0].url == url
    assert shell.forwards >= 1
