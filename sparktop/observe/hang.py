"""A hung engine: one that answers (/health, /metrics, its API) but makes no tokens while requests wait.

`/health` says only that the API server is up; an engine whose core is stuck (a deadlocked collective, a
GPU fault the process survives, a scheduler that stopped stepping) answers it all the same. What gives it
away is its own counters: requests running or queued, and the tokens it has computed (generated or
prefilled) not moving for `after` seconds. `HangWatch` keeps that per engine on the poller's clock and
says why, in words (`"no tokens for 45 s with 3 requests waiting (2 running, 1 queued)"`); the poller
turns an engine it finds so into `EngineSnapshot.state == "hung"` (still one of `LIVE_STATES`: its figures
are read as usual), and `notices` says `hung` when it starts and `hung_cleared` when tokens flow again
(or the engine is back from a restart).

What its counters cannot show: an engine that exports neither token counter nor its running and waiting
requests, a hang with nothing asked of it (nothing waits, so nothing is late), and one stream that stalls
while others flow. For those there is the canary (`observe.canary`, optional): a tiny request now and then
to an idle engine, whose failure (no first token in time, a stream that stalls, an error) is given to the
same watch (`canary_failed`), so "hung" has one truth: the engine is shown hung with the canary's reason
(`"canary: no first token in 60 s"`) until a later canary is answered or its tokens move again. While a
canary is in flight its own request is not one that waits (`judge`'s `in_flight`).

Prompt tokens count as progress, so a long prefill (a 100k-token prompt prefilled in chunks) is not
a hang; an engine that reports prompt tokens only once a prefill ends reads as hung if one prefill alone
takes longer than `after`, which is why it is a parameter (`--hung-after`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparktop.engine_ids import is_router
from sparktop.observe.snapshot import EngineSnapshot

HUNG_AFTER_S = 30.0  # seconds without a token, with requests waiting, that make an engine hung


def seconds_text(seconds: float) -> str:
    """"45 s", "3 min 20 s", "30 min", "2 h 05 min", "1 h"."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60:02d} s" if s % 60 else "")
    return f"{s // 3600} h" + (f" {s % 3600 // 60:02d} min" if s % 3600 // 60 else "")


def hung_reason(idle: float, running: float, waiting: float) -> str:
    """"no tokens for 45 s with 3 requests waiting (2 running, 1 queued)"."""
    n = running + waiting
    parts = [f"{running:.0f} running" if running else "", f"{waiting:.0f} queued" if waiting else ""]
    detail = ", ".join(p for p in parts if p)
    return (f"no tokens for {seconds_text(idle)} with {n:.0f} request{'s' if n != 1 else ''} waiting"
            + (f" ({detail})" if detail else ""))


@dataclass
class HangWatch:
    """One engine's progress, from the snapshots of its successful polls (`judge`), and the verdict of its
    last canary. `after`: the seconds without progress, with requests in flight, that make it hung (None or
    0: never, by its counters; a canary still may)."""

    after: float | None = HUNG_AFTER_S
    progress: float | None = None  # tokens computed so far (generated + prompt), as last read
    moved_at: float | None = None  # when they were last seen to move, or the engine last seen idle
    canary: str | None = None  # why its last canary failed: it is hung until one is answered or tokens move
    canary_progress: float | None = None  # the tokens computed when that verdict was last judged
    epoch: int = 0  # moved on by every reset: a canary asked before it says nothing of what answers after

    def reset(self) -> None:
        """Forget everything: the engine went away (an outage, a restart) or serves nothing on purpose."""
        self._forget_progress()
        self.canary = self.canary_progress = None
        self.epoch += 1

    def _forget_progress(self) -> None:
        self.progress = self.moved_at = None

    def canary_failed(self, reason: str, epoch: int) -> None:
        """A canary asked at `epoch` failed, for `reason` (`"canary: no first token in 60 s"`): shown hung from
        the next poll on. A canary asked before the engine went away is not heard."""
        if epoch == self.epoch:
            self.canary, self.canary_progress = reason, None

    def canary_answered(self, epoch: int) -> None:
        """A canary asked at `epoch` was answered in time: its verdict, if one stood, is lifted."""
        if epoch == self.epoch:
            self.canary = self.canary_progress = None

    def judge(self, snap: EngineSnapshot, now: float, in_flight: int = 0) -> str | None:
        """Why the engine read in `snap` (a successful poll at `now`, the poller's monotonic seconds) is hung,
        or None when it is not (or cannot be told). `in_flight`: canary requests of its own under way, which
        are not requests waiting (a canary waits for its own verdict)."""
        if snap.state != "ready" or is_router(snap.kind):
            self.reset()  # sleeping serves nothing on purpose; a router's tokens are its engines'
            return None
        counters = [c for c in (snap.gen_tokens_total, snap.prompt_tokens_total) if c is not None]
        progress = sum(counters) if counters else None
        by_counters = self._by_counters(snap, now, progress, in_flight)
        if self.canary is None:
            return by_counters
        if in_flight or progress is None or self.canary_progress is None:
            # Another canary's own tokens are no sign of health (its verdict says); once none is under way,
            # tokens are counted from here.
            self.canary_progress = None if in_flight else progress
            return self.canary
        if progress != self.canary_progress:
            self.canary = self.canary_progress = None  # tokens flow again: someone's request is served
            return by_counters
        return self.canary

    def _by_counters(self, snap: EngineSnapshot, now: float, progress: float | None, in_flight: int) -> str | None:
        if not self.after or progress is None or (snap.running is None and snap.waiting is None):
            self._forget_progress()
            return None
        running, waiting = snap.running or 0.0, snap.waiting or 0.0
        # A canary of its own is not a request waiting: taken from the queue first (it came last), then the
        # running ones.
        queued = min(waiting, float(in_flight))
        waiting -= queued
        running = max(0.0, running - (in_flight - queued))
        if running + waiting <= 0:
            self.progress, self.moved_at = progress, None  # nothing asked of it: nothing is late
            return None
        if self.moved_at is None or progress != self.progress:
            # Requests first seen, or tokens moved (a restart's counters that start again move too): the
            # wait is counted from this poll.
            self.progress, self.moved_at = progress, now
            return None
        idle = now - self.moved_at
        if idle < self.after:
            return None
        return hung_reason(idle, running, waiting)
