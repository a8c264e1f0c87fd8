"""The concurrency sweep: levels × runs of lockstep batches.

For each concurrency c: one warm-up batch (not recorded), then `runs`
batches of c simultaneous streaming requests, each batch starting when the
previous one has finished (llama-benchy's model). Every finished request is
appended to the run's requests.jsonl at once; the engine's /metrics is read
alongside so each level also says how full the KV cache and the queue got.

The clean-measurement guard: a level counts only when the engine had
nothing else to do. Before each level the sweep waits (up to
`idle_timeout`) until the engines report nothing running or waiting; during
the level their running + waiting must never exceed what the sweep itself
had in flight while the /metrics answer was read (the server counts a
request only after it arrives and drops it before the client sees its end,
so an honest sweep never exceeds it). Anything more is foreign traffic: the
level is *contaminated*, measured once more under a new attempt number,
and reported as contaminated if that happens again. The engines watched are
`guard_urls` (the engines behind a router), else the endpoint itself, each
recognised by what it answers and read as its engine exports its figures
(`observe.engines`: vLLM's or SGLang's /metrics, llama.cpp's /metrics and
/slots, TensorRT-LLM's /prometheus/metrics); an endpoint that exports no
running and queued requests means no guard, said once in the run's meta.

`Sweep.events()` is the sweep as an async iterator of `bench.events`
(the CLI draws a rich progress display from them, the app its sweep
screen); the sweep itself never draws anything.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import aiohttp

from sparktop import __version__
from sparktop.bench.events import (
    EngineSample,
    LevelContaminated,
    LevelDone,
    LevelStarted,
    RequestDone,
    SweepEvent,
    SweepFinished,
    SweepStarted,
    WaitingForIdle,
)
from sparktop.bench.levels import SweepError
from sparktop.bench.prompts import LocalTokenizer, PromptMaker, calibrate, load_local_tokenizer
from sparktop.bench.request import RequestRecord, stream_chat
from sparktop.bench.results import RunWriter, load_run, new_run_id
from sparktop.bench.run import Run
from sparktop.bench.stats import EngineWatch, LevelKey, LevelStats, level_stats, parse_slo
from sparktop.clock import SYSTEM, Clock
from sparktop.engine_ids import DEFAULT
from sparktop.events import emitting
from sparktop.measuring import measuring

if TYPE_CHECKING:
    from sparktop.observe.engines import Answer, Engine

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64)
METRICS_INTERVAL = 0.25  # s between /metrics reads during the sweep
POWER_INTERVAL = 1.0  # s between power readings (nvidia-smi on every node) during a level
IDLE_POLL = 0.5  # s between /metrics reads while waiting for an idle engine
# A /metrics answer is compared with the most requests the sweep had in flight
# from this long before its GET until its answer: room for an engine whose
# gauges trail its requests by a step.
GUARD_SLACK = 0.25
# A request that failed on the client's side (a timeout, a cut connection)
# may still be on the server for a moment: it stays counted this long.
FAILED_LINGER = 5.0


def normalize_endpoint(url: str) -> str:
    """`http://host:port` or `http://host:port/v1` -> `http://host:port`."""
    u = url.strip().rstrip("/")
    if "://" not in u:
        u = "http://" + u
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SweepError(f"--endpoint {url!r}: expected http://HOST:PORT or http://HOST:PORT/v1")
    if u.endswith("/v1"):
        u = u[:-3]
    return u


def request_timeout(pp: int, tg: int, concurrency: int, base: float = 60.0) -> float:
    """Seconds one request may take. It grows with the work queued ahead of
    it: at c=256 a request can wait minutes for its turn, and a fixed
    client timeout would quietly turn that wait into failures."""
    return base + concurrency * (tg * 0.05 + pp * 0.001)


@dataclass
class SweepSettings:
    endpoint: str
    levels: list[int] = field(default_factory=lambda: list(DEFAULT_LEVELS))
    runs: int = 5
    pp: int = 1024
    tg: int = 128
    depth: int = 0  # context tokens in a system message before the prompt
    model: str | None = None
    extra_body: dict = field(default_factory=dict)
    timeout: float | None = None  # per request; None scales with tg and concurrency
    max_error_rate: float = 0.10
    warmup: bool = True
    exact_tg: bool = False
    tokenizer: str | None = None
    latency_mode: str = "api"  # api: mean of three GET /v1/models; none: 0
    metrics: bool = True  # read the engines' /metrics (False: no engine figures, no guard)
    # The guard: base URLs (http://host:port) of the vLLM engines whose /metrics
    # to watch, when the endpoint is a router without them; None: the endpoint.
    guard_urls: list[str] | None = None
    idle_timeout: float = 60.0  # s to wait before each level for the engines to go idle
    remeasure_contaminated: bool = True  # measure a contaminated level once more
    # What ran, for the record (the launcher or the user says; not measured).
    recipe: str | None = None
    topology: str | None = None
    nodes: list[str] = field(default_factory=list)
    label: str | None = None
    runtime: str | None = None  # the runtime a study launched (vllm, sglang, llama-cpp, trtllm)
    # A rate sweep (bench/load.py: RateSweep) instead of lockstep batches: requests per second per level.
    rates: list[float] | None = None
    arrivals: str = "poisson"  # poisson | constant
    requests: int | None = None  # per rate level (None: enough for `duration` seconds)
    duration: float = 30.0  # seconds of sending per rate level, when `requests` is not given
    max_concurrency: int | None = None  # requests in flight at most (None: as many as the schedule sends)
    seed: int = 0  # the arrivals' (and a trace's sampling) random seed
    slo: str | None = None  # "ttft_p95=2s,itl_p95=100ms"
    find_max_rate: bool = False  # search for the highest rate that meets `slo`
    max_levels: int = 12  # levels a search may measure
    min_rate: float = 0.05  # a search stops halving below this
    rate_tolerance: float = 0.10  # a search stops when the bracket is this narrow (relative)
    # At a depth: each context loaded into the engine's cache by a request of its own before the measured
    # one reuses it (llama-benchy's --enable-prefix-caching), or sent once, cold.
    prefix_cache: bool = False
    trace: str | None = None  # a rate sweep replaying this trace (bench/trace.py) instead of `rates`
    # A depth sweep: each concurrency at each of these context depths (instead of `depth`), in `cells`' order
    # when given ([[depth, concurrency], ...]: Spark Arena's heat-aware order), else depth by depth.
    depths: list[int] | None = None
    cells: list[list[int]] | None = None
    warmup_first_only: bool = False  # warm up before the first level only (a profile's: each warms the next)
    profile: str | None = None  # the published profile these settings are (`--profile spark-arena-v2`)

    def level_cells(self) -> list[tuple[int, int]]:
        """(depth, concurrency) of every lockstep level, in the order they run."""
        if self.cells:
            return [(int(d), int(c)) for d, c in self.cells]
        return [(d, c) for d in (self.depths or [self.depth]) for c in self.levels]

    def validate(self) -> None:
        if not self.levels or any(c < 1 for c in self.levels):
            raise SweepError(f"-c: concurrency levels must be positive integers, got {self.levels}")
        if self.runs < 1:
            raise SweepError(f"--runs must be at least 1, got {self.runs}")
        if self.pp < 1 or self.tg < 1:
            raise SweepError(f"--pp and --tg must be at least 1, got pp={self.pp} tg={self.tg}")
        if self.tg < 2:
            raise SweepError("--tg must be at least 2: decode speed needs two tokens")
        if not 0 <= self.max_error_rate <= 1:
            raise SweepError(f"--max-error-rate must be between 0 and 1, got {self.max_error_rate}")
        if self.idle_timeout < 0:
            raise SweepError(f"--idle-timeout must not be negative, got {self.idle_timeout}")
        if self.rates is not None or self.find_max_rate or self.trace:
            self._validate_rates()

    def _validate_rates(self) -> None:
        if self.arrivals not in ("poisson", "constant"):
            raise SweepError(f"--arrivals must be poisson or constant, got {self.arrivals!r}")
        if self.requests is not None and self.requests < 1:
            raise SweepError(f"--requests must be at least 1, got {self.requests}")
        if self.duration <= 0:
            raise SweepError(f"--duration must be more than 0 seconds, got {self.duration}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise SweepError(f"--max-concurrency must be at least 1, got {self.max_concurrency}")
        if self.find_max_rate and not self.slo:
            raise SweepError("--find-max-rate needs --slo (e.g. --slo ttft_p95=2s,itl_p95=100ms): the highest "
                             "rate meeting what?")
        if self.slo:
            parse_slo(self.slo)

    def public(self) -> dict:
        d = asdict(self)
        d.pop("endpoint", None)
        return d


def parse_extra_body(items: list[str] | None) -> dict:
    """`--extra-body reasoning_effort=low` (repeatable; values are JSON when
    they parse as JSON) or one JSON object."""
    body: dict = {}
    for item in items or []:
        item = item.strip()
        if item.startswith("{"):
            try:
                obj = json.loads(item)
            except ValueError as e:
                raise SweepError(f"--extra-body {item!r}: not a JSON object ({e})") from None
            if not isinstance(obj, dict):
                raise SweepError(f"--extra-body {item!r}: expected a JSON object")
            body.update(obj)
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SweepError(f"--extra-body {item!r}: expected KEY=VALUE (e.g. reasoning_effort=low) or a JSON object")
        try:
            body[key.strip()] = json.loads(value)
        except ValueError:
            body[key.strip()] = value
    return body


# -- the sweep ----------------------------------------------------------------


@dataclass
class _Target:
    """What every request of the sweep goes to, and with."""

    session: aiohttp.ClientSession
    url: str
    model: str
    prompts: PromptMaker
    attempt: int  # 1, or one more than the run being resumed
    tokenizer: LocalTokenizer | None = None  # counts a stream's tokens when the server sends no token ids


@dataclass
class _Level:
    index: int
    concurrency: LevelKey  # and its depth
    timeout: float
    done: int  # requests recorded at this level so far
    attempt: int  # on its records: a re-measurement gets a new one


# -- the guard ------------------------------------------------------------------


class _InFlight:
    """How many requests the sweep has on the wire, and the most it had
    within a stretch of time (a /metrics answer is from some instant between
    its GET and its answer)."""

    def __init__(self, clock: Clock) -> None:
        self.n = 0
        self.sent = 0  # requests sent, ever
        self._now = clock.now
        self._log: deque[tuple[float, int]] = deque([(clock.now(), 0)])

    def _set(self, n: int) -> None:
        self.n = n
        t = self._now()
        self._log.append((t, n))
        while len(self._log) > 1 and self._log[1][0] < t - 10.0:
            self._log.popleft()

    def add(self) -> None:
        self.sent += 1
        self._set(self.n + 1)

    def remove(self, linger: float = 0.0) -> None:
        if linger > 0:
            asyncio.get_running_loop().call_later(linger, self._set_less)
        else:
            self._set_less()

    def _set_less(self) -> None:
        self._set(max(0, self.n - 1))

    def peak(self, since: float, until: float) -> int:
        """The most in flight at any moment of [since, until]."""
        best = 0
        for t, n in reversed(self._log):
            if t > until:
                continue
            best = max(best, n)
            if t <= since:  # the count as the stretch began
                break
        return best


@dataclass
class _Reading:
    """The watched engines' /metrics, summed, and the sweep's own peak in flight meanwhile."""

    sent: float  # monotonic
    got: float
    running: float | None
    waiting: float | None
    finished: float | None  # requests finished, as the engine counts them
    kv: float | None
    preemptions: float | None
    peak: int

    @property
    def busy(self) -> float | None:
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)


@dataclass
class _Window:
    """One attempt at a level, as the guard sees it: from the idle reading
    before its warm-up to the reading after its last batch."""

    t0: float
    sent0: int
    base: _Reading | None
    busy_before: str | None
    idle_wait: float
    preempt0: float | None = None
    samples: int = 0
    peak_excess: float = 0.0
    first: float | None = None  # s into the level of the first reading with foreign requests
    last: float | None = None

    def observe(self, r: _Reading) -> None:
        busy = r.busy
        if busy is None:
            return
        self.samples += 1
        excess = busy - r.peak
        if excess >= 0.5:  # gauges are floats
            at = max(0.0, (r.sent + r.got) / 2 - self.t0)
            self.first = at if self.first is None else self.first
            self.last = at
            self.peak_excess = max(self.peak_excess, excess)

    def verdict(self, end: _Reading | None, own: int, watch: EngineWatch) -> None:
        """Fill the guard's fields of `watch`: `own` requests were the sweep's."""
        counted: int | None = None
        base = self.base
        if (end is not None and base is not None and end.finished is not None and base.finished is not None
                and end.finished >= base.finished):  # a counter that went down: the engine restarted
            counted = max(0, round(end.finished - base.finished) - own)
        seen = round(self.peak_excess) if self.samples else None
        known = [n for n in (counted, seen) if n is not None]
        # Both are lower bounds: the counter misses foreign requests still
        # running at the end, the gauges the ones that came and went between reads.
        foreign = max(known) if known else None
        watch.foreign_requests = foreign
        watch.idle_wait_s = round(self.idle_wait, 2)
        parts = [self.busy_before] if self.busy_before else []
        if foreign:
            what = f"{foreign} foreign request{'s' if foreign != 1 else ''}"
            if self.first is not None and self.last is not None:
                parts.append(f"{what} between {self.first:.1f} s and {self.last:.1f} s into the level"
                             if self.last - self.first >= 0.05 else f"{what} at {self.first:.1f} s into the level")
            else:
                parts.append(f"{what} finished during the level (the engine's request counter)")
        watch.contaminated = bool(parts)
        watch.contamination = "; ".join(parts) if parts else None


class Sweep:
    """`async for event in Sweep(settings, results_root).events()`, or
    `await Sweep(...).run()` for the SweepFinished alone."""

    def __init__(self, settings: SweepSettings, results_root: Path,
                 resume: str | Path | None = None, api_key: str | None = None,
                 power: Callable[[], Awaitable[float | None]] | None = None, clock: Clock = SYSTEM):
        """`power()`: the watts of the nodes serving the endpoint now (e.g.
        `observe.power.NodesPower`), sampled during each level's measured
        batches for its energy per token; None: no energy figures. `clock`:
        what every request, window and wait is timed on (a test gives a
        virtual-time loop's, `sparktop.clock.loop_clock`)."""
        settings.endpoint = normalize_endpoint(settings.endpoint)
        if settings.guard_urls is not None:
            try:
                urls = [normalize_endpoint(u) for u in settings.guard_urls]
            except SweepError as e:
                raise SweepError(f"guard: {e}".replace("--endpoint ", "")) from None
            settings.guard_urls = list(dict.fromkeys(urls)) or None
        settings.validate()
        self.s = settings
        self.clock = clock
        self.root = Path(results_root)
        self._emit: Callable[[SweepEvent], None] = lambda event: None
        self.resume = resume
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.levels: list[LevelStats] = []
        self.latency = 0.0
        self._done = 0
        self._total = 0
        self._batch_secs: dict[int, float] = {}
        self._engine = EngineWatch()
        self._power = power
        self._measuring = False  # a level's measured batches are running (power counts)
        self._power_sum = 0.0
        self.writer: RunWriter | None = None
        # The guard: the engines watched (none: no guard), why not, and the
        # current attempt's window.
        self._flight = _InFlight(clock)
        self._watched: list[str] = []
        self._engines: dict[str, Engine] = {}  # the watched engines, by URL, as recognised
        self.engine_names: dict[str, str] = {}  # "vLLM 0.32.0", "llama.cpp b11434", by URL
        self.guard = "off: not started"
        self._window: _Window | None = None
        self._attempt = 1  # the newest attempt number in use
        # Complete batches per level: a resumed run's from disk, then this
        # session's as they finish (the level figures need no re-read).
        self._batches: dict[LevelKey, list[list[RequestRecord]]] = {}
        self._contexts: dict[int, PromptMaker] = {}  # per depth: contexts of that many tokens
        self.context_len: int | None = None  # the tokens a request may hold, as /v1/models says
        self.metrics_interval = METRICS_INTERVAL

    # -- server facts -----------------------------------------------------------

    async def _get_json(self, session: aiohttp.ClientSession, path: str) -> dict | None:
        try:
            async with session.get(self.s.endpoint + path, headers=self._headers,
                                   timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    return None
                return await r.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    async def _model(self, session: aiohttp.ClientSession) -> str:
        if self.s.model:
            return self.s.model
        try:
            async with session.get(self.s.endpoint + "/v1/models", headers=self._headers,
                                   timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    raise SweepError(f"{self.s.endpoint}/v1/models answered HTTP {r.status}; "
                                     "is this an OpenAI-compatible server? (--model skips this)")
                data = await r.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise SweepError(f"{self.s.endpoint}: cannot reach the endpoint ({type(e).__name__}: {e})") from None
        rows = [m for m in (data or {}).get("data") or [] if isinstance(m, dict) and m.get("id")]
        if not rows:
            raise SweepError(f"{self.s.endpoint}/v1/models lists no model")
        self._check_context(rows[0])
        return str(rows[0]["id"])

    def _check_context(self, model: dict) -> None:
        """A request longer than the server holds fails every time: said before anything is sent.
        The context one request may use: vLLM's and SGLang's `max_model_len`, llama.cpp's per-slot `n_ctx`."""
        meta = model.get("meta")
        context = model.get("max_model_len") or (meta.get("n_ctx") if isinstance(meta, dict) else None)
        if not isinstance(context, int) or context <= 0:
            return
        self.context_len = context
        depth = max(d for d, _ in self.s.level_cells())
        need = self.s.pp + self.s.tg + depth
        if need > context:
            raise SweepError(f"{self.s.endpoint}: a request of --pp {self.s.pp} --tg {self.s.tg}"
                             + (f" --depth {depth}" if depth else "")
                             + f" needs {need} tokens of context; the server holds {context} per request")

    async def _latency(self, session: aiohttp.ClientSession) -> float:
        if self.s.latency_mode == "none":
            return 0.0
        times = []
        for _ in range(3):
            t = self.clock.now()
            if await self._get_json(session, "/v1/models") is not None:
                times.append(self.clock.now() - t)
        return sum(times) / len(times) if times else 0.0

    async def _probe(self, session: aiohttp.ClientSession, model: str, content: str) -> int:
        payload = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
        payload.update(self.s.extra_body)
        payload["stream"] = False
        self._flight.add()
        try:
            async with session.post(self.s.endpoint + "/v1/chat/completions", json=payload, headers=self._headers,
                                    timeout=aiohttp.ClientTimeout(total=120)) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    msg = (body.get("error") or {}).get("message") if isinstance(body, dict) else body
                    raise SweepError(f"{self.s.endpoint}: the calibration request failed: HTTP {r.status}: {msg}")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            raise SweepError(f"{self.s.endpoint}: the calibration request failed ({type(e).__name__}: {e})") from None
        finally:
            self._flight.remove()
        tokens = ((body or {}).get("usage") or {}).get("prompt_tokens")
        if not isinstance(tokens, int):
            raise SweepError(f"{self.s.endpoint}: the server reports no usage.prompt_tokens, so prompt "
                             "lengths cannot be calibrated; pass --tokenizer FILE")
        return tokens

    # -- engine metrics and the guard ------------------------------------------

    async def _answer(self, session: aiohttp.ClientSession, url: str, path: str) -> Answer:
        from sparktop.observe.engines import Answer, EngineUnreachable

        try:
            async with session.get(url + path, timeout=aiohttp.ClientTimeout(total=5)) as r:
                return Answer(path, r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read(),
                              self.clock.now())
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise EngineUnreachable(f"{type(exc).__name__}: {exc}") from None

    async def _figures(self, session: aiohttp.ClientSession, url: str):
        """What one watched engine reports now (`prometheus.Derived`), or None."""
        from sparktop.observe.engines import EngineUnreachable

        engine = self._engines.get(url)
        if engine is None:
            return None
        try:
            return await engine.read(lambda path: self._answer(session, url, path), self.clock.now(), False)
        except EngineUnreachable:
            return None

    async def _setup_guard(self, session: aiohttp.ClientSession) -> None:
        """Which engines to watch: those of `guard_urls` (or the endpoint) that
        export their running and queued requests, whatever the engine."""
        from sparktop.observe.engines import EngineUnreachable, NotAnEngine, recognise

        if not self.s.metrics:
            self.guard = "off: metrics are not read"
            return
        urls = list(dict.fromkeys(self.s.guard_urls or [self.s.endpoint]))
        why: dict[str, str] = {}
        for url in urls:
            def get(path: str, url: str = url) -> Awaitable[Answer]:
                return self._answer(session, url, path)

            try:
                engine = await recognise(get)
            except (EngineUnreachable, NotAnEngine) as exc:
                why[url] = str(exc)
                continue
            if engine.router:
                why[url] = f"a {engine.name} router: its engines count its requests"
                continue
            try:
                figures = await engine.read(get, self.clock.now(), False)
            except EngineUnreachable as exc:
                why[url] = f"{engine.name}, {exc.reason}"
                continue
            if figures.running is None:
                why[url] = f"{engine.name} exports no running requests"
                continue
            self._engines[url] = engine
            self.engine_names[url] = f"{engine.name} {engine.version or ''}".strip()
        self._watched = [u for u in urls if u in self._engines]
        missing = [u for u in urls if u not in self._watched]
        if not self._watched:
            self.guard = "off: " + "; ".join(f"{u}: {why[u]}" for u in missing)
        else:
            self.guard = "on: " + ", ".join(self._watched)
            if missing:
                self.guard += " (not watched: " + "; ".join(f"{u}: {why[u]}" for u in missing) + ")"

    async def _read(self, session: aiohttp.ClientSession) -> _Reading | None:
        """The watched engines now, summed; None when one of them did not answer."""
        sent = self.clock.now()
        read = await asyncio.gather(*(self._figures(session, u) for u in self._watched))
        got = self.clock.now()
        if not read or any(d is None for d in read):
            return None
        done = [d for d in read if d is not None]

        def total(name: str) -> float | None:
            values = [getattr(d, name) for d in done]
            return None if any(v is None or math.isnan(v) for v in values) else sum(values)

        kvs = [d.kv_usage for d in done if d.kv_usage is not None and not math.isnan(d.kv_usage)]
        reading = _Reading(sent, got, total("running"), total("waiting"), total("requests"), max(kvs) if kvs else None,
                           total("preemptions"), self._flight.peak(sent - GUARD_SLACK, got))
        self._take(reading)
        return reading

    def _take(self, r: _Reading) -> None:
        """A reading: on screen, and into the level's figures and guard while one is measured."""
        self._emit(EngineSample(r.kv, r.running, r.waiting))
        window = self._window
        if window is None or r.sent < window.t0:
            return
        w = self._engine
        if r.kv is not None:
            w.kv_cache_usage_max = max(w.kv_cache_usage_max or 0.0, r.kv)
        if r.running is not None:
            w.running_max = max(w.running_max or 0.0, r.running)
        if r.waiting is not None:
            w.waiting_max = max(w.waiting_max or 0.0, r.waiting)
        if r.preemptions is not None:
            window.preempt0 = r.preemptions if window.preempt0 is None else window.preempt0
            w.preemptions = max(0.0, r.preemptions - window.preempt0)
        window.observe(r)

    async def _watch_power(self) -> None:
        """The nodes' power once a second while a level is measured: each
        reading is a command on every node, too costly at the metrics' pace."""
        while True:
            started = self.clock.now()
            await self._read_power()
            await asyncio.sleep(max(0.0, POWER_INTERVAL - (self.clock.now() - started)))

    async def _read_power(self) -> None:
        assert self._power is not None
        watts = await self._power()
        if watts is not None and self._measuring:
            self._power_sum += watts
            w = self._engine
            w.power_samples += 1
            w.power_w = self._power_sum / w.power_samples

    async def _watch_metrics(self, session: aiohttp.ClientSession) -> None:
        # Ends with its session: a cancellation aiohttp swallowed mid-request must not leave it
        # scraping a closed session (an exception nobody retrieves, a traceback at Ctrl-C).
        while not session.closed:
            try:
                await self._read(session)
            except RuntimeError:
                if session.closed:
                    return
                raise
            await asyncio.sleep(self.metrics_interval)

    async def _wait_idle(self, session: aiohttp.ClientSession, c: int) -> _Window:
        """Before a level: wait until the engines have nothing running or
        waiting (one read when they are idle), up to `idle_timeout`."""
        start = self.clock.now()
        failures = 0
        busy_before = None
        while True:
            r = await self._read(session)
            waited = self.clock.now() - start
            if r is None:
                failures += 1
                if failures >= 3 or waited >= self.s.idle_timeout:
                    break  # unreadable now: measure, and let the readings during the level tell
            elif not r.busy:
                break
            else:
                self._emit(WaitingForIdle(c, r.running or 0.0, r.waiting or 0.0, waited, self.s.idle_timeout))
                if waited >= self.s.idle_timeout:
                    busy_before = (f"engine still busy after {waited:.0f} s of waiting before the level "
                                   f"({r.running or 0:.0f} running, {r.waiting or 0:.0f} waiting)")
                    break
            await asyncio.sleep(IDLE_POLL)
        return _Window(self.clock.now(), self._flight.sent, r, busy_before, self.clock.now() - start,
                       r.preemptions if r is not None else None)

    # -- batches ----------------------------------------------------------------

    def _payload(self, model: str, prompts: PromptMaker, context: PromptMaker | None) -> dict:
        messages = []
        if context is not None:
            messages.append({"role": "system", "content": context.make()})
        messages.append({"role": "user", "content": prompts.make()})
        payload = {"model": model, "messages": messages, "max_tokens": self.s.tg, "stream": True,
                   "return_token_ids": True, "stream_options": {"include_usage": True}}
        payload.update(self.s.extra_body)
        if self.s.exact_tg:
            payload.update(min_tokens=self.s.tg, ignore_eos=True, max_tokens=self.s.tg)
        payload["stream"] = True
        return payload

    def _eta(self, level_index: int, c: int, batches_left_here: int) -> float | None:
        if c not in self._batch_secs:
            return None
        per = self._batch_secs[c]
        eta = per * batches_left_here
        for _depth, nxt in self.s.level_cells()[level_index + 1:]:
            # Decode is bandwidth-bound: a bigger batch takes longer, but far
            # less than proportionally. A rough guess, refined level by level.
            eta += per * math.sqrt(nxt / c) * (self.s.runs + (1 if self.s.warmup else 0))
        return eta

    def _context(self, to: _Target, depth: int) -> str | None:
        """A new context of `depth` tokens to put before a prompt (None at depth 0): every request its own,
        so no two requests share a prefix the engine could reuse (with --prefix-cache on, a request reuses
        its own context, loaded just before: `_load_contexts`)."""
        if not depth:
            return None
        maker = self._contexts.get(depth)
        if maker is None:
            maker = self._contexts[depth] = to.prompts.context(depth)
        return maker.make()

    async def _load_contexts(self, to: _Target, level: _Level, run: int, contexts: list[str],
                             record: bool) -> None:
        """--prefix-cache on, at a depth: each context sent once on its own (a "." for a prompt, as
        llama-benchy does), all together, so the measured requests that follow find it in the engine's
        prefix cache and their prefill is their prompt's. Kept as context-load records, out of the level's
        figures."""
        c = level.concurrency

        async def one(i: int) -> None:
            rec = RequestRecord(level=int(c), run=run, index=i, attempt=level.attempt, depth=c.depth,
                                context_load=True)
            payload = self._payload(to.model, to.prompts, None)
            payload["messages"] = [{"role": "system", "content": contexts[i]}, {"role": "user", "content": "."}]
            self._flight.add()
            try:
                await stream_chat(to.url, payload, rec, level.timeout, self._headers, to.tokenizer, self.clock)
            finally:
                self._flight.remove(0.0 if rec.ok else FAILED_LINGER)
            if record:
                self._out.append(rec)

        await asyncio.gather(*(one(i) for i in range(len(contexts))))

    async def _batch(self, to: _Target, level: _Level, run: int, record: bool) -> list[RequestRecord]:
        c = level.concurrency
        decoded = 0
        first: float | None = None

        # Every prompt is made before the first request leaves, so the batch
        # reaches the server together (as llama-benchy's does).
        depth = c.depth
        # Off the event loop: a 100k-token context is a few full encodes with a tokenizer (0.3-0.5 s each),
        # which would freeze the screen and the metrics watcher that share this loop.
        contexts: list[str | None] = [None] * c
        if depth:
            contexts = await asyncio.to_thread(lambda: [self._context(to, depth) for _ in range(c)])
        payloads = [self._payload(to.model, to.prompts, None) for _ in range(c)]
        for payload, context in zip(payloads, contexts, strict=True):
            if context is not None:
                payload["messages"].insert(0, {"role": "system", "content": context})
        cached = depth if depth and self.s.prefix_cache else None
        if cached:
            await self._load_contexts(to, level, run, [x for x in contexts if x is not None], record)
        batch_start = self.clock.now()

        async def one(i: int) -> RequestRecord:
            nonlocal decoded, first
            rec = RequestRecord(level=int(c), run=run, index=i, attempt=level.attempt, depth=depth,
                                cached_tokens=cached)
            self._flight.add()
            try:
                await stream_chat(to.url, payloads[i], rec, level.timeout, self._headers, to.tokenizer,
                                  self.clock)
            finally:
                self._flight.remove(0.0 if rec.ok else FAILED_LINGER)
            if not record:
                return rec
            self._out.append(rec)
            self._done += 1
            level.done += 1
            if rec.ok and rec.first_token is not None:
                first = rec.first_token if first is None else min(first, rec.first_token)
                decoded += rec.decode_tokens
            stamp = self.clock.stamp()
            live = decoded / (stamp - first) if first is not None and stamp > first else None
            self._emit(RequestDone(rec, self._done, self._total, level.done, int(c) * self.s.runs, live,
                                   self._eta(level.index, c, self.s.runs - run)))
            return rec

        done = await asyncio.gather(*(one(i) for i in range(c)))
        self._batch_secs[c] = self.clock.now() - batch_start
        return list(done)

    # -- the whole sweep --------------------------------------------------------

    def events(self) -> AsyncIterator[SweepEvent]:
        """The sweep, as its events; the last is SweepFinished. Closing the
        iterator (or cancelling its consumer) cancels the sweep: finished
        requests stay in requests.jsonl and the run is marked cancelled."""
        return emitting(self._measured)

    async def _measured(self, emit: Callable[[SweepEvent], None]) -> SweepFinished:
        # Other load on this machine (the demo's) steps aside from the node measured while the sweep runs
        # (`sparktop.measuring`); a rate sweep (`load.RateSweep`) is measured the same way.
        with measuring(self.s.endpoint):
            return await self._sweep(emit)

    async def run(self) -> SweepFinished:
        """The sweep without watching it: its last event."""
        finished = None
        async for event in self.events():
            finished = event
        assert isinstance(finished, SweepFinished)
        return finished

    async def _sweep(self, emit: Callable[[SweepEvent], None]) -> SweepFinished:
        self._emit = emit
        s = self.s
        previous = load_run(self.resume) if self.resume is not None else None
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=600)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            to, meta = await self._prepare(session, previous)
            done_batches = self._open_run(to, meta, previous)
            status, reason = "done", None
            watcher = asyncio.ensure_future(self._watch_metrics(session)) if self._watched else None
            if self._power is not None and await self._power() is None:
                self._power = None  # no reading (no nvidia-smi there, a node down): no energy figures
            power = asyncio.ensure_future(self._watch_power()) if self._power is not None else None
            try:
                for index, (depth, conc) in enumerate(s.level_cells()):
                    c = LevelKey(conc, depth)
                    have = min(done_batches.get(c, 0), s.runs)
                    if have < s.runs:
                        level = _Level(index, c, s.timeout or request_timeout(s.pp + depth, s.tg, conc), have * conc,
                                       to.attempt)
                        reason = await self._measure(to, level, have)
                        if reason is not None:
                            status = "stopped"
                            break
            except asyncio.CancelledError:
                status, reason = "cancelled", "cancelled by the user; finished requests are kept"
                self._finish(status, reason)
                raise
            finally:
                tasks = [task for task in (watcher, power) if task is not None]
                for task in tasks:
                    task.cancel()
                # Gone before the session closes: a scrape started after it would fail with "Session is
                # closed", an exception nobody retrieves, printed as a traceback when the user pressed Ctrl-C.
                if tasks:
                    done, _ = await asyncio.wait(tasks, timeout=5)
                    for task in done:  # retrieved: a watcher's error never reaches the user as a traceback
                        if not task.cancelled():
                            task.exception()
            return self._finish(status, reason)

    async def _prepare(self, session: aiohttp.ClientSession, previous: Run | None) -> tuple[_Target, dict]:
        """What the server is, its latency, prompts of the right length; the run's metadata."""
        s = self.s
        model = await self._model(session)
        await self._setup_guard(session)
        engine = self.engine_names.get(s.endpoint) or ", ".join(dict.fromkeys(self.engine_names.values())) or None
        # vLLM's version where it says one (the field predates other engines); the engine by name beside it.
        watched = [self._engines[s.endpoint]] if s.endpoint in self._engines else list(self._engines.values())
        version = (await self._get_json(session, "/version") or {}).get("version") if (
            not watched or watched[0].id == DEFAULT) else None  # `/version` is vLLM's
        self.latency = await self._latency(session)
        tokenizer = load_local_tokenizer(s.tokenizer) if s.tokenizer else None
        try:
            prompts = await calibrate(s.pp, lambda text: self._probe(session, model, text), tokenizer)
        except ValueError as e:
            raise SweepError(str(e)) from None
        attempt = max((r.attempt for r in previous.records), default=0) + 1 if previous is not None else 1
        meta = {
            "endpoint": s.endpoint, "model": model, "vllm_version": version, "sparktop_version": __version__,
            "recipe": s.recipe, "topology": s.topology, "nodes": s.nodes, "label": s.label,
            "runtime": s.runtime, "engine": engine,
            "settings": s.public(), "started": self.clock.wall(), "latency_s": self.latency,
            "prompt_calibration": {"words": prompts.words, "template_tokens": prompts.template,
                                   "exact": prompts.exact, "tokenizer": bool(tokenizer)},
            "guard": self.guard, "status": "running",
        }
        self._attempt = attempt
        return _Target(session, s.endpoint + "/v1/chat/completions", model, prompts, attempt,
                       tokenizer), meta

    def _open_run(self, to: _Target, meta: dict, previous: Run | None) -> dict[int, int]:
        """Open the run's files (a new run, or the one resumed); complete batches per level."""
        s = self.s
        done_batches: dict[int, int] = {}
        if previous is not None:
            run_id = previous.id
            self._batches = previous.batches()
            done_batches = {c: len(bs) for c, bs in self._batches.items()}
            self.writer = RunWriter(self.root if previous.path is None else previous.path.parent, run_id,
                                    meta, resume=True)
            self.writer.update(guard=self.guard)
        else:
            run_id = new_run_id(to.model, s.topology or s.label, meta["started"])
            self.writer = RunWriter(self.root, run_id, meta)
        cells = [LevelKey(c, d) for d, c in s.level_cells()]
        self._total = sum(c * s.runs for c in cells)
        self._done = sum(min(done_batches.get(c, 0), s.runs) * c for c in cells)
        self._emit(SweepStarted(run_id, self.writer.dir, to.model, s, self._total, self._done))
        return done_batches

    async def _measure(self, to: _Target, level: _Level, have: int) -> str | None:
        """One level, measured once more when foreign traffic spoiled it. The
        reason it stopped the sweep (too many errors), else None."""
        s, c = self.s, level.concurrency
        first: EngineWatch | None = None
        while True:
            reason = await self._attempt_level(to, level, have)
            watch = self._engine
            if first is not None or reason is not None or not watch.contaminated or not s.remeasure_contaminated:
                break
            # Set this attempt aside (it stays on disk) and measure the whole
            # level again under a new attempt number, which Run.batches() prefers.
            self._out.engine_level(c, watch)
            self._emit(LevelContaminated(c, level.attempt, watch.foreign_requests, watch.contamination or "", True))
            first = watch
            self._attempt += 1
            level = _Level(level.index, c, level.timeout, 0, self._attempt)
            self._batches[c] = []
            self._total += c * s.runs
            have = 0
        if first is not None:
            watch.remeasured = True
            if watch.contaminated:
                watch.contamination = f"{watch.contamination}; re-measured once, still contaminated"
        if watch.contaminated:
            self._emit(LevelContaminated(c, level.attempt, watch.foreign_requests, watch.contamination or "", False))
        self._out.engine_level(c, watch)
        stats = self._level(c)
        self.levels = [lv for lv in self.levels if lv.key != c] + [stats]
        self._emit(LevelDone(stats))
        return reason

    async def _attempt_level(self, to: _Target, level: _Level, have: int) -> str | None:
        """A warm-up, then the batches still missing, watched by the guard."""
        s, c = self.s, level.concurrency
        self._engine = EngineWatch(attempt=level.attempt)
        if self._watched:
            self._window = await self._wait_idle(to.session, c)
        try:
            if s.warmup and (not s.warmup_first_only or level.index == 0):
                self._emit(LevelStarted(c, True))
                await self._batch(to, level, 0, record=False)
            self._emit(LevelStarted(c, False))
            errors = requests = 0
            reason = None
            self._measuring, self._power_sum = True, 0.0
            for run in range(have + 1, s.runs + 1):
                batch = await self._batch(to, level, run, record=True)
                self._batches.setdefault(c, []).append(batch)
                errors += sum(1 for r in batch if not r.ok)
                requests += len(batch)
                if requests and errors / requests > s.max_error_rate:
                    first = next((r.error for r in batch if r.error), None) or "errors"
                    reason = (f"stopped at c{c}: {errors} of {requests} requests failed "
                              f"({errors / requests:.0%} > {s.max_error_rate:.0%}); first: {first}")
                    break
            if self._power is not None and self._engine.power_samples == 0:
                await self._read_power()  # a level shorter than the power interval: a reading at its end
            window = self._window
            if window is not None:
                end = await self._read(to.session)
                window.verdict(end, self._flight.sent - window.sent0, self._engine)
        finally:
            self._window = None
            self._measuring = False
        return reason

    def _level(self, c: LevelKey) -> LevelStats:
        return level_stats(c, self._batches.get(c, []), self.latency, self.s.pp + c.depth, self._engine)

    @property
    def _out(self) -> RunWriter:
        """The run's files, open from the start of the sweep on."""
        assert self.writer is not None, "the sweep has not started"
        return self.writer

    def _finish(self, status: str, reason: str | None) -> SweepFinished:
        self._out.close(status, reason)
        run = load_run(self._out.dir)
        levels = run.levels()
        self._out.update(contaminated_levels=[lv.concurrency for lv in levels if lv.contaminated],
                         remeasured_levels=[lv.concurrency for lv in levels if lv.remeasured])
        event = SweepFinished(status, reason, levels, self._out.dir)
        self._emit(event)
        return event
