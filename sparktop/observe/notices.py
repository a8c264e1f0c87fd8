"""What changed, in words: the monitor's event log.

A `Notice` is one timestamped line about an engine or a node — an engine
going down, coming back or restarting, hung (answering but making no
tokens while requests wait, `observe.hang`) and no longer, restarting over
and over, preemptions starting, the KV cache above 90 %, requests that
waited long in the queue, an error in its log, a node lost or back, memory
low. `NoticeDetector` derives them from the
snapshots the poller emits, comparing each with the one before; the poller
puts them in its event stream, so a recording keeps them and a replay shows
them, and the screens only display them.

Each condition fires once when it starts and is re-armed only once it has
clearly ended (hysteresis), so a figure hovering at a threshold does not
fill the log. Their `kind`s are stable names an alert can match (the list
is `Notice.kind`'s); a hung engine says `hung` once, and `hung_cleared`
once it serves again: tokens flow, or it is back ready after a restart
(whatever came between: `down`, `back`, `restarted`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from sparktop.observe.prometheus import QUEUE_WAIT_S
from sparktop.observe.snapshot import LIVE_STATES, EngineGone, EngineSnapshot, NodeSnapshot, Notice

KV_HIGH = 0.90  # KV cache usage that starts a notice ...
KV_CLEAR = 0.85  # ... and the level it must fall under before another
PREEMPT_QUIET_S = 30.0  # preemptions after this long without any are news again
MEMORY_LOW = 0.10  # MemAvailable below this share of MemTotal (a GB10 freezes when it runs out)
MEMORY_CLEAR = 0.15
DOWN_STATES = ("unreachable", "failed")
RESTART_SLACK_S = 1.0  # a start time that moved by less is the same start (float noise)
RESTART_LOOP_COUNT = 3  # this many starts of an engine within ...
RESTART_LOOP_WINDOW_S = 600.0  # ... this long are a restart loop


@dataclass
class _EngineMemory:
    state: str | None = None
    ever_ready: bool = False
    down: bool = False  # a "down" was said and no "back" yet
    started_at: float | None = None
    preemptions: float | None = None
    preempt_at: float | None = None  # when preemptions last grew
    kv_high: bool = False
    queue_slow: bool = False
    rejecting: bool = False
    error: str | None = None
    hung: bool = False  # a "hung" was said and no "hung_cleared" yet
    hung_by_canary: bool = False  # ... and it was the canary's verdict (not the counters')
    restarts: deque[float] = field(default_factory=deque)  # when it started again (snapshot times), recent ones
    looping: bool = False  # a "restart_loop" was said; re-armed once the window holds fewer starts
    start_seen: bool = False  # its latest start was counted as it started up (not again once it is up)


@dataclass
class _NodeMemory:
    state: str | None = None
    memory_low: bool = False


@dataclass
class NoticeDetector:
    """Turns consecutive snapshots into notices; one per poller."""

    engines: dict[str, _EngineMemory] = field(default_factory=dict)
    nodes: dict[str, _NodeMemory] = field(default_factory=dict)

    def engine(self, s: EngineSnapshot) -> list[Notice]:
        m = self.engines.setdefault(s.key, _EngineMemory())
        out: list[Notice] = []

        def say(kind: str, level: str, text: str) -> None:
            out.append(Notice(s.t, "engine", s.key, kind, level, text))

        up = s.state in LIVE_STATES
        if s.state == "starting" and (m.state in DOWN_STATES or m.ever_ready and m.state not in ("starting",
                                                                                                  "connecting")):
            m.start_seen = True  # a start-up after it had run (or died), seen through its log
            self._started_again(m, s, say)
        if s.state in DOWN_STATES and m.ever_ready and not m.down:
            m.down = True
            if s.state == "failed":
                say("down", "error", f"engine failed: {s.error or s.reason or 'it stopped answering'}")
            else:
                say("down", "error", f"engine down: {s.reason or 'it stopped answering'}")
        elif up and m.down:
            m.down = False  # back, whether it answered again or started anew (through "starting")
            say("back", "info", "engine back")
        elif s.state == "ready" and m.state == "starting" and not m.ever_ready:
            say("ready", "info", "engine ready")
        if m.state is not None and m.state != s.state:
            if s.state == "sleeping" and m.state == "ready":
                say("sleeping", "info", f"engine put to {s.sleep_text}")
            elif s.state == "ready" and m.state == "sleeping":
                say("woke", "info", "engine woken up")
        if s.error and s.error != m.error and s.state == "failed" and not out:
            say("error", "error", f"error in its log: {s.error}")
        m.error = s.error
        if up:
            self._restart(m, s, say)
            m.start_seen = False
            self._engine_figures(m, s, say)
            m.ever_ready = True
        self._hung(m, s, say)
        m.state = s.state
        return out

    @staticmethod
    def _hung(m: _EngineMemory, s: EngineSnapshot, say) -> None:
        if s.state == "hung" and not m.hung:
            m.hung, m.hung_by_canary = True, (s.reason or "").startswith("canary:")
            say("hung", "error", f"engine hung: {s.reason or 'it makes no tokens while requests wait'}")
        elif s.state == "ready" and m.hung:
            m.hung = False
            back = m.state not in ("hung", None)  # it went away (restarted, down) and came back ready
            # A canary's verdict lifts when a later one is answered (or tokens move): it answers again.
            again = "it answers again" if m.hung_by_canary else "tokens flow again"
            say("hung_cleared", "info", "engine no longer hung: " + ("back and ready" if back else again))

    def _started_again(self, m: _EngineMemory, s: EngineSnapshot, say) -> None:
        """One more start of the engine (at `s.t`): a restart loop when the window holds enough of them."""
        m.restarts.append(s.t)
        while m.restarts and m.restarts[0] < s.t - RESTART_LOOP_WINDOW_S:
            m.restarts.popleft()
        if len(m.restarts) < RESTART_LOOP_COUNT:
            m.looping = False
        elif not m.looping:
            m.looping = True
            say("restart_loop", "error", f"engine restarting over and over: {len(m.restarts)} starts in the last "
                f"{RESTART_LOOP_WINDOW_S / 60:.0f} min")

    def _restart(self, m: _EngineMemory, s: EngineSnapshot, say) -> None:
        if s.started_at is None:
            return
        if m.started_at is not None and s.started_at > m.started_at + RESTART_SLACK_S:
            started = time.strftime("%H:%M:%S", time.localtime(s.started_at))
            say("restarted", "warn", f"engine restarted at {started}: its counters start again")
            m.preemptions = None  # its counters began again
            if not m.start_seen:  # a restart the polls did not see start up (it was quick): counted now
                self._started_again(m, s, say)
        m.started_at = s.started_at

    @staticmethod
    def _engine_figures(m: _EngineMemory, s: EngineSnapshot, say) -> None:
        if s.preemptions is not None:
            if m.preemptions is not None and s.preemptions > m.preemptions:
                quiet = m.preempt_at is None or s.t - m.preempt_at >= PREEMPT_QUIET_S
                if quiet:
                    kv = f", KV {s.kv_usage:.0%}" if s.kv_usage is not None else ""
                    say("preempting", "warn", f"preemptions started: {s.preemptions - m.preemptions:.0f} "
                        f"(the KV cache is full{kv}; requests are recomputed)")
                m.preempt_at = s.t
            m.preemptions = s.preemptions
        if s.kv_usage is not None:
            if not m.kv_high and s.kv_usage >= KV_HIGH:
                m.kv_high = True
                say("kv_high", "warn", f"KV cache above {KV_HIGH:.0%} ({s.kv_usage:.0%})")
            elif m.kv_high and s.kv_usage < KV_CLEAR:
                m.kv_high = False
        if s.queue_slow is not None:
            if not m.queue_slow and s.queue_slow > 0:
                m.queue_slow = True
                p95 = s.pct("queue", "p95")
                tail = f" (queue p95 {p95:.1f} s)" if p95 is not None else ""
                say("queue_slow", "warn", f"{s.queue_slow:.0f} request{'s' if s.queue_slow != 1 else ''} waited "
                    f"over {QUEUE_WAIT_S:.0f} s in the queue{tail}")
            elif m.queue_slow and s.queue_slow == 0:
                m.queue_slow = False
        recent = s.rejections_recent or 0.0
        if not m.rejecting and (s.rejection_rate or 0) > 0:
            m.rejecting = True
            reasons = ", ".join(k for k, v in sorted((s.rejections_by_reason or {}).items()) if v)
            say("rejecting", "error", "refusing requests: a queue limit is reached" + (f" ({reasons})"
                                                                                        if reasons else ""))
        elif m.rejecting and recent == 0 and not s.rejection_rate:
            m.rejecting = False

    def gone(self, event: EngineGone, t: float | None = None) -> list[Notice]:
        m = self.engines.pop(event.key, None)
        if m is None or not m.ever_ready:
            return []
        return [Notice(time.time() if t is None else t, "engine", event.key, "gone", "warn",
                       "engine gone: its container was removed")]

    def node(self, s: NodeSnapshot) -> list[Notice]:
        m = self.nodes.setdefault(s.name, _NodeMemory())
        out: list[Notice] = []

        def say(kind: str, level: str, text: str) -> None:
            out.append(Notice(s.t, "node", s.name, kind, level, text))

        if s.state == "down" and m.state not in (None, "down", "connecting"):
            say("node_lost", "error", f"node lost: {s.reason or 'no answer'}")
        elif s.state == "ok" and m.state == "down":
            say("node_back", "info", "node back")
        if s.state == "ok" and s.memory is not None and s.memory.total:
            share = s.memory.available / s.memory.total
            if not m.memory_low and share < MEMORY_LOW:
                m.memory_low = True
                say("memory_low", "error", f"memory low: {s.memory.available / 1024**3:.1f} GiB available "
                    f"({share:.0%}); a GB10 freezes when it runs out")
            elif m.memory_low and share >= MEMORY_CLEAR:
                m.memory_low = False
                say("memory_ok", "info", f"memory recovered: {s.memory.available / 1024**3:.1f} GiB available")
        m.state = s.state
        return out
