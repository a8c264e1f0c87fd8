"""What every engine module fills in: how the engine is recognised by what
it answers, how it is found in a node's containers and process list, and
how its answers become an `EngineSnapshot`.

An engine module subclasses `Engine`, names its row of `engine_ids` (its
id, name, aliases, port, images: who it is) and sets the class attributes
of how it is recognised and read; the defaults read a Prometheus `/metrics`
through its `MetricNames` and the model list of `/v1/models`. Recognition and discovery are class methods
(pure functions of what was answered or what a command line says); reading
is per instance, one instance per watched endpoint, holding its scrapes.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from sparktop import engine_ids
from sparktop.engine_ids import EngineId
from sparktop.layouts import Layout
from sparktop.observe import argv as a
from sparktop.observe.engine_log import VLLM_LOG, LogPatterns
from sparktop.observe.prometheus import Derived, EngineMetrics, MetricNames, MetricsError
from sparktop.observe.snapshot import FIGURES, EngineSnapshot

MODEL_REFRESH_S = 30.0


class EngineUnreachable(Exception):
    def __init__(self, reason: str, bound: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.bound = bound  # the port accepted the connection but did not answer


class NotAnEngine(Exception):
    """Something answers at the address, but not as any engine sparktop knows."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Answer:
    """One HTTP answer, kept as the engine gave it."""

    path: str
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes
    # When the body arrived (on the probe's clock): counters are rated on the clock of their reading, not of the
    # poll's start, so a slow answer from a busy server does not bend the rate. 0 when unknown.
    at: float = 0.0

    @functools.cached_property
    def text(self) -> str | None:
        """The body as UTF-8, or None when it is not (no engine answers bytes).
        Decoded once: a scrape's 50 kB were decoded three times a poll (its
        checks, then the parse)."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def json(self) -> Any:
        """The body as JSON, or None."""
        text = self.text
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None

    @property
    def is_html(self) -> bool:
        head = (self.text or "")[:512].lstrip().lower()
        return "text/html" in self.headers.get("content-type", "") or head.startswith(("<!doctype html", "<html"))

    def owners(self) -> set[str]:
        """The `owned_by` of each model an OpenAI `/v1/models` lists."""
        data = self.json()
        rows = data.get("data") if isinstance(data, dict) else None
        return {str(m.get("owned_by")) for m in rows or [] if isinstance(m, dict) and m.get("owned_by")}

    def first_model(self) -> dict | None:
        data = self.json()
        rows = data.get("data") if isinstance(data, dict) else None
        return next((m for m in rows or [] if isinstance(m, dict) and m.get("id")), None)


Get = Callable[[str], Awaitable[Answer]]  # path -> answer; raises EngineUnreachable


def what_is_wrong(answer: Answer) -> str | None:
    """Why an answer to a metrics path is no Prometheus text, in a line, or None."""
    if answer.text is None:
        return f"{answer.path} is not Prometheus text (it answered bytes that are not UTF-8)"
    if answer.is_html:
        return f"not an engine: {answer.path} answered an HTML page"
    return None


class Engine:
    """One kind of engine. Subclasses set the class attributes and override
    what their engine does differently."""

    # Who it is: its row of `engine_ids`, which sets the six below (a subclass names its own row).
    row: ClassVar[EngineId] = engine_ids.get(engine_ids.GENERIC)
    id: ClassVar[str] = row.id  # what snapshots, plans and recipes call it
    name: ClassVar[str] = row.name  # what people read
    aliases: ClassVar[tuple[str, ...]] = row.aliases  # what people type for it: `--engine llama-cpp`
    router: ClassVar[bool] = row.router  # routes to other engines: its tokens are theirs
    default_port: ClassVar[int] = row.default_port
    images: ClassVar[tuple[str, ...]] = row.images  # regexes of the images it ships in (discovery)
    names: ClassVar[MetricNames | None] = None  # its Prometheus series (their prefix is its row's); None: none
    metrics_path: ClassVar[str | None] = None
    # Said after "/metrics answered HTTP 404" when the engine serves it only when asked to.
    metrics_off_hint: ClassVar[str] = ""
    # Recognition: `owned_by` values in /v1/models, a `Server` header, a path of its own to ask.
    owned_by: ClassVar[tuple[str, ...]] = ()
    server_header: ClassVar[str | None] = None
    info_path: ClassVar[str | None] = None
    # Discovery: the argument that names its server in a process list.
    process_arg: ClassVar[str | None] = None  # a grep -E pattern matching one argument (`[x]` keeps grep off itself)
    process_bytes: ClassVar[tuple[bytes, ...]] = ()  # substrings of such a command line (a cheap first filter)
    # The titles its processes give themselves (vLLM's `VLLM::EngineCore`, `VLLM::Worker_TP0`): they hold its
    # GPU memory and are listed under those names, not its command line.
    process_titles: ClassVar[tuple[str, ...]] = ()
    # A word its command needs besides its image for a container to be its server (vLLM's image runs `ray`
    # too: only `... serve` is the engine); None: the image is enough.
    image_needs: ClassVar[str | None] = None
    # What it exports, beyond its scrape: figures from its own JSON routes.
    extra_figures: ClassVar[tuple[str, ...]] = ()
    # How its log says where its start-up is and why it failed (`engine_log`).
    log: ClassVar[LogPatterns] = VLLM_LOG

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        row = cls.row
        cls.id, cls.name, cls.aliases, cls.router = row.id, row.name, row.aliases, row.router
        cls.default_port, cls.images = row.default_port, row.images
        prefix = cls.names.prefix if cls.names is not None else None
        if prefix != row.metric_prefix:
            raise TypeError(f"{cls.__name__}: its series start with {prefix!r}, its engine_ids row says "
                            f"{row.metric_prefix!r}")

    def __init__(self, how: str = ""):
        self.how = how  # how it was recognised: "owned_by sglang in /v1/models"
        self.metrics = EngineMetrics(self.names) if self.names is not None else None
        self.model: str | None = None
        self.max_model_len: int | None = None
        self.version: str | None = None

    # -- recognition (what it answers) ------------------------------------------------

    @classmethod
    def claims_models(cls, answer: Answer) -> str | None:
        """How its `/v1/models` answer shows it is this engine, or None."""
        server = answer.headers.get("server", "")
        if cls.server_header and server.lower().startswith(cls.server_header.lower()):
            return f"Server: {server} header"
        if answer.status == 200:
            owners = answer.owners() & set(cls.owned_by)
            if owners:
                return f"owned_by {sorted(owners)[0]} in /v1/models"
        return None

    @classmethod
    def claims_info(cls, answer: Answer) -> str | None:
        """How the answer to `info_path` shows it is this engine, or None."""
        return None

    @classmethod
    def claims_metrics(cls, answer: Answer) -> str | None:
        """How a metrics scrape shows it is this engine (its prefix), or None."""
        text = answer.text
        if cls.names is not None and text is not None and not answer.is_html and \
                re.search(rf"^{re.escape(cls.names.prefix)}", text, re.M):
            return f"{cls.names.prefix} series at {answer.path}"
        return None

    # -- discovery (a node's containers and processes) -----------------------------------

    @classmethod
    def command(cls, argv: list[str]) -> str | None:
        """What this engine's server is called in a command line ("llama-server",
        "vllm serve"), or None when `argv` does not run it."""
        return None

    @classmethod
    def is_worker(cls, argv: list[str]) -> bool:
        """A worker of an engine over several nodes: no API of its own."""
        return False

    @classmethod
    def port(cls, argv: list[str]) -> int:
        return a.flag_port(argv, cls.default_port)

    @classmethod
    def host(cls, argv: list[str]) -> str | None:
        host = a.flag_value(argv, "--host")
        return None if host in (None, "", "0.0.0.0", "::", "[::]") else host

    @classmethod
    def served_model(cls, argv: list[str]) -> str | None:
        return a.flag_value(argv, "--served-model-name", "--model")

    @classmethod
    def layout(cls, argv: list[str]) -> Layout:
        return Layout()

    @classmethod
    def head_of(cls, argv: list[str]) -> str | None:
        """For a worker: the address of the head it joins."""
        return None

    @classmethod
    def workers_of(cls, argv: list[str]) -> list[str]:
        """For a head that names its workers (llama.cpp's --rpc): their addresses."""
        return []

    @classmethod
    def from_image(cls, image: str) -> bool:
        return any(re.search(pattern, image) for pattern in cls.images)

    # -- reading ------------------------------------------------------------------------

    def configure(self, argv: list[str]) -> None:
        """What its command line says that its answers do not (where the command line is known)."""

    async def details(self, get: Get, models: Answer | None = None) -> None:
        """The served model, its context length and the engine's version:
        read when it is found and every MODEL_REFRESH_S after."""
        if models is None:
            try:
                models = await get("/v1/models")
            except EngineUnreachable:
                return
        first = models.first_model() if models.status == 200 else None
        if first is not None:
            self.model = str(first.get("id"))
            self.max_model_len = _int(first.get("max_model_len")) or self.max_model_len

    async def read(self, get: Get, t: float, histograms: bool) -> Derived:
        """This poll's figures. The default reads a Prometheus scrape."""
        if self.metrics is None or self.metrics_path is None:
            return Derived(missing=[f for f in FIGURES if f not in self.extra_figures])
        answer = await get(self.metrics_path)
        if answer.status != 200:
            hint = f": {self.metrics_off_hint}" if answer.status == 404 and self.metrics_off_hint else ""
            raise EngineUnreachable(f"{self.metrics_path} answered HTTP {answer.status}{hint}", bound=True)
        wrong = what_is_wrong(answer)
        if wrong is not None:
            raise EngineUnreachable(wrong, bound=True)
        assert answer.text is not None  # what_is_wrong said so
        try:
            scrape = self.metrics.parse(answer.text, answer.at or t, histograms=histograms)
        except MetricsError as exc:
            raise EngineUnreachable(str(exc), bound=True) from None
        derived = self.metrics.add(scrape)
        derived.read_at = scrape.t
        derived.missing = [f for f in derived.missing if f not in self.extra_figures]
        return derived

    def set_windows(self, rate: float, latency: float, poll_interval: float = 1.0) -> None:
        """Token rates over `rate` seconds, percentiles over `latency` (see `EngineMetrics.set_windows`)."""
        if self.metrics is not None:
            self.metrics.set_windows(rate, latency, poll_interval)

    def forget(self) -> None:
        """After an outage: start rates afresh, read the model again."""
        if self.metrics is not None:
            self.metrics.reset()
        self.model = None

    def fill(self, snap: EngineSnapshot, d: Derived) -> None:
        """Copy what this poll read into the snapshot."""
        for name in DERIVED_FIELDS:
            setattr(snap, name, getattr(d, name))
        snap.not_exported = list(d.missing)
        snap.kind = self.id  # LiteLLM's id is engine_ids.ROUTER
        snap.engine = self.name
        snap.recognised = self.how
        snap.model = self.model
        snap.version = self.version
        snap.max_model_len = self.max_model_len
        if d.sleeping:
            snap.state = "sleeping"
            snap.sleep_level = d.sleep_level
        else:
            snap.sleep_level = None


DERIVED_FIELDS = (
    "kv_usage", "running", "waiting", "prompt_tps", "gen_tps", "ttft_p50", "ttft_p95", "itl_p50", "itl_p95",
    "prefix_hit_rate", "preemptions", "requests", "waiting_by_reason", "rejections", "rejections_by_reason",
    "rejection_rate", "rejections_recent", "rejections_span", "mem_read_bps", "mem_write_bps", "finished_rate",
    "finished_rate_by_reason", "finished_by_reason", "prompt_tokens_total", "gen_tokens_total", "started_at",
    "latency", "latency_histograms", "queue_slow", "spec_acceptance", "spec_accept_len", "gen_tps_now",
    "prompt_tps_now",
)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
