"""The continuous-batching engine on its own: scheduling limits, block
accounting, preemption and prefix caching."""

from __future__ import annotations

import asyncio

from sparktop.model.cards import find_card
from sparktop.model.perf import PerfModel
from sparktop.twin.engine import BLOCK, BlockPool, Engine, EngineConfig, FinishEvent, Sequence, TokenEvent


def make_engine(util=0.9, **config) -> Engine:
    cfg = EngineConfig(gpu_memory_utilization=util, speed=1000.0, **config)
    return Engine(PerfModel(find_card("llama-3.1-8b")), cfg)


async def drain(seq: Sequence) -> tuple[int, FinishEvent]:
    tokens = 0
    while True:
        event = await seq.events.get()
        if isinstance(event, TokenEvent):
            tokens += event.count
        else:
            return tokens, event


def request(i: int, prompt: int = 1000, max_tokens: int = 50) -> Sequence:
    return Sequence(f"r{i}", [i * 100000 + j for j in range(prompt)], max_tokens=max_tokens, ignore_eos=True)


async def test_every_request_gets_exactly_its_tokens():
    engine = make_engine()
    engine.start()
    try:
        seqs = [engine.submit(request(i, max_tokens=20 + i)) for i in range(10)]
        results = await asyncio.gather(*(drain(s) for s in seqs))
    finally:
        await engine.stop()
    for i, (tokens, finish) in enumerate(results):
        assert tokens == 20 + i and finish.reason == "length" and finish.completion_tokens == 20 + i
    assert engine.pool.usage == 0.0  # finished requests hold nothing; cached blocks are evictable


async def test_natural_stop_without_ignore_eos():
    engine = make_engine()
    engine.start()
    try:
        seq = engine.submit(Sequence("s", list(range(100)), max_tokens=500, natural_len=30))
        tokens, finish = await drain(seq)
    finally:
        await engine.stop()
    assert (tokens, finish.reason) == (30, "stop")


async def test_max_num_seqs_keeps_the_rest_waiting():
    engine = make_engine(max_num_seqs=4)
    steps = []  # (running, waiting) as each step was scheduled: every step, not a sample of them
    original = engine.schedule

    def spy():
        plan = original()
        steps.append((len(engine.running), len(engine.waiting)))
        return plan

    engine.schedule = spy
    engine.start()
    try:
        seqs = [engine.submit(request(i, max_tokens=200)) for i in range(10)]
        await asyncio.gather(*(drain(s) for s in seqs))
    finally:
        await engine.stop()
    assert max(running for running, _ in steps) == 4
    # The first time four run, the other six wait; and every one of the ten ran.
    assert next(waiting for running, waiting in steps if running == 4) == 6
    assert all(s.finished for s in seqs)


async def test_chunked_prefill_respects_the_token_budget():
    engine = make_engine(max_num_batched_tokens=512)
    shapes = []
    original = engine.apply

    def spy(work, preempted, now):  # the steps the engine ran, as it ran them
        shapes.append(sum(n for _, n in work))
        return original(work, preempted, now)

    engine.apply = spy
    engine.start()
    try:
        await drain(engine.submit(request(1, prompt=2000, max_tokens=5)))
    finally:
        await engine.stop()
    assert max(shapes) <= 512
    assert shapes[:4] == [512, 512, 512, 464]


async def test_over_full_cache_preempts_and_still_finishes_everything():
    engine = make_engine(util=0.112, max_model_len=4096)
    capacity = engine.kv_capacity_tokens
    assert capacity < 12_000
    engine.start()
    try:
        seqs = [engine.submit(request(i, prompt=1000, max_tokens=300)) for i in range(24)]
        results = await asyncio.gather(*(drain(s) for s in seqs))
    finally:
        await engine.stop()
    assert all(tokens == 300 for tokens, _ in results)
    assert engine.total_preemptions > 0
    assert sum(s.preemptions for s in seqs) == engine.total_preemptions


async def test_prefix_cache_reuses_full_blocks_of_a_repeated_prompt():
    engine = make_engine()
    engine.start()
    try:
        prompt = list(range(1000))
        _, first = await drain(engine.submit(Sequence("a", prompt, max_tokens=2, ignore_eos=True)))
        _, second = await drain(engine.submit(Sequence("b", prompt, max_tokens=2, ignore_eos=True)))
        _, other = await drain(engine.submit(Sequence("c", [7] + prompt, max_tokens=2, ignore_eos=True)))
    finally:
        await engine.stop()
    assert first.cached_tokens == 0
    assert second.cached_tokens == (999 // BLOCK) * BLOCK
    assert other.cached_tokens == 0  # a different first token changes every block hash


def test_block_pool_evicts_least_recently_used_cached_blocks():
    pool = BlockPool(4)
    assert pool.allocate(2)
    seq = Sequence("x", [], max_tokens=1)
    seq.private_blocks = 2
    assert pool.register(b"h1") and pool.register(b"h2")
    seq.private_blocks, seq.hashed = 0, [b"h1", b"h2"]
    pool.release(seq)
    assert pool.usage == 0.0 and list(pool.evictable) == [b"h1", b"h2"]
    assert pool.allocate(3)  # 2 free + evict h1
    assert list(pool.evictable) == [b"h2"]
    assert not pool.allocate(2)


def test_without_chunked_prefill_prompts_are_scheduled_whole():
    from sparktop.model.scheduler import Scheduler

    clock = [0.0]
    sched = Scheduler(PerfModel(find_card("llama-3.1-8b")),
                      EngineConfig(max_num_batched_tokens=3000, enable_chunked_prefill=False), clock=lambda: clock[0])
    for i in range(3):
        sched.submit(request(i, prompt=1200, max_tokens=2))
    work, _ = sched.schedule()
    # Two whole prompts fit the budget; the third waits instead of being cut.
    assert [n for _, n in work] == [1200, 1200] and len(sched.waiting) == 1
