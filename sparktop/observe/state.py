"""Everything the screen shows, kept as plain data: the latest snapshot of
every node and engine plus a bounded history of the figures drawn as
sparklines and charts. Live polling and replay both feed it the same
events; the UI only reads it.
"""

from __future__ import annotations

import functools
import itertools
import shlex
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sparktop.engine_ids import is_router
from sparktop.layouts import layout_of
from sparktop.observe import engines
from sparktop.observe.argv import flag_value as _flag
from sparktop.observe.energy import Energy
from sparktop.observe.link import LinkView, LinkWatch, PortPair, pair_ports
from sparktop.observe.link import totals as link_totals
from sparktop.observe.link import view as link_view
from sparktop.observe.snapshot import GIB, LIVE_STATES, EngineGone, EngineSnapshot, NodeSnapshot, Notice, ObserveEvent

HISTORY = 3600  # points per series: an hour at the default interval
NOTICES = 200  # event-log lines kept per engine or node
NOTICE_ON_CARD_S = 90.0  # how long a card shows its last notice
ENERGY_WINDOW_S = 5.0  # power is averaged over the window the engine's token rate covers
HOLD_S = 10.0  # how long the cluster's charts hold a figure past its poll (polls run every 1-5 s)
PEAK_FIGURES = ("running", "waiting", "kv_usage", "prompt_tps", "gen_tps")



@dataclass
class ClusterSummary:
    """The cluster at a glance: the monitor's summary line for three nodes
    and more. Routers are left out of the engine counts and rates (their
    tokens are their engines')."""

    nodes: int = 0
    nodes_ok: int = 0
    mem_used: int = 0  # bytes, over the nodes that reported memory
    mem_total: int = 0
    engines: int = 0
    engines_ready: int = 0
    gen_tps: float = 0.0
    prompt_tps: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    watts: float | None = None  # every node's GPU power (None: some node reports none)

    @property
    def j_per_token(self) -> float | None:
        if self.watts is None or self.gen_tps <= 0:
            return None
        return self.watts / self.gen_tps


@dataclass
class Reset:
    """Replay seeking: forget everything before the events that follow."""


@dataclass
class History:
    maxlen: int = HISTORY
    t: deque = field(default_factory=deque)
    series: dict[str, deque] = field(default_factory=dict)
    pushed: int = 0  # points ever pushed (the deques forget the oldest)

    def push(self, t: float, values: dict[str, float | None]) -> None:
        if self.t and t <= self.t[-1]:
            return  # a re-emitted snapshot (state change) adds no point
        if not self.t:
            self.t = deque(maxlen=self.maxlen)
        self.t.append(t)
        self.pushed += 1
        for name, value in values.items():
            if name not in self.series:
                self.series[name] = deque([None] * (len(self.t) - 1), maxlen=self.maxlen)
            self.series[name].append(value)
        for name, series in self.series.items():
            if name not in values:
                series.append(None)  # a figure this point lacks (a link gone down): a gap, in step

    def values(self, name: str, last: int | None = None) -> list[float]:
        """Recent values with gaps as 0 (what a sparkline can draw)."""
        data = self.series.get(name)
        if not data:
            return []
        # The newest `last` only: a card draws a few dozen points of an hour's history every second.
        items = itertools.islice(data, max(0, len(data) - last), None) if last else data
        return [0.0 if v is None else float(v) for v in items]

    def points(self, name: str) -> tuple[list[float], list[float]]:
        """(t, value) pairs without gaps, for charts."""
        data: Iterable = self.series.get(name, ())
        xs: list[float] = []
        ys: list[float] = []
        for t, v in zip(self.t, data, strict=False):
            if v is not None:
                xs.append(t)
                ys.append(float(v))
        return xs, ys


def _link_point(s: NodeSnapshot) -> dict[str, float | None]:
    """The link's Gb/s each way, RDMA and kernel, summed over the ports that are up (none: no link)."""
    up = [p for p in s.links if p.up]
    return link_totals(up) if up else {}


class ClusterState:
    def __init__(self, history: int = HISTORY):
        self._clear(history)

    def _clear(self, history: int) -> None:
        self.history_len = history
        self.nodes: dict[str, NodeSnapshot] = {}
        self.engines: dict[str, EngineSnapshot] = {}
        self.node_history: dict[str, History] = {}
        self.engine_history: dict[str, History] = {}
        # Since sparktop started: the highest of each figure, per engine.
        self.peaks: dict[str, dict[str, float]] = {}
        # The event log, per engine URL or node name (newest last).
        self.notices: dict[str, deque[Notice]] = {}
        # Per node, what its link carries and what is wrong with it (observe/link.py).
        self.links: dict[str, LinkView] = {}
        self.link_pairs: list[PortPair] = []  # which port reaches which node (observe/link.py)
        self.link_notes: list[str] = []  # what could not be paired, and why
        self._link_watch = LinkWatch()
        self.now = 0.0  # the newest snapshot's time: "now" for a replay as for a live session
        self.version = 0  # bumps on every change, so a view can skip redraws

    def apply(self, event: ObserveEvent | Reset) -> None:
        self.version += 1
        if isinstance(event, NodeSnapshot | EngineSnapshot) and event.t > self.now:
            self.now = event.t
        if isinstance(event, NodeSnapshot):
            self.nodes[event.name] = event
            if event.state == "ok":
                self._node_point(event)
                self._link(event)
        elif isinstance(event, EngineSnapshot):
            self.engines[event.key] = event
            if event.state in LIVE_STATES:  # asleep or hung, the charts go on (at zero)
                self._engine_point(event)
                self._peak(event)
        elif isinstance(event, EngineGone):
            self.engines.pop(event.key, None)
        elif isinstance(event, Notice):
            self.notices.setdefault(event.key, deque(maxlen=NOTICES)).append(event)
        elif isinstance(event, Reset):
            self._clear(self.history_len)

    def spread_engines(self, node: str) -> list[EngineSnapshot]:
        """The engines running on `node` and on other nodes with it (tensor or pipeline parallel)."""
        out = []
        for e in self.engines.values():
            nodes = self.engine_nodes(e)
            if node in nodes and len(nodes) > 1:
                out.append(e)
        return out

    def peer_of(self, node: str, device: str) -> tuple[str, str, PortPair] | None:
        """The node and device a node's RDMA port reaches, and the pair (how it was found, verified)."""
        for p in self.link_pairs:
            if (p.a_node, p.a_device) == (node, device):
                return p.b_node, p.b_device, p
            if (p.b_node, p.b_device) == (node, device):
                return p.a_node, p.a_device, p
        return None

    def _link(self, s: NodeSnapshot) -> None:
        if s.links:
            self.link_pairs, self.link_notes = pair_ports([n for n in self.nodes.values() if n.links])
        v = link_view(s, self.spread_engines(s.name))
        if v is None:
            self.links.pop(s.name, None)
            return
        self.links[s.name] = self._link_watch.update(v)

    def _node_point(self, s: NodeSnapshot) -> None:
        h = self.node_history.setdefault(s.name, History(self.history_len))
        mem = s.memory
        h.push(s.t, {
            "mem_used_gib": mem.used / GIB if mem else None,
            "mem_frac": mem.used_fraction if mem else None,
            "gpu_util": s.gpu.util if s.gpu else None,
            "cpu": s.cpu_pct,
            "power": s.gpu.power if s.gpu else None,
            **_link_point(s),
        })

    def _engine_point(self, s: EngineSnapshot) -> None:
        h = self.engine_history.setdefault(s.key, History(self.history_len))
        h.push(s.t, {
            "kv": s.kv_usage, "running": s.running, "waiting": s.waiting, "gen_tps": s.gen_tps,
            "prompt_tps": s.prompt_tps, "ttft_p50": s.ttft_p50, "itl_p50": s.itl_p50,
            # Poll by poll, for the sparklines beside the windowed figures (the window's own where an
            # engine's counters have no meaning between two polls).
            "gen_now": s.gen_tps_now if s.gen_tps_now is not None else s.gen_tps,
            "prompt_now": s.prompt_tps_now if s.prompt_tps_now is not None else s.prompt_tps,
        })

    def _peak(self, s: EngineSnapshot) -> None:
        peaks = self.peaks.setdefault(s.key, {})
        for name in PEAK_FIGURES:
            value = getattr(s, name)
            if value is not None and value > peaks.get(name, float("-inf")):
                peaks[name] = value

    def last_notice(self, key: str, now: float, within: float = NOTICE_ON_CARD_S) -> Notice | None:
        """The newest notice of an engine or node if it is recent enough to show on its card."""
        log = self.notices.get(key)
        if not log:
            return None
        last = log[-1]
        return last if now - last.t <= within else None

    def log(self, *keys: str) -> list[Notice]:
        """The notices of these engines and nodes together, oldest first."""
        rows = [n for key in keys for n in self.notices.get(key, ())]
        return sorted(rows, key=lambda n: n.t)

    def engine_nodes(self, e: EngineSnapshot) -> list[str]:
        """The nodes an engine runs on: its own, and for one spread over
        nodes (tensor parallel) every node running a container of the same
        launch, or, for one sparktop did not launch, the nodes whose
        workers name its head (`_workers_of`)."""
        if e.node is None:
            return []
        layout = layout_of(e.topology)
        if layout is None or not layout.spans_nodes or is_router(e.kind):  # a router runs on one node
            return [e.node]
        home = self.nodes.get(e.node)
        launch = role = None
        if home is not None and e.container:
            mine = next((c for c in home.containers if c.name == e.container), None)
            if mine is not None:
                launch, role = mine.labels.get("sparktop.launch"), mine.labels.get("sparktop.role", "")
        # Replicas of one launch tell their containers apart by their head's name: the head is "vllm-spark-c"
        # (or "sglang-…", "llama-…", "trtllm-…"), its workers "worker1-spark-c", "rpc1-spark-c", "mpi1-spark-c".
        suffix = role[role.index("-"):] if role and "-" in role else ""
        nodes = [e.node]
        if launch is None:
            return nodes + self._workers_of(e, home)
        for name, n in sorted(self.nodes.items()):
            if name == e.node:
                continue
            if any(c.state == "running" and c.labels.get("sparktop.launch") == launch
                   and not is_router(c.labels.get("sparktop.kind"))
                   and c.labels.get("sparktop.role", "").endswith(suffix) for c in n.containers):
                nodes.append(name)
        return nodes

    def _workers_of(self, e: EngineSnapshot, home: NodeSnapshot | None) -> list[str]:
        """The other nodes of an engine sparktop did not launch, from their
        command lines: a headless vLLM whose --master-addr is the head's,
        or a Ray worker started with the head's address. A node whose
        worker names no address this head is known by (its commands cannot
        be read, or the head was given a name) counts when it has GPU work
        and does not name another engine's head."""
        mine = _head_addresses(e, home)
        others: set[str] = set()
        for other in self.engines.values():
            if other.key != e.key and other.node and other.node != e.node and not is_router(other.kind):
                others |= _head_addresses(other, self.nodes.get(other.node))
        claimed: dict[str, str | None] = {}  # node -> the head address its workers serve (None: a head itself)
        for name, n in self.nodes.items():
            if name == e.node:
                continue
            for argv in _commands(n):
                target = _serves(argv)
                if target is not None:
                    claimed[name] = target
                    break
                found = engines.for_command(argv)
                if found is not None and not found[0].is_worker(argv):
                    claimed.setdefault(name, None)  # a head of its own
        named = sorted(name for name, target in claimed.items() if target in mine)
        if named:
            return named
        return sorted(name for name, n in self.nodes.items()
                      if name != e.node and n.processes and claimed.get(name, "") not in others
                      and (name not in claimed or claimed[name] is not None))

    def mean_power(self, node: str, until: float, window: float = ENERGY_WINDOW_S) -> float | None:
        """The node's GPU power (W) averaged over the `window` seconds before `until`."""
        h = self.node_history.get(node)
        if h is None:
            return None
        values = []
        for t, v in zip(reversed(h.t), reversed(h.series.get("power", ())), strict=False):
            if t < until - window - 0.5:
                break  # the history goes back in time: the rest is older
            if t <= until + 0.5 and v is not None:
                values.append(v)
        return sum(values) / len(values) if values else None

    def engine_energy(self, e: EngineSnapshot) -> Energy | None:
        """Energy per generated token: the power of the engine's nodes over
        the window its token rate covers, divided by that rate."""
        nodes = self.engine_nodes(e)
        if not nodes or e.gen_tps is None:
            return None
        watts = [self.mean_power(n, e.t) for n in nodes]
        if any(w is None for w in watts):
            return None
        return Energy(watts=sum(w for w in watts if w is not None), tokens_per_s=e.gen_tps, nodes=nodes,
                      window_s=ENERGY_WINDOW_S)

    def node_energy(self, name: str) -> Energy | None:
        """Energy per token generated on a node: its power over the tokens of
        the engines on it (an engine on k nodes counts 1/k of its tokens here)."""
        node = self.nodes.get(name)
        if node is None:
            return None
        tps = 0.0
        seen = False
        for e in self.engines.values():
            if e.state not in LIVE_STATES or e.gen_tps is None:
                continue
            nodes = self.engine_nodes(e)
            if name in nodes:
                tps += e.gen_tps / len(nodes)
                seen = True
        watts = self.mean_power(name, node.t)
        if not seen or watts is None:
            return None
        return Energy(watts=watts, tokens_per_s=tps, nodes=[name], window_s=ENERGY_WINDOW_S)

    def cluster_points(self, name: str, *, nodes: bool = False, window_s: float = 300.0,
                       step_s: float = 1.0) -> tuple[list[float], list[float]]:
        """A figure summed over the cluster, sampled every `step_s` over the
        last `window_s`: every engine's (routers left out: their tokens are
        their engines') or, with `nodes`, every node's, of those there now.
        Each history holds its last value until its next one (polls do not
        line up), for at most HOLD_S."""
        if nodes:
            histories = [h for key, h in self.node_history.items() if key in self.nodes]
        else:
            histories = [h for key, h in self.engine_history.items()
                         if key in self.engines and not is_router(self.engines[key].kind)]
        newest = max((h.t[-1] for h in histories if h.t), default=None)
        if newest is None:
            return [], []
        start = newest - window_s
        buckets = int(window_s / step_s) + 1
        sums, seen = [0.0] * buckets, [False] * buckets
        for h in histories:
            points = []
            for t, v in zip(reversed(h.t), reversed(h.series.get(name, ())), strict=False):
                if t < start - step_s:
                    break  # newest first: the rest is older
                if v is not None:
                    points.append((t, float(v)))
            points.reverse()
            j, last, last_t = 0, None, 0.0
            for b in range(buckets):
                at = start + b * step_s
                while j < len(points) and points[j][0] <= at:
                    last_t, last = points[j]
                    j += 1
                # A value holds until the next poll, not past HOLD_S: an engine that stopped
                # answering (its history stops) no longer adds its last rate.
                if last is not None and at - last_t <= HOLD_S:
                    sums[b] += last
                    seen[b] = True
        return ([start + b * step_s for b in range(buckets) if seen[b]],
                [sums[b] for b in range(buckets) if seen[b]])

    def summary(self) -> ClusterSummary:
        out = ClusterSummary(nodes=len(self.nodes))
        watts: float | None = 0.0
        for name, n in self.nodes.items():
            out.nodes_ok += n.state == "ok"
            if n.memory is not None:
                out.mem_used += n.memory.used
                out.mem_total += n.memory.total
            # Averaged as each card's energy is: over the window the token rates cover.
            power = self.mean_power(name, n.t) if n.state == "ok" else None
            watts = None if watts is None or power is None else watts + power
        for e in self.engines.values():
            if is_router(e.kind):
                continue
            out.engines += 1
            if e.state not in LIVE_STATES:
                continue
            out.engines_ready += e.state != "hung"  # its figures count; it is not ready
            out.gen_tps += e.gen_tps or 0.0
            out.prompt_tps += e.prompt_tps or 0.0
            out.running += e.running or 0.0
            out.waiting += e.waiting or 0.0
        out.watts = watts if self.nodes else None
        return out

    def ordered_nodes(self) -> list[NodeSnapshot]:
        return [self.nodes[k] for k in sorted(self.nodes)]

    def ordered_engines(self) -> list[EngineSnapshot]:
        return sorted(self.engines.values(), key=lambda e: (e.node or "~", e.url))


@functools.lru_cache(maxsize=512)
def _split(command: str) -> tuple[str, ...]:
    """A container's command as argv, once per distinct command: engine_nodes runs on every paint."""
    try:
        return tuple(shlex.split(command))
    except ValueError:
        return tuple(command.split())


def _commands(node: NodeSnapshot | None) -> list[list[str]]:
    """The command lines of a node's running containers and vLLM processes."""
    if node is None:
        return []
    out = [p.argv for p in node.servers]
    for c in node.containers:
        if c.state != "running" or not c.command:
            continue
        argv = list(_split(c.command))
        out.append(argv)
        if len(argv) > 2 and argv[1] == "-c":  # `sh -c "ray start --head ... && vllm serve ..."`
            out += [list(_split(part)) for part in argv[2].split("&&")]
    return out


def _head_addresses(e: EngineSnapshot, home: NodeSnapshot | None) -> set[str]:
    """What an engine's workers may call its head: its URL's host, and the
    --master-addr or --node-ip-address its own command lines give."""
    heads = {urlsplit(e.url).hostname or ""}
    for argv in _commands(home):
        if _serves(argv) is None:
            heads |= {a for a in (_flag(argv, "--master-addr"), _flag(argv, "--node-ip-address")) if a}
    heads.discard("")
    return heads


def _serves(argv: list[str]) -> str | None:
    """The head address a worker's command line joins: `vllm serve --headless
    --master-addr A`, SGLang's `--node-rank 1 --dist-init-addr A:port`, or
    `ray start --address A:port` (not `--head`)."""
    found = engines.for_command(argv)
    if found is not None and found[0].is_worker(argv):
        return found[0].head_of(argv)
    if "ray" in " ".join(argv[:3]) and "start" in argv and "--head" not in argv:
        address = _flag(argv, "--address")
        return address.rsplit(":", 1)[0] if address else None
    return None

