"""The twin's engine: vLLM's scheduler (`model.scheduler`) run in (scaled) real time.

The step's duration comes from the performance model; the loop sleeps until
the wall clock reaches the step's end (divided by `speed`), then emits the
step's tokens. A step that the CPU could not keep up with is not caught up
in a burst: the clock is reset, as a real GPU would simply be late.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable

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


class Engine(Scheduler):
    """The scheduler with a clock and a loop; requests come in, token events go out."""

    def __init__(self, perf: PerfModel, config: EngineConfig, metrics: MetricsSink | None = None,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(perf, config, metrics, clock)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        # Busy time, for GPU utilisation: (wall start, wall end) of recent steps.
        self._busy: collections.deque[tuple[float, float]] = collections.deque(maxlen=4096)

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
            plan = self.schedule()
            if plan is None:
                # Nothing can run (e.g. a request larger than the cache): wait for change.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.5)
                continue
            work, preempted = plan
            decode, prefill = self.split(work)
            duration = self.perf.step_time(decode, prefill) / self.config.speed
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
            self.apply(work, preempted, end)

