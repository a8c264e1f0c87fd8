"""What a sweep would measure, computed without running anything.

The twin's own scheduler (`engine.Engine`) runs on a virtual clock: a
lockstep batch of c requests arrives, steps take the time the performance
model gives them, and every token gets its time stamp. The statistics are
then the sweep's own (`bench.stats`), so a prediction and a measurement of
the twin are the same computation, one in virtual time, one in real time.

Topologies: solo (one engine), cluster-ray / cluster-mp (one TP=2 engine,
Ray adding its per-step cost), shuffle (two solo engines, each request sent
to either at random: the expectation over the binomial split), least-busy
(two solo engines behind a router whose in-flight counts only move once a
response starts streaming: a lockstep batch arrives before any does, every
tie goes to the first deployment, and the second node starves — the
mechanism the articles measured, not a fit to their numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparktop.bench.request import RequestRecord
from sparktop.bench.stats import LevelStats, level_stats
from sparktop.twin.cards import ModelCard
from sparktop.twin.engine import Engine, EngineConfig, FinishEvent, Sequence, TokenEvent
from sparktop.twin.perf import DEFAULT_CONSTANTS, Constants, PerfModel

TOPOLOGIES = ("solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy")
ROUTED = ("shuffle", "least-busy")


@dataclass(frozen=True)
class Serving:
    """How an engine is set up, as far as timing and memory go."""

    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131072
    kv_dtype_bytes: int | None = None
    enforce_eager: bool = False


def perf_for(card: ModelCard, topology: str, k: Constants = DEFAULT_CONSTANTS, serving: Serving = Serving()):
    tp = 2 if topology.startswith("cluster") else 1
    return PerfModel(card, tp=tp, k=k, kv_dtype_bytes=serving.kv_dtype_bytes, ray=topology == "cluster-ray",
                     enforce_eager=serving.enforce_eager)


def run_engine(perf: PerfModel, serving: Serving, n: int, pp: int, tg: int,
               arrival: float = 0.0) -> list[tuple[float, list[float], str | None]]:
    """n requests of pp prompt and tg output tokens reaching an idle engine at
    `arrival`: (first token time, token times, error) per request.

    Every prompt starts with the chat template, which a warmed-up engine has
    in its prefix cache (vLLM caches prefixes by default); the rest of each
    prompt is its own."""
    clock = [0.0]
    cfg = EngineConfig(max_num_seqs=serving.max_num_seqs, max_num_batched_tokens=serving.max_num_batched_tokens,
                       max_model_len=serving.max_model_len, gpu_memory_utilization=serving.gpu_memory_utilization,
                       enable_prefix_caching=True, join_window=0.0)
    eng = Engine(perf, cfg, clock=lambda: clock[0])
    template = [1] * perf.card.chat_overhead_tokens + [2, 3]
    body = max(1, pp - len(template))
    eng.submit(Sequence(request_id="warm", prompt_ids=template + [-1] * body, max_tokens=1, ignore_eos=True))
    _run(eng, perf, clock)
    clock[0] = arrival
    seqs = []
    for i in range(n):
        ids = template + [1_000_000 * (i + 1) + j for j in range(body)]
        seq = Sequence(request_id=str(i), prompt_ids=ids[:max(pp, len(template) + 1)], max_tokens=tg,
                       ignore_eos=True, arrival=arrival)
        eng.submit(seq)
        seqs.append(seq)
    _run(eng, perf, clock)
    out = []
    for seq in seqs:
        times, error = [], None
        while not seq.events.empty():
            ev = seq.events.get_nowait()
            if isinstance(ev, TokenEvent):
                times.append(ev.t)
            elif isinstance(ev, FinishEvent) and ev.reason == "error":
                error = ev.message or "error"
        if not seq.finished:
            error = error or "never scheduled"
        out.append((times[0] if times else math.nan, times, error))
    return out


def _run(eng: Engine, perf: PerfModel, clock: list[float]) -> None:
    """Step the engine on the virtual clock until everything submitted is done."""
    while eng.running or eng.waiting:
        if not eng.waiting and all(q.prefill_remaining == 0 and q.output_count > 0 for q in eng.running):
            _decode_to_end(perf, eng, clock)
            break
        plan = eng._schedule()
        if plan is None:
            break
        work, preempted = plan
        decode, prefill = eng._split(work)
        clock[0] += perf.step_time(decode, prefill)
        eng._apply(work, preempted, clock[0])


def _decode_to_end(perf: PerfModel, eng: Engine, clock: list[float]) -> None:
    """Everyone is decoding and nobody waits: the rest is pure decode steps,
    taken without the scheduler (the same steps, a fraction of the cost)."""
    running = list(eng.running)
    ctx = [q.num_computed for q in running]
    left = [q.max_tokens - q.output_count for q in running]
    t = clock[0]
    while running:
        t += perf.step_time(ctx)
        keep_r, keep_c, keep_l = [], [], []
        for q, c, n in zip(running, ctx, left):
            q.output_count += 1
            q.events.put_nowait(TokenEvent(1, t, False, "length" if n == 1 else None))
            if n == 1:
                q.finished = True
                q.events.put_nowait(FinishEvent("length", t, q.prompt_len, q.output_count))
            else:
                keep_r.append(q)
                keep_c.append(c + 1)
                keep_l.append(n - 1)
        running, ctx, left = keep_r, keep_c, keep_l
    eng.running.clear()
    clock[0] = t


def _records(results, c: int, pp: int, router: float, start: float = 0.0) -> list[RequestRecord]:
    recs = []
    for i, (first, times, error) in enumerate(results):
        # The router's cost is paid once per request before the engine sees
        # it; its relaying of the stream is folded into that one constant.
        r = RequestRecord(level=c, run=1, index=i, start=start, prompt_tokens=pp, error=error)
        if times:
            r.token_times = [t + router for t in times]
            r.first_token = r.first_response = r.token_times[0]
            r.end = r.token_times[-1]
            r.completion_tokens = len(times)
        elif error is None:
            r.error = "no tokens"
        recs.append(r)
    return recs


@dataclass
class Prediction:
    topology: str
    concurrency: int
    stats: LevelStats
    fits: bool
    kv_cache_usage: float  # of the busiest engine, at the end of prefill


def kv_usage(perf: PerfModel, serving: Serving, n: int, tokens: int) -> float:
    cap = perf.kv_capacity_tokens(serving.gpu_memory_utilization, serving.max_num_batched_tokens)
    if cap <= 0:
        return math.inf
    per_seq = tokens + (perf.seq_state_bytes / perf.kv_bytes_per_token if perf.kv_bytes_per_token else 0)
    return n * per_seq / cap


def predict(card: ModelCard, topology: str, c: int, pp: int = 1024, tg: int = 128,
            k: Constants = DEFAULT_CONSTANTS, serving: Serving = Serving()) -> Prediction:
    perf = perf_for(card, topology, k, serving)
    router = k.router_overhead_s if topology in ROUTED else 0.0
    if topology == "shuffle":
        stats = _expected(lambda a: _records(_engine(perf, serving, a, pp, tg) + _engine(perf, serving, c - a, pp, tg),
                                             c, pp, router), c)
        busiest = max(range(c + 1), key=lambda a: _binom(c, a)) if c else 0
        kv = kv_usage(perf, serving, max(busiest, c - busiest), pp + tg)
    else:
        n = c  # solo and clusters take all; least-busy sends a lockstep batch to its first node
        stats = level_stats(c, [_records(_engine(perf, serving, n, pp, tg), c, pp, router)], 0.0, pp)
        kv = kv_usage(perf, serving, n, pp + tg)
    return Prediction(topology, c, stats, kv <= 1.0, kv)


_CACHE: dict[tuple, list] = {}


def _engine(perf: PerfModel, serving: Serving, n: int, pp: int, tg: int) -> list:
    """run_engine, remembered: a fit asks for the same batch many times."""
    if n <= 0:
        return []
    key = (perf.card.name, perf.tp, perf.ray, perf.enforce_eager, perf.kv_dtype_bytes, repr(perf.k), serving,
           n, pp, tg)
    if key not in _CACHE:
        if len(_CACHE) > 20000:
            _CACHE.clear()
        _CACHE[key] = run_engine(perf, serving, n, pp, tg)
    return _CACHE[key]


def _binom(c: int, a: int) -> float:
    return math.comb(c, a) / 2 ** c


def _split_points(c: int) -> list[tuple[int, float]]:
    """How many of c requests go to the first node, with weights: every
    split for small c, five quantiles of the binomial for large."""
    if c <= 8:
        return [(a, _binom(c, a)) for a in range(c + 1)]
    cdf, points, a = 0.0, [], 0
    for q in (0.1, 0.3, 0.5, 0.7, 0.9):
        while cdf + _binom(c, a) < q:
            cdf += _binom(c, a)
            a += 1
        points.append((a, 0.2))
    return points


def _expected(make, c: int) -> LevelStats:
    """The expectation of each statistic over the shuffle's random split."""
    keys = ("pp_tps_total", "pp_tps_req", "tg_tps_total", "tg_tps_req", "ttft_ms_mean", "ttft_ms_p50",
            "ttft_ms_p95", "peak_tps")
    acc = {key: 0.0 for key in keys}
    weight = 0.0
    base = None
    for a, w in _split_points(c):
        lv = level_stats(c, [make(a)], 0.0, 0)
        base = base or lv
        for key in keys:
            v = getattr(lv, key)
            if v is not None:
                acc[key] += w * v
        weight += w
    for key in keys:
        setattr(base, key, acc[key] / weight if weight else None)
    return base
