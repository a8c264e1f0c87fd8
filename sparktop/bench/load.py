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
"""

from __future__ import annotations

import asyncio
import math
import random
import re
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
from sparktop.bench.stats import EngineWatch, percentile
from sparktop.bench.sweep import FAILED_LINGER, Sweep, SweepError, _Target, request_timeout

ARRIVALS = ("poisson", "constant")
SLO_METRICS = {"ttft": "time to first token", "itl": "inter-token latency", "e2e": "end-to-end latency"}
_SLO = re.compile(r"^(ttft|itl|e2e)_p(\d{1,2}(?:\.\d+)?)\s*=\s*(\d+(?:\.\d+)?)\s*(ms|s)?$")
BEHIND_MIN_S = 0.020  # lag below this is the event loop's noise, at any rate
BEHIND_SHARE = 0.10  # of the mean gap between sends: a p95 lag past it means the schedule was not kept
SEND_SHORTFALL = 0.95  # sending fewer per second than this share of the rate asked: behind
WILSON_Z = 1.645  # one-sided 95 %
RATE_METRICS_INTERVAL = 1.0  # s between the guard's /metrics reads during a rate level


# -- what the user asks ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SloTerm:
    metric: str  # ttft | itl | e2e
    quantile: float  # 0.95
    limit_s: float

    @property
    def text(self) -> str:
        limit = f"{self.limit_s * 1000:g}ms" if self.limit_s < 1 else f"{self.limit_s:g}s"
        return f"{self.metric}_p{self.quantile * 100:g}={limit}"


def parse_slo(text: str, where: str = "--slo") -> list[SloTerm]:
    """`ttft_p95=2s,itl_p95=100ms` (a unit-less number is seconds)."""
    terms = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = _SLO.match(part.lower())
        if m is None:
            raise SweepError(f"{where}: {part!r} is not a target like ttft_p95=2s or itl_p95=100ms "
                             f"(metrics: {', '.join(SLO_METRICS)}; percentiles p50..p99; units s or ms)")
        q = float(m.group(2)) / 100
        if not 0 < q < 1:
            raise SweepError(f"{where}: {part!r}: the percentile must be between p1 and p99")
        limit = float(m.group(3)) / (1000 if m.group(4) == "ms" else 1)
        if limit <= 0:
            raise SweepError(f"{where}: {part!r}: the limit must be more than 0")
        terms.append(SloTerm(m.group(1), q, limit))
    if not terms:
        raise SweepError(f"{where}: no target given (e.g. ttft_p95=2s,itl_p95=100ms)")
    return terms


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


# -- what a level measured ------------------------------------------------------------------------


def ttft_s(r: RequestRecord) -> float | None:
    return r.first_token - r.start if r.ok and r.first_token is not None else None


def itl_s(r: RequestRecord) -> float | None:
    """The request's mean gap between tokens after the first (None: fewer than two tokens)."""
    n = r.completion_tokens or len(r.token_times)
    if not r.ok or r.first_token is None or r.last_token is None or n < 2:
        return None
    span = r.last_token - r.first_token
    return span / (n - 1) if span > 0 else None


def e2e_s(r: RequestRecord) -> float | None:
    return r.end - r.start if r.ok and r.end is not None else None


_MEASURE: dict[str, Callable[[RequestRecord], float | None]] = {"ttft": ttft_s, "itl": itl_s, "e2e": e2e_s}


def meets(r: RequestRecord, slo: list[SloTerm]) -> bool:
    """A request meets the SLO when it succeeded and each of its figures is within its limit."""
    if not r.ok:
        return False
    for term in slo:
        value = _MEASURE[term.metric](r)
        if value is None:
            # One token (no ITL) cannot break an ITL target; a missing TTFT or end can break anything.
            if term.metric == "itl" and r.first_token is not None:
                continue
            return False
        if value > term.limit_s:
            return False
    return True


def wilson_lower(successes: int, n: int, z: float = WILSON_Z) -> float | None:
    """The lower end of the Wilson score interval of a share (one-sided 95 % by default)."""
    if n == 0:
        return None
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z * z / n))


@dataclass
class RateLevelStats:
    rate: float | None  # asked, requests/s (None: a replayed trace's own times)
    arrivals: str
    requests: int
    completed: int
    errors: int
    duration_s: float | None  # first send to last response
    request_throughput: float | None  # completed requests / duration
    output_tps: float | None  # output tokens / duration
    input_tps: float | None
    ttft_p50: float | None
    ttft_p95: float | None
    ttft_p99: float | None
    ttft_mean: float | None
    itl_p50: float | None
    itl_p95: float | None
    itl_mean: float | None
    e2e_p50: float | None
    e2e_p95: float | None
    send_rate: float | None  # requests sent per second over the span of the sends
    lag_p50: float | None  # actual send minus scheduled, seconds (held under --max-concurrency left out)
    lag_p95: float | None
    lag_max: float | None
    held_mean: float | None  # seconds a request waited for a slot under --max-concurrency
    concurrency_mean: float | None  # requests in flight, time-weighted over the level
    concurrency_peak: int
    behind: str | None  # why the client fell behind its schedule, or None
    depth: int = 0
    saturated: str | None = None  # why the server is not keeping up at this rate (its queue grew), or None
    slo: list[str] = field(default_factory=list)
    slo_met: int | None = None  # requests that met every target
    slo_share: float | None = None
    slo_lower: float | None = None  # Wilson lower bound of the share (95 %, one-sided)
    goodput: float | None = None  # requests/s that met the SLO
    meets_slo: bool | None = None  # every percentile within its limit
    slo_values: dict[str, float | None] = field(default_factory=dict)  # the percentile each target names

    def as_dict(self) -> dict:
        # null without an SLO, as meets_slo: nothing was asked of the level, so it neither passed nor failed
        return asdict(self) | {"passes": self.passes if self.slo else None}

    @property
    def label(self) -> str:
        return f"{_r(self.rate)}/s" if self.rate is not None else "trace"

    @property
    def passes(self) -> bool:
        """The level served its rate within the SLO: every percentile within its limit, the server's queue
        not growing, and the client on its schedule (a level it fell behind was offered less than its rate).
        The one verdict the CLI, the screen, the max-rate search and the study report give."""
        return bool(self.meets_slo) and not self.saturated and not self.behind


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


def _in_flight(records: list[RequestRecord]) -> tuple[float | None, int]:
    """Time-weighted mean and peak of the requests in flight."""
    edges = []
    for r in records:
        if r.end is not None:
            edges += [(r.start, 1), (r.end, -1)]
    if not edges:
        return None, 0
    edges.sort()
    n = peak = 0
    area, last = 0.0, edges[0][0]
    for t, step in edges:
        area += n * (t - last)
        n += step
        peak = max(peak, n)
        last = t
    span = edges[-1][0] - edges[0][0]
    return (area / span if span > 0 else float(peak)), peak


def _mean_in_flight(records: list[RequestRecord], lo: float, hi: float) -> float:
    """Requests in flight between `lo` and `hi`, time-weighted (one still running counts to `hi`)."""
    area = 0.0
    for r in records:
        end = r.end if r.end is not None else hi
        area += max(0.0, min(end, hi) - max(r.start, lo))
    return area / (hi - lo) if hi > lo else 0.0


def _queue_grew(records: list[RequestRecord]) -> str | None:
    """Whether requests piled up while they were being sent: the mean in flight over the second half of
    the sends well above the first half's. A server that keeps up holds a steady number in flight
    (Little's law: rate × latency); one that does not gains a request every 1/(rate − capacity) s.

    Random arrivals make the count wander too: over a half of length h, with L in flight on average each
    for about W seconds, the half's mean varies by about √(4·L·W/h). Only a rise past twice the spread of
    the difference of two halves counts. The rule it replaces (half as many again, and two more) read a
    queue in 17 of 200 simulated 3 s levels at 32/s where every request was served as fast as the first
    (this one in 1), and a search runs ten such levels."""
    sent = sorted(r.start for r in records)
    if len(sent) < 10:
        return None
    a, mid, b = sent[0], sent[len(sent) // 2], sent[-1]
    if b <= a:
        return None
    # The wander of a server that keeps up: each request in flight for its unqueued time (the level's
    # quickest), as many as the first half sent per second (a queue's own delay must not widen it).
    times = [r.end - r.start for r in records if r.end is not None]
    wander = 0.0
    if times and mid > a:
        w = min(times)
        held = (len(sent) // 2) / (mid - a) * w
        wander = 2 * math.sqrt(2 * 4 * held * w / ((b - a) / 2))

    first, second = _mean_in_flight(records, a, mid), _mean_in_flight(records, mid, b)
    if second - first > max(2.0, wander):
        return (f"requests piled up: {first:.1f} in flight on average over the first half of the sends, "
                f"{second:.1f} over the second: the server serves fewer per second than arrive")
    return None


def level_requests(rate: float, requests: int | None, duration: float) -> int:
    """Requests in a level: as many as asked, else enough for `duration` seconds at `rate` (20 at least,
    so its percentiles mean something)."""
    return requests if requests else max(20, math.ceil(rate * duration))


def rate_level_stats(records: list[RequestRecord], rate: float | None, arrivals: str,
                     slo: list[SloTerm] | None = None, depth: int = 0) -> RateLevelStats:
    ok = [r for r in records if r.ok and r.end is not None]
    starts = [r.start for r in records]
    ends = [r.end for r in records if r.end is not None]
    # The span a level's rates are over: from its start (one mean gap before its first send is due, as
    # AIPerf's and vLLM's client's spans begin) to its last response; a trace's from its first request.
    due = sorted(r.scheduled for r in records if r.scheduled is not None)
    planned = (len(due) - 1) / (due[-1] - due[0]) if len(due) > 2 and due[-1] > due[0] else None
    origin = (due[0] - 1.0 / rate) if due and rate else min(starts) if starts else None
    duration = max(ends) - origin if origin is not None and ends and max(ends) > origin else None
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ttft = [v for v in map(ttft_s, ok) if v is not None]
    itl = [v for v in map(itl_s, ok) if v is not None]
    e2e = [v for v in map(e2e_s, ok) if v is not None]
    lags = [max(0.0, r.start - r.scheduled - r.held_s) for r in records if r.scheduled is not None]
    held = [r.held_s for r in records if r.scheduled is not None]
    sends = sorted(starts)
    send_rate = (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 2 and sends[-1] > sends[0] else None
    mean_c, peak_c = _in_flight(records)
    behind = None
    lag95 = percentile(lags, 0.95)
    schedule_rate = rate or planned
    if schedule_rate is not None and lags:
        gap = 1.0 / schedule_rate
        if lag95 is not None and lag95 > max(BEHIND_MIN_S, BEHIND_SHARE * gap):
            behind = (f"sends ran late: p95 {lag95 * 1000:.0f} ms behind schedule (a tenth of the mean gap is "
                      f"{BEHIND_SHARE * gap * 1000:.0f} ms)")
        # Against its own schedule (a Poisson schedule's realised rate is not the rate asked).
        uncapped = not any(h > 0 for h in held)
        if uncapped and send_rate is not None and planned is not None and len(sends) >= 10 \
                and send_rate < SEND_SHORTFALL * planned:
            behind = (f"sent {send_rate:.3g} requests/s where its schedule had {planned:.3g}: this client "
                      "cannot send faster")
    saturated = _queue_grew(records)
    stats = RateLevelStats(
        rate=rate, arrivals=arrivals, requests=len(records), completed=len(ok), errors=len(records) - len(ok),
        duration_s=duration,
        request_throughput=len(ok) / duration if duration else None,
        output_tps=out_tokens / duration if duration else None,
        input_tps=in_tokens / duration if duration else None,
        ttft_p50=percentile(ttft, 0.50), ttft_p95=percentile(ttft, 0.95), ttft_p99=percentile(ttft, 0.99),
        ttft_mean=sum(ttft) / len(ttft) if ttft else None,
        itl_p50=percentile(itl, 0.50), itl_p95=percentile(itl, 0.95), itl_mean=sum(itl) / len(itl) if itl else None,
        e2e_p50=percentile(e2e, 0.50), e2e_p95=percentile(e2e, 0.95),
        send_rate=send_rate, lag_p50=percentile(lags, 0.50), lag_p95=lag95, lag_max=max(lags) if lags else None,
        held_mean=sum(held) / len(held) if held else None,
        concurrency_mean=mean_c, concurrency_peak=peak_c, behind=behind, depth=depth, saturated=saturated)
    if slo:
        met = sum(1 for r in records if meets(r, slo))
        stats.slo = [t.text for t in slo]
        stats.slo_met = met
        stats.slo_share = met / len(records) if records else None
        stats.slo_lower = wilson_lower(met, len(records))
        stats.goodput = met / duration if duration else None
        values = {"ttft": ttft, "itl": itl, "e2e": e2e}
        stats.slo_values = {t.text: percentile(values[t.metric], t.quantile) for t in slo}
        # Failed requests count against every percentile: as if they never answered.
        failed = stats.errors > 0 and stats.errors / max(1, len(records)) > 1 - max(t.quantile for t in slo)
        stats.meets_slo = not failed and all(v is not None and v <= t.limit_s
                                             for t, v in zip(slo, stats.slo_values.values(), strict=True))
    return stats


def _r(rate: float) -> str:
    """A rate as people write it: 3, 0.25, 1.5, 1,536."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


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
            return f"no rate met the SLO, down to {_r(self.failed_at or 0)} requests/s{why}"
        bracket = (f"; {_r(self.failed_at)}/s does not" if self.failed_at is not None
                   else " (the search stopped before any rate failed)")
        share = ""
        if self.share is not None and self.lower is not None:
            share = (f"; at it {share_text(self.share)} of {self.requests} requests met every target "
                     f"(95 % lower bound {share_text(self.lower)})")
        return f"max rate {_r(self.rate)} requests/s meets the SLO{bracket}{share}"


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
        from sparktop.bench.results import RunWriter, new_run_id

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
