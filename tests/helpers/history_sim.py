"""A twin cluster's days, time compressed: two GB10 nodes and one engine on
each, with a daily load curve, and the events a person later asks about
(an engine restart, a night of low memory, a KV spike), as the snapshots
the poller would have yielded. They go through the real `NoticeDetector`,
`ClusterState` and `HistoryWriter`, on the data's own clock, as fast as the
machine allows."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sparktop.observe.notices import NoticeDetector
from sparktop.observe.snapshot import GIB, EngineSnapshot, Gpu, Memory, NodeSnapshot
from sparktop.observe.state import ClusterState

NODES = ("spark-a", "spark-b")
TOTAL = 119 * GIB  # what a GB10's MemTotal says, about


@dataclass
class Scenario:
    start: float  # unix time of the first poll
    days: float = 7.0
    step: float = 30.0  # seconds between polls
    restart_at: float | None = None  # engine 0 restarts (its counters start again)
    memory_low: tuple[float, float] | None = None  # spark-b's available memory under 10 % from..to
    kv_spike: tuple[float, float] | None = None  # engine 1's KV cache at 97 % from..to
    idle_gap: tuple[float, float] | None = None  # engine 1 does not answer from..to (a session ends)
    watts_idle: float = 12.0
    watts_busy: float = 80.0
    initial_tokens: float = 0.0  # the engines' token counters at the first poll (they ran before)
    engines_started: float | None = None  # when the engines started (default: an hour before `start`)


@dataclass
class Truth:
    """What happened, counted beside the simulation, for the tests to compare with."""

    gen_tokens: dict[str, float] = field(default_factory=dict)  # per engine URL
    kv_peak: dict[str, tuple[float, float]] = field(default_factory=dict)  # url -> (value, t)
    mem_low: tuple[float, float] | None = None  # (lowest available bytes, t)
    events: int = 0


def url(i: int) -> str:
    return f"http://{NODES[i]}:8000"


def load(t: float) -> float:
    """0..1: busy in the working day, quiet at night (local time does not matter here)."""
    hour = (t % 86400) / 3600
    return max(0.05, math.sin(math.pi * (hour - 6) / 14)) if 6 <= hour <= 20 else 0.05


def events(sc: Scenario, truth: Truth | None = None) -> Iterator[object]:
    truth = truth if truth is not None else Truth()
    detector = NoticeDetector()
    # gen, prompt, requests since the engine started
    counters = {url(i): [sc.initial_tokens, 3 * sc.initial_tokens, sc.initial_tokens / 256] for i in range(2)}
    watched: dict[str, float | None] = {url(i): None for i in range(2)}  # the counter at the last ready poll
    began = sc.engines_started if sc.engines_started is not None else sc.start - 3600
    started = {url(i): began for i in range(2)}
    t = sc.start
    end = sc.start + sc.days * 86400
    restarted = False

    def inside(span: tuple[float, float] | None) -> bool:
        return span is not None and span[0] <= t < span[1]

    while t < end:
        busy = load(t)
        for i, name in enumerate(NODES):
            available = TOTAL * (0.06 if i == 1 and inside(sc.memory_low) else 0.45 - 0.1 * busy)
            node = NodeSnapshot(name=name, t=t, state="ok",
                                memory=Memory(total=TOTAL, available=int(available), free=int(available)),
                                cpu_pct=5 + 20 * busy,
                                gpu=Gpu(name="NVIDIA GB10", util=95 * busy, temp=40 + 30 * busy,
                                        power=sc.watts_idle + (sc.watts_busy - sc.watts_idle) * busy),
                                gpu_status="ok", docker_status="ok")
            if truth.mem_low is None or node.memory.available < truth.mem_low[0]:
                truth.mem_low = (node.memory.available, t)
            yield node
            yield from _count(detector.node(node), truth)
        for i in range(2):
            key = url(i)
            if i == 0 and sc.restart_at is not None and not restarted and t >= sc.restart_at:
                restarted = True
                counters[key] = [0.0, 0.0, 0.0]
                started[key] = t - 5
                watched[key] = None  # what it served before its first poll is not in any minute
            if i == 1 and inside(sc.idle_gap):
                e = EngineSnapshot(key=key, url=key, t=t, state="unreachable", reason="connection refused",
                                   node=NODES[i], model="openai/gpt-oss-120b")
                watched[key] = None  # a gap longer than a session's: what follows is a new session
            else:
                gen_tps = 400 * busy
                c = counters[key]
                c[0] += gen_tps * sc.step
                c[1] += 3 * gen_tps * sc.step
                c[2] += gen_tps * sc.step / 256
                if watched[key] is not None:
                    truth.gen_tokens[key] = truth.gen_tokens.get(key, 0.0) + c[0] - watched[key]
                watched[key] = c[0]
                kv = 0.97 if i == 1 and inside(sc.kv_spike) else 0.6 * busy
                if kv > truth.kv_peak.get(key, (-1.0, 0.0))[0]:
                    truth.kv_peak[key] = (kv, t)
                e = EngineSnapshot(key=key, url=key, t=t, state="ready", node=NODES[i],
                                   model="openai/gpt-oss-120b", engine="vLLM", kv_usage=kv,
                                   running=round(32 * busy), waiting=8.0 if kv > 0.9 else 0.0, gen_tps=gen_tps,
                                   prompt_tps=3 * gen_tps, gen_tokens_total=c[0], prompt_tokens_total=c[1],
                                   requests=c[2], started_at=started[key],
                                   latency={"ttft": {"p50": 0.2, "p95": 0.5}, "itl": {"p50": 0.02, "p95": 0.03}})
            yield e
            yield from _count(detector.engine(e), truth)
        t += sc.step


def _count(notices, truth: Truth) -> Iterator[object]:
    for n in notices:
        truth.events += 1
        yield n


def run(sc: Scenario, sink: Callable[[object, ClusterState], None], truth: Truth | None = None) -> ClusterState:
    """Feed the scenario's events to `sink(event, state)` after `state.apply`, as the app does."""
    state = ClusterState(history=64)
    for event in events(sc, truth):
        state.apply(event)
        sink(event, state)
    return state


def write_days(path, days: float = 2.0, end: float | None = None) -> dict[str, int]:
    """`days` of the twin cluster ending at `end` (default now), an engine restart and a KV spike half-way
    (events), written through the real writer and closed; the file's row counts per table."""
    import time

    from sparktop.history.store import HistoryStore
    from sparktop.history.writer import HistoryWriter

    end = time.time() if end is None else end
    start = end - days * 86400
    half = start + days * 86400 / 2
    writer = HistoryWriter(HistoryStore.open(path))
    run(Scenario(start=start, days=days, step=60.0, restart_at=half, kv_spike=(half, half + 600)), writer.observe)
    writer.close()
    return row_counts(path)


def row_counts(path) -> dict[str, int]:
    from sparktop.history.store import HistoryStore

    with HistoryStore.open(path, write=False) as s:
        return {table: s.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("node_minutes", "engine_minutes", "events", "sessions")}


def damage(path, pages: int = 2) -> bytes:
    """`pages` pages in the middle of the file overwritten with noise, as a failing disk does; its bytes."""
    import random

    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[16:18], "big") or 65536
    middle = len(data) // size // 2
    noise = random.Random(38)
    for page in range(middle, middle + pages):
        data[page * size:(page + 1) * size] = bytes(noise.randrange(256) for _ in range(size))
    path.write_bytes(bytes(data))
    return bytes(data)


def fill(where):
    """A file that takes all the free space of the filesystem at `where`; its path."""
    filler = where / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler
