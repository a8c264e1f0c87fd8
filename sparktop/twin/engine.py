"""The twin's engine: vLLM's scheduler (`model.scheduler`) run in (scaled) real time.

The step's duration comes from the performance model; the loop sleeps until
the wall clock reaches the step's end (divided by `speed`), then emits the
step's tokens. A step that the CPU could not keep up with is not caught up
in a burst: the clock is reset, as a real GPU would simply be late.

Each step's work is also accounted as vLLM's `--enable-mfu-metrics` does it
(`step_traffic`: FLOPs, bytes read and written per GPU), from the same parts
the performance model times, so the bandwidth those bytes imply over a step
never exceeds the node's.

The engine sleeps as vLLM's does (`sleep`, `wake_up`): scheduling pauses
(in-flight requests aborted, drained or kept, as the pause mode says), new
requests queue until it wakes, and sleep levels 1 and 2 discard the KV cache
(the prefix cache is empty afterwards; kept requests are recomputed).

The engine can also hang on demand, which is the twin's own and no
engine's (`hang`): its scheduler stops taking steps, so requests keep
arriving and waiting and the running ones make no more tokens, while every
route (`/health` too) still answers, as an engine whose core is stuck
does. `TwinServer` exposes it as `POST /twin/hang` and SIGUSR1; a restart
(a new process) is not hung. With nothing asked of it a hung engine shows
nothing at all (nothing waits, nothing is late): what a canary request
(`observe.canary`) is for.

A stream can stall on demand too, the twin's own as well (`stall`): every
request stops being scheduled once it has made `after` tokens, while the
others (shorter ones, new ones) go on and every route answers, as a
request stuck inside an engine whose other work goes on; the stream's
client sees its first tokens, then nothing. `POST /twin/stall` sets it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparktop.model.perf import PerfModel
from sparktop.model.scheduler import (  # noqa: F401  (re-exported for the server and tests)
    BLOCK,
    BlockPool,
    EngineConfig,
    FinishEvent,
    MetricsSink,
    Scheduler,
    Sequence,
    TokenEvent,
)

SLEEP_TAGS = frozenset({"weights", "kv_cache"})  # what vLLM's executor puts to sleep at level 1 or 2
PAUSE_MODES = ("abort", "wait", "keep")


@dataclass(frozen=True)
class StepTraffic:
    """One step's work on one GPU, as vLLM's MFU metrics estimate it."""

    flops: float
    read_bytes: float
    write_bytes: float


def step_traffic(perf: PerfModel, decode: list[int], prefill: list[tuple[int, int]],
                 seconds: float | None = None) -> StepTraffic:
    """FLOPs and bytes of one step, part by part as `PerfModel._step` times it.

    Reads: the weights the step touches (dense parts, the unembedding, the
    experts its tokens route to), the KV its sequences attend to, recurrent
    state, half the activation traffic. Writes: the new tokens' KV, the
    recurrent state, the other half of the activations. FLOPs: 2 per active
    weight per token (the unembedding per sampled position), plus attention
    scores and recurrent scans. Every byte here is one the model charges at
    most the node's bandwidth for; `seconds` (the step's modeled time), when
    given, caps the bytes at that bandwidth over the step all the same, so
    the figure stays physical whatever the fitted constants.
    """
    n_decode, n_prefill = len(decode), sum(n for n, _ in prefill)
    tokens, seqs = n_decode + n_prefill, len(decode) + len(prefill)
    if not tokens:
        return StepTraffic(0.0, 0.0, 0.0)
    # Private parts of the performance model: the traffic is its own account
    # of the step, read rather than derived a second time.
    read = sum(nbytes for nbytes, _, _, _ in perf._dense) + perf._head_bytes
    flops = sum(per_row for _, per_row, _, _ in perf._dense) * tokens + perf._head_flops * seqs
    if perf._moe_layers:
        active = perf._experts[1]
        read += perf.touched_experts(tokens) * perf._expert_bytes
        flops += perf._expert_flops * perf._moe_layers * tokens * active
    decode_sums = [sum(min(c, window) for c in decode) if window else sum(decode)
                   for _, _, window, _ in perf._attn]
    kv_read, attn_flops = perf.attention_traffic(decode_sums, prefill)
    read += kv_read
    flops += attn_flops
    write = tokens * sum(layers * per for layers, per, _, _ in perf._attn)
    state = perf._rec_state * seqs
    flops += perf._rec_decode_flops * n_decode + perf._rec_prefill_flops * n_prefill
    activations = perf.k.activation_passes * perf._act_bytes * tokens
    read += state + activations / 2
    write += state + activations / 2
    if seconds is not None:
        limit = perf.hw.bandwidth_gbs * 1e9 * seconds
        if read + write > limit:
            scale = limit / (read + write)
            read, write = read * scale, write * scale
    return StepTraffic(flops, read, write)


class Engine(Scheduler):
    """The scheduler with a clock and a loop; requests come in, token events go out."""

    def __init__(self, perf: PerfModel, config: EngineConfig, metrics: MetricsSink | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 traffic: Callable[[StepTraffic], None] | None = None):
        super().__init__(perf, config, metrics, clock)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        # Busy time, for GPU utilisation: (wall start, wall end) of recent steps.
        self._busy: collections.deque[tuple[float, float]] = collections.deque(maxlen=4096)
        # Where each step's estimated work goes (--enable-mfu-metrics), if anywhere.
        self.traffic = traffic
        # vLLM's pause state: None, "new" (new requests queue, admitted ones
        # finish) or "all" (nothing is scheduled); and what sleeps.
        self.paused: str | None = None
        self.sleeping_tags: set[str] = set()
        self._in_step = False  # between schedule() and apply(): the step's work is in flight
        # Tokens run through the model (prefill chunks and decodes, recomputed ones included): what a
        # tensor-parallel engine's all-reduces move over the link scales with it.
        self.tokens_computed = 0
        # The twin's own fault (`hang`): no step is taken while it is set; everything else goes on.
        self.hung = False
        # The twin's other fault (`stall`): a request that has made this many tokens is no longer scheduled.
        self.stall_after: int | None = None

    def hang(self, on: bool = True) -> None:
        """Stop (or resume) taking steps: running requests make no tokens and new ones wait, while the
        server answers as before. No engine's behaviour, a stuck core's symptom: what a watchdog must catch."""
        self.hung = on
        self._changed()

    def stall(self, after: int | None) -> None:
        """Stall every stream once it has made `after` tokens (None: let them all go on): such a request keeps
        its place and its KV blocks but is no longer scheduled, so its client has its first tokens and then
        nothing, while the engine serves the rest as before. No engine's behaviour, a stuck request's symptom."""
        self.stall_after = after
        self._changed()

    def _stalled(self) -> list[Sequence]:
        """The running requests a stall holds."""
        after = self.stall_after
        return [] if after is None else [s for s in self.running if s.output_count >= after]

    def _changed(self) -> None:
        self._wake.set()

    def submit(self, seq: Sequence) -> Sequence:
        # Requests served over HTTP are awaited: their events go to a queue.
        if not isinstance(seq.events, asyncio.Queue):
            seq.events = asyncio.Queue()
        return super().submit(seq)

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="twin-engine")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for seq in list(self.running) + list(self.waiting):
            self._finish(seq, "abort", self.clock())

    def utilization(self, window: float = 1.0) -> float:
        """Fraction of the last `window` wall seconds spent in steps."""
        now = self.clock()
        start = now - window
        busy = 0.0
        for a, b in reversed(self._busy):
            if b <= start:
                break
            busy += b - max(a, start)
        return min(1.0, busy / window)

    # -- sleep ------------------------------------------------------------------

    @property
    def is_sleeping(self) -> bool:
        return self.paused is not None or bool(self.sleeping_tags)

    def schedule(self):
        held = self._stalled()
        if not held:
            return self._schedule()
        # Scheduled as if the stalled requests were not there, then put back ahead of the rest: they are the
        # oldest, and a preemption's victim is the newest.
        ids = {id(s) for s in held}
        self.running = [s for s in self.running if id(s) not in ids]
        try:
            return self._schedule()
        finally:
            self.running = held + self.running

    def _schedule(self):
        if self.paused == "all":
            return None
        if self.paused == "new":
            # Queued requests stay queued: schedule as if there were none, then
            # put them back behind whatever a preemption sent to the queue.
            queued, self.waiting = self.waiting, collections.deque()
            try:
                return super().schedule()
            finally:
                self.waiting.extend(queued)
        return super().schedule()

    async def sleep(self, level: int, mode: str = "abort") -> None:
        """vLLM's EngineCore.sleep: pause as `mode` says, then (level 1 or 2)
        free the KV cache; level 0 only pauses scheduling."""
        if mode == "abort":
            for seq in list(self.running) + list(self.waiting):
                self.abort(seq)
        self.paused = "all" if mode == "keep" else "new"
        if mode == "wait":
            while self.running:  # in-flight requests drain first
                await asyncio.sleep(0.01)
        while self._in_step:  # the step under way ends before its KV goes
            await asyncio.sleep(0.005)
        if level >= 1:
            self._discard_kv()
            self.sleeping_tags = set(SLEEP_TAGS)
        self._changed()

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """vLLM's EngineCore.wake_up; True once everything is resident again
        (then scheduling resumes). `scheduling` is level 0's tag."""
        if tags is not None:
            tags = [t for t in tags if t != "scheduling"]
        if tags is None:
            self.sleeping_tags.clear()
        elif tags and self.sleeping_tags and set(tags) <= self.sleeping_tags:
            self.sleeping_tags -= set(tags)  # an unknown tag wakes nothing, as in vLLM
        awake = not self.sleeping_tags
        if awake:
            self.paused = None
            self._changed()
        return awake

    def _discard_kv(self) -> None:
        """The KV cache is gone: running requests recompute from the queue's
        head, and the prefix cache holds nothing."""
        for seq in reversed(self.running):
            self.pool.release(seq)
            seq.num_computed = 0
            self.waiting.appendleft(seq)
        self.running.clear()
        self.pool.free += len(self.pool.evictable)
        self.pool.evictable.clear()

    # -- the loop -------------------------------------------------------------

    async def _loop(self) -> None:
        target: float | None = None
        while True:
            if not self.running and not self.waiting:
                target = None
                self._wake.clear()
                await self._wake.wait()
                if self.config.join_window > 0 and self.waiting:
                    target = self.clock()
                    # An idle engine takes a moment before its first step, so
                    # a batch sent together starts together. The wait is part
                    # of that step's time (target starts at the arrival), and
                    # never longer than a lone request's own step.
                    first = self.waiting[0]
                    alone = self.perf.step_time([], [(min(first.prefill_remaining,
                                                          self.config.max_num_batched_tokens), 0)])
                    await asyncio.sleep(min(self.config.join_window, alone / self.config.speed))
                continue
            if self.failed:
                await asyncio.sleep(0.05)
                continue
            if self.hung:
                target = None  # a step after the hang starts afresh, not late
                self._wake.clear()
                await self._wake.wait()  # `hang(False)` wakes it; arrivals only queue
                continue
            if not self.waiting and len(self._stalled()) == len(self.running):
                target = None  # only stalled requests: nothing to step until one is let go or another arrives
                self._wake.clear()
                await self._wake.wait()
                continue
            plan = self.schedule()
            if plan is None:
                # Nothing can run (e.g. a request larger than the cache): wait for change.
                self._wake.clear()
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose the cancel `stop()` sends.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await self._wake.wait()
                continue
            work, preempted = plan
            self._in_step = True
            decode, prefill = self.split(work)
            modeled = self.perf.step_time(decode, prefill)
            if self.traffic is not None:
                self.traffic(step_traffic(self.perf, decode, prefill, modeled))
            duration = modeled / self.config.speed
            now = self.clock()
            start = target if target is not None and target > now - 0.25 else now
            target = start + duration
            delay = target - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            end = self.clock()
            self._busy.append((max(start, end - duration), end))
            self.tokens_computed += sum(n for _, n in work)
            self.apply(work, preempted, end)
            self._in_step = False

