"""The canary against real twins: a twin hung with nothing asked of it (`POST /twin/hang`) shows nothing to
its counters, and the canary's request makes it `hung` with the canary's reason until it is let go; a twin
whose streams stall after two tokens (`POST /twin/stall`) the same; and the canaries' tokens never reach the
history nor the exporter, which hold the user's requests alone.

The twins run in their own processes (`tests/helpers/twin_process.py`) on this machine's time, with a
canary every second and timeouts of two (real short parameters: the tests assert states and their order,
never how long anything took), or in process on simulated time with the defaults (a canary every five
minutes, a minute's timeouts), where a day's totals are compared."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparktop.history.query import HistoryReader
from sparktop.history.store import HistoryStore
from sparktop.history.writer import HistoryWriter
from sparktop.observe.canary import CanaryPolicy
from sparktop.observe.poller import EngineTarget, Poller
from sparktop.observe.snapshot import EngineSnapshot, Notice
from sparktop.observe.state import ClusterState
from tests.helpers.collector import Collector, ask, history_json, wait_served
from tests.helpers.simulated import sim_clock, sim_twin, simulated
from tests.helpers.twin_process import DIALECT_ARGV, start_twin_process

MODEL = "llama-3.1-8b"
QUICK = CanaryPolicy(every=1.0, first_token=2.0, stall=2.0)


def twin_count(url: str, family: str = "vllm:request_success") -> float:
    """A counter as the twin itself exports it: every request it finished, the canaries' too."""
    body = httpx.get(url + "/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(body) if f.name == family
               for s in f.samples if s.name.endswith("_total"))


async def watch_until(poller: Poller, stop, limit: float = 30.0) -> list:
    """The poller's events until `stop(events)`; fails after `limit` s (a hang detector, not a timing)."""
    events: list = []

    async def consume():
        async for event in poller.events():
            events.append(event)
            if stop(events):
                return

    try:
        await asyncio.wait_for(consume(), limit)
    except TimeoutError:
        raise AssertionError(f"not seen in {limit:g} s: {[getattr(e, 'state', e) for e in events][-20:]}") from None
    return events


def said(events: list, kind: str) -> list[Notice]:
    return [e for e in events if isinstance(e, Notice) and e.kind == kind]


@contextlib.asynccontextmanager
async def watched_twin(*flags: str):
    """A twin in its own process and a poller sending it a canary every second; (poller, url)."""
    proc, url = start_twin_process(MODEL, *flags, speed=8)
    poller = Poller([], [EngineTarget(url)], interval=0.25, default_port=None, hung_after=60.0, canary=QUICK)
    try:
        await poller.start()
        yield poller, url
    finally:
        await poller.close()
        proc.terminate()
        proc.wait(10)


async def first_canary_answered(poller: Poller, url: str) -> list:
    """Until the twin has finished a request the poller does not show: the first canary, answered."""
    return await watch_until(poller, lambda ev: twin_count(url) >= 1 and any(
        isinstance(e, EngineSnapshot) and e.state == "ready" and e.requests == 0 for e in ev[-3:]))


async def test_an_idle_twin_that_hangs_is_caught_by_the_canary_and_cleared_when_let_go():
    async with watched_twin() as (poller, url):
        events = await first_canary_answered(poller, url)
        assert not said(events, "hung")  # answered: nothing to say
        async with httpx.AsyncClient() as client:
            assert (await client.post(url + "/twin/hang")).json() == {"hung": True}
            events = await watch_until(poller, lambda ev: bool(said(ev, "hung")))
            # Hung with nothing asked of it: /health says all is well; only the canary knows.
            assert (await client.get(url + "/health")).status_code == 200
            hung = [e for e in events if isinstance(e, EngineSnapshot) and e.state == "hung"]
            assert hung[0].reason == "canary: no first token in 2 s"
            assert said(events, "hung")[0].text == "engine hung: canary: no first token in 2 s"
            assert (await client.post(url + "/twin/hang", json={"hung": False})).json() == {"hung": False}
        events = await watch_until(poller, lambda ev: bool(said(ev, "hung_cleared")))
        assert said(events, "hung_cleared")[0].text == "engine no longer hung: it answers again"
        after = [e for e in events if isinstance(e, EngineSnapshot)]
        assert after[-1].state == "ready"


async def test_a_stream_that_stalls_is_caught_by_the_canary_and_cleared_when_it_flows():
    async with watched_twin() as (poller, url):
        await first_canary_answered(poller, url)
        async with httpx.AsyncClient() as client:
            assert (await client.post(url + "/twin/stall", json={"after": 2})).json() == {"after": 2}
            events = await watch_until(poller, lambda ev: bool(said(ev, "hung")))
            hung = [e for e in events if isinstance(e, EngineSnapshot) and e.state == "hung"]
            assert hung[0].reason == "canary: stream stalled after 2 tokens for 2 s"
            # The stalled request holds its place in the engine, the rest would be served.
            assert (await client.get(url + "/twin/stall")).json() == {"after": 2}
            assert (await client.post(url + "/twin/stall", json={"after": None})).json() == {"after": None}
        await watch_until(poller, lambda ev: bool(said(ev, "hung_cleared")))


def test_the_twin_stall_route_refuses_what_it_does_not_take():
    proc, url = start_twin_process(MODEL, speed=8)
    try:
        for bad in ({"after": 0}, {"after": "2"}, {"after": True}, [2]):
            assert httpx.post(url + "/twin/stall", json=bad, timeout=5).status_code == 400, bad
        assert httpx.post(url + "/twin/stall", timeout=5).json() == {"after": 1}  # no body: after the first token
        # A request no longer than the stall is served whole.
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
        assert httpx.post(url + "/v1/completions", json=body, timeout=10).json()["usage"]["completion_tokens"] == 1
    finally:
        proc.terminate()
        proc.wait(10)


@simulated
async def test_a_days_totals_are_the_users_requests_alone_with_canaries_running(tmp_path):
    """Twenty minutes of simulated time: a canary every five minutes (the default) and a user's request every
    170 s, some of them meeting a canary in flight. The history's minutes and session, and the counters the
    state holds (what the exporter serves), count the user's requests alone; the twin counted both."""
    clock = sim_clock()
    async with sim_twin(MODEL, speed=4, clock=clock) as server:
        poller = Poller([], [EngineTarget(server.url)], interval=10.0, default_port=None, clock=clock,
                        canary=CanaryPolicy())
        state = ClusterState()
        writer = HistoryWriter(HistoryStore.open(tmp_path / "h.sqlite"), clock=clock)
        started = clock.wall()
        user = {"gen": 0, "prompt": 0, "requests": 0}

        async def users():
            async with httpx.AsyncClient(timeout=None) as client:
                for i in range(7):
                    await asyncio.sleep(170.0)
                    body = {"model": MODEL, "prompt": f"user {i} " * 20, "max_tokens": 24, "ignore_eos": True}
                    usage = (await client.post(server.url + "/v1/completions", json=body)).json()["usage"]
                    user["gen"] += usage["completion_tokens"]
                    user["prompt"] += usage["prompt_tokens"]
                    user["requests"] += 1

        async def consume():
            async for event in poller.events():
                state.apply(event)
                writer.observe(event, state)

        await poller.start()
        feeding = asyncio.create_task(consume())
        await users()
        await asyncio.sleep(30.0)  # the last request read
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeding
        await poller.close()
        writer.close()
        engine = server.engine
        assert engine is not None
        twin_gen, twin_prompt = engine.total_generation_tokens, engine.total_prompt_tokens
    last = state.engines[server.url]
    assert last.state == "ready"
    canaries = (twin_gen - user["gen"]) / 4
    assert canaries >= 4 and canaries == int(canaries)  # one at the start and one every 300 s of the 1200
    # What the state holds (and the exporter serves): the user's.
    assert (last.gen_tokens_total, last.prompt_tokens_total, last.requests) == (
        user["gen"], user["prompt"], user["requests"])
    assert twin_prompt > user["prompt"]
    reader = HistoryReader(HistoryStore.open(tmp_path / "h.sqlite", write=False))
    days = [d for d in reader.daily(started - 86400, clock.wall() + 86400) if d.url == server.url]
    assert sum(d.gen_tokens for d in days) == user["gen"]
    assert sum(d.prompt_tokens for d in days) == user["prompt"]
    assert sum(d.requests for d in days) == user["requests"]
    (session,) = [s for s in reader.sessions(started - 86400, clock.wall() + 86400) if s.url == server.url]
    assert (session.gen_tokens, session.requests) == (user["gen"], user["requests"])


@pytest.mark.slow
def test_collect_with_canaries_writes_and_serves_the_users_requests_alone(tmp_path):
    """`sparktop collect --canary 30`: its first canary goes at once; the twin counts it, the collector's
    metrics and history do not."""
    from tests.conftest import free_port

    twin, url = start_twin_process(MODEL, speed=8)
    path = tmp_path / "history.sqlite"
    port = free_port()
    collect = None
    try:
        collect = Collector(tmp_path, "--engine", url, "-i", "0.5", "--file", str(path),
                            "--serve-metrics", f"127.0.0.1:{port}", "--canary", "30")
        collect.wait_for("canary: a 4-token request to each idle engine every 30 s")
        deadline = time.monotonic() + 60  # a hang detector, not a timing
        while twin_count(url) < 1:  # the canary, answered
            assert time.monotonic() < deadline, collect.lines
            time.sleep(0.2)
        wait_served(port, "sparktop_engine_requests_finished_total", url, 0)
        tokens = ask(url, 4)
        wait_served(port, "sparktop_engine_requests_finished_total", url, 4)
        wait_served(port, "sparktop_engine_generation_tokens_total", url, tokens)
        code, out, err = collect.stop()
        twin_gen = twin_count(url, "vllm:generation_tokens")
    finally:
        if collect is not None:
            collect.stop()
        twin.terminate()
        twin.wait(10)
    assert code == 0, err
    assert twin_gen == tokens + 4  # the twin made the canary's four tokens too
    found = history_json(path)
    (session,) = [x for x in found["sessions"] if x["url"] == url]
    assert (session["gen_tokens"], session["requests"]) == (tokens, 4)
    days = [d for d in found["daily"] if d["url"] == url]
    assert sum(d["gen_tokens"] for d in days) == tokens
    assert sum(d["requests"] for d in days) == 4


@simulated
@pytest.mark.parametrize("engine", list(DIALECT_ARGV))
async def test_every_dialects_twin_stalls_a_stream_on_demand(engine):
    """The stall is the twin's, not a dialect's: in every engine's words a stream gets its first two tokens and
    then nothing, for as long as the stall holds, and the rest once it is lifted."""
    import io

    from sparktop.twin.dialects import dialect_for
    from sparktop.twin.server import TwinServer

    clock = sim_clock()
    dialect = dialect_for(engine)
    args = dialect.parse([*DIALECT_ARGV[engine], "--host", "127.0.0.1", "--port", "0", "--speed", "4",
                          "--startup-speed", "1e6"])
    server = TwinServer(args, log=io.StringIO(), dialect=dialect, clock=clock)
    await server.start()
    chunks: list[str] = []
    try:
        async with httpx.AsyncClient(timeout=None) as client:
            while (await client.get(server.url + "/health")).status_code != 200:  # SGLang's: after its warm-up
                await asyncio.sleep(0.5)
            assert (await client.post(server.url + "/twin/stall", json={"after": 2})).json() == {"after": 2}
            body = {"model": args.name, "prompt": "hello there", "max_tokens": 8, "stream": True, "ignore_eos": True}

            async def stream() -> None:
                async with client.stream("POST", server.url + "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data:"):
                            chunks.append(line)

            reading = asyncio.create_task(stream())
            await asyncio.sleep(120)  # of the loop's time: a stall that long sends nothing more
            assert not reading.done()
            tokens = [c for c in chunks if '"text"' in c or '"content"' in c]
            assert len(tokens) == 2, chunks
            assert (await client.post(server.url + "/twin/stall", json={"after": None})).json() == {"after": None}
            await reading
    finally:
        await server.stop()
    assert chunks[-1] == "data: [DONE]"
