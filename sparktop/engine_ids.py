"""Every engine's identity, in one table: what it is called (by sparktop,
by people, by other tools), the images and programs it ships as, its port
and its metric prefix.

Each layer that knows engines (observe's `Engine`, launch's `Runtime`, the
twin's `Dialect`, the performance model) keeps what it does with an engine
in its own seam, but reads *which* engine it is from here: a name anyone
types (`llama-cpp`, `--engine trt-llm`, a recipe's `runtime:`) resolves to
one id through `lookup`/`runtime_id`, the same id in every layer. The id is
what snapshots, recordings, plans' labels and dialects carry (`llama.cpp`,
not sparkrun's `llama-cpp`, which is an alias and the `sparkrun` column).

Three ids are special: `DEFAULT` where nothing is known yet (a container
before it answers, a recipe without `runtime:`), `ROUTER` for the LiteLLM
router in front of replicas, and `GENERIC` for a server that answers as
OpenAI does and as no engine sparktop knows. `HAPROXY` is the other router
(`leastconn`, the default in front of replicas); `is_router` says it of both.

Foundation: imports only `sparktop.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparktop.errors import SparktopError


@dataclass(frozen=True)
class EngineId:
    id: str  # what snapshots, plans, recipes, dialects and the model call it
    name: str  # what people read
    aliases: tuple[str, ...] = ()  # what people and other tools type (recipe runtime:, --engine, --runtime, sparkrun)
    images: tuple[str, ...] = ()  # regexes of the images it ships in (recognition: Engine.images)
    default_image: str = ""  # what a launch and the twin's demo pull when nothing names one
    programs: tuple[str, ...] = ()  # its server's executables (process list, sparkrun command:, twin stand-ins)
    default_port: int = 8000
    metric_prefix: str | None = None  # every Prometheus series of it starts with this; None: it exports none
    router: bool = False  # routes to other engines: its tokens are theirs
    sparkrun: str | None = None  # its `runtime:` in sparkrun's recipes, where sparkrun runs it
    base_model: bool = False  # the performance model's shared constants (and `stacks`) are its own


DEFAULT = "vllm"  # where nothing is known yet (a container before it answers, a recipe without runtime:)
ROUTER = "router"  # LiteLLM (the id its snapshots, plans and recordings have always carried)
HAPROXY = "haproxy"
GENERIC = "openai"

# In observe's recognition order, GENERIC last.
ROWS: tuple[EngineId, ...] = (
    EngineId("vllm", "vLLM", aliases=("vllm-distributed", "vllm-ray", "eugr-vllm"),
             images=(r"vllm", r"scitrera/dgx-spark-vllm"), default_image="nvcr.io/nvidia/vllm:25.11-py3",
             programs=("vllm",), default_port=8000, metric_prefix="vllm:", sparkrun="vllm", base_model=True),
    EngineId("sglang", "SGLang", images=(r"sglang",), default_image="lmsysorg/sglang:spark",
             programs=("sglang",), default_port=30000, metric_prefix="sglang:", sparkrun="sglang"),
    EngineId("llama.cpp", "llama.cpp", aliases=("llama-cpp", "llamacpp", "llama_cpp", "llama-server"),
             images=(r"llama\.cpp", r"llama-cpp", r"llamacpp"),
             default_image="scitrera/dgx-spark-llama-cpp:b8094-cu131",
             programs=("llama-server", "rpc-server", "ggml-rpc-server"), default_port=8080,
             metric_prefix="llamacpp:", sparkrun="llama-cpp"),
    EngineId("trtllm", "TensorRT-LLM", aliases=("tensorrt-llm", "trt-llm", "tensorrt_llm", "trt_llm", "trtllm-serve"),
             images=(r"tensorrt-llm", r"trtllm"), default_image="nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13",
             programs=("trtllm-serve",), default_port=8000, metric_prefix="trtllm_", sparkrun="trtllm"),
    EngineId("ollama", "Ollama", images=(r"(^|/)ollama(:|$)",), programs=("ollama",), default_port=11434),
    EngineId("tgi", "TGI", aliases=("text-generation-inference",), images=(r"text-generation-inference",),
             programs=("text-generation-launcher",), default_port=80, metric_prefix="tgi_"),
    EngineId(ROUTER, "LiteLLM", aliases=("litellm",), images=(r"litellm",),
             default_image="ghcr.io/berriai/litellm:v1.106.2", programs=("litellm",), default_port=4000,
             router=True),
    # HAProxy's official image (Debian trixie, built with its Prometheus exporter), pinned to a 3.2 LTS release.
    # No image patterns or programs: HAProxy fronts many things besides models, so only what sparktop launched
    # (labelled `sparktop.kind=haproxy`) or an address given is watched as a router, never any haproxy found.
    EngineId(HAPROXY, "HAProxy", default_image="haproxy:3.2.24", default_port=4000, router=True),
    EngineId(GENERIC, "an OpenAI-compatible server"),
)


# The engines sparktop recognises by name (neither the router nor GENERIC), in the table's order.
KNOWN_ENGINES: tuple[EngineId, ...] = tuple(r for r in ROWS if not r.router and r.id != GENERIC)


class UnknownEngine(SparktopError):
    pass


def _index(rows: tuple[EngineId, ...]) -> dict[str, EngineId]:
    """Every id and alias (lower-case) -> its row; a name given twice is a mistake in the table."""
    out: dict[str, EngineId] = {}
    for row in rows:
        for name in (row.id, *row.aliases):
            key = name.lower()
            if key in out:
                raise AssertionError(f"engine_ids: {name!r} names both {out[key].id} and {row.id}")
            out[key] = row
    return out


_BY_NAME = _index(ROWS)


def lookup(name: str | None) -> EngineId | None:
    """The row of an id or alias (any case, spaces around ignored); None when unknown."""
    if not name:
        return None
    return _BY_NAME.get(name.strip().lower())


def get(name: str) -> EngineId:
    """The row of an id or alias; UnknownEngine when sparktop knows no such engine."""
    row = lookup(name)
    if row is None:
        raise UnknownEngine(f"{name} is not an engine sparktop knows ({', '.join(r.id for r in ROWS)})")
    return row


def runtime_id(name: str) -> str:
    """The id of what someone typed (`llama-cpp` -> `llama.cpp`); UnknownEngine when unknown."""
    return get(name).id


def name_of(kind: str | None) -> str:
    """"SGLang" for `sglang`, "LiteLLM" for `router`; the kind itself when unknown, "engine" when none."""
    row = lookup(kind)
    return row.name if row is not None else (kind or "engine")


def is_router(kind: str | None) -> bool:
    """Whether a snapshot's or an endpoint's kind is the router (its tokens are its engines')."""
    row = lookup(kind)
    return row is not None and row.router


def typed(row: EngineId) -> str:
    """The name help texts offer for it: sparkrun's where sparkrun runs it (`llama-cpp`), else its id."""
    return row.sparkrun or row.id


def listing(words: list[str], last: str = "and") -> str:
    """["vLLM", "SGLang", "TGI"] -> "vLLM, SGLang and TGI", for help texts."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"
