"""Alerts: conditions worth a message to a phone, each firing once when it has held for a while and resolving once
when it has clearly ended.

Where `notices` says what changed (every restart, every preemption burst), an alert says what needs someone: a node
lost, memory running out, an engine down or hung, a KV cache full with a queue that grows, preemptions that go on,
a replica that lags the others, the link fallen to sockets or half a cable, the GPU's clocks held down, the history
paused (a full disk). Each `Rule` reads the cluster's latest snapshots (`ClusterState`) and says, per node or
engine, whether its condition holds now and in what words. `AlertWatch.check` keeps, per rule and subject, since
when the condition has held or stopped holding: an alert fires after it has held `after_s` (the rule's own, or the
watch's default) and resolves after it has not held for `clear_s`, so a figure hovering at a threshold sends one
message, not one a poll. Firing and resolving are `Notice`s (`kind` "alert" and "alert_resolved", the rule's name
first in the text), so the app's event log, the history's events and a recording carry them as every other notice;
`sparktop collect --notify` delivers them (`history/notify.py`).

The GPU's clock held low with no reason given, as bad USB-C power delivery does, is `gpu_low_clock`; a filesystem the
node's work fills (`/`, the Hugging Face cache's, Docker's root) running out, `disk_low` and `disk_full`.

Time is the snapshots' (`ClusterState.now`), so a replay raises the same alerts at the same moments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparktop.observe.machine import limiting
from sparktop.observe.snapshot import EngineSnapshot, NodeSnapshot, Notice

if TYPE_CHECKING:
    from sparktop.observe.state import ClusterState

AFTER_S = 30.0  # a condition must hold this long before it fires (a rule may say otherwise)
CLEAR_S = 30.0  # ... and be gone this long before it resolves
MEMORY_WARN, MEMORY_CRITICAL = 0.20, 0.10  # the card's thresholds: MemAvailable under this share of MemTotal
KV_FULL = 0.95  # KV cache usage that, with a queue that grows, means requests wait for memory
# The silent low clock (issue 38, after another Spark dashboard's rule): the SM clock under 45 % of its maximum while
# the GPU is at least half busy, draws under 35 W and NVML gives no reason. A Spark whose USB-C power delivery went
# wrong runs at ~500-850 MHz of 3003 (17-28 %) on 6-16 W under load, a healthy one at ~2400-2480 MHz (80 %+) on ~85 W
# (hoesing/spark-gpu-throttle-check's README @ 1e8ccbdf), so the thresholds sit well between the two.
LOW_CLOCK_SHARE, LOW_CLOCK_BUSY_PCT, LOW_CLOCK_POWER_W = 0.45, 50.0, 35.0
# Space left on a filesystem a Spark's work lives on (`/`, the HF cache's, Docker's root). What fails is a write of a
# known size, not a share of the disk, so the thresholds are bytes: under DISK_LOW_B the next large model does not
# fit (the weights one Spark serves reach ~120-130 GB, its 128 GB of unified memory); under DISK_FULL_B not even a
# small model's (~10-20 GB) or an engine's image, and containers' writes, logs and the history start failing.
DISK_LOW_B, DISK_FULL_B = 130e9, 20e9
FIRE, RESOLVE = "alert", "alert_resolved"


# A rule's test: the cluster, one node or engine, and a dict the watch keeps for the rule and that subject
# (what a rule must remember between polls: a counter's recent values).
Check = Callable[["ClusterState", "NodeSnapshot | EngineSnapshot", dict], "str | None"]


@dataclass(frozen=True)
class Rule:
    name: str  # node_lost, engine_down ... (the alert's name in messages and in Prometheus' rules)
    subject: str  # node | engine
    severity: str  # warning | critical
    # What holds now, in words (None: the condition does not hold), from the cluster and one node or engine.
    check: Check
    after_s: float | None = None  # None: the watch's default
    clear_s: float | None = None


def _node_lost(state: ClusterState, n: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    assert isinstance(n, NodeSnapshot)
    return f"node {n.name} {n.state}: {n.reason or 'not answering'}" if n.state in ("down", "stale") else None


def _memory(share: float) -> Check:
    def check(state: ClusterState, n: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
        assert isinstance(n, NodeSnapshot)
        m = n.memory
        if n.state != "ok" or m is None or not m.total:
            return None
        avail = m.available / m.total
        return (f"{n.name}: {avail:.0%} of memory available ({m.available / 2**30:.1f} of "
                f"{m.total / 2**30:.1f} GiB), under {share:.0%}") if avail < share else None
    return check


def _throttled(state: ClusterState, n: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    assert isinstance(n, NodeSnapshot)
    # Idling or a clock the user set is the GPU doing as told, not held down (`machine.limiting`).
    reasons = limiting(n.gpu.throttle or []) if n.gpu is not None and n.state == "ok" else []
    return f"{n.name}: GPU clocks held down ({', '.join(reasons)})" if reasons else None


def _low_clock(state: ClusterState, n: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    assert isinstance(n, NodeSnapshot)
    g = n.gpu
    # Unread reasons (a driver before 535) say nothing: the low clock could be one of them.
    if n.state != "ok" or g is None or g.throttle is None or not g.max_sm_clock or g.sm_clock is None \
            or g.util is None or g.power is None:
        return None
    share = g.sm_clock / g.max_sm_clock
    if share >= LOW_CLOCK_SHARE or g.util < LOW_CLOCK_BUSY_PCT or g.power >= LOW_CLOCK_POWER_W or limiting(g.throttle):
        return None
    return (f"{n.name}: GPU at {g.sm_clock:.0f} of {g.max_sm_clock:.0f} MHz ({share:.0%}) while {g.util:.0f}% busy "
            f"on {g.power:.0f} W, with no reason given: its power delivery (USB-C) may cap it")


def _disk(under: float) -> Check:
    def check(state: ClusterState, n: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
        assert isinstance(n, NodeSnapshot)
        # A filesystem smaller than twice the threshold (a 100 GB partition for Docker) would read low even empty,
        # for ever: it is held to the next threshold down, or none (what an alert that never clears teaches is
        # to mute it).
        low = [d for d in n.disks if d.free < under and (d.total >= 2 * under or under == DISK_FULL_B)] \
            if n.state == "ok" else []
        return "; ".join(f"{n.name}: {d.free / 1e9:.1f} GB free of {d.total / 1e9:.0f} GB on {d.mount}"
                         f"{' (' + ', '.join(d.holds) + ')' if d.holds else ''}, under {under / 1e9:.0f} GB"
                         for d in low) or None
    return check


def _link(state: ClusterState, n: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    assert isinstance(n, NodeSnapshot)
    view = state.links.get(n.name)
    return f"{n.name}: {view.warning}" if view is not None and view.warning else None


def _history_paused(state: ClusterState, n: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    return None  # fed by the collector (`AlertWatch.history`), not by a snapshot


def _engine_down(state: ClusterState, e: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    assert isinstance(e, EngineSnapshot)
    if e.state in ("unreachable", "failed"):
        return f"engine {e.label} ({e.url}) {e.state}: {e.error or e.reason or 'not answering'}"
    return None


def _engine_hung(state: ClusterState, e: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    assert isinstance(e, EngineSnapshot)
    return f"engine {e.label} ({e.url}) hung: {e.reason or 'no tokens while requests wait'}" \
        if e.state == "hung" else None


def _kv_full(state: ClusterState, e: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    assert isinstance(e, EngineSnapshot)
    if e.state != "ready" or e.kv_usage is None or e.kv_usage < KV_FULL or not e.waiting:
        return None
    return f"engine {e.label} ({e.url}): KV cache {e.kv_usage:.0%} full, {e.waiting:.0f} requests waiting"


def _preempting(state: ClusterState, e: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    assert isinstance(e, EngineSnapshot)
    if e.state != "ready" or e.preemptions is None:
        return None
    # Preemptions since the engine started, over the last minute: still growing means still preempting.
    seen = mem.setdefault("seen", [])
    seen.append((state.now, e.preemptions))
    seen[:] = [(t, v) for t, v in seen if t >= state.now - 60.0]
    grew = seen[-1][1] - seen[0][1]
    return f"engine {e.label} ({e.url}): {grew:.0f} preemptions in the last minute" if grew > 0 else None


def _replica_lagging(state: ClusterState, e: NodeSnapshot | EngineSnapshot, mem: dict) -> str | None:
    from sparktop.observe.replicas import replica_of

    assert isinstance(e, EngineSnapshot)
    replica = replica_of(state.engines.values(), e.key)
    return f"replica {e.url} of {e.label} lags: {replica.lagging}" if replica and replica.lagging else None


RULES: tuple[Rule, ...] = (
    Rule("node_lost", "node", "critical", _node_lost),
    Rule("memory_low", "node", "warning", _memory(MEMORY_WARN)),
    Rule("memory_critical", "node", "critical", _memory(MEMORY_CRITICAL), after_s=10.0),
    Rule("gpu_throttled", "node", "warning", _throttled, after_s=60.0),
    Rule("gpu_low_clock", "node", "warning", _low_clock, after_s=60.0),
    Rule("disk_low", "node", "warning", _disk(DISK_LOW_B), after_s=60.0),  # a download's files come and go
    Rule("disk_full", "node", "critical", _disk(DISK_FULL_B)),
    Rule("link_degraded", "node", "warning", _link),
    Rule("engine_down", "engine", "critical", _engine_down),
    Rule("engine_hung", "engine", "critical", _engine_hung, after_s=0.0),  # the state already waited
    Rule("kv_saturated", "engine", "warning", _kv_full, after_s=60.0),
    Rule("preempting", "engine", "warning", _preempting, after_s=60.0),
    Rule("replica_lagging", "engine", "warning", _replica_lagging, after_s=120.0),
)
HISTORY_RULE = Rule("history_paused", "node", "warning", _history_paused, after_s=0.0)


@dataclass
class _Track:
    since: float | None = None  # when the condition began to hold (None: it does not)
    memory: dict = field(default_factory=dict)  # the rule's own, for this subject
    gone_since: float | None = None  # when it stopped holding, while firing
    firing: bool = False
    text: str = ""


@dataclass
class AlertWatch:
    """Rules over the cluster, with hysteresis in time; one per app or collector."""

    after_s: float = AFTER_S
    clear_s: float = CLEAR_S
    rules: tuple[Rule, ...] = RULES
    _tracks: dict[tuple[str, str], _Track] = field(default_factory=dict)
    _history: tuple[float, str] | None = None  # the collector's history pause, since when and why

    def history(self, paused: str | None, now: float) -> None:
        """The collector's history file: paused (why: "disk full") or writing (None)."""
        if paused and self._history is None:
            self._history = (now, paused)
        elif not paused:
            self._history = None

    def firing(self) -> list[tuple[str, str, str]]:
        """(rule, subject key, text) of every alert firing now."""
        return [(rule, key, t.text) for (rule, key), t in self._tracks.items() if t.firing]

    def check(self, state: ClusterState) -> list[Notice]:
        """The alerts that fire or resolve at `state.now`, as notices (to apply to the state and record)."""
        now = state.now
        out: list[Notice] = []
        subjects: dict[str, Iterable[NodeSnapshot | EngineSnapshot]] = {
            "node": list(state.nodes.values()), "engine": list(state.engines.values())}
        seen: set[tuple[str, str]] = set()
        for rule in self.rules:
            for snap in subjects[rule.subject]:
                key = snap.name if isinstance(snap, NodeSnapshot) else snap.key
                seen.add((rule.name, key))
                track = self._tracks.setdefault((rule.name, key), _Track())
                self._step(rule, rule.subject, key, rule.check(state, snap, track.memory), now, out)
        if self._history is not None or (HISTORY_RULE.name, "history") in self._tracks:
            seen.add((HISTORY_RULE.name, "history"))
            text = f"history paused: {self._history[1]}" if self._history is not None else None
            self._step(HISTORY_RULE, "node", "history", text, now, out)
        for (name, key), track in list(self._tracks.items()):
            if (name, key) not in seen:  # its node or engine is gone from the cluster: nothing to alert on
                if track.firing:
                    out.append(Notice(now, "engine" if key.startswith("http") else "node", key, RESOLVE, "info",
                                      f"{name} resolved: no longer watched"))
                del self._tracks[(name, key)]
        return out

    def _step(self, rule: Rule, subject: str, key: str, text: str | None, now: float, out: list[Notice]) -> None:
        track = self._tracks.setdefault((rule.name, key), _Track())
        after = self.after_s if rule.after_s is None else rule.after_s
        clear = self.clear_s if rule.clear_s is None else rule.clear_s
        if text is not None:
            track.gone_since = None
            if track.since is None:
                track.since = now
            track.text = text
            if not track.firing and now - track.since >= after:
                track.firing = True
                held = f" (for {now - track.since:.0f} s)" if now - track.since >= 1 else ""
                out.append(Notice(now, subject, key, FIRE, "error" if rule.severity == "critical" else "warn",
                                  f"{rule.name} [{rule.severity}]: {text}{held}"))
        else:
            track.since = None
            if track.firing:
                if track.gone_since is None:
                    track.gone_since = now
                if now - track.gone_since >= clear:
                    track.firing = False
                    track.gone_since = None
                    out.append(Notice(now, subject, key, RESOLVE, "info", f"{rule.name} resolved: {track.text}"))
            if not track.firing and not track.memory:
                del self._tracks[(rule.name, key)]
