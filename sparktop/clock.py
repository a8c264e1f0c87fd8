"""The clock sparktop's timed components read, so that a test can give them another.

The twin's engine, the sweep (its requests, its rate schedule, its guard),
the poller (snapshot times, the windows rates are taken over) and the
history writer all read time through a `Clock` they are given:

- `now()`: monotonic seconds, for intervals, rates and deadlines;
- `wall()`: epoch seconds, for what is recorded (snapshots, history
  rows) and must line up with other processes;
- `stamp()`: epoch seconds as fine-grained and steady as `now()`, for a
  request's start, first token and token times.

`SYSTEM` is the machine's clock (`time.monotonic`, the clock asyncio's
loops sleep on; `time.time`; `perf_counter` offset to the epoch once). `loop_clock()` reads a running asyncio
loop's own clock instead: on an ordinary loop that is the same monotonic
clock, and on a virtual-time loop (the tests run an in-process twin and a
sweep on one, with `looptime`) every step the twin takes, every chunk the
sweep stamps and every sleep in between are on simulated time, so a
sweep's figures are exact and repeatable at any machine speed. Waiting is
always `asyncio.sleep`, which is on the loop's clock either way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    now: Callable[[], float]  # monotonic seconds
    wall: Callable[[], float]  # epoch seconds
    # Epoch seconds at `now()`'s resolution with one offset for the clock's life: for timestamps that are
    # subtracted from one another (a request's token times) and must still read as wall time in a file.
    stamp: Callable[[], float]


def _system() -> Clock:
    offset = time.time() - time.perf_counter()
    return Clock(time.monotonic, time.time, lambda: time.perf_counter() + offset)


SYSTEM = _system()


def loop_clock(loop: asyncio.AbstractEventLoop | None = None) -> Clock:
    """The clock of `loop` (default: the running one): simulated time under
    a virtual-time loop, the system's monotonic clock under any other. Its
    wall time starts at the system's and moves with the loop."""
    loop = loop or asyncio.get_running_loop()
    epoch = time.time() - loop.time()

    def wall() -> float:
        return epoch + loop.time()

    return Clock(loop.time, wall, wall)
