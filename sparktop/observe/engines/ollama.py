"""Ollama: recognised by `/api/version` (its /v1/models says `owned_by:
library`, which tells nothing); found as `ollama serve` in containers
(`ollama/ollama`) and processes (its model runners, `ollama runner`, are
its own children: not engines); read from `/api/ps`, the models it has
loaded and the memory each holds. It exports no Prometheus metrics: token
rates come per response only (`eval_count` / `eval_duration`), so every
serving figure is shown as not exported by Ollama.
"""

from __future__ import annotations

import re

from sparktop import engine_ids
from sparktop.observe import argv as a
from sparktop.observe.engine_log import LogPatterns
from sparktop.observe.engines.base import Answer, Engine, EngineUnreachable, Get
from sparktop.observe.prometheus import Derived
from sparktop.observe.snapshot import FIGURES, EngineSnapshot

# `ollama serve`: Go's slog lines, "time=... level=INFO source=routes.go:1 msg=\"Listening on 127.0.0.1:11434
# (version 0.12.6)\"".
LOG = LogPatterns(
    stages=(("initializing", re.compile(r"server config|Ollama")), ("ready", re.compile(r"Listening on "))),
    failure=re.compile(r"^Error: |level=ERROR"),
    dead=re.compile(r"level=ERROR .*(panic|fatal)|^panic: "),
)


class Ollama(Engine):
    row = engine_ids.get("ollama")
    info_path = "/api/version"
    process_arg = r"(^|/)ollam[a]$"
    process_bytes = (b"ollama",)
    log = LOG

    def __init__(self, how: str = ""):
        super().__init__(how)
        self.loaded: list[str] = []

    @classmethod
    def claims_info(cls, answer: Answer) -> str | None:
        data = answer.json()
        if answer.status == 200 and isinstance(data, dict) and set(data) == {"version"} and \
                answer.path == "/api/version":
            return f"/api/version answered {data['version']}"
        return None

    @classmethod
    def command(cls, argv: list[str]) -> str | None:
        for i, arg in enumerate(argv[:3]):
            if a.basename(arg) == "ollama" and argv[i + 1:i + 2] == ["serve"]:
                return "ollama serve"
        return None

    @classmethod
    def port(cls, argv: list[str]) -> int:
        return cls.default_port  # OLLAMA_HOST sets it, in the environment (its socket says where it listens)

    @classmethod
    def served_model(cls, argv: list[str]) -> str | None:
        return None  # it loads models on demand

    async def details(self, get: Get, models: Answer | None = None) -> None:
        try:
            answer = await get("/api/version")
        except EngineUnreachable:
            return
        data = answer.json() if answer.status == 200 else None
        if isinstance(data, dict) and data.get("version"):
            self.version = str(data["version"])

    async def read(self, get: Get, t: float, histograms: bool) -> Derived:
        answer = await get("/api/ps")
        if answer.status != 200:
            raise EngineUnreachable(f"/api/ps answered HTTP {answer.status}", bound=True)
        data = answer.json()
        rows = data.get("models") if isinstance(data, dict) else None
        self.loaded = [str(m.get("name") or m.get("model")) for m in rows or [] if isinstance(m, dict)]
        self.model = self.loaded[0] if self.loaded else None
        lengths = [m.get("context_length") for m in rows or [] if isinstance(m, dict)]
        self.max_model_len = next((n for n in lengths if isinstance(n, int) and n > 0), None)
        return Derived(missing=list(FIGURES))

    def fill(self, snap: EngineSnapshot, d: Derived) -> None:
        super().fill(snap, d)
        if len(self.loaded) > 1:
            snap.model = f"{self.loaded[0]} (+{len(self.loaded) - 1})"
        elif not self.loaded:
            snap.model = None
            snap.reason = "no model loaded (Ollama loads one on the first request)"
