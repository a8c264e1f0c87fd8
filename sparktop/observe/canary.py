"""The canary: a tiny request now and then, to catch what an engine's counters cannot show.

`observe.hang` calls an engine hung when its token counters stand still while requests wait. Two hangs
escape it: one with nothing asked of it (no traffic overnight, the core wedged: the first request in the
morning hangs), and a single stream that stalls half-way while the counters have nothing else to move for.
The canary asks: a streamed completion of `CANARY_MAX_TOKENS` tokens for a one-word prompt, to the engine's
OpenAI endpoint under its served model's name. Off unless asked for (`sparktop collect --canary [S]`,
`sparktop monitor --canary [S]`: `CanaryPolicy`), and kept small:

- at most one per engine every `every` seconds (default 300, at least 30 from the command line), on the
  poller's clock (`due`, given the poller's `now`);
- never while the engine is busy with requests (its running and waiting ones, or its tokens/s where it
  exports neither): then its counters say whether it moves, which is `observe.hang`'s case;
- never to a router (its tokens are its engines'), only to an engine that answered ready (or hung) just now.

Its verdict goes to the engine's `HangWatch`, the one truth for "hung": no first token within
`first_token` seconds (`"canary: no first token in 60 s"`), a stream whose next chunk does not come within
`stall` seconds of the last before it ends (`"canary: stream stalled after 2 tokens for 60 s"`), or an error
the engine answers (a 5xx, an error in the stream), make the engine `hung` with that reason, so the
notices, the `engine_hung` alert, the card and the watchdog act on it as on any hang. It clears when a
later canary is answered in time or the engine's tokens move again (`HangWatch.judge`). What says nothing
of the engine's health is no verdict: a refusal (4xx: a key it lacks, a model name it does not take) and a
connection that fails (the poll says the engine is down).

Never the user's traffic. The canary knows what it cost the engine (the response's `usage`: its prompt
and completion tokens; a request; its finish reason), and `CanaryLedger` takes that out of the engine's
counters in every snapshot the poller yields (`prompt_tokens_total`, `gen_tokens_total`, `requests`,
`finished_by_reason`), so the history's minutes and sessions and the exporter's counters hold the user's
requests alone. While a canary is in flight the counters are held where they were (the engine counts its
tokens before the canary has them all); once it has ended, they are the engine's less every canary, never
going back (an engine that counts later than it answers is caught up with). A restart (the counters fall,
or its start time changes) starts the account afresh. Exact for a canary that was answered (its usage is
the engine's own count). Not exact, and bounded by one canary's few tokens each time:

- a canary that failed: taken out is what it saw (the tokens it received, its prompt's size as the last
  answered canary's usage gave it once a first token came, a request finished as `abort`); what the engine
  does with it after the canary gave up (a hung request it finishes once it is let go, a disconnect it
  counts as another reason) is not seen, and shows as the user's;
- the rates (tokens/s over the rate window, the sparkline's since the last poll, finished requests/s):
  the engine's own, the canary's few tokens included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from sparktop.engine_ids import is_router
from sparktop.observe.hang import HangWatch, seconds_text
from sparktop.observe.snapshot import EngineSnapshot

CANARY_EVERY_S = 300.0  # a canary per engine at most this often, by default
CANARY_MIN_EVERY_S = 30.0  # the least period the command line takes: a canary is never traffic of its own
CANARY_TIMEOUT_S = 60.0  # seconds for its first token, and between two chunks after it, by default
CANARY_PROMPT = "Hello"
CANARY_MAX_TOKENS = 4
CANARY_PATH = "/v1/completions"
COUNTERS = ("prompt_tokens_total", "gen_tokens_total", "requests")  # the snapshot's counters it is taken out of


@dataclass(frozen=True)
class CanaryPolicy:
    """How often a canary goes to each engine (`every`, seconds of the poller's clock), and how long it
    waits for its first token (`first_token`) and for each chunk after it (`stall`)."""

    every: float = CANARY_EVERY_S
    first_token: float = CANARY_TIMEOUT_S
    stall: float = CANARY_TIMEOUT_S

    def describe(self) -> str:
        """What `collect` says of it, in a line."""
        return (f"canary: a {CANARY_MAX_TOKENS}-token request to each idle engine every {seconds_text(self.every)} "
                f"(no first token in {seconds_text(self.first_token)}, or a stream silent for "
                f"{seconds_text(self.stall)}, shows it hung); not counted as your traffic")


@dataclass
class CanaryResult:
    """How one canary went. `reason`: why it makes the engine hung (None: answered in time, or not asked).
    `asked`: False when it says nothing of the engine's health (refused, or not reached). The rest is what
    it added to the engine's counters, as far as it knows (`CanaryLedger`)."""

    reason: str | None = None
    asked: bool = True
    prompt_tokens: float = 0.0
    gen_tokens: float = 0.0
    requests: float = 0.0
    finish: str | None = None  # the finish reason the engine counts it under
    usage: bool = False  # its counts are the engine's own (a usage object), not the canary's estimate

    @property
    def ok(self) -> bool:
        return self.asked and self.reason is None


def busy(snap: EngineSnapshot) -> bool:
    """Whether the engine serves requests now: its running or waiting ones, else its tokens/s."""
    if snap.running is not None or snap.waiting is not None:
        return (snap.running or 0.0) + (snap.waiting or 0.0) > 0
    rate = snap.gen_tps_now if snap.gen_tps_now is not None else snap.gen_tps
    return bool(rate and rate > 0)


@dataclass
class CanaryLedger:
    """What one engine's canaries added to its counters, taken out of every snapshot (`apply`), so what is
    shown, written and exported is the user's traffic. See the module's docstring for where it is exact."""

    sent: dict[str, float] = field(default_factory=dict)  # per counter: every settled canary's, since it started
    sent_by_reason: dict[str, float] = field(default_factory=dict)
    raw: dict[str, float] = field(default_factory=dict)  # the engine's counters as last read
    shown: dict[str, float] = field(default_factory=dict)  # what was last yielded
    shown_by_reason: dict[str, float] = field(default_factory=dict)
    raw_by_reason: dict[str, float] = field(default_factory=dict)
    started_at: float | None = None  # the engine's start time as last read (another: a restart)
    prompt_size: float | None = None  # the canary's prompt in tokens, as the engine last counted it

    def settle(self, result: CanaryResult) -> None:
        """A canary has ended: what it cost goes into the account."""
        if result.usage and result.prompt_tokens:
            self.prompt_size = result.prompt_tokens
        for name, value in zip(COUNTERS, (result.prompt_tokens, result.gen_tokens, result.requests), strict=True):
            if value:
                self.sent[name] = self.sent.get(name, 0.0) + value
        if result.requests and result.finish:
            self.sent_by_reason[result.finish] = self.sent_by_reason.get(result.finish, 0.0) + result.requests

    def apply(self, snap: EngineSnapshot, holding: bool = False) -> None:
        """Take the canaries out of `snap`'s counters (in place). `holding`: a canary is in flight, so the
        counters stay where they were shown (what it added so far is not known yet)."""
        restarted = (snap.started_at is not None and self.started_at is not None
                     and abs(snap.started_at - self.started_at) > 1.0)
        if snap.started_at is not None:
            self.started_at = snap.started_at
        for name in COUNTERS:
            raw = getattr(snap, name)
            if raw is None:
                continue
            if restarted or raw < self.raw.get(name, raw):
                self.sent.pop(name, None)  # its counters started again: so does the account
                self.shown.pop(name, None)
            self.raw[name] = raw
            value = self._held(raw - self.sent.get(name, 0.0), self.shown.get(name), holding)
            self.shown[name] = value
            setattr(snap, name, value)
        by_reason = snap.finished_by_reason
        if by_reason is not None:
            if restarted or any(v < self.raw_by_reason.get(k, v) for k, v in by_reason.items()):
                self.sent_by_reason.clear()
                self.shown_by_reason.clear()
            self.raw_by_reason = dict(by_reason)
            mine: dict[str, float] = {}
            for reason, raw in by_reason.items():
                mine[reason] = self._held(raw - self.sent_by_reason.get(reason, 0.0),
                                          self.shown_by_reason.get(reason), holding)
            self.shown_by_reason = dict(mine)
            snap.finished_by_reason = mine

    @staticmethod
    def _held(value: float, shown: float | None, holding: bool) -> float:
        """`value` as it may be shown after `shown`: no higher while a canary is in flight, never lower."""
        if shown is None:
            return max(0.0, value)
        return min(value, shown) if holding else max(value, shown)


@dataclass
class Canary:
    """One engine's canary: when it is due (`due`), the one in flight (`start`), and its account (`ledger`)."""

    policy: CanaryPolicy = field(default_factory=CanaryPolicy)
    last_at: float | None = None  # when the last one was sent, on the poller's clock
    task: asyncio.Task | None = None
    ledger: CanaryLedger = field(default_factory=CanaryLedger)
    last: CanaryResult | None = None  # how the last one went
    said_refused: bool = False  # its refusal was said (once, until one is answered)

    @property
    def in_flight(self) -> bool:
        return self.task is not None and not self.task.done()

    def due(self, snap: EngineSnapshot, now: float) -> bool:
        """Whether to send one now, after a successful poll at `now` that read `snap`."""
        if self.in_flight or is_router(snap.kind) or snap.state not in ("ready", "hung") or busy(snap):
            return False
        return self.last_at is None or now - self.last_at >= self.policy.every

    def start(self, client: aiohttp.ClientSession, base: str, model: str | None, hang: HangWatch, now: float, *,
              headers: dict[str, str] | None = None, name: str = "canary",
              refused: Callable[[str], None] | None = None) -> None:
        """Send one (in a task of its own); its verdict goes to `hang`, its cost to the ledger. `refused` is told,
        once until one is answered again, when the engine would not take it (a key, a model name): a canary
        the user asked for that never runs must not be silent."""
        self.last_at = now
        epoch = hang.epoch

        async def run() -> None:
            try:
                result = await ask(client, base, model, self.policy, headers=headers,
                                   prompt_size=self.ledger.prompt_size)
            except Exception as exc:  # noqa: BLE001 - a canary's own fault never stops the poller
                result = CanaryResult(reason=f"canary not asked: {type(exc).__name__}", asked=False)
            self.last = result
            self.ledger.settle(result)
            if not result.asked:
                # Refused for good (a key, a model name), not unreached (the poll says that) nor rate-limited.
                why = result.reason or ""
                if refused is not None and why.startswith("canary refused") and "HTTP 429" not in why \
                        and not self.said_refused:
                    self.said_refused = True
                    refused(why)
                return
            self.said_refused = False
            if result.reason is None:
                hang.canary_answered(epoch)
            else:
                hang.canary_failed(result.reason, epoch)

        self.task = asyncio.create_task(run(), name=name)


def _tokens_in(chunk: dict) -> int:
    """Tokens one streamed chunk carries: its choices with text (or, without text, not the finish alone)."""
    n = 0
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        text = choice.get("text") or delta.get("content") or delta.get("reasoning_content")
        if not text and delta.get("role"):
            continue  # the chat stream's opening chunk names the role: no token yet
        if text or choice.get("finish_reason") is None:
            n += 1
    return n


def _error_text(body: object) -> str:
    """An error body's message, short."""
    if isinstance(body, dict):
        err = body.get("error", body)
        message = err.get("message") if isinstance(err, dict) else err
        if message:
            return str(message)[:80]
    return ""


async def ask(client: aiohttp.ClientSession, base: str, model: str | None, policy: CanaryPolicy, *,
              headers: dict[str, str] | None = None, prompt_size: float | None = None) -> CanaryResult:
    """One canary to the engine at `base` (its address without /v1): how it went. Its waits are on the running
    loop, whose clock is the poller's (a test's virtual-time loop, or the machine's monotonic clock).
    `prompt_size`: the prompt's tokens as an earlier answered canary's usage gave them, for one that fails
    before its own usage comes."""
    body: dict[str, object] = {"prompt": CANARY_PROMPT, "max_tokens": CANARY_MAX_TOKENS, "stream": True,
                               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if model:
        body["model"] = model
    tokens = 0
    usage: dict | None = None
    finish: str | None = None

    def spent(reason: str | None, requests: float = 1.0, end: str | None = "abort") -> CanaryResult:
        """What it cost the engine, as far as it knows."""
        gen = float(usage.get("completion_tokens") or tokens) if usage else float(tokens)
        prompt = float(usage.get("prompt_tokens") or 0) if usage else 0.0
        if not prompt and tokens:  # the engine counts a prompt once its first token is out
            prompt = prompt_size or 0.0
        return CanaryResult(reason=reason, prompt_tokens=prompt, gen_tokens=gen, requests=requests, finish=end,
                            usage=usage is not None and reason is None)

    def stalled() -> str:
        if not tokens:
            return f"canary: no first token in {seconds_text(policy.first_token)}"
        return (f"canary: stream stalled after {tokens} token{'s' if tokens != 1 else ''} for "
                f"{seconds_text(policy.stall)}")

    timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=min(10.0, policy.first_token))
    try:
        async with asyncio.timeout(policy.first_token) as limit:
            async with client.post(base.rstrip("/") + CANARY_PATH, json=body, headers=headers,
                                   timeout=timeout) as r:
                if r.status >= 400:
                    text = ""
                    with contextlib.suppress(ValueError, aiohttp.ClientError):
                        text = _error_text(json.loads(await r.read() or b"null"))
                    detail = f"HTTP {r.status}" + (f" ({text})" if text else "")
                    if r.status < 500:  # refused: a key, a model name, a limit; the engine's health is not in it
                        return CanaryResult(reason=f"canary refused: {detail}", asked=False)
                    return CanaryResult(reason=f"canary: error: {detail}")
                while True:
                    line = await r.content.readline()
                    if not line:  # the stream ended without [DONE]
                        if finish is not None:
                            return spent(None, end=finish)
                        return spent(f"canary: the stream ended after {tokens} tokens without finishing")
                    text_line = line.decode("utf-8", "replace").strip()
                    if not text_line.startswith("data:"):
                        continue
                    data = text_line[5:].strip()
                    if data == "[DONE]":
                        return spent(None, end=finish or "length")
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        continue
                    if not isinstance(chunk, dict):
                        continue
                    if "error" in chunk:
                        return spent(f"canary: error: {_error_text(chunk) or 'in the stream'}", end="error")
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        if isinstance(choice, dict) and choice.get("finish_reason"):
                            finish = str(choice["finish_reason"])
                    tokens += _tokens_in(chunk)
                    if tokens:  # from the first token on, each chunk has `stall` seconds to come
                        limit.reschedule(asyncio.get_running_loop().time() + policy.stall)
    except aiohttp.ConnectionTimeoutError as exc:  # a TimeoutError too: not reached is not a hang
        return CanaryResult(reason=f"canary not answered: {type(exc).__name__}", asked=False)
    except TimeoutError:
        return spent(stalled())
    except (aiohttp.ClientError, OSError) as exc:
        # Not reached, or cut off: the poll says what became of the engine (down, restarted).
        return CanaryResult(reason=f"canary not answered: {type(exc).__name__}", asked=False,
                            requests=0.0 if not tokens else 1.0, gen_tokens=float(tokens),
                            finish="abort" if tokens else None)
