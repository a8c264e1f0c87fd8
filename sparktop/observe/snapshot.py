"""What the monitor knows about a node or an engine at one moment.

Plain dataclasses, convertible to and from JSON so a session can be
recorded and replayed (`--record`, `sparktop replay`) and printed by
`sparktop status --json`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparktop.engine_ids import DEFAULT
from sparktop.observe.linkparse import LinkRate
from sparktop.observe.machine import Machine

if TYPE_CHECKING:
    from sparktop.observe.prometheus import Histogram

GIB = 1024**3

# The engine states in which it answers and its figures are read (charted, summed, kept in the history).
LIVE_STATES = ("ready", "sleeping", "hung")

# The engine figures the monitor shows, by the name `EngineSnapshot.not_exported` lists them under,
# with what people call them.
FIGURES: dict[str, str] = {
    "kv": "KV cache", "running": "running", "waiting": "queued", "prompt_tps": "prompt t/s",
    "gen_tps": "gen t/s", "prefix": "prefix hits", "preemptions": "preemptions",
    "finished": "requests done", "ttft": "TTFT", "itl": "ITL", "queue": "queue", "e2e": "e2e",
    "spec": "speculative decoding",
}


@dataclass
class Memory:
    """Unified memory, from /proc/meminfo (bytes)."""

    total: int
    available: int
    free: int = 0
    buffers: int = 0
    cached: int = 0
    swap_total: int = 0
    swap_free: int = 0

    @property
    def used(self) -> int:
        # GB10 has no separate GPU memory: used is what the kernel cannot give back.
        return max(0, self.total - self.available)

    @property
    def page_cache(self) -> int:
        return self.buffers + self.cached

    @property
    def swap_used(self) -> int:
        return max(0, self.swap_total - self.swap_free)

    @property
    def used_fraction(self) -> float:
        return self.used / self.total if self.total else 0.0


@dataclass
class Gpu:
    name: str | None = None
    util: float | None = None  # percent
    temp: float | None = None  # C
    power: float | None = None  # W
    sm_clock: float | None = None  # MHz
    pstate: str | None = None
    # Why its clocks are held down now (NVML's clock event reasons, in words); None: not read
    throttle: list[str] | None = None
    max_sm_clock: float | None = None  # MHz, the SM clock's ceiling (clocks.max.sm, read once); None: not read


@dataclass
class Disk:
    """A filesystem a Spark's work lives on (`df -P`): the root's, the Hugging Face cache's, Docker's root's."""

    mount: str  # where it is mounted: "/"
    total: int  # bytes
    free: int  # bytes a user can still write (df's Available: the blocks reserved for root left out)
    holds: list[str] = field(default_factory=list)  # what lives on it: root | hf_cache | docker
    device: str = ""  # the filesystem as df names it: /dev/nvme0n1p2


@dataclass
class GpuProcess:
    pid: int
    name: str
    used_mib: int | None
    container_id: str | None = None  # from its cgroup: the container it runs in

    def container(self, containers: list[Container]) -> Container | None:
        """The container (of `docker ps`) this process runs in."""
        if not self.container_id:
            return None
        return next((c for c in containers if c.id and (c.id.startswith(self.container_id)
                                                        or self.container_id.startswith(c.id))), None)


@dataclass
class Container:
    name: str
    image: str
    state: str  # running | exited | created | ...
    status: str  # "Up 3 minutes", "Exited (1) 2 seconds ago"
    id: str = ""
    command: str = ""
    running_for: str = ""
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class ServerProcess:
    """A vLLM API server running as a plain process on a node (outside Docker)."""

    pid: int
    argv: list[str]
    ports: list[int] = field(default_factory=list)  # the TCP ports it listens on
    # socket: read from its open sockets | flag: its --port (vLLM's 8000 without one), because its
    # sockets could not be read (another user's process) or it does not listen yet
    port_source: str = "socket"
    # vllm serve | vllm api_server | sparktop twin serve | sglang launch_server | llama-server | trtllm-serve | ...
    command: str = "vllm serve"
    engine: str = DEFAULT  # the engine module that knows it (`observe/engines/`): vllm | sglang | llama.cpp | ...


@dataclass
class NodeSnapshot:
    name: str
    t: float
    state: str = "connecting"  # connecting | ok | stale | down
    reason: str | None = None
    memory: Memory | None = None
    cpu_pct: float | None = None
    gpu: Gpu | None = None
    gpu_status: str = "unknown"  # ok | missing | error text
    processes: list[GpuProcess] = field(default_factory=list)
    containers: list[Container] = field(default_factory=list)
    docker_status: str = "unknown"  # ok | missing | error text
    poll_ms: float | None = None
    servers: list[ServerProcess] = field(default_factory=list)  # engines started outside Docker
    servers_rss_mib: float | None = None  # resident memory of those engines' processes (and vLLM's cores)
    # Per RDMA device of its ConnectX-7: RDMA and kernel Gb/s each way since the previous poll (empty where
    # the node has none, or on its first poll).
    links: list[LinkRate] = field(default_factory=list)
    machine: Machine | None = None  # which GB10 (or other) machine, from DMI
    # The RDMA ports' addresses (`ip -br addr`, read every few seconds): netdev -> "169.254.44.136/16", ...
    addresses: dict[str, tuple[str, ...]] = field(default_factory=dict)
    disks: list[Disk] = field(default_factory=list)  # read with the slow tier, one per filesystem; []: not read

    @property
    def engines_mib(self) -> int:
        """Memory held by GPU processes (every engine's workers, Ray's, llama.cpp's rpc-server); where
        nvidia-smi lists none (a node without it, a CPU engine), what the engine processes hold."""
        if self.processes:
            return sum(p.used_mib or 0 for p in self.processes)
        return round(self.servers_rss_mib or 0)


@dataclass
class EngineSnapshot:
    key: str  # stable identity: the endpoint URL
    url: str
    t: float
    # connecting | starting | ready | sleeping | hung | unreachable | stale | failed; sleeping: vLLM's sleep
    # mode (it answers, but serves nothing until woken up), see `sleep_level`; hung: it answers, but makes no
    # tokens while requests wait (`observe.hang`; `reason` says for how long, with how many)
    state: str = "connecting"
    reason: str | None = None
    node: str | None = None
    # What answers: the engine's id (vllm | sglang | llama.cpp | trtllm | ollama | tgi | openai, the last any
    # other OpenAI-compatible server) or `router` (LiteLLM: its tokens are its engines'); "" for an address
    # given that has not answered (what it is, nothing says yet)
    kind: str = DEFAULT
    engine: str | None = None  # the engine's name for people: "vLLM", "SGLang", "llama.cpp", "TensorRT-LLM", ...
    recognised: str | None = None  # how it was recognised: "owned_by sglang in /v1/models", "Server: llama.cpp header"
    # The figures (`FIGURES` keys) this engine does not export: shown as such, never as 0 or a blank
    not_exported: list[str] = field(default_factory=list)
    topology: str | None = None
    container: str | None = None
    stage: str | None = None  # startup stage while starting
    model: str | None = None
    version: str | None = None
    max_model_len: int | None = None
    kv_usage: float | None = None  # 0..1
    running: float | None = None
    waiting: float | None = None
    prompt_tps: float | None = None
    gen_tps: float | None = None  # over the rate window (10 s unless set)
    gen_tps_now: float | None = None  # since the previous poll: bursty, for the sparkline
    prompt_tps_now: float | None = None
    ttft_p50: float | None = None  # seconds
    ttft_p95: float | None = None
    itl_p50: float | None = None
    itl_p95: float | None = None
    prefix_hit_rate: float | None = None  # 0..1 over the window
    preemptions: float | None = None  # since the engine started
    requests: float | None = None  # finished requests since start
    # vLLM 0.32 and later; None when the engine does not export them.
    waiting_by_reason: dict[str, float] | None = None  # capacity | deferred (sums to `waiting`)
    rejections: float | None = None  # requests refused by a queue limit since the API server started
    rejections_by_reason: dict[str, float] | None = None  # max_num_queued_reqs | max_num_queued_tokens
    rejection_rate: float | None = None  # per second, last few seconds
    rejections_recent: float | None = None  # over the last 30 s (less when watched for less)
    rejections_span: float | None = None  # the seconds `rejections_recent` covers
    sleep_level: int | None = None  # while sleeping: 1 weights offloaded, 2 all discarded (None: KV only)
    mem_read_bps: float | None = None  # bytes/s per GPU, vLLM's estimate; None when it reports none
    mem_write_bps: float | None = None
    finished_rate: float | None = None  # requests finished per second (every reason), last few seconds
    finished_rate_by_reason: dict[str, float] | None = None  # stop | length | abort | error | repetition
    finished_by_reason: dict[str, float] | None = None  # since the engine started
    prompt_tokens_total: float | None = None  # since the engine started
    gen_tokens_total: float | None = None
    started_at: float | None = None  # unix time the engine started (its counters' creation)
    # {"ttft" | "itl" | "queue" | "e2e": {"p50", "p95", "p99" (last 30 s), "p95_1m" (last minute)}}, seconds
    latency: dict[str, dict[str, float | None]] | None = None
    latency_histograms: dict[str, Histogram] | None = None  # the histograms `latency` is from (`replicas` sums them)
    queue_slow: float | None = None  # requests in the last 30 s that waited over 5 s in the queue
    spec_acceptance: float | None = None  # speculative decoding: drafted tokens accepted, 0..1, last 30 s
    spec_accept_len: float | None = None  # ... and tokens per step of a draft accepted, mean
    slots: int | None = None  # llama.cpp: parallel slots (its largest batch); busy ones are `running`
    # a router that says how it sees its replicas (HAProxy's health checks): each one's state, UP, DOWN, ...
    backends: dict[str, str] | None = None
    poll_ms: float | None = None
    error: str | None = None  # failed: the first error line of its death, from the container's log
    # how it was found: "given (--engine)", "container vllm-solo", "process 4242 (vllm serve, port 8000)",
    # "default port 8000"
    found: str | None = None
    # its server's command line where discovery read it (a process's, a container's), secrets masked: what
    # a prediction for it reads its serving flags from (`launch.prediction.subject_for_engine`)
    argv: list[str] = field(default_factory=list)
    image: str | None = None  # its container's image (names its build: the stack a prediction uses)
    # what its launch labelled it with: the card, format and stack `predict` used (`labels.PREDICTION`)
    serves: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.model or self.url

    def exports(self, figure: str) -> bool:
        """Whether this engine exports a figure (`FIGURES`); unknown until it has been read."""
        return figure not in self.not_exported

    def not_exported_text(self, *figures: str) -> str:
        """"TTFT, ITL: not exported by llama.cpp" for the given figures it lacks (all of them by default)."""
        names = [FIGURES[f] for f in (figures or tuple(FIGURES)) if f in self.not_exported]
        return f"{', '.join(names)}: not exported by {self.engine or self.kind}" if names else ""

    @property
    def mem_bw(self) -> float | None:
        """Bytes read and written per second per GPU (vLLM's estimate)."""
        if self.mem_read_bps is None and self.mem_write_bps is None:
            return None
        return (self.mem_read_bps or 0.0) + (self.mem_write_bps or 0.0)

    def pct(self, name: str, which: str) -> float | None:
        """A latency percentile in seconds: `pct("queue", "p95_1m")`."""
        return ((self.latency or {}).get(name) or {}).get(which)

    @property
    def errors_rate(self) -> float:
        """Requests per second that ended in error or were aborted."""
        by = self.finished_rate_by_reason or {}
        return by.get("error", 0.0) + by.get("abort", 0.0)

    @property
    def deferred(self) -> float:
        """Waiting requests held back by a transient constraint (LoRA budget,
        KV transfer), not by lack of capacity."""
        return (self.waiting_by_reason or {}).get("deferred", 0.0)

    @property
    def sleep_text(self) -> str:
        """"sleeping (level 1)", or "sleeping" when only its KV cache is released."""
        return "sleeping" if self.sleep_level is None else f"sleeping (level {self.sleep_level})"


@dataclass
class EngineGone:
    """An engine disappeared (its container was removed)."""

    key: str


@dataclass
class Notice:
    """One line of the event log (`observe.notices` says when)."""

    t: float  # unix time
    subject: str  # "engine" | "node"
    key: str  # the engine's URL or the node's name
    kind: str  # down | back | ready | restarted | preempting | kv_high | queue_slow | error | rejecting
    #            | sleeping | woke | gone | hung | hung_cleared | restart_loop | node_lost | node_back
    #            | memory_low | memory_ok; the watchdog's (`launch.watchdog`): watchdog_restart |
    #            watchdog_restart_failed | watchdog_gave_up | watchdog_elsewhere; canary_refused (`observe.canary`)
    level: str  # info | warn | error
    text: str
    # The lines behind it, where it has some: the last lines of an engine's log before the watchdog acted
    lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = {"t": self.t, "subject": self.subject, "key": self.key, "kind": self.kind, "level": self.level,
             "text": self.text}
        if self.lines:
            d["lines"] = list(self.lines)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Notice:
        return cls(t=d["t"], subject=d["subject"], key=d["key"], kind=d["kind"], level=d["level"], text=d["text"],
                   lines=list(d.get("lines") or []))



def to_dict(obj: Any) -> Any:
    return dataclasses.asdict(obj)


def node_from_dict(d: dict) -> NodeSnapshot:
    d = dict(d)
    if d.get("memory"):
        d["memory"] = Memory(**d["memory"])
    if d.get("gpu"):
        d["gpu"] = Gpu(**d["gpu"])
    d["processes"] = [GpuProcess(**p) for p in d.get("processes", [])]
    d["containers"] = [Container(**c) for c in d.get("containers", [])]
    d["servers"] = [ServerProcess(**p) for p in d.get("servers", [])]
    d["links"] = [LinkRate(**x) for x in d.get("links", [])]
    if d.get("machine"):
        d["machine"] = Machine(**d["machine"])
    d["addresses"] = {k: tuple(v) for k, v in (d.get("addresses") or {}).items()}
    d["disks"] = [Disk(**x) for x in d.get("disks") or []]
    return NodeSnapshot(**d)


def engine_from_dict(d: dict) -> EngineSnapshot:
    if d.get("latency_histograms"):  # JSON made its bucket bounds strings ("Infinity" too) and its pairs lists
        d = {**d, "latency_histograms": {name: ({float(le): n for le, n in buckets.items()}, total)
                                     for name, (buckets, total) in d["latency_histograms"].items()}}
    return EngineSnapshot(**d)


# What the poller (and a replay) yields: the observation events.
ObserveEvent = NodeSnapshot | EngineSnapshot | EngineGone | Notice
