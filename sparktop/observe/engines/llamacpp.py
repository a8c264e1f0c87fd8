"""llama.cpp's `llama-server`: recognised by its `Server: llama.cpp` header
(or `owned_by: llamacpp` in /v1/models, or its /props); found as
`llama-server` in containers (`ghcr.io/ggml-org/llama.cpp:server*`,
sparkrun's `scitrera/dgx-spark-llama-cpp`) and processes (`rpc-server`, `ggml-rpc-server` in newer builds, is a
worker of a two-node layout: no API of its own); read from `/metrics`
(only with `--metrics`; 501 otherwise) and `/slots`.

Read from llama.cpp's source (tools/server, build b11434):
- counters only for rates: `llamacpp:prompt_tokens_total` (prompt tokens
  computed, cached ones excluded, counted when a prompt is done),
  `prompt_tokens_cached_total`, `tokens_predicted_total`, the speculative
  `spec_decode_num_*_total`; its `*_tokens_seconds` gauges are averages
  since the previous scrape (they reset on every read), so never used;
- `tokens_predicted_total` grows only when a request ends, so a long
  generation would read as 0 t/s until it finished: the generation rate is
  that counter plus the tokens each busy slot has decoded so far
  (`/slots`' `n_decoded`), over the same window as every engine's rate;
- `requests_processing` (busy slots) and `requests_deferred` (waiting for
  a slot) are the running and queued requests;
- there is no KV gauge (removed upstream) and no latency histogram: the KV
  cache is read from `/slots` (prompt and generated tokens held by each busy
  slot over the cache's size: one buffer of n_ctx tokens with a unified KV,
  else n_ctx per slot), TTFT, ITL, queue and end-to-end are not exported;
- prefix hits: cached over all prompt tokens (computed plus cached).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from sparktop import engine_ids
from sparktop.layouts import Layout
from sparktop.observe import argv as a
from sparktop.observe.engine_log import LogPatterns
from sparktop.observe.engines.base import Answer, Engine, EngineUnreachable, Get, what_is_wrong
from sparktop.observe.prometheus import Derived, MetricNames, MetricsError
from sparktop.observe.snapshot import FIGURES, EngineSnapshot

# llama-server's log (tools/server, common/, src/ at b11434): "0.00.004.554 I srv    load_model: loading model ...".
LOG = LogPatterns(
    stages=(("initializing", re.compile(r"llama_server: initializing")),
            ("loading weights", re.compile(r"load_model: loading model|load_tensors: loading model tensors")),
            ("kv cache", re.compile(r"llama_kv_cache: |initializing, n_slots = ")),
            ("ready", re.compile(r"llama_server: model loaded|listening on http|server is listening on"))),
    failure=re.compile(r"error loading model|failed to load model|failed to create.?context|failed to allocate|"
                       r"exiting due to|Failed to connect to|couldn't bind HTTP server|cudaMalloc failed"),
    wrapper=re.compile(r"exiting due to|failed to load model, '|failed to create_context with model|"
                       r"failed to load model '|llama_model_load_from_file_impl"),
    dead=re.compile(r"GGML_ASSERT|GGML_ABORT|CUDA error|ggml_cuda_error|terminate called|Segmentation fault"),
    kv_tokens=re.compile(r"llama_kv_cache: size = .*\((\d+) cells"),
    level=re.compile(r"^\d+\.\d\d\.\d\d\d\.\d\d\d (?P<level>[IWEDF]) "),
)
RPC_SERVERS = ("rpc-server", "ggml-rpc-server")  # a worker of a two-node layout (named so since 2026)
NAMES = MetricNames(
    prefix="llamacpp:",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    prompt_tokens=("llamacpp:prompt_tokens_total",),
    gen_tokens=("llamacpp:tokens_predicted_total",),
    cached_tokens=("llamacpp:prompt_tokens_cached_total",),
    spec_drafts=("llamacpp:spec_decode_num_drafts_total",),
    spec_draft_tokens=("llamacpp:spec_decode_num_draft_tokens_total",),
    spec_accepted=("llamacpp:spec_decode_num_accepted_tokens_total",),
)


class LlamaCpp(Engine):
    row = engine_ids.get("llama.cpp")
    names = NAMES
    metrics_path = "/metrics"
    owned_by = ("llamacpp",)
    server_header = "llama.cpp"
    info_path = "/props"
    process_arg = r"(^|/)llama-serve[r]$|(^|/)(ggml-)?rpc-serve[r]$"
    process_bytes = (b"llama-server", b"rpc-server")
    extra_figures = ("kv",)
    log = LOG

    def __init__(self, how: str = ""):
        super().__init__(how)
        self.slots: int | None = None
        self.slot_ctx: int | None = None  # tokens each slot may hold
        self.ctx_train: int | None = None
        self.unified: bool | None = None  # one KV buffer shared by the slots (--kv-unified, or -np auto)
        self.metrics_off = False  # started without --metrics (501)
        self.slots_off = False  # started with --no-slots
        self._decoding = 0  # tokens the busy slots have decoded so far (in no counter yet)
        self._generated: deque[tuple[float, float]] = deque()  # (t, counted + decoding), for the rate

    @classmethod
    def claims_info(cls, answer: Answer) -> str | None:
        data = answer.json()
        if answer.status == 200 and isinstance(data, dict) and "default_generation_settings" in data and \
                "total_slots" in data:
            return "/props answered as llama-server's"
        return None

    @classmethod
    def command(cls, argv: list[str]) -> str | None:
        for arg in argv[:3]:
            if a.basename(arg) in ("llama-server", *RPC_SERVERS):
                return a.basename(arg)
        return None

    @classmethod
    def is_worker(cls, argv: list[str]) -> bool:
        return cls.command(argv) in RPC_SERVERS

    @classmethod
    def served_model(cls, argv: list[str]) -> str | None:
        alias = a.flag_value(argv, "-a", "--alias")
        model = a.flag_value(argv, "-m", "--model", "-hf", "--hf-repo")
        return alias or (a.basename(model) if model else None)

    @classmethod
    def layout(cls, argv: list[str]) -> Layout:
        workers = cls.workers_of(argv)
        # Layers split over the head and each rpc-server: a pipeline across nodes.
        return Layout(pp=1 + len(workers)) if workers else Layout()

    @classmethod
    def workers_of(cls, argv: list[str]) -> list[str]:
        servers = a.flag_value(argv, "--rpc") or ""
        return [s.rsplit(":", 1)[0] for s in servers.split(",") if s.strip()]

    def configure(self, argv: list[str]) -> None:
        """What its command line says about its KV cache, when it is known."""
        if "--kv-unified" in argv or "-kvu" in argv:
            self.unified = True
        elif a.flag_int(argv, "-np", "--parallel") not in (None, -1):
            self.unified = False

    async def details(self, get: Get, models: Answer | None = None) -> None:
        await super().details(get, models)
        first = models.first_model() if models is not None and models.status == 200 else None
        meta = (first or {}).get("meta")
        if isinstance(meta, dict):
            self.ctx_train = _int(meta.get("n_ctx_train")) or self.ctx_train
        try:
            answer = await get("/props")
        except EngineUnreachable:
            return
        props = answer.json() if answer.status == 200 else None
        if not isinstance(props, dict):
            return
        self.slots = _int(props.get("total_slots")) or self.slots
        settings = props.get("default_generation_settings")
        if isinstance(settings, dict):
            self.slot_ctx = _int(settings.get("n_ctx")) or self.slot_ctx
        self.max_model_len = self.slot_ctx or self.max_model_len  # what one request may hold
        if props.get("build_info"):
            self.version = str(props["build_info"])
        if props.get("model_alias") and not self.model:
            self.model = str(props["model_alias"])

    async def read(self, get: Get, t: float, histograms: bool) -> Derived:
        # The counters first, then the slots: a request that ends between the two reads is then counted
        # in neither (a dip the next poll makes up), never in both (a spike no server ran).
        derived, t = await self._scrape(get, t)
        kv, busy = await self._slots(get)
        self._live_rate(derived, t)
        if kv is not None:
            derived.kv_usage = kv
            derived.missing = [f for f in derived.missing if f != "kv"]
        elif "kv" not in derived.missing:
            derived.missing.append("kv")
        if self.metrics_off and busy is not None:
            derived.running = float(busy)  # the busy slots are the running requests
            derived.missing = [f for f in derived.missing if f != "running"]
        return derived

    async def _scrape(self, get: Get, t: float) -> tuple[Derived, float]:
        """This poll's counters, and when they were read."""
        answer = await get("/metrics")
        t = answer.at or t
        if answer.status == 501:  # started without --metrics: the slots are all there is
            self.metrics_off = True
            return Derived(missing=[f for f in FIGURES if f != "kv"]), t
        if answer.status != 200:
            raise EngineUnreachable(f"/metrics answered HTTP {answer.status}", bound=True)
        self.metrics_off = False
        wrong = what_is_wrong(answer)
        if wrong is not None:
            raise EngineUnreachable(wrong, bound=True)
        assert self.metrics is not None and answer.text is not None
        try:
            derived = self.metrics.add(self.metrics.parse(answer.text, t, histograms=False))
        except MetricsError as exc:
            raise EngineUnreachable(str(exc), bound=True) from None
        # Its prompt counter excludes cached tokens: hits are cached over all prompt tokens seen.
        self._prefix(derived)
        return derived, t

    def _live_rate(self, derived: Derived, t: float) -> None:
        """Generated tokens/s from what has ended and what is being decoded now, over the rate window."""
        if derived.gen_tokens_total is None or self.slots_off or self.metrics is None:
            return
        total = derived.gen_tokens_total + self._decoding
        window = self.metrics.rate_window
        if self._generated and total < self._generated[-1][1] - self._decoding - 1:
            self._generated.clear()  # the counter went back: a restart
        self._generated.append((t, total))
        while len(self._generated) > 2 and t - self._generated[1][0] >= window:
            self._generated.popleft()
        t0, first = self._generated[0]
        if t > t0:
            derived.gen_tps = max(0.0, total - first) / (t - t0)
        if len(self._generated) > 1:
            (t1, before), (t2, now) = self._generated[-2], self._generated[-1]
            derived.gen_tps_now = max(0.0, now - before) / (t2 - t1) if t2 > t1 else None

    def _prefix(self, derived: Derived) -> None:
        assert self.metrics is not None
        scrapes = self.metrics.scrapes
        if len(scrapes) < 2:
            return
        old, new = scrapes[0], scrapes[-1]
        cached = _delta(old.total(NAMES.cached_tokens), new.total(NAMES.cached_tokens))
        computed = _delta(old.total(NAMES.prompt_tokens), new.total(NAMES.prompt_tokens))
        if cached is not None and computed is not None and cached + computed > 0:
            derived.prefix_hit_rate = cached / (cached + computed)
        # Its prompt counter leaves out the tokens served from the cache; vLLM's and SGLang's count them:
        # add them, so prompt t/s means the same beside another engine.
        recent = next((s for s in scrapes if new.t - s.t <= self.metrics.rate_window), scrapes[-2])
        cached_now = _delta(recent.total(NAMES.cached_tokens), new.total(NAMES.cached_tokens))
        if derived.prompt_tps is not None and cached_now and new.t > recent.t:
            derived.prompt_tps += cached_now / (new.t - recent.t)

    async def _slots(self, get: Get) -> tuple[float | None, int | None]:
        """(KV cache in use 0..1, busy slots) from /slots; (None, None) without it."""
        if self.slots_off:
            return None, None
        try:
            answer = await get("/slots")
        except EngineUnreachable:
            return None, None
        if answer.status == 501:
            self.slots_off = True
            return None, None
        slots = answer.json() if answer.status == 200 else None
        if not isinstance(slots, list):
            return None, None
        busy = [s for s in slots if isinstance(s, dict) and s.get("is_processing")]
        self._decoding = sum(_decoded(s) for s in busy)
        return kv_from_slots(slots, self.unified, self.ctx_train), len(busy)

    def fill(self, snap: EngineSnapshot, d: Derived) -> None:
        super().fill(snap, d)
        snap.slots = self.slots
        if self.metrics_off:
            snap.reason = "llama-server runs without --metrics: tokens/s and the queue are not exported"


def kv_from_slots(slots: list[Any], unified: bool | None = None, ctx_train: int | None = None) -> float | None:
    """The KV cache in use by requests, 0..1: the tokens each busy slot holds
    (`n_prompt_tokens`: its prompt and what it generated so far; an idle
    slot keeps its last conversation for reuse, as vLLM keeps freed blocks
    for prefix hits, and like those it is not counted), over the cache's
    size. With a unified KV (one buffer every slot may fill, llama-server's
    default when -np is not given) the cache is one slot's n_ctx; else each
    slot has its own. Unknown, it is guessed unified when the slots together
    would hold more than the model was trained for (n_ctx_train), which only
    the unified default does."""
    rows = [s for s in slots if isinstance(s, dict) and isinstance(s.get("n_ctx"), int) and s["n_ctx"] > 0]
    if not rows:
        return None
    held = sum(s["n_prompt_tokens"] for s in rows
               if s.get("is_processing") and isinstance(s.get("n_prompt_tokens"), int))
    per_slot = max(s["n_ctx"] for s in rows)
    if unified is None:
        unified = bool(ctx_train) and per_slot * len(rows) > (ctx_train or 0)
    capacity = per_slot if unified else sum(s["n_ctx"] for s in rows)
    return min(1.0, held / capacity)


def _decoded(slot: dict) -> int:
    """The tokens a busy slot has generated so far (`next_token[0].n_decoded`)."""
    tokens = slot.get("next_token")
    first = tokens[0] if isinstance(tokens, list) and tokens else tokens
    value = first.get("n_decoded") if isinstance(first, dict) else None
    return value if isinstance(value, int) and value > 0 else 0


def _delta(old: float | None, new: float | None) -> float | None:
    if old is None or new is None:
        return None
    return new - old if new >= old else new


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
