"""Recipes: what to run (model, image, the engine's arguments, environment, limits).

A recipe is one YAML file. sparktop's own format::

    name: gpt-oss-120b
    description: OpenAI gpt-oss-120b, MXFP4
    model: openai/gpt-oss-120b
    runtime: vllm                        # vllm (default) | sglang | llama-cpp | trtllm
    served_model_name: gpt-oss-120b     # optional
    image: nvcr.io/nvidia/vllm:25.11-py3 # optional, else the inventory default (defaults.images per runtime)
    port: 8000                           # optional, else the inventory default
    vllm:                                # flag -> value; true = bare flag (`args:` for any runtime,
      gpu_memory_utilization: 0.70      #   in its own flag names: mem_fraction_static, ctx_size, ...)
      max_model_len: 131072
    extra_args: ["--enable-auto-tool-choice"]
    env: {VLLM_USE_FLASHINFER_MOE_FP4: "0"}
    limits: {solo_only: false, cluster_only: false, min_nodes: 1, max_nodes: 8}
    topologies:                          # per-topology overrides
      cluster-mp: {vllm: {max_model_len: 262144}}
    memory: {weights_gib: 61}            # or params_b + bits
    config: {...}                        # TensorRT-LLM: its --extra_llm_api_options YAML

A llama.cpp recipe's model is a GGUF: `REPO:QUANT` (`-hf`) or a `.gguf` path
on the nodes (`-m`); its `card:` names the model sparktop predicts for.

Validation happens on load and every error names the file, the line and
the key, with a did-you-mean for unknown keys. Flags the topology decides
(host, port, tensor parallelism, the distributed backend, node ranks) are
refused in recipes, as are literal secrets: HF_TOKEN and API keys come from
the environment of the person launching, never from a file.

Community formats are read too (see `community.py`): eugr's
spark-vllm-docker `recipe_version: "1"` files and sparkrun's version 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparktop.engine_ids import DEFAULT
from sparktop.errors import ConfigError, SparktopError
from sparktop.launch.runtimes import RUNTIMES, UnknownRuntime, runtime_for, runtime_id
from sparktop.layouts import MAX_NODES, Layout, LayoutError, parse_layout
from sparktop.model.cards import UnknownModel, find_card
from sparktop.model.gguf import gguf_card, gguf_format
from sparktop.model.quant import Quantization
from sparktop.model.serving import Serving
from sparktop.yamlfile import check_keys, line_of

TOPOLOGIES = ("solo", "cluster-ray", "cluster-mp", "shuffle", "least-busy")
CLUSTER_TOPOLOGIES = ("cluster-ray", "cluster-mp")
ROUTER_TOPOLOGIES = ("shuffle", "least-busy")

# vLLM's flags the topology and the inventory decide, never a recipe (the launcher's extra args are vLLM's);
# each runtime's own are its `reserved`.
RESERVED_FLAGS = {r.replace("_", "-") for r in runtime_for(DEFAULT).reserved}
# The recipe keys a runtime's flags go under: `args:`, and the keys of runtimes' own (vLLM's `vllm:`).
FLAG_KEYS = ("args", *sorted({r.flags_key for r in RUNTIMES.values()} - {"args"}))
SECRET_NAMES = re.compile(r"(TOKEN|API_KEY|SECRET|PASSWORD|MASTER_KEY)$", re.I)
FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")

TOP_KEYS = ("name", "description", "model", "runtime", "served_model_name", "image", "port", "vllm", "args",
            "extra_args", "env", "limits", "topologies", "memory", "card", "quantization", "config")
LIMIT_KEYS = ("solo_only", "cluster_only", "min_nodes", "max_nodes")
OVERRIDE_KEYS = ("vllm", "args", "extra_args", "env", "image", "port")
MEMORY_KEYS = ("weights_gib", "params_b", "bits")


@dataclass
class Override:
    flags: dict[str, Any] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    port: int | None = None


@dataclass
class Recipe:
    id: str  # how it is named on the command line (the file name without .yaml)
    name: str
    model: str
    path: Path | None = None
    format: str = "sparktop"
    description: str = ""
    served_model_name: str | None = None
    image: str | None = None
    port: int | None = None
    # The engine's flags (`args:`, or vLLM's `vllm:`), in its own names: flag -> value.
    flags: dict[str, Any] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    solo_only: bool = False
    cluster_only: bool = False
    min_nodes: int = 1
    max_nodes: int = MAX_NODES  # the nodes a layout of it may take (community formats default to 2)
    topologies: dict[str, Override] = field(default_factory=dict)
    weights_gib: float | None = None
    params_b: float | None = None
    bits: float | None = None
    card: str | None = None
    quantization: str | None = None
    pass_env: list[str] = field(default_factory=list)  # passed by name from the launching environment
    runtime: str = DEFAULT  # the runtime that serves it (`launch/runtimes/`)
    engine_config: dict[str, Any] = field(default_factory=dict)  # TensorRT-LLM's options file (`config:`)

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    def allowed_topologies(self, node_count: int) -> list[str]:
        """The five two-node names this recipe can run as on `node_count` nodes."""
        return [t for t in TOPOLOGIES if self.why_not_layout(parse_layout(t), node_count) is None]

    def why_not(self, topology: str, node_count: int) -> str:
        try:
            layout = parse_layout(topology)
        except LayoutError as exc:
            return str(exc)
        return self.why_not_layout(layout, node_count) or f"{topology} is not allowed for {self.id}"

    def why_not_layout(self, layout: Layout, node_count: int) -> str | None:
        """Why this recipe cannot run in `layout` on `node_count` nodes (None: it can).
        `max_nodes` bounds the nodes the layout takes, `min_nodes` those of
        one engine (a model that does not fit fewer)."""
        k = layout.nodes_per_engine
        name = layout.name
        if layout.nodes > node_count:
            count = "two nodes" if layout.nodes == 2 else f"{layout.nodes} nodes"
            return f"{name} needs {count}; the inventory has {node_count}"
        if k == 1 and (self.cluster_only or self.min_nodes > 1):
            if layout.router:
                return f"{name} runs {self.id} solo on each node, but it is cluster only"
            return f"{self.id} is cluster only: it does not fit one Spark"
        if k > 1 and self.solo_only:
            return f"{self.id} is solo only"
        if k < self.min_nodes:
            return f"{self.id} needs engines of at least {self.min_nodes} nodes; {name} spreads one over {k}"
        if layout.ep:
            card = self.twin_card()
            if card is not None and not card.is_moe:
                return f"{name}: expert parallel spreads a MoE model's experts; {self.id} is a dense model"
        if layout.nodes > self.max_nodes:
            return (f"runs on at most {self.max_nodes} node{'s' * (self.max_nodes != 1)} "
                    f"(limits.max_nodes); {name} takes {layout.nodes}")
        if k > 1:
            why = runtime_for(self.runtime).why_not(layout)
            if why:
                return f"{name}: {why}"
        return None

    def settings(self, topology: str) -> tuple[dict[str, Any], list[str], dict[str, str], str | None, int | None]:
        """The engine's flags, extra args, env, image, port for one topology."""
        flags = dict(self.flags)
        extra = list(self.extra_args)
        env = dict(self.env)
        image, port = self.image, self.port
        override = self.topologies.get(topology)
        if override:
            flags.update(override.flags)
            extra += override.extra_args
            env.update(override.env)
            image = override.image or image
            port = override.port or port
        return flags, extra, env, image, port

    def estimated_weights_gib(self) -> float | None:
        if self.weights_gib:
            return self.weights_gib
        if self.params_b and self.bits:
            return self.params_b * 1e9 * self.bits / 8 / 1024**3 * 1.05  # plus embeddings and scales
        card = self.twin_card()
        return card.weights_gib if card else None

    def serving(self, topology: str, overrides: dict | None = None) -> Serving:
        """The engine settings this recipe gives its engine for `topology` (and
        `--set` overrides), as the performance model reads them."""
        args, *_ = self.settings(topology)
        flags = runtime_for(self.runtime).serving_flags({**args, **(overrides or {})})
        return Serving.from_flags({k: v for k, v in flags.items() if k != "kv_cache_free_fraction"},
                                  where=str(self.path))

    def quant_shown(self) -> str:
        """The weights' format as `recipes` and the launcher show it: the recipe's `quantization`, else its
        card's ("—" with no card)."""
        card = self.twin_card()
        return self.quantization or (card.quant.scheme if card is not None else "—")

    def twin_card(self):
        """The model card this recipe serves (None: sparktop has no card for
        it), in the weight format the recipe's `quantization` names when that
        is one the performance model knows and differs from the card's."""
        for name in (self.card, self.model, self.served_model_name, self.id):
            if not name:
                continue
            try:
                gguf = runtime_for(self.runtime).weights == "gguf"
                card = find_card(name) if not gguf or name == self.card else gguf_card(name)
            except UnknownModel:
                continue
            quantization = self.quantization or (gguf_format(self.model) if gguf else None)
            if quantization:
                try:
                    quant = Quantization.of(quantization)
                except SparktopError:
                    return card
                if quant.scheme != card.quant.scheme and (quant.experts, quant.linear) != (
                        card.quant.experts, card.quant.linear):
                    card = dataclasses.replace(card, quant=quant)
            return card
        return None


def flag_args(flags: dict[str, Any]) -> list[str]:
    """`{gpu_memory_utilization: 0.7, enforce_eager: true}` -> vLLM argv items (other runtimes spell
    theirs through their `Runtime.flag_args`)."""
    out: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out.append(flag)
            out.extend(str(v) for v in value)
        elif isinstance(value, dict):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            out += [flag, str(value)]
    return out


# -- loading ------------------------------------------------------------------------


def _err(path, container, key, where, message):
    return ConfigError(str(path), line_of(container, key), where, message)


def _str_map(raw, path, parent, key, where) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _err(path, parent, key, where, "must be a mapping of NAME: value")
    out = {}
    for name, value in raw.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            raise _err(path, raw, name, f"{where}.{name}", "is not a valid environment variable name")
        if isinstance(value, (dict, list)):
            raise _err(path, raw, name, f"{where}.{name}", "must be a string or a number")
        if SECRET_NAMES.search(str(name)) and value not in (None, ""):
            raise _err(path, raw, name, f"{where}.{name}",
                       "looks like a secret; do not write secrets in recipes — sparktop passes "
                       f"{name} from your environment by name")
        out[str(name)] = "" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
    return out


def _flag_map(raw, path, parent, key, where, runtime: str = DEFAULT) -> dict[str, Any]:
    """A mapping of the runtime's flags, checked: valid names, none the layout decides, sane values."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _err(path, parent, key, where, "must be a mapping of flag: value")
    rt = runtime_for(runtime)
    reserved = {r.replace("_", "-") for r in rt.reserved}
    out = {}
    for name, value in raw.items():
        name_s = str(name).lstrip("-")
        name_s = rt.short_flags.get(name_s, name_s)  # llama-server's `c: 8192` is its ctx_size
        flag = name_s.replace("_", "-")
        here = f"{where}.{name}"
        if not FLAG_NAME.match(name_s):
            raise _err(path, raw, name, here, f"is not a {rt.name} flag name")
        if flag in reserved:
            raise _err(path, raw, name, here, "is set by sparktop from the topology and inventory; remove it "
                                              "(use the top-level port / served_model_name keys)")
        if SECRET_NAMES.search(name_s) and value not in (None, "", False):
            # A flag's value is on the command line: in every process list and in the plan sparktop prints.
            raise _err(path, raw, name, here, "looks like a secret; do not write secrets in recipes — set it in "
                                              "your environment and pass it by name (`pass_env:`; vLLM reads "
                                              "VLLM_API_KEY, llama-server LLAMA_API_KEY)")
        if flag in ("gpu-memory-utilization", "mem-fraction-static", "kv-cache-free-gpu-memory-fraction") and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1):
            raise _err(path, raw, name, here, f"{name_s} must be between 0 and 1, got {value}")
        if flag in ("max-model-len", "max-num-seqs", "max-num-batched-tokens", "max-cudagraph-capture-size",
                    "context-length", "max-running-requests", "ctx-size", "parallel", "max-batch-size",
                    "max-num-tokens", "max-seq-len") and \
                (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise _err(path, raw, name, here, f"must be a positive integer, got {value!r}")
        out[name_s.replace("-", "_")] = value
    return out


def _str_list(raw, path, parent, key, where) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        import shlex

        return shlex.split(raw)
    if not isinstance(raw, list) or not all(isinstance(x, (str, int, float)) for x in raw):
        raise _err(path, parent, key, where, "must be a list of strings")
    return [str(x) for x in raw]


def _int(raw, path, parent, key, where, low=None, high=None) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _err(path, parent, key, where, f"must be an integer, got {raw!r}")
    if (low is not None and raw < low) or (high is not None and raw > high):
        raise _err(path, parent, key, where, f"must be between {low} and {high}, got {raw}")
    return raw


def _bool(raw, path, parent, key, where) -> bool:
    if not isinstance(raw, bool):
        raise _err(path, parent, key, where, f"must be true or false, got {raw!r}")
    return raw


def _number(raw, path, parent, key, where) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw <= 0:
        raise _err(path, parent, key, where, f"must be a positive number, got {raw!r}")
    return float(raw)


def parse_native(doc: dict, path: Path) -> Recipe:
    check_keys(doc, TOP_KEYS, path)
    for required in ("name", "model"):
        if not doc.get(required):
            raise ConfigError(str(path), getattr(doc, "line", None), required, "is required")
    recipe = Recipe(id=path.stem, name=str(doc["name"]), model=str(doc["model"]), path=path)
    if doc.get("runtime") is not None:
        try:
            recipe.runtime = runtime_id(str(doc["runtime"]))
        except UnknownRuntime as exc:
            raise _err(path, doc, "runtime", "runtime", str(exc)) from None
    _check_flag_keys(doc, path, recipe.runtime, "")
    if "config" in doc:
        if not runtime_for(recipe.runtime).options_file:
            raise _err(path, doc, "config", "config", "is an options file (TensorRT-LLM's); this recipe's runtime, "
                                                      f"{recipe.runtime}, takes none")
        if not isinstance(doc["config"], dict):
            raise _err(path, doc, "config", "config", "must be a mapping (TensorRT-LLM's --extra_llm_api_options)")
        recipe.engine_config = _plain(doc["config"])
    recipe.description = str(doc.get("description") or "")
    recipe.served_model_name = str(doc["served_model_name"]) if doc.get("served_model_name") else None
    recipe.image = str(doc["image"]) if doc.get("image") else None
    recipe.card = str(doc["card"]) if doc.get("card") else None
    recipe.quantization = str(doc["quantization"]) if doc.get("quantization") else None
    if "port" in doc:
        recipe.port = _int(doc["port"], path, doc, "port", "port", 1, 65535)
    flags_key = "args" if "args" in doc else runtime_for(recipe.runtime).flags_key
    recipe.flags = _flag_map(doc.get(flags_key), path, doc, flags_key, flags_key, recipe.runtime)
    recipe.extra_args = _str_list(doc.get("extra_args"), path, doc, "extra_args", "extra_args")
    recipe.env = _str_map(doc.get("env"), path, doc, "env", "env")
    limits = doc.get("limits") or {}
    if not isinstance(limits, dict):
        raise _err(path, doc, "limits", "limits", "must be a mapping")
    check_keys(limits, LIMIT_KEYS, path, "limits")
    for key in ("solo_only", "cluster_only"):
        if key in limits:
            setattr(recipe, key, _bool(limits[key], path, limits, key, f"limits.{key}"))
    for key in ("min_nodes", "max_nodes"):
        if key in limits:
            setattr(recipe, key, _int(limits[key], path, limits, key, f"limits.{key}", 1, 64))
    if recipe.solo_only and recipe.cluster_only:
        raise _err(path, limits, "cluster_only", "limits.cluster_only", "a recipe cannot be both solo only and "
                                                                         "cluster only")
    if recipe.min_nodes > recipe.max_nodes:
        raise _err(path, limits, "min_nodes", "limits.min_nodes", "is larger than max_nodes")
    if recipe.cluster_only and recipe.min_nodes < 2:
        recipe.min_nodes = 2
    overrides = doc.get("topologies") or {}
    if not isinstance(overrides, dict):
        raise _err(path, doc, "topologies", "topologies", "must be a mapping of topology: overrides")
    check_keys(overrides, TOPOLOGIES, path, "topologies")
    for topology, raw in overrides.items():
        where = f"topologies.{topology}"
        if not isinstance(raw, dict):
            raise _err(path, overrides, topology, where, "must be a mapping")
        check_keys(raw, OVERRIDE_KEYS, path, where)
        _check_flag_keys(raw, path, recipe.runtime, f"{where}.")
        key_here = "args" if "args" in raw else runtime_for(recipe.runtime).flags_key
        recipe.topologies[topology] = Override(
            flags=_flag_map(raw.get(key_here), path, raw, key_here, f"{where}.{key_here}", recipe.runtime),
            extra_args=_str_list(raw.get("extra_args"), path, raw, "extra_args", f"{where}.extra_args"),
            env=_str_map(raw.get("env"), path, raw, "env", f"{where}.env"),
            image=str(raw["image"]) if raw.get("image") else None,
            port=_int(raw["port"], path, raw, "port", f"{where}.port", 1, 65535) if "port" in raw else None,
        )
    memory = doc.get("memory") or {}
    if not isinstance(memory, dict):
        raise _err(path, doc, "memory", "memory", "must be a mapping")
    check_keys(memory, MEMORY_KEYS, path, "memory")
    for key in MEMORY_KEYS:
        if key in memory:
            setattr(recipe, key, _number(memory[key], path, memory, key, f"memory.{key}"))
    own = runtime_for(recipe.runtime).reserved
    reserved = {r.replace("_", "-") for r in own} | own
    for arg in recipe.extra_args:
        if arg.startswith("--") and arg[2:].split("=")[0] in reserved:
            raise _err(path, doc, "extra_args", "extra_args", f"{arg} is set by sparktop from the topology")
    return recipe


def _check_flag_keys(raw: dict, path: Path, runtime: str, where: str) -> None:
    """A runtime's own flags key (`vllm:`) in a recipe of another runtime is a mistake: its flags go under `args:`."""
    rt = runtime_for(runtime)
    for key in FLAG_KEYS:
        if key in raw and key not in ("args", rt.flags_key):
            raise _err(path, raw, key, f"{where}{key}", f"a {runtime} recipe gives its flags under args:, in "
                                                        f"{rt.name}'s own names")


def _plain(value: Any) -> Any:
    """A YAML value as plain dicts and lists (the loader's keep their line numbers), to be written out again."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def parse_sets(items: list[str] | None, runtime: str = DEFAULT) -> dict:
    """`--set max_num_seqs=64 --set enforce_eager=true` -> overrides of the runtime's flags."""
    import yaml

    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SparktopError(f"--set {item!r}: expected FLAG=VALUE (e.g. --set max_num_seqs=64)")
        out[key.strip().lstrip("-").replace("-", "_")] = yaml.safe_load(value) if value else True
    return _flag_map(out, "--set", {}, None, "--set", runtime)
