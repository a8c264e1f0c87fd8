"""vLLM v1's scheduler: continuous batching over a paged KV cache, clock-free.

Each step the scheduler gives every running sequence its tokens first (one
for a decoding sequence, the next prefill chunk for one still prefilling),
then admits waiting requests while the token budget
(`max_num_batched_tokens`), the sequence limit (`max_num_seqs`) and free
KV blocks allow. When a running sequence needs a block and none is free,
the most recently admitted sequence is preempted: its blocks are freed and
it goes back to the head of the queue to be recomputed. Full prompt blocks
are kept in a prefix cache (hashed by content, evicted LRU when space is
needed), as with `--enable-prefix-caching`.

The scheduler knows no clock: `schedule()` picks a step's work, the caller
decides how long the step takes (the performance model) and when it ends,
and `apply()` hands out the step's tokens at that time. `model.simulate`
drives it on a virtual clock to predict a sweep; the twin
(`twin.engine`) drives it in (scaled) real time to serve one.
"""


from __future__ import annotations

import collections
import hashlib
import itertools
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sparktop.model.perf import PerfModel, ceil_div

BLOCK = 16  # tokens per KV block (vLLM's default block size)


@dataclass
class EngineConfig:
    max_num_seqs: int = 1024  # vLLM's default on a GPU of 70 GiB or more (model.serving)
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131072
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    # Without chunked prefill a prompt is scheduled whole or not at all.
    enable_chunked_prefill: bool = True
    speed: float = 1.0
    # Requests reaching an idle engine within this many real seconds of its
    # first step join that step. A lockstep batch leaves a client within a
    # millisecond or two; whether its stragglers catch the first step is a
    # race on a real engine, which makes TTFT at c>1 bimodal from run to
    # run. The twin settles the race one way, so that two tools measuring it
    # see the same server. A lone request is not delayed by it.
    join_window: float = 0.005
    # The KV cache's size in tokens where the engine fixes it itself (llama.cpp's -c, SGLang's
    # --max-total-tokens); None: what gpu_memory_utilization leaves after weights and activations.
    kv_tokens: int | None = None


@dataclass
class TokenEvent:
    """`count` new tokens for a request at wall time `t`."""

    count: int
    t: float
    first: bool = False
    finish: str | None = None  # set on a request's last token: stop | length


@dataclass
class FinishEvent:
    reason: str  # stop | length | abort | error
    t: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    message: str = ""


class EventLog(collections.deque):
    """A sequence's events when nobody awaits them (the virtual clock)."""

    def put_nowait(self, item) -> None:
        self.append(item)

    def get_nowait(self):
        return self.popleft()

    def empty(self) -> bool:
        return not self


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    natural_len: int = 1 << 30  # where the model would emit EOS on its own
    arrival: float = 0.0
    stream: bool | None = None  # whether the client streams (some engines' metrics label it)
    # Where the scheduler puts TokenEvent / FinishEvent: anything with
    # put_nowait (the twin passes an asyncio.Queue to await them).
    events: Any = field(default_factory=lambda: EventLog())
    # engine state
    output_count: int = 0
    num_computed: int = 0  # tokens whose KV is in the cache
    hashed: list[bytes] = field(default_factory=list)  # prefix-cache blocks held
    private_blocks: int = 0
    block_hashes: list[bytes] | None = None
    cached_tokens: int = 0
    first_scheduled: float | None = None
    first_token_t: float | None = None
    last_token_t: float | None = None
    finished: bool = False
    preemptions: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def target_len(self) -> int:
        """Tokens whose KV must exist before the next token can be sampled."""
        return self.prompt_len + self.output_count

    @property
    def prefill_remaining(self) -> int:
        return max(0, self.target_len - self.num_computed)

    @property
    def num_blocks(self) -> int:
        return len(self.hashed) + self.private_blocks

    def should_stop(self) -> str | None:
        if self.output_count >= self.max_tokens:
            return "length"
        if not self.ignore_eos and self.output_count >= max(self.min_tokens, self.natural_len):
            return "stop"
        return None


class MetricsSink(Protocol):
    def on_step(self, *, prompt_tokens: int, generation_tokens: int, preemptions: int,
                running: int, waiting: int, kv_usage: float, iteration_tokens: int) -> None: ...
    def on_prefix(self, *, queries: int, hits: int) -> None: ...
    def on_first_token(self, seq: Sequence, ttft: float, queue_time: float) -> None: ...
    def on_token_gap(self, gap: float) -> None: ...
    def on_finish(self, seq: Sequence, reason: str, now: float) -> None: ...


class _NullMetrics:
    def __getattr__(self, name):
        return lambda *a, **k: None


class BlockPool:
    """KV blocks: free, in use, and cached-but-evictable (prefix cache)."""

    def __init__(self, total: int):
        self.total = total
        self.free = total
        self.refs: dict[bytes, int] = {}
        self.evictable: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def allocate(self, n: int) -> bool:
        if n <= 0:
            return True
        if self.free + len(self.evictable) < n:
            return False
        while self.free < n:
            self.evictable.popitem(last=False)  # evict least recently used
            self.free += 1
        self.free -= n
        return True

    def lookup(self, h: bytes) -> bool:
        return h in self.refs or h in self.evictable

    def acquire(self, h: bytes) -> None:
        if h in self.refs:
            self.refs[h] += 1
        else:
            self.evictable.pop(h)
            self.refs[h] = 1

    def register(self, h: bytes) -> bool:
        """Turn one of the caller's private blocks into a cached block `h`."""
        if self.lookup(h):
            return False
        self.refs[h] = 1
        return True

    def release(self, seq: Sequence) -> None:
        for h in seq.hashed:
            count = self.refs[h] - 1
            if count:
                self.refs[h] = count
            else:
                del self.refs[h]
                self.evictable[h] = None
        self.free += seq.private_blocks
        seq.hashed = []
        seq.private_blocks = 0

    @property
    def usage(self) -> float:
        if self.total <= 0:
            return 0.0
        return 1.0 - (self.free + len(self.evictable)) / self.total


def block_hashes(prompt_ids: list[int]) -> list[bytes]:
    """Chained hashes of every full block of the prompt: each block's token ids as 64-bit integers (their text
    where they are not), after the hash of the blocks before it."""
    hashes: list[bytes] = []
    parent = b""
    try:
        packed: bytes | None = array("q", prompt_ids).tobytes()  # one conversion for the whole prompt
    except (OverflowError, TypeError):
        packed = None
    width = BLOCK * 8
    for start in range(0, len(prompt_ids) - BLOCK + 1, BLOCK):
        # b"q" + bytes never equals a list's text, which starts with "[".
        block = (b"q" + packed[start * 8:start * 8 + width] if packed is not None
                 else repr(prompt_ids[start:start + BLOCK]).encode())
        parent = hashlib.blake2b(parent + block, digest_size=12).digest()
        hashes.append(parent)
    return hashes


class Scheduler:
    """The scheduler and its KV cache; requests come in, token events go out."""

    def __init__(self, perf: PerfModel, config: EngineConfig, metrics: MetricsSink | None = None,
                 clock: Callable[[], float] = lambda: 0.0):
        self.perf = perf
        self.config = config
        self.metrics = metrics or _NullMetrics()
        self.clock = clock
        block_bytes = BLOCK * perf.kv_bytes_per_token
        if config.kv_tokens is not None:
            self.num_blocks = ceil_div(config.kv_tokens, BLOCK)
        else:
            budget = perf.kv_budget_bytes(config.gpu_memory_utilization, config.max_num_batched_tokens)
            self.num_blocks = max(0, int(budget // block_bytes))
        self.seq_blocks = ceil_div(int(perf.seq_state_bytes), int(block_bytes)) if perf.seq_state_bytes else 0
        self.pool = BlockPool(self.num_blocks)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self._ids = itertools.count()
        self.steps = 0
        self.total_prompt_tokens = 0
        self.total_generation_tokens = 0
        self.total_preemptions = 0
        self.failed: str | None = None

    # -- capacity -------------------------------------------------------------

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * BLOCK

    def max_concurrency(self, tokens_per_request: int) -> float:
        per = ceil_div(tokens_per_request, BLOCK) + self.seq_blocks
        return self.num_blocks / per if per else 0.0

    def fail(self, message: str) -> None:
        """The engine died (e.g. its TP peer vanished): every request errors."""
        self.failed = message
        now = self.clock()
        for seq in list(self.running) + list(self.waiting):
            self._finish(seq, "error", now, message)
        self._changed()

    # -- requests -------------------------------------------------------------

    def submit(self, seq: Sequence) -> Sequence:
        if self.failed:
            seq.events.put_nowait(FinishEvent("error", self.clock(), seq.prompt_len, 0, message=self.failed))
            seq.finished = True
            return seq
        seq.arrival = seq.arrival or self.clock()
        self.waiting.append(seq)
        self._changed()
        return seq

    def abort(self, seq: Sequence) -> None:
        if seq.finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._finish(seq, "abort", self.clock())

    # -- observation ----------------------------------------------------------

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    def _changed(self) -> None:
        """Work arrived or the engine failed (the twin wakes its loop)."""

    # -- one step ---------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return ceil_div(tokens, BLOCK) + self.seq_blocks

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        need = self._blocks_for(tokens) - seq.num_blocks
        if need <= 0:
            return True
        if self.pool.allocate(need):
            seq.private_blocks += need
            return True
        return False

    def _preempt(self, seq: Sequence) -> None:
        self.pool.release(seq)
        seq.num_computed = 0
        seq.preemptions += 1
        self.total_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> tuple[list[tuple[Sequence, int]], int] | None:
        """Pick this step's work: a list of (sequence, tokens to compute)."""
        budget = self.config.max_num_batched_tokens
        work: list[tuple[Sequence, int]] = []
        preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.prefill_remaining, budget)
            while not self._grow(seq, seq.num_computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted += 1
                if victim is seq:
                    break
            else:
                work.append((seq, n))
                budget -= n
                i += 1
            # when seq itself was preempted the list shrank: do not advance
        while (self.waiting and budget > 0 and not preempted
               and len(self.running) < self.config.max_num_seqs):
            seq = self.waiting[0]
            hits = self._lookup_prefix(seq)
            n = min(seq.prefill_remaining, budget)
            if not self.config.enable_chunked_prefill and n < seq.prefill_remaining and work:
                self.pool.release(seq)
                seq.num_computed = 0
                break
            if not self._grow(seq, seq.num_computed + n):
                self.pool.release(seq)
                seq.num_computed = 0
                if not self.running:
                    # It can never fit; vLLM would have rejected it up front.
                    self.waiting.popleft()
                    self._finish(seq, "error", self.clock(), "prompt does not fit in the KV cache")
                    continue
                break
            self.waiting.popleft()
            self.metrics.on_prefix(queries=seq.prompt_len, hits=hits)
            if seq.first_scheduled is None:
                seq.first_scheduled = self.clock()
            self.running.append(seq)
            work.append((seq, n))
            budget -= n
        if not work:
            return None
        return work, preempted

    def _lookup_prefix(self, seq: Sequence) -> int:
        """Take the cached blocks that match the prompt; returns tokens hit."""
        if seq.block_hashes is None:
            seq.block_hashes = block_hashes(seq.prompt_ids) if self.config.enable_prefix_caching else []
        hits = 0
        # Never reuse the whole prompt: the last token must be computed to sample.
        usable = (seq.prompt_len - 1) // BLOCK
        for h in seq.block_hashes[:usable]:
            if not self.pool.lookup(h):
                break
            self.pool.acquire(h)
            seq.hashed.append(h)
            hits += 1
        seq.num_computed = hits * BLOCK
        if seq.preemptions == 0:
            seq.cached_tokens = hits * BLOCK
        return hits * BLOCK

    def _register_blocks(self, seq: Sequence) -> None:
        if not seq.block_hashes:
            return
        full = min(seq.num_computed, seq.prompt_len) // BLOCK
        while len(seq.hashed) < full and seq.private_blocks > 0:
            h = seq.block_hashes[len(seq.hashed)]
            if not self.pool.register(h):
                break
            seq.private_blocks -= 1
            seq.hashed.append(h)

    @staticmethod
    def split(work: list[tuple[Sequence, int]]):
        """Step shape for the performance model: decode contexts and prefill chunks."""
        decode = [s.num_computed for s, n in work if n == 1 and s.output_count > 0]
        prefill = [(n, s.num_computed) for s, n in work if not (n == 1 and s.output_count > 0)]
        return decode, prefill

    def apply(self, work, preempted, now: float) -> None:
        self.steps += 1
        prompt_tokens = 0
        gen_tokens = 0
        for seq, n in work:
            if seq.finished:
                continue
            seq.num_computed += n
            self._register_blocks(seq)
            if seq.prefill_remaining:
                continue  # a prefill chunk that is not the last
            first = seq.output_count == 0
            if first:
                prompt_tokens += seq.prompt_len
            seq.output_count += 1
            gen_tokens += 1
            if first:
                seq.first_token_t = now
                queue = (seq.first_scheduled or now) - seq.arrival
                self.metrics.on_first_token(seq, now - seq.arrival, queue)
            elif seq.last_token_t is not None:
                self.metrics.on_token_gap(now - seq.last_token_t)
            seq.last_token_t = now
            reason = seq.should_stop()
            seq.events.put_nowait(TokenEvent(1, now, first, reason))
            if reason:
                self.running.remove(seq)
                self._finish(seq, reason, now)
        self.total_prompt_tokens += prompt_tokens
        self.total_generation_tokens += gen_tokens
        self.metrics.on_step(
            prompt_tokens=prompt_tokens, generation_tokens=gen_tokens, preemptions=preempted,
            running=len(self.running), waiting=len(self.waiting), kv_usage=self.kv_usage,
            iteration_tokens=sum(n for _, n in work),
        )

    def _finish(self, seq: Sequence, reason: str, now: float, message: str = "") -> None:
        if seq.finished:
            return
        seq.finished = True
        self.pool.release(seq)
        seq.events.put_nowait(FinishEvent(reason, now, seq.prompt_len, seq.output_count,
                                          seq.cached_tokens, message))
        self.metrics.on_finish(seq, reason, now)
