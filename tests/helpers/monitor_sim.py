"""The monitor on a clock the test holds: a clock moved by hand for the
poller and its probes (`HandClock`), waiting for the snapshots a poller
yields by count, not by seconds (`next_nodes`), and the polls the probes
start counted (`PollCounter`).

A poller, its probes and the history writer (and so `sparktop collect`)
read time only through the `sparktop.clock.Clock` they are given. Given a `HandClock`, what they decide
by time (is the slow tier due, what interval a link rate spans, when a
node is stale) moves only when the test moves it, while the polls still come
at the loop's pace: their waits are `asyncio` waits. So a test counts polls
and says "not at the next five polls, then at the first one after it was
told", which no machine's speed can change. (For a poller of an in-process
twin only, the loop itself can be on virtual time: tests/helpers/simulated.py.)
"""

from __future__ import annotations

import asyncio

from sparktop.clock import Clock
from sparktop.observe.poller import Poller
from sparktop.observe.snapshot import NodeSnapshot

EPOCH = 1_700_000_000.0  # the wall time of a hand clock's zero (November 2023)


class HandClock:
    """Monotonic seconds that move only by `advance`; wall time is `EPOCH` plus them."""

    def __init__(self, start: float = 1000.0):
        self.t = start
        self.clock = Clock(self.now, self.wall, self.wall)

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return EPOCH + self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


async def next_nodes(poller: Poller, n: int, name: str | None = None, state: str | None = "ok",
                     timeout: float = 30.0) -> list[NodeSnapshot]:
    """The next `n` node snapshots the poller yields (of node `name`, if given), by default those in
    `state` "ok": one per poll that answered. (Between polls the poller's watchdog may say a node went
    stale, after the test moved a hand clock past twice the interval: that is no poll.) `timeout` only
    guards against a poller that stopped: the test counts snapshots, not seconds."""
    out: list[NodeSnapshot] = []
    async with asyncio.timeout(timeout):
        async for event in poller.events():
            if isinstance(event, NodeSnapshot) and (name is None or event.name == name) and (
                    state is None or event.state == state):
                out.append(event)
                if len(out) == n:
                    return out
    return out


class PollCounter:
    """Counts the polls the probes start, and those under way: `HostProbe.poll` and `EngineProbe.poll`
    wrapped for one test (through its `monkeypatch`). A test then says "no poll started while paused"
    or "never two under way", which are counts, whatever the polls' pace."""

    def __init__(self, monkeypatch) -> None:
        from sparktop.observe.engine_probe import EngineProbe
        from sparktop.observe.host_probe import HostProbe

        self.started = 0
        self.in_flight = 0
        for cls in (HostProbe, EngineProbe):
            monkeypatch.setattr(cls, "poll", self._counting(cls.poll))

    def _counting(self, poll):
        async def counted(probe):
            self.started += 1
            self.in_flight += 1
            try:
                return await poll(probe)
            finally:
                self.in_flight -= 1

        return counted
