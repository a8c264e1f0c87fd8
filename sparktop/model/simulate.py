"""What a sweep would measure, computed without running anything.

vLLM's scheduler as the twin runs it (`model.scheduler`) runs on a virtual
clock: a lockstep batch of c requests arrives, steps take the time the
performance model gives them, and every token gets its time stamp. The
statistics are then the sweep's own (`bench.stats`), so a prediction and a
measurement of the twin are the same computation, one in virtual time, one
in real time. Past the KV cache's capacity the scheduler preempts and
recomputes, as vLLM does, and the throughput falls the way it falls on a
real engine; nothing is only flagged.

Topologies: solo (one engine), cluster-ray / cluster-mp (one TP=2 engine,
Ray adding its per-step cost), and replicas behind a router (leastconn,
shuffle, least-busy): every statistic is the expectation over the router's
split of the batch, a distribution each router row gives (`model.routers`):
HAProxy's leastconn one split, as even as it goes (the default), shuffle
the binomial (multinomial) split, least-busy as the LiteLLM sparktop
launches behaves (its in-flight counts move when a request is sent, so a
batch splits close to even and only small bursts race to one node), and the
articles' least-busy (their router counted a request only once it streamed:
a lockstep batch all went to the first node and the second starved — the
mechanism the articles measured, not a fit to their numbers).

Besides lockstep batches (llama-benchy), `serve` runs the other workload
published figures use: N requests kept c at a time in flight (`vllm bench
serve --max-concurrency c`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from sparktop.bench.request import RequestRecord
from sparktop.bench.stats import LevelStats, level_stats
from sparktop.layouts import parse_layout
from sparktop.model.cards import ModelCard
from sparktop.model.constants import DEFAULT_CONSTANTS, Constants
from sparktop.model.perf import PerfModel
from sparktop.model.routers import router_for
from sparktop.model.scheduler import EngineConfig, FinishEvent, Scheduler, Sequence, TokenEvent
from sparktop.model.serving import Serving

TOPOLOGIES = ("solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy")
ROUTED = ("shuffle", "least-busy")
DEFAULT_SERVING = Serving()  # vLLM's defaults (frozen: one instance serves every call)


def perf_for(card: ModelCard, topology: str, k: Constants = DEFAULT_CONSTANTS,
             serving: Serving = DEFAULT_SERVING) -> PerfModel:
    layout = parse_layout(topology)  # one engine of it: replicas are the router's to add
    if serving.moe_backend != "auto" or serving.linear_backend != "auto":
        card = dataclasses.replace(card, quant=card.quant.on_backend(serving.moe_backend, serving.linear_backend))
    return PerfModel(card, tp=layout.tp, pp=layout.pp, k=k, kv_dtype_bytes=serving.kv_dtype_bytes,
                     ray=layout.spans_nodes and layout.backend == "ray", enforce_eager=serving.enforce_eager)


def scheduler_for(perf: PerfModel, serving: Serving, clock) -> Scheduler:
    cfg = EngineConfig(max_num_seqs=serving.max_num_seqs, max_num_batched_tokens=serving.max_num_batched_tokens,
                       max_model_len=serving.max_model_len or perf.card.max_model_len,
                       gpu_memory_utilization=serving.gpu_memory_utilization,
                       enable_prefix_caching=serving.enable_prefix_caching,
                       enable_chunked_prefill=serving.enable_chunked_prefill, join_window=0.0,
                       kv_tokens=serving.kv_tokens)
    return Scheduler(perf, cfg, clock=clock)


@dataclass
class Outcome:
    """One request as the simulated engine served it."""

    start: float
    times: list[float]  # every token's time
    error: str | None


def _template(perf: PerfModel) -> list[int]:
    return [1] * perf.card.chat_overhead_tokens + [2, 3]


def _prompt(template: list[int], pp: int, i: int) -> list[int]:
    body = max(1, pp - len(template))
    base = 1_000_000 * (i + 1)
    return (template + list(range(base, base + body)))[:max(pp, len(template) + 1)]


def _warm(eng: Scheduler, perf: PerfModel, clock: list[float], pp: int) -> None:
    """A warm-up request (as a sweep sends) leaves the chat template in the prefix cache."""
    template = _template(perf)
    eng.submit(Sequence(request_id="warm", prompt_ids=template + [-1] * max(1, pp - len(template)), max_tokens=1,
                        ignore_eos=True))
    _run(eng, perf, clock)


@dataclass
class TokenTimes:
    """Many tokens of one sequence at once (the decode fast path)."""

    times: list[float]


def _outcome(seq: Sequence, start: float) -> Outcome:
    times: list[float] = []
    error = None
    while not seq.events.empty():
        ev = seq.events.get_nowait()
        if isinstance(ev, TokenTimes):
            times.extend(ev.times)
        elif isinstance(ev, TokenEvent):
            times.append(ev.t)
        elif isinstance(ev, FinishEvent) and ev.reason == "error":
            error = ev.message or "error"
    if not seq.finished:
        error = error or "never scheduled"
    return Outcome(start, times, error)


def run_engine(perf: PerfModel, serving: Serving, n: int, pp: int, tg: int,
               arrival: float = 0.0) -> list[Outcome]:
    """n requests of pp prompt and tg output tokens reaching an idle, warmed-up
    engine together at `arrival`.

    Every prompt starts with the chat template, which a warmed-up engine has
    in its prefix cache (vLLM caches prefixes by default); the rest of each
    prompt is its own."""
    clock = [0.0]
    eng = scheduler_for(perf, serving, lambda: clock[0])
    template = _template(perf)
    _warm(eng, perf, clock, pp)
    clock[0] = arrival
    seqs = []
    for i in range(n):
        seq = Sequence(request_id=str(i), prompt_ids=_prompt(template, pp, i), max_tokens=tg, ignore_eos=True,
                       arrival=arrival)
        eng.submit(seq)
        seqs.append(seq)
    _run(eng, perf, clock)
    return [_outcome(seq, arrival) for seq in seqs]


def run_closed_loop(perf: PerfModel, serving: Serving, requests: int, c: int, pp: int, tg: int
                    ) -> tuple[list[Outcome], float]:
    """`requests` requests kept `c` at a time in flight, each new one sent the
    moment one finishes (a benchmark's --max-concurrency); returns the
    outcomes and the wall time from the first send to the last token."""
    clock = [0.0]
    eng = scheduler_for(perf, serving, lambda: clock[0])
    template = _template(perf)
    _warm(eng, perf, clock, pp)
    t0 = clock[0]
    sent: list[tuple[Sequence, float]] = []

    def send(i: int) -> None:
        seq = Sequence(request_id=str(i), prompt_ids=_prompt(template, pp, i), max_tokens=tg, ignore_eos=True,
                       arrival=clock[0])
        eng.submit(seq)
        sent.append((seq, clock[0]))

    for i in range(min(c, requests)):
        send(i)
    while eng.running or eng.waiting:
        before = sum(1 for s, _ in sent if s.finished)
        if not _step(eng, perf, clock):
            break
        done = sum(1 for s, _ in sent if s.finished) - before
        for _ in range(done):
            if len(sent) < requests:
                send(len(sent))
    outs = [_outcome(seq, start) for seq, start in sent]
    return outs, clock[0] - t0


def _run(eng: Scheduler, perf: PerfModel, clock: list[float]) -> None:
    """Step the engine on the virtual clock until everything submitted is done."""
    while eng.running or eng.waiting:
        # A decoding sequence has one token (its last) left to compute.
        if not eng.waiting and all(q.prefill_remaining <= 1 and q.output_count > 0 for q in eng.running):
            _decode_to_end(perf, eng, clock)
            break
        plan = eng.schedule()
        if plan is None:
            break
        work, preempted = plan
        decode, prefill = eng.split(work)
        clock[0] += perf.step_time(decode, prefill)
        eng.apply(work, preempted, clock[0])


def _decode_to_end(perf: PerfModel, eng: Scheduler, clock: list[float]) -> None:
    """Everyone is decoding and nobody waits: the rest is pure decode steps.
    Taken without the scheduler (the same steps, a fraction of the cost)
    while the cache has room for every sequence to the end; otherwise the
    scheduler runs them, preemptions and all."""
    running = list(eng.running)
    ctx = [q.num_computed for q in running]
    left = [q.max_tokens - q.output_count for q in running]
    need = sum(eng._blocks_for(c + n) - q.num_blocks for q, c, n in zip(running, ctx, left, strict=True))
    if need > eng.pool.free + len(eng.pool.evictable):
        while (eng.running or eng.waiting) and _step(eng, perf, clock):
            pass
        return
    # Sequences leave in order of the tokens they have left; between two
    # departures the batch is the same, so each step's time is one call on
    # the batch's size and total context, not a walk over its sequences.
    order = sorted(range(len(running)), key=lambda i: left[i])
    n, ctx_sum, min_ctx = len(running), sum(ctx), min(ctx)
    times: list[float] = []
    t, step, gone = clock[0], 0, 0
    active = list(ctx)
    while n:
        dt = perf.decode_time(n, ctx_sum, min_ctx)
        if dt is None:
            dt = perf.step_time([c + step for i, c in enumerate(active) if left[i] > step])
        t += dt
        times.append(t)
        step += 1
        ctx_sum += n
        min_ctx += 1
        while gone < len(order) and left[order[gone]] == step:
            i = order[gone]
            gone += 1
            n -= 1
            ctx_sum -= ctx[i] + step
        if n and gone:
            min_ctx = min(ctx[i] for i in order[gone:]) + step
    for i, q in enumerate(running):
        q.events.put_nowait(TokenTimes(times[:left[i]]))
        q.output_count += left[i]
        q.finished = True
        q.events.put_nowait(FinishEvent("length", times[left[i] - 1], q.prompt_len, q.output_count))
    eng.running.clear()
    clock[0] = t


def _records(outcomes: list[Outcome], c: int, pp: int, router: float) -> list[RequestRecord]:
    recs = []
    for i, o in enumerate(outcomes):
        # The API server's (and the router's) cost is paid once per request
        # before the engine sees it; relaying the stream is folded into it.
        r = RequestRecord(level=c, run=1, index=i, start=o.start, prompt_tokens=pp, error=o.error)
        if o.times:
            r.token_times = [t + router for t in o.times]
            r.first_token = r.first_response = r.token_times[0]
            r.end = r.token_times[-1]
            r.completion_tokens = len(o.times)
        elif o.error is None:
            r.error = "no tokens"
        recs.append(r)
    return recs


@dataclass
class Prediction:
    topology: str
    concurrency: int
    stats: LevelStats
    fits: bool  # the whole batch's KV fits the cache at once
    kv_cache_usage: float  # what the busiest engine's batch needs, as a share of its cache
    preempted: bool = False  # the simulated engine had to preempt (and recompute)


def kv_usage(perf: PerfModel, serving: Serving, n: int, tokens: int) -> float:
    cap = serving.kv_tokens or perf.kv_capacity_tokens(serving.gpu_memory_utilization,
                                                       serving.max_num_batched_tokens)
    if cap <= 0:
        return math.inf
    per_seq = tokens + perf.seq_state_bytes / perf.kv_bytes_per_token
    return n * per_seq / cap


def _step(eng: Scheduler, perf: PerfModel, clock: list[float]) -> bool:
    """One scheduler step on the virtual clock; False when nothing can run."""
    plan = eng.schedule()
    if plan is None:
        return False
    work, preempted = plan
    decode, prefill = eng.split(work)
    clock[0] += perf.step_time(decode, prefill)
    eng.apply(work, preempted, clock[0])
    return True


def predict(card: ModelCard, topology: str, c: int, pp: int = 1024, tg: int = 128,
            k: Constants = DEFAULT_CONSTANTS, serving: Serving = DEFAULT_SERVING,
            router: str | None = None) -> Prediction:
    """One lockstep batch of c requests (a llama-benchy level), as measured. `router`: the router's version
    (`model.routers`: a version such as `litellm-articles`, or a row's id); None: the router sparktop launches for
    the layout's word (HAProxy for `leastconn`, LiteLLM for `shuffle` and `least-busy`)."""
    perf = perf_for(card, topology, k, serving)
    layout = parse_layout(topology)
    row = router_for(layout.router, router) if layout.router else None
    overhead = k.request_overhead_s + ((row.overhead_s if row.overhead_s is not None else k.router_overhead_s)
                                       if row else 0.0)
    if row is None or row.behaviour == "first":
        n = c  # solo and clusters take all; a router that sends a lockstep batch to its first node too
        stats = level_stats(c, [_records(_engine(perf, serving, n, pp, tg), c, pp, overhead)], 0.0, pp, peak=False)
    else:
        # The expectation over the router's split of the batch (each split: requests per replica).
        stats = _expected_over(lambda split: _records([o for a in split for o in _engine(perf, serving, a, pp, tg)],
                                                      c, pp, overhead), c, row.splits(c, layout.replicas))
        n = row.busiest(c, layout.replicas)
    kv = kv_usage(perf, serving, n, pp + tg)
    preempted = kv > 1.0 and n > 0
    return Prediction(topology, c, stats, kv <= 1.0, kv, preempted)


@dataclass
class ServePrediction:
    """`vllm bench serve`-style: N requests, c in flight."""

    topology: str
    concurrency: int
    requests: int
    wall_s: float
    output_tps: float  # output tokens / wall
    request_throughput: float
    ttft_ms_mean: float | None
    tpot_ms_mean: float | None  # time per output token after the first, per request
    errors: int


def predict_serve(card: ModelCard, topology: str, requests: int, c: int, pp: int, tg: int,
                  k: Constants = DEFAULT_CONSTANTS, serving: Serving = DEFAULT_SERVING,
                  replay: int | None = None) -> ServePrediction:
    """N requests kept c in flight. Long runs are replayed for `replay`
    requests (default 4 per slot, where the engine has reached its steady
    state) and the wall time scaled up to all N."""
    key = (card.name, card.quant, topology, requests, c, pp, tg, repr(k), serving, replay)
    if key not in _SERVE_CACHE:
        if len(_SERVE_CACHE) > 2000:
            _SERVE_CACHE.clear()
        n = min(requests, replay or 4 * c)
        p = _predict_serve(card, topology, n, c, pp, tg, k, serving)
        if n < requests:
            p = dataclasses.replace(p, requests=requests, wall_s=p.wall_s * requests / n)
        _SERVE_CACHE[key] = p
    return _SERVE_CACHE[key]


_SERVE_CACHE: dict[tuple, ServePrediction] = {}


def _predict_serve(card: ModelCard, topology: str, requests: int, c: int, pp: int, tg: int,
                   k: Constants, serving: Serving) -> ServePrediction:
    layout = parse_layout(topology)
    if layout.router:
        # r engines, each with its share of the requests and of the concurrency.
        perf = perf_for(card, topology, k, serving)
        r_ = layout.replicas
        shares = [(requests // r_ + (i < requests % r_), c // r_ + (i < c % r_)) for i in range(r_)]
        halves = [run_closed_loop(perf, serving, r, max(1, cc), pp, tg) for r, cc in shares if r and cc]
        outs = [o for h in halves for o in h[0]]
        # Each slot sends its requests one after another, each paying the overheads.
        wall = max(h[1] for h in halves) + math.ceil(requests / c) * (k.router_overhead_s + k.request_overhead_s)
    else:
        perf = perf_for(card, topology, k, serving)
        outs, wall = run_closed_loop(perf, serving, requests, c, pp, tg)
        wall += math.ceil(requests / c) * k.request_overhead_s
    ok = [o for o in outs if o.times and not o.error]
    tokens = sum(len(o.times) for o in ok)
    extra = k.request_overhead_s + (k.router_overhead_s if layout.router else 0.0)
    ttft = [(o.times[0] - o.start + extra) * 1000 for o in ok]
    tpot = [(o.times[-1] - o.times[0]) / (len(o.times) - 1) * 1000 for o in ok if len(o.times) > 1]
    return ServePrediction(topology, c, requests, wall, tokens / wall if wall > 0 else 0.0,
                           len(ok) / wall if wall > 0 else 0.0, sum(ttft) / len(ttft) if ttft else None,
                           sum(tpot) / len(tpot) if tpot else None, len(outs) - len(ok))


_CACHE: dict[tuple, list] = {}


def _engine(perf: PerfModel, serving: Serving, n: int, pp: int, tg: int) -> list[Outcome]:
    """run_engine, remembered: a fit asks for the same batch many times."""
    if n <= 0:
        return []
    key = (perf.card.name, perf.card.quant, perf.tp, perf.pp, perf.ray, perf.enforce_eager, perf.kv_dtype_bytes,
           repr(perf.k), serving, n, pp, tg)
    if key not in _CACHE:
        if len(_CACHE) > 20000:
            _CACHE.clear()
        _CACHE[key] = run_engine(perf, serving, n, pp, tg)
    return _CACHE[key]


def _expected_over(make, c: int, points) -> LevelStats:
    """The expectation of each statistic over weighted splits (`make(split)` gives their records)."""
    keys = ("pp_tps_total", "pp_tps_req", "tg_tps_total", "tg_tps_req", "ttft_ms_mean", "ttft_ms_p50",
            "ttft_ms_p95", "peak_tps", "e2e_tps_total", "e2e_tps_req", "wall_s_mean")
    acc = {key: 0.0 for key in keys}
    weight = 0.0
    base = None
    for a, w in points:
        lv = level_stats(c, [make(a)], 0.0, 0, peak=False)
        base = base or lv
        for key in keys:
            v = getattr(lv, key)
            if v is not None:
                acc[key] += w * v
        weight += w
    assert base is not None  # a router's split distribution always has at least one split
    for key in keys:
        setattr(base, key, acc[key] / weight if weight else None)
    return base
