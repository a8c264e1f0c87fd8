"""The canary (`observe.canary`): when one is sent (on a hand-moved clock: the poller's `now` is given), what
its verdict does to the hang watch, what it cost taken out of the engine's counters, and how one request
is judged, against a small in-process server on simulated time."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from sparktop import cli
from sparktop.engine_ids import ROUTER
from sparktop.observe import canary as canary_mod
from sparktop.observe.canary import Canary, CanaryLedger, CanaryPolicy, CanaryResult, ask, busy
from sparktop.observe.hang import HangWatch
from sparktop.observe.snapshot import EngineSnapshot
from tests.helpers.simulated import simulated

URL = "http://spark-a:8000"


def snap(state: str = "ready", **figures) -> EngineSnapshot:
    figures.setdefault("running", 0.0)
    figures.setdefault("waiting", 0.0)
    return EngineSnapshot(key=URL, url=URL, t=0.0, state=state, **figures)


class _Flying:
    """A task that has not ended: a canary in flight."""

    def done(self) -> bool:
        return False


# -- when ---------------------------------------------------------------------------------------------------


def test_a_canary_goes_once_per_period_on_the_clock_it_is_given():
    c = Canary(CanaryPolicy(every=300))
    assert c.due(snap(), 1000.0)  # the first at once: a hang already there is caught
    c.last_at = 1000.0
    assert not c.due(snap(), 1000.0 + 299.9)
    assert c.due(snap(), 1000.0 + 300.0)
    c.task = _Flying()  # type: ignore[assignment]
    assert c.in_flight and not c.due(snap(), 5000.0)  # one at a time, however late


def test_no_canary_while_the_engine_serves_requests():
    c = Canary(CanaryPolicy(every=30))
    assert not c.due(snap(running=1.0), 0.0)
    assert not c.due(snap(waiting=2.0), 0.0)
    # An engine that says neither: its tokens/s say whether it is busy.
    assert not c.due(snap(running=None, waiting=None, gen_tps_now=12.0), 0.0)
    assert c.due(snap(running=None, waiting=None, gen_tps_now=0.0), 0.0)
    assert busy(snap(running=None, waiting=None, gen_tps=3.0))
    assert not busy(snap(running=None, waiting=None))


def test_never_a_canary_to_a_router_nor_to_an_engine_that_is_not_ready():
    c = Canary()
    assert not c.due(snap(kind=ROUTER), 0.0)  # its tokens are its engines'
    for state in ("sleeping", "starting", "stale", "unreachable", "failed", "connecting"):
        assert not c.due(snap(state), 0.0), state
    assert c.due(snap("hung"), 0.0)  # hung by an earlier canary: the next one may clear it


def test_the_command_lines_defaults_are_the_canarys():
    assert (cli.CANARY_EVERY_S, cli.CANARY_MIN_EVERY_S, cli.CANARY_TIMEOUT_S) == (
        canary_mod.CANARY_EVERY_S, canary_mod.CANARY_MIN_EVERY_S, canary_mod.CANARY_TIMEOUT_S)
    args = cli.build_parser().parse_args(["collect", "--canary"])
    assert cli._canary_policy(args) == CanaryPolicy(every=300.0, first_token=60.0, stall=60.0)
    args = cli.build_parser().parse_args(["monitor", "--canary", "45", "--canary-timeout", "20"])
    assert cli._canary_policy(args) == CanaryPolicy(every=45.0, first_token=20.0, stall=20.0)
    assert cli._canary_policy(cli.build_parser().parse_args(["collect"])) is None  # off by default
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["collect", "--canary", "10"])  # at least 30 s


# -- its verdict --------------------------------------------------------------------------------------------


def test_a_failed_canary_makes_the_engine_hung_until_one_is_answered():
    w = HangWatch(after=30)
    idle = {"gen_tokens_total": 100.0, "prompt_tokens_total": 50.0}
    assert w.judge(snap(**idle), 0) is None
    w.canary_failed("canary: no first token in 60 s", w.epoch)
    assert w.judge(snap(**idle), 61) == "canary: no first token in 60 s"
    assert w.judge(snap(**idle), 400) == "canary: no first token in 60 s"  # it stands
    w.canary_answered(w.epoch)
    assert w.judge(snap(**idle), 401) is None


def test_a_canarys_verdict_clears_when_tokens_flow_but_not_for_another_canarys_own():
    w = HangWatch(after=30)
    w.canary_failed("canary: stream stalled after 2 tokens for 60 s", w.epoch)
    reason = "canary: stream stalled after 2 tokens for 60 s"
    assert w.judge(snap(gen_tokens_total=100.0, prompt_tokens_total=0.0), 0) == reason
    # The next canary in flight makes tokens of its own: no sign of health yet.
    assert w.judge(snap(gen_tokens_total=102.0, prompt_tokens_total=3.0, running=1.0), 300, in_flight=1) == reason
    assert w.judge(snap(gen_tokens_total=102.0, prompt_tokens_total=3.0), 361) == reason
    # Someone's tokens move: it serves again.
    assert w.judge(snap(gen_tokens_total=150.0, prompt_tokens_total=3.0, running=1.0), 362) is None


def test_a_verdict_from_before_the_engine_went_away_is_not_heard():
    w = HangWatch(after=30)
    asked = w.epoch
    w.reset()  # an outage, a restart
    w.canary_failed("canary: error: HTTP 500", asked)
    assert w.judge(snap(gen_tokens_total=0.0, prompt_tokens_total=0.0), 10) is None
    # And an engine asleep on purpose, or gone, forgets a verdict.
    w.canary_failed("canary: error: HTTP 500", w.epoch)
    assert w.judge(snap("sleeping", gen_tokens_total=0.0, prompt_tokens_total=0.0), 11) is None
    assert w.judge(snap(gen_tokens_total=0.0, prompt_tokens_total=0.0), 12) is None


def test_the_canary_in_flight_is_not_a_request_waiting():
    """A hung engine with nothing asked of it but the canary: the counters do not call it hung for the
    canary's own request (its verdict will), and a user's request beside it is counted as one."""
    w = HangWatch(after=30)
    quiet = {"gen_tokens_total": 10.0, "prompt_tokens_total": 5.0}
    assert w.judge(snap(waiting=1.0, **quiet), 0, in_flight=1) is None
    assert w.judge(snap(waiting=1.0, **quiet), 59, in_flight=1) is None
    assert w.judge(snap(waiting=2.0, **quiet), 60, in_flight=1) is None
    late = w.judge(snap(waiting=2.0, **quiet), 90, in_flight=1)
    assert late == "no tokens for 30 s with 1 request waiting (1 queued)"


# -- never the user's traffic -------------------------------------------------------------------------------


def test_the_ledger_takes_each_canary_out_of_the_counters():
    ledger = CanaryLedger()

    def read(gen, prompt, requests, holding=False, started=1000.0, by_reason=None):
        s = snap(gen_tokens_total=gen, prompt_tokens_total=prompt, requests=requests, started_at=started,
                 finished_by_reason=by_reason)
        ledger.apply(s, holding)
        return s.gen_tokens_total, s.prompt_tokens_total, s.requests

    assert read(100, 500, 10) == (100, 500, 10)  # what it served before: the user's
    # A canary in flight: its first tokens are counted by the engine, not shown.
    assert read(102, 503, 10, holding=True) == (100, 500, 10)
    # ... nor is a user's request that came meanwhile, until the canary has ended.
    assert read(150, 600, 11, holding=True) == (100, 500, 10)
    ledger.settle(CanaryResult(prompt_tokens=3, gen_tokens=4, requests=1, finish="length", usage=True))
    assert read(152, 603, 12) == (148, 600, 11)  # the user's alone
    assert ledger.prompt_size == 3
    # An engine that counts later than it answered: never back, caught up with.
    ledger.settle(CanaryResult(prompt_tokens=3, gen_tokens=4, requests=1, finish="length", usage=True))
    assert read(152, 603, 12) == (148, 600, 11)
    assert read(156, 606, 13) == (148, 600, 11)
    assert read(166, 606, 14) == (158, 600, 12)
    # A restart: its counters start again, and so does the account.
    assert read(4, 3, 1, started=2000.0) == (4, 3, 1)
    assert read(10, 9, 2, started=2000.0) == (10, 9, 2)


def test_the_ledger_takes_the_canarys_finish_out_of_its_reason():
    ledger = CanaryLedger()
    s = snap(finished_by_reason={"stop": 5.0, "length": 2.0})
    ledger.apply(s)
    ledger.settle(CanaryResult(prompt_tokens=3, gen_tokens=4, requests=1, finish="length", usage=True))
    s = snap(finished_by_reason={"stop": 5.0, "length": 3.0})
    ledger.apply(s)
    assert s.finished_by_reason == {"stop": 5.0, "length": 2.0}


# -- one request --------------------------------------------------------------------------------------------


def _server(behaviour: str) -> web.Application:
    """A completions route that answers as `behaviour` says: `ok`, `stall` (two tokens, then silence), `hang`
    (headers, no token), `refuse` (401), `fail` (500)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["max_tokens"] == 4 and body["stream"] is True and body["model"] == "m"
        if behaviour == "refuse":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if behaviour == "fail":
            return web.json_response({"error": {"message": "engine core died"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = {"ok": 4, "stall": 2, "hang": 0}[behaviour]
        for i in range(n):
            usage = {"prompt_tokens": 2, "completion_tokens": i + 1, "total_tokens": i + 3}
            chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if i == 3 else None}],
                     "usage": usage}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0.05)
        if behaviour != "ok":
            await asyncio.sleep(3600)
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


@simulated
@pytest.mark.parametrize(("behaviour", "reason", "asked", "gen", "prompt", "requests"), [
    ("ok", None, True, 4, 2, 1),
    ("stall", "canary: stream stalled after 2 tokens for 60 s", True, 2, 2, 1),
    ("hang", "canary: no first token in 60 s", True, 0, 0, 1),
    ("refuse", "canary refused: HTTP 401 (Unauthorized)", False, 0, 0, 0),
    ("fail", "canary: error: HTTP 500 (engine core died)", True, 0, 0, 0),
])
async def test_one_canary_is_judged_by_its_stream(behaviour, reason, asked, gen, prompt, requests):
    runner = web.AppRunner(_server(behaviour))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    loop = asyncio.get_running_loop()
    try:
        async with aiohttp.ClientSession() as client:
            began = loop.time()
            result = await ask(client, f"http://127.0.0.1:{port}", "m", CanaryPolicy(every=300))
            took = loop.time() - began
    finally:
        await runner.cleanup()
    assert (result.reason, result.asked) == (reason, asked)
    assert (result.gen_tokens, result.prompt_tokens, result.requests) == (gen, prompt, requests)
    if behaviour in ("stall", "hang"):
        assert took >= 60  # of the loop's (simulated) time: it waited its timeout out, no less
        assert result.finish == "abort"
    if behaviour == "ok":
        assert result.finish == "length" and result.usage and took < 60


@simulated
async def test_a_refused_canary_is_said_once_until_one_is_answered():
    """A canary the engine refuses (401: a key the user did not give) says nothing of its health, but a canary asked
    for that never runs must not be silent: one `refused` call, not one a period, and again after an answer."""
    from sparktop.observe.canary import Canary
    from sparktop.observe.hang import HangWatch

    said: list[str] = []
    apps = {b: _server(b) for b in ("refuse", "ok")}
    runners = [web.AppRunner(apps[b]) for b in ("refuse", "ok")]
    ports = []
    for runner in runners:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    canary, hang = Canary(CanaryPolicy(every=300)), HangWatch()
    try:
        async with aiohttp.ClientSession() as client:
            for port in (ports[0], ports[0], ports[1], ports[0]):
                canary.start(client, f"http://127.0.0.1:{port}", "m", hang, 0.0, refused=said.append)
                assert canary.task is not None
                await canary.task
    finally:
        for runner in runners:
            await runner.cleanup()
    assert said == ["canary refused: HTTP 401 (Unauthorized)"] * 2
    assert hang.canary is None  # a refusal is no verdict


async def test_a_canary_that_cannot_connect_in_time_is_no_verdict():
    """aiohttp's connect timeout is a TimeoutError too: a network blip is 'not answered', never 'no first token'
    (which would call a healthy engine hung, alert and, with the watchdog, restart it)."""

    class NoConnect:
        def post(self, *args, **kwargs):
            raise aiohttp.ConnectionTimeoutError("Connection timeout to host http://10.0.0.9:8000")

    result = await ask(NoConnect(), "http://10.0.0.9:8000", "m", CanaryPolicy(every=300))  # type: ignore[arg-type]
    assert result.asked is False and result.reason == "canary not answered: ConnectionTimeoutError"
