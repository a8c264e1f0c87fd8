"""Every engine sparktop watches, one module each, and how an address is
recognised as one of them by what it answers (never by its port: NVIDIA's
llama.cpp playbook serves on 30000, SGLang's default).

Recognition asks, in order, until an engine claims the answers:
1. `/v1/models`: its `owned_by` (vllm, sglang, tensorrt_llm, llamacpp) and
   its `Server` header (llama.cpp); the routers are asked first, since the
   list a router passes on is its engine's (HAProxy adds its `Via` header);
2. each engine's own route (`info_path`: vLLM's /version, SGLang's
   /server_info, llama.cpp's /props, Ollama's /api/version, TGI's /info,
   LiteLLM's /health/liveliness, HAProxy's /haproxy/health), the engine a container or process
   suggested first;
3. a model list with none of those: any other OpenAI-compatible server;
4. the metrics routes (`/prometheus/metrics` before `/metrics`: TensorRT-LLM's
   plain /metrics empties itself when read, so it is asked last, and only
   of a server nothing else recognised), by each engine's series prefix.
What answers as none of them is no engine, said in a line ("not an engine:
/metrics answered an HTML page"). It happens when an address is first seen
and after an outage, never on an ordinary poll.

Adding an engine: its row in `sparktop/engine_ids.py` (who it is), a module
here with an `Engine` subclass naming that row (recognition, discovery,
reading), listed in `ENGINES`; a twin dialect for it in
`twin/dialects/`; tests. Engine modules never import each other.
"""

from __future__ import annotations

import re

from sparktop import engine_ids
from sparktop.observe.engines.base import Answer, Engine, EngineUnreachable, Get, NotAnEngine, what_is_wrong
from sparktop.observe.engines.haproxy import Haproxy
from sparktop.observe.engines.litellm import Litellm
from sparktop.observe.engines.llamacpp import LlamaCpp
from sparktop.observe.engines.ollama import Ollama
from sparktop.observe.engines.openai import OpenAICompatible
from sparktop.observe.engines.sglang import Sglang
from sparktop.observe.engines.tgi import Tgi
from sparktop.observe.engines.trtllm import TensorRtLlm
from sparktop.observe.engines.vllm import Vllm

__all__ = ["ENGINES", "Answer", "Engine", "EngineUnreachable", "NotAnEngine", "by_id", "for_command", "recognise"]

# Most specific first: a generic answer (a model list) is claimed by the first that recognises more.
ENGINES: tuple[type[Engine], ...] = (Vllm, Sglang, LlamaCpp, TensorRtLlm, Ollama, Tgi, Litellm, Haproxy)
GENERIC = OpenAICompatible
_KNOWN: tuple[type[Engine], ...] = (*ENGINES, GENERIC)
_BY_ID: dict[str, type[Engine]] = {e.id: e for e in _KNOWN}


def by_id(engine_id: str | None) -> type[Engine] | None:
    """The engine module of a snapshot's `kind` (or a recipe's runtime, any of its `engine_ids` names), or None."""
    row = engine_ids.lookup(engine_id)
    return _BY_ID.get(row.id) if row is not None else None


def name_of(kind: str | None) -> str:
    """"SGLang" for `sglang`, "LiteLLM" for `router`."""
    return engine_ids.name_of(kind)


def for_command(argv: list[str]) -> tuple[type[Engine], str] | None:
    """The engine a command line runs, and what its server is called ("llama-server")."""
    for engine in ENGINES:
        command = engine.command(argv)
        if command is not None:
            return engine, command
    return None


def for_image(image: str) -> type[Engine] | None:
    return next((e for e in ENGINES if e.from_image(image)), None)


def process_pattern() -> str:
    """One `grep -E` pattern matching an argument of any engine's server command."""
    return "|".join(e.process_arg for e in ENGINES if e.process_arg)


PROCESS_BYTES: tuple[bytes, ...] = tuple(b for e in ENGINES for b in e.process_bytes)
# The titles engines' processes give themselves (`VLLM::EngineCore`): such a process's first argument starts with one.
PROCESS_TITLES: tuple[str, ...] = tuple(t for e in ENGINES for t in e.process_titles)
PROCESS_TITLE_BYTES: tuple[bytes, ...] = tuple(t.encode() for t in PROCESS_TITLES)


def title_pattern() -> str:
    """One `grep -E` pattern matching the first argument of a process that titled itself (`^VLL[M]::`),
    "" when no engine does. The bracket keeps grep from matching its own command line."""
    out = []
    for title in PROCESS_TITLES:
        last = max(i for i, c in enumerate(title) if c.isalnum())
        out.append("^" + re.escape(title[:last]) + f"[{title[last]}]" + re.escape(title[last + 1:]))
    return "|".join(out)


_PROCESS_ARG = re.compile(process_pattern().replace("[", "").replace("]", ""))


def engine_argument(arg: str) -> bool:
    """Whether one argument names an engine's server (the in-process read of the process list)."""
    return bool(_PROCESS_ARG.search(arg))


async def recognise(get: Get, hint: str | None = None) -> Engine:
    """The engine answering through `get`, recognised by what it answers.

    Raises EngineUnreachable when it does not answer at all, NotAnEngine
    (with why, in a line) when what answers is none of them."""
    hinted = by_id(hint)
    order = sorted(ENGINES, key=lambda e: e is not hinted)
    # A router passes its engines' model list on (HAProxy's is a replica's, owned_by vllm): the routers are
    # asked about it before the engines are, by what they add to it (HAProxy's Via header).
    models_order = sorted(order, key=lambda e: e is not hinted and not e.router)
    asked: dict[str, Answer | None] = {}

    async def ask(path: str) -> Answer | None:
        if path not in asked:
            try:
                asked[path] = await get(path)
            except EngineUnreachable:
                asked[path] = None  # a route that hangs or drops: no claim, the others may tell
        return asked[path]

    models = await get("/v1/models")  # does it answer at all? (unreachable: raised as is)
    asked["/v1/models"] = models
    for engine in models_order:
        how = engine.claims_models(models)
        if how:
            return await _found(engine, how, get, models)
    for engine in order:
        if engine.info_path:
            answer = await ask(engine.info_path)
            how = engine.claims_info(answer) if answer is not None else None
            if how:
                return await _found(engine, how, get, models)
    if models.status == 200 and models.first_model() is not None:
        return await _found(GENERIC, "lists models at /v1/models, and answers as no engine sparktop knows", get,
                            models)
    for path in dict.fromkeys(e.metrics_path for e in order if e.metrics_path and e.metrics_path != "/metrics"):
        answer = await ask(path)
        for engine in order:
            how = engine.claims_metrics(answer) if answer is not None and answer.status == 200 else None
            if how:
                return await _found(engine, how, get, models)
    metrics = await ask("/metrics")
    if metrics is not None and metrics.status == 200:
        for engine in order:
            how = engine.claims_metrics(metrics)
            if how:
                return await _found(engine, how, get, models)
    raise NotAnEngine(_why_not(models, metrics))


async def _found(engine: type[Engine], how: str, get: Get, models: Answer) -> Engine:
    found = engine(how)
    await found.details(get, models)
    return found


def _why_not(models: Answer, metrics: Answer | None) -> str:
    if metrics is not None and metrics.status == 200:
        wrong = what_is_wrong(metrics)
        if wrong:
            return wrong
    if models.is_html:
        return "not an engine: /v1/models answered an HTML page"
    said = f"/v1/models answered HTTP {models.status}" if models.status != 200 else "/v1/models lists no model"
    if metrics is None:
        return f"not an engine sparktop knows: {said}, /metrics did not answer"
    if metrics.status != 200:
        return f"not an engine sparktop knows: {said}, /metrics answered HTTP {metrics.status}"
    return f"not an engine sparktop knows: {said}, and /metrics has no engine's series"
