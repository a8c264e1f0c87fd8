"""Request-rate sweeps: requests leave on a schedule instead of in lockstep
batches, the way AIPerf, GuideLLM and vLLM's own benchmark client measure.

- **Arrivals**: Poisson (exponential gaps, seeded) or constant at each
  `--rate` (requests per second), or the times of a replayed trace
  (`trace.py`); `--max-concurrency` caps what is in flight (a request that
  waits for a slot says how long it was held).
- **Goodput under SLOs**: `--slo ttft_p95=2s,itl_p95=100ms`: a level meets
  the SLO when each percentile is within its limit; a request meets it when
  its own TTFT and ITL are within the limits; goodput is the requests per
  second that met it. The share that met it carries a Wilson lower bound,
  the confidence `--find-max-rate` reports.
- **The client keeps up, or says so**: every request's lag (actual send
  minus scheduled) is kept; a level whose sends ran late (p95 lag over a
  tenth of the mean gap and over 20 ms, or fewer sends per second than
  asked) is marked, and no max rate is claimed from it.

Definitions (as AIPerf's, so the figures compare): TTFT is the first token
minus the send; a request's ITL is its decode time over its tokens after
the first, (last token − first token) / (output tokens − 1), and the
percentiles are over requests (vLLM's client calls this TPOT); request
throughput and output tokens/s are over the level's span, from its start
(the first send is due one gap after it) to its last response, as AIPerf
and vLLM's client divide; e2e is the last byte minus the send.

A level's figures and the SLO's parsing are computed in `bench/stats.py` (`rate_level_stats`,
`parse_slo`), where a run's rate levels are recomputed from its requests too (`Run.rate_levels`).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from sparktop.bench.events import (
    MaxRateFound,
    RateLevelDone,
    RateLevelStarted,
    RequestDone,
    SweepEvent,
    SweepFinished,
    SweepStarted,
)
from sparktop.bench.request import RequestRecord, stream_chat
from sparktop.bench.results import RunWriter, new_run_id
from sparktop.bench.stats import EngineWatch, RateLevelStats, parse_slo, rate_level_stats, rate_text
from sparktop.bench.sweep import FAILED_LINGER, Sweep, SweepError, _Target, request_timeout

ARRIVALS = ("poisson", "constant")
RATE_METRICS_INTERVAL = 1.0  # s between the guard's /metrics reads during a rate level


# -- what the user asks ----------------------------------------------------------------------------


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise SweepError(f"--rate {text!r}: expected request rates per second like 1,2,4,8") from None
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates):
        raise SweepError(f"--rate {text!r}: rates must be positive numbers of requests per second")
    return rates


def schedule(rate: float, n: int, arrivals: str, rng: random.Random) -> list[float]:
    """Send times (seconds from the level's start) of `n` requests at `rate` per second: the first one gap
    after the start, as AIPerf and vLLM's client schedule them (n requests over n gaps, so a level's rate is
    requests over its span from the start)."""
    if arrivals == "constant":
        return [(i + 1) / rate for i in range(n)]
    out, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)  # Poisson arrivals: exponential gaps, mean 1/rate
        out.append(t)
    return out


# -- a level as the tables show it (its figures: `stats.rate_level_stats`) -------------------------


def ms_text(v: float | None) -> str:
    """Seconds as whole milliseconds for a table ("—" when there is none)."""
    return "—" if v is None else f"{v * 1000:,.0f}"


def rate_texts(lv: RateLevelStats) -> dict[str, str]:
    """A rate level's figures as a table shows them (times in ms), keyed by column, for the CLI's table and
    the sweep screen alike; the SLO verdict and its colours are each table's own."""
    return {"rate": lv.label, "sent/s": f"{lv.send_rate:.3g}" if lv.send_rate else "—",
            "req/s": f"{lv.request_throughput:.3g}" if lv.request_throughput else "—",
            "tok/s": f"{lv.output_tps or 0:,.0f}", "TTFT50": ms_text(lv.ttft_p50), "TTFT95": ms_text(lv.ttft_p95),
            "ITL50": ms_text(lv.itl_p50), "ITL95": ms_text(lv.itl_p95), "e2e95": ms_text(lv.e2e_p95),
            "lag95": ms_text(lv.lag_p95),
            "busy": f"{lv.concurrency_mean:.1f}" if lv.concurrency_mean is not None else "—",
            "good/s": f"{lv.goodput:.3g}" if lv.goodput is not None else "—",
            "met": f"{lv.slo_share:.0%}" if lv.slo_share is not None else "—"}


def level_requests(rate: float, requests: int | None, duration: float) -> int:
    """Requests in a level: as many as asked, else enough for `duration` seconds at `rate` (20 at least,
    so its percentiles mean something)."""
    return requests if requests else max(20, math.ceil(rate * duration))


def share_text(share: float) -> str:
    """97 %, or 99.7 % where a whole percent would round a shortfall away."""
    return f"{share:.0%}" if share < 0.995 or share == 1 else f"{share:.1%}"


@dataclass
class MaxRate:
    """`--find-max-rate`'s answer: the highest rate that met the SLO and the lowest that did not."""

    rate: float | None  # the highest rate that met it (None: not even the lowest tried)
    failed_at: float | None  # the lowest rate that did not (None: none failed within the search)
    share: float | None  # at `rate`: the share of requests that met the SLO ...
    lower: float | None  # ... and its 95 % lower bound
    requests: int
    tried: list[tuple[float, bool, str | None]] = field(default_factory=list)  # (rate, met, why not)

    @property
    def text(self) -> str:
        if self.rate is None:
            first = self.tried[0] if self.tried else None
            why = f" ({first[2]})" if first and first[2] else ""
            return f"no rate met the SLO, down to {rate_text(self.failed_at or 0)} requests/s{why}"
        bracket = (f"; {rate_text(self.failed_at)}/s does not" if self.failed_at is not None
                   else " (the search stopped before any rate failed)")
        share = ""
        if self.share is not None and self.lower is not None:
            share = (f"; at it {share_text(self.share)} of {self.requests} requests met every target "
                     f"(95 % lower bound {share_text(self.lower)})")
        return f"max rate {rate_text(self.rate)} requests/s meets the SLO{bracket}{share}"


# -- the sweep --------------------------------------------------------------------------------------


class RateSweep(Sweep):
    """A sweep over request rates (`settings.rates`); the same server facts,
    prompts, guard and run files as the lockstep `Sweep`, with levels that
    send on a schedule. Events: SweepStarted, RateLevelStarted, RequestDone,
    RateLevelDone, (MaxRateFound), SweepFinished."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        s = self.s
        self.slo = parse_slo(s.slo) if s.slo else []
        self.rate_levels: list[RateLevelStats] = []
        self.max_rate: MaxRate | None = None
        self._rng = random.Random(s.seed)
        self._shared: str | None = None  # --prefix-cache on at a depth: the context every request sends
        # The guard reads /metrics once a second here, not four times: a level is seconds long, not one
        # batch, and each read takes the API server's CPU for milliseconds it would spend streaming (AIPerf
        # and vLLM's client read nothing; at four reads a second TTFT p95 measured a quarter higher).
        self.metrics_interval = RATE_METRICS_INTERVAL

    async def _sweep(self, emit: Callable[[SweepEvent], None]) -> SweepFinished:
        self._emit = emit
        s = self.s
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=600)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            to, meta = await self._prepare(session, None)
            meta["mode"] = "rate"
            meta["slo"] = [t.text for t in self.slo]
            self._open_rate_run(to, meta)
            status, reason = "done", None
            watcher = asyncio.ensure_future(self._watch_metrics(session)) if self._watched else None
            try:
                if s.warmup:
                    await self._warm_up(to)
                if s.trace:
                    reason = await self._trace_level(to)
                elif s.find_max_rate:
                    reason = await self._find_max_rate(to)
                else:
                    for index, rate in enumerate(s.rates or []):
                        reason = await self._rate_level(to, rate, index + 1)
                        if reason is not None:
                            break
                if reason is not None:
                    status = "stopped"
            except asyncio.CancelledError:
                status, reason = "cancelled", "cancelled by the user; finished requests are kept"
                self._finish_rate(status, reason)
                raise
            finally:
                if watcher is not None:
                    watcher.cancel()
                    await asyncio.wait([watcher], timeout=5)
            return self._finish_rate(status, reason)

    def _open_rate_run(self, to: _Target, meta: dict) -> None:
        s = self.s
        run_id = new_run_id(to.model, s.topology or s.label or "rate", meta["started"])
        self.writer = RunWriter(self.root, run_id, meta)
        self._total = sum(level_requests(r, s.requests, s.duration)
                          for r in ((s.rates or [1.0])[:1] if s.find_max_rate else s.rates or []))
        self._done = 0
        self._emit(SweepStarted(run_id, self.writer.dir, to.model, s, self._total, 0))

    async def _warm_up(self, to: _Target) -> None:
        """Two requests one after the other, not recorded: the first request of a cold engine pays for
        compilation and cache allocation, which is no level's figure."""
        for i in range(2):
            rec = RequestRecord(level=0, run=0, index=i, attempt=self._attempt)
            await stream_chat(to.url, self._rate_payload(to)[0], rec, self._timeout(), self._headers, to.tokenizer,
                              self.clock)

    def _timeout(self) -> float:
        s = self.s
        return s.timeout or request_timeout(s.pp + s.depth, s.tg, max(1, s.max_concurrency or 8))

    def _rate_payload(self, to: _Target) -> tuple[dict, int | None]:
        """A request's body, and the tokens of its context the engine has seen before: with --prefix-cache
        on, one context per sweep that every request shares (a conversation's history every user of a
        service sends); off, a new one each."""
        depth = self.s.depth
        if depth and self.s.prefix_cache:
            if self._shared is None:
                self._shared = self._context(to, depth)
            context, cached = self._shared, depth
        else:
            context, cached = self._context(to, depth), None
        payload = self._payload(to.model, to.prompts, None)
        if context is not None:
            payload["messages"].insert(0, {"role": "system", "content": context})
        return payload, cached

    async def _rate_level(self, to: _Target, rate: float, index: int) -> str | None:
        """One level: `requests` sent at `rate`; the reason the sweep stops (too many errors), else None."""
        s = self.s
        n = level_requests(rate, s.requests, s.duration)
        offsets = schedule(rate, n, s.arrivals, self._rng)
        self._emit(RateLevelStarted(rate, n, index))
        self._engine = EngineWatch(attempt=self._attempt)
        window = await self._wait_idle(to.session, 0) if self._watched else None
        records = await self._send(to, offsets, rate, index)
        if window is not None:
            end = await self._read(to.session)
            window.verdict(end, self._flight.sent - window.sent0, self._engine)
        stats = rate_level_stats(records, rate, s.arrivals, self.slo, s.depth)
        self.rate_levels.append(stats)
        self._out.update(rate_levels=[lv.as_dict() for lv in self.rate_levels])  # a level's figures, as it ends
        self._emit(RateLevelDone(stats))
        errors = stats.errors
        if records and errors / len(records) > s.max_error_rate:
            first = next((r.error for r in records if r.error), None) or "errors"
            return (f"stopped at {rate:g} requests/s: {errors} of {len(records)} requests failed "
                    f"({errors / len(records):.0%} > {s.max_error_rate:.0%}); first: {first}")
        return None

    async def _trace_level(self, to: _Target) -> str | None:
        """The trace replayed once: each request at its own time, with its own prompt and output length."""
        from sparktop.bench.trace import TracePrompts, load_trace

        s = self.s
        assert s.trace is not None
        trace = load_trace(s.trace)
        if self.context_len is not None:
            for r in trace.requests:
                if r.input_tokens + r.output_tokens > self.context_len:
                    raise SweepError(f"{trace.path}:{r.line}: a request of {r.input_tokens} prompt and "
                                     f"{r.output_tokens} output tokens; the server holds {self.context_len} "
                                     "per request")
        template = to.prompts.template
        prompts = TracePrompts(to.prompts.words / max(1, s.pp - template), s.seed)
        payloads = []
        for r in trace.requests:
            payload = self._payload(to.model, to.prompts, None)
            # The chat template's tokens come on top of the text: the text is that much shorter.
            payload["messages"] = [{"role": "user", "content": prompts.text(
                replace(r, input_tokens=max(1, r.input_tokens - template)))}]
            # Its recorded output length, exactly: a replay is of the same work.
            payload.update(max_tokens=r.output_tokens, min_tokens=r.output_tokens, ignore_eos=True)
            payloads.append(payload)
        self._total = len(payloads)
        self._emit(RateLevelStarted(None, len(payloads), 1))
        self._engine = EngineWatch(attempt=self._attempt)
        records = await self._send(to, [r.offset_s for r in trace.requests], None, 1, payloads)
        stats = rate_level_stats(records, None, "trace", self.slo, 0)
        self.rate_levels.append(stats)
        self._out.update(rate_levels=[lv.as_dict() for lv in self.rate_levels],
                         trace={"path": str(trace.path), "requests": len(trace.requests),
                                "duration_s": trace.duration_s, "rate": trace.rate})
        self._emit(RateLevelDone(stats))
        if records and stats.errors / len(records) > s.max_error_rate:
            first = next((r.error for r in records if r.error), None) or "errors"
            return f"{stats.errors} of {len(records)} requests failed; first: {first}"
        return None

    async def _send(self, to: _Target, offsets: list[float], rate: float | None, index: int,
                    payloads: list[dict] | None = None) -> list[RequestRecord]:
        """Send one request at each offset (seconds from now), capped at `max_concurrency` in flight."""
        s = self.s
        slots = asyncio.Semaphore(s.max_concurrency) if s.max_concurrency else None
        # Prompts are made before the first send: making one is not the client's lag.
        # Off the event loop: at a depth each context is a few full encodes with a tokenizer.
        made = [(p, None) for p in payloads] if payloads is not None else await asyncio.to_thread(
            lambda: [self._rate_payload(to) for _ in offsets])
        bodies = [body for body, _ in made]
        timeout = self._timeout()
        level_done = 0
        stamp = self.clock.stamp

        async def one(i: int, due: float) -> RequestRecord:
            nonlocal level_done
            rec = RequestRecord(level=0, run=index, index=i, attempt=self._attempt, rate=rate, scheduled=due,
                                depth=s.depth, cached_tokens=made[i][1])
            if slots is not None:
                waited = stamp()
                await slots.acquire()
                rec.held_s = max(0.0, stamp() - max(waited, due))
            self._flight.add()
            try:
                await stream_chat(to.url, bodies[i], rec, timeout, self._headers, to.tokenizer, self.clock)
            finally:
                self._flight.remove(0.0 if rec.ok else FAILED_LINGER)
                if slots is not None:
                    slots.release()
            self._out.append(rec)  # on disk the moment it finishes
            self._done += 1
            level_done += 1
            self._emit(RequestDone(rec, self._done, max(self._total, self._done), level_done, len(offsets),
                                   None, None))
            return rec

        # One clock for the schedule and the records: a request's `scheduled` and its `start` differ by the
        # client's own lag alone.
        start = stamp() + 0.05
        tasks = []
        for i, offset in enumerate(offsets):
            wait = start + offset - stamp()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.ensure_future(one(i, start + offset)))
        return list(await asyncio.gather(*tasks))

    async def _find_max_rate(self, to: _Target) -> str | None:
        """Double from the first rate until a level fails the SLO (or the client falls behind), then halve
        the gap between the best that met it and the lowest that did not until they are within
        `--rate-tolerance` of each other."""
        s = self.s
        rate = (s.rates or [1.0])[0]
        best: RateLevelStats | None = None
        failed: float | None = None
        tried: list[tuple[float, bool, str | None]] = []
        index = 0
        while index < s.max_levels:
            index += 1
            self._total = self._done + level_requests(rate, s.requests, s.duration)
            reason = await self._rate_level(to, rate, index)
            stats = self.rate_levels[-1]
            why = None  # what failed the level, in words: stats.passes says whether
            if stats.behind:
                why = f"the client fell behind ({stats.behind})"
            elif stats.saturated:
                why = stats.saturated
            elif not stats.meets_slo:
                why = "; ".join(f"{k} was {v * 1000:.0f} ms" if v is not None else f"{k}: no value"
                                for k, v in stats.slo_values.items()
                                if v is None or v > next(t.limit_s for t in self.slo if t.text == k)) \
                      or f"{stats.errors} errors"
            ok = stats.passes and reason is None
            tried.append((rate, ok, why or reason))
            if ok:
                best = stats
            else:
                failed = rate if failed is None else min(failed, rate)
            if reason is not None and best is None:
                break
            if failed is None:
                rate *= 2
            elif best is None:
                rate /= 2
                if rate < s.min_rate:
                    break
            else:
                assert best.rate is not None
                if failed - best.rate <= s.rate_tolerance * best.rate:
                    break
                rate = (best.rate + failed) / 2
        self.max_rate = MaxRate(best.rate if best else None, failed, best.slo_share if best else None,
                                best.slo_lower if best else None, best.requests if best else 0, tried)
        self._emit(MaxRateFound(self.max_rate))
        return None

    def _finish_rate(self, status: str, reason: str | None) -> SweepFinished:
        self._out.update(rate_levels=[lv.as_dict() for lv in self.rate_levels],
                         max_rate=asdict(self.max_rate) if self.max_rate else None)
        self._out.close(status, reason)
        event = SweepFinished(status, reason, [], self._out.dir)
        self._emit(event)
        return event
