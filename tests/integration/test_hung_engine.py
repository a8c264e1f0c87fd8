"""A hung engine, caught: a twin made to hang (`POST /twin/hang`, the twin's own route in every dialect)
answers /health 200 and its metrics while it makes no tokens, and the poller shows it `hung`, with why,
once its counters have not moved for `hung_after` seconds with requests waiting; let go, its tokens flow
and the hang is cleared. The twin and the poller share one virtual-time loop (tests/helpers/simulated.py),
so "30 s without a token" is 30 s of the poller's clock, not of this machine's."""

from __future__ import annotations

import asyncio
import contextlib
import re

import httpx
import pytest

from sparktop.observe.poller import EngineTarget, Poller
from sparktop.observe.snapshot import EngineSnapshot, Notice
from sparktop.observe.state import ClusterState
from tests.helpers.simulated import sim_clock, sim_twin, simulated
from tests.helpers.twin_process import DIALECT_ARGV

HUNG_AFTER = 30.0


async def watch(poller: Poller, state: ClusterState, seconds: float, stop) -> list:
    """The events the poller yields until `stop(events)` (or `seconds` of the loop's time), applied to `state`."""
    events: list = []

    async def consume():
        async for event in poller.events():
            state.apply(event)
            events.append(event)
            if stop(events):
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(consume(), seconds)
    return events


def notices(events: list, kind: str) -> list[Notice]:
    return [e for e in events if isinstance(e, Notice) and e.kind == kind]


async def requests(url: str, n: int, max_tokens: int = 2000) -> list:
    """`n` streamed chats that each want `max_tokens`: in flight, then waiting, for as long as the test."""
    async with httpx.AsyncClient(timeout=None) as client:

        async def one(i: int) -> int:
            body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": f"{i} hello " * 40}],
                    "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
            chunks = 0
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_lines():
                    chunks += 1
            return chunks

        return await asyncio.gather(*(one(i) for i in range(n)))


@simulated
@pytest.mark.parametrize("flags", [(), ("--max-num-seqs", "2")], ids=["all-running", "some-queued"])
async def test_a_twin_that_hangs_is_shown_hung_with_why_and_cleared_when_it_makes_tokens_again(flags):
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", *flags, speed=4, clock=clock) as server:
        poller = Poller([], [EngineTarget(server.url)], interval=1.0, default_port=None, clock=clock,
                        hung_after=HUNG_AFTER)
        state = ClusterState()
        await poller.start()
        load = asyncio.create_task(requests(server.url, 3))
        try:
            # Serving: tokens flow, nothing is said.
            events = await watch(poller, state, 20, lambda ev: sum(
                isinstance(e, EngineSnapshot) and (e.gen_tokens_total or 0) > 0 for e in ev) >= 3)
            assert not notices(events, "hung")
            async with httpx.AsyncClient() as client:
                hung_at = clock.wall()
                assert (await client.post(server.url + "/twin/hang")).json() == {"hung": True}
                events = await watch(poller, state, 120, lambda ev: bool(notices(ev, "hung")))
                # Hung, it still says it is healthy: only its counters give it away.
                assert (await client.get(server.url + "/health")).status_code == 200
                assert (await client.get(server.url + "/twin/hang")).json() == {"hung": True}
                assert (await client.post(server.url + "/twin/hang", json={"hung": False})).json() == {"hung": False}
            events += await watch(poller, state, 60, lambda ev: bool(notices(ev, "hung_cleared")))
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await load
            await poller.close()
    snaps = [e for e in events if isinstance(e, EngineSnapshot)]
    hung = [s for s in snaps if s.state == "hung"]
    assert hung, [s.state for s in snaps]
    first = hung[0]
    # Not before its counters had stood still for HUNG_AFTER seconds of the poller's clock, with its requests.
    assert first.t - hung_at >= HUNG_AFTER
    assert first.running + first.waiting == 3
    match = re.fullmatch(r"no tokens for (\d+) s with 3 requests waiting \((.*)\)", first.reason or "")
    assert match, first.reason
    assert HUNG_AFTER <= int(match.group(1)) <= first.t - hung_at + 1
    assert match.group(2) == ("3 running" if not flags else "2 running, 1 queued")
    # While hung its figures are read as ever (they are what shows it), and the card's summary does not count
    # it as ready.
    assert all(s.gen_tokens_total == first.gen_tokens_total for s in hung)
    (said,) = notices(events, "hung")
    assert said.level == "error" and said.text == f"engine hung: {first.reason}"
    (cleared,) = notices(events, "hung_cleared")
    assert cleared.text == "engine no longer hung: tokens flow again" and cleared.t > said.t
    after = [s for s in snaps if s.t >= cleared.t]
    assert after[0].state == "ready" and after[0].gen_tokens_total > first.gen_tokens_total
    assert state.summary().engines_ready == 1


@simulated
async def test_an_idle_engine_that_hangs_is_not_hung_until_something_waits():
    """Nothing asked of it, nothing is late: a hang with no request in flight shows nothing; the first
    request that then waits starts the count."""
    clock = sim_clock()
    async with sim_twin("llama-3.1-8b", speed=4, clock=clock) as server:
        poller = Poller([], [EngineTarget(server.url)], interval=1.0, default_port=None, clock=clock,
                        hung_after=HUNG_AFTER)
        await poller.start()
        try:
            async with httpx.AsyncClient() as client:
                await client.post(server.url + "/twin/hang")
            state = ClusterState()
            events = await watch(poller, state, 2 * HUNG_AFTER, lambda ev: False)
            assert {e.state for e in events if isinstance(e, EngineSnapshot)} == {"ready"}
            load = asyncio.create_task(requests(server.url, 1))
            asked = clock.wall()
            events = await watch(poller, state, 3 * HUNG_AFTER, lambda ev: bool(notices(ev, "hung")))
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await load
        finally:
            await poller.close()
    first = next(e for e in events if isinstance(e, EngineSnapshot) and e.state == "hung")
    assert first.t - asked >= HUNG_AFTER
    assert first.reason and first.reason.endswith("with 1 request waiting (1 queued)"), first.reason


@simulated
@pytest.mark.parametrize("engine", list(DIALECT_ARGV))
async def test_every_dialects_twin_hangs_on_demand_and_answers_its_health_meanwhile(engine):
    """The hang is the twin's, not a dialect's: in every engine's words the twin takes `POST /twin/hang`, keeps
    answering /health 200 while a request it holds makes no token, and finishes it once let go."""
    import io

    from sparktop.twin.dialects import dialect_for
    from sparktop.twin.server import TwinServer

    clock = sim_clock()
    dialect = dialect_for(engine)
    args = dialect.parse([*DIALECT_ARGV[engine], "--host", "127.0.0.1", "--port", "0", "--speed", "4",
                          "--startup-speed", "1e6"])
    server = TwinServer(args, log=io.StringIO(), dialect=dialect, clock=clock)
    await server.start()
    try:
        engine_ = server.engine
        assert engine_ is not None
        async with httpx.AsyncClient(timeout=None) as client:
            while (await client.get(server.url + "/health")).status_code != 200:  # SGLang's: after its warm-up
                await asyncio.sleep(0.5)
            assert (await client.post(server.url + "/twin/hang")).json() == {"hung": True}
            made = engine_.total_generation_tokens
            body = {"model": args.name, "prompt": list(range(1000, 1100)), "max_tokens": 20, "ignore_eos": True}
            asked = asyncio.create_task(client.post(server.url + "/v1/completions", json=body))
            await asyncio.sleep(120)  # of the loop's time: a hang that long makes no token
            # Held, and not a token made.
            assert not asked.done() and len(engine_.waiting) + len(engine_.running) == 1
            assert engine_.total_generation_tokens == made
            assert (await client.get(server.url + "/health")).status_code == 200
            assert (await client.post(server.url + "/twin/hang", json={"hung": False})).json() == {"hung": False}
            answer = await asked
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 20
            bad = await client.post(server.url + "/twin/hang", json={"hung": "yes"})
            assert bad.status_code == 400 and not engine_.hung
    finally:
        await server.stop()
