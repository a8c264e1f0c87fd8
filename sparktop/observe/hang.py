"""A hung engine: one that answers (/health, /metrics, its API) but makes no tokens while requests wait.

`/health` says only that the API server is up; an engine whose core is stuck (a deadlocked collective, a
GPU fault the process survives, a scheduler that stopped stepping) answers it all the same. What gives it
away is its own counters: requests running or queued, and the tokens it has computed (generated or
prefilled) not moving for `after` seconds. `HangWatch` keeps that per engine on the poller's clock and
says why, in words (`"no tokens for 45 s with 3 requests waiting (2 running, 1 queued)"`); the poller
turns an engine it finds so into `EngineSnapshot.state == "hung"` (still one of `LIVE_STATES`: its figures
are read as usual), and `notices` says `hung` when it starts and `hung_cleared` when tokens flow again
(or the engine is back from a restart).

What it cannot see: an engine that exports neither token counter nor its running and waiting requests
(such an engine is never called hung), and a hang with nothing asked of it (nothing waits, so nothing is
late). Prompt tokens count as progress, so a long prefill (a 100k-token prompt prefilled in chunks) is not
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
    """One engine's progress, from the snapshots of its successful polls (`judge`). `after`: the seconds
    without progress, with requests in flight, that make it hung (None or 0: never)."""

    after: float | None = HUNG_AFTER_S
    progress: float | None = None  # tokens computed so far (generated + prompt), as last read
    moved_at: float | None = None  # when they were last seen to move, or the engine last seen idle

    def reset(self) -> None:
        self.progress = self.moved_at = None

    def judge(self, snap: EngineSnapshot, now: float) -> str | None:
        """Why the engine read in `snap` (a successful poll at `now`, the poller's monotonic seconds) is hung,
        or None when it is not (or cannot be told)."""
        if not self.after or snap.state != "ready" or is_router(snap.kind):
            self.reset()  # sleeping serves nothing on purpose; a router's tokens are its engines'
            return None
        counters = [c for c in (snap.gen_tokens_total, snap.prompt_tokens_total) if c is not None]
        if not counters or (snap.running is None and snap.waiting is None):
            self.reset()
            return None
        progress = sum(counters)
        running, waiting = snap.running or 0.0, snap.waiting or 0.0
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
