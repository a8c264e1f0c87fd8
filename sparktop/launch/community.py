"""Recipes in the formats the DGX Spark community already uses.

- eugr/spark-vllm-docker, `recipe_version: "1"`: `name`, `container`,
  `model`, `defaults`, `env`, `solo_only` / `cluster_only`, and a `command`
  template with `{placeholders}` filled from `defaults`. The command's
  flags become the recipe's vLLM arguments; those the topology decides
  (`--port`, `--host`, `-tp`, `--distributed-executor-backend`) are left to
  sparktop. `mods` and `build_args` are eugr build steps sparktop cannot
  apply; they are named in the description so nothing is silently lost.
- sparkrun (scitrera/sparkrun), version 2 — the default when a file has no
  `recipe_version`: `model`, `container`, `runtime`, `mode`, `min_nodes`,
  `max_nodes`, `solo_only` / `cluster_only`, `defaults`, `env`, `metadata`
  and a `command` template (`{model}` and every `defaults` key); with no
  `command`, the engine's flags come from the well-known `defaults` keys.
  Every runtime sparkrun launches is read as it is: vLLM (`vllm`,
  `vllm-distributed`, `vllm-ray`, `eugr-vllm`), `sglang`, `llama-cpp` and
  `trtllm`; the command's flags become the runtime's own arguments, those
  the layout decides being left to sparktop. `${VAR}` in `env` means "pass
  VAR from the launching environment", which sparktop does by name.

A user points `--recipes` at their existing folder and sees their recipes.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path
from typing import Any, cast

from sparktop.engine_ids import DEFAULT
from sparktop.errors import ConfigError
from sparktop.launch.recipe import SECRET_NAMES, Recipe
from sparktop.launch.runtimes import UnknownRuntime, runtime_for, runtime_id
from sparktop.launch.runtimes.base import number as _number
from sparktop.yamlfile import line_of

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


SPARKRUN_KEYS = {"container", "runtime", "command", "defaults", "mode", "metadata", "runtime_config",
                 "pre_exec", "post_exec", "post_commands", "builder", "sparkrun_version"}
NATIVE_ONLY_KEYS = {"vllm", "image", "limits", "topologies", "extra_args", "memory"}


def parse_community(doc: dict, path: Path) -> Recipe | None:
    version = doc.get("recipe_version")
    if version is None:
        # sparkrun writes no version for its (version 2) recipes.
        if "container" in doc and SPARKRUN_KEYS & set(doc) and not NATIVE_ONLY_KEYS & set(doc):
            return _sparkrun_v2(doc, path)
        return None
    if str(version) == "1":
        return _eugr_v1(doc, path)
    if str(version) == "2":
        return _sparkrun_v2(doc, path)
    raise ConfigError(str(path), line_of(doc, "recipe_version"), "recipe_version",
                      f"unknown recipe_version {version!r} (sparktop reads eugr's \"1\" and sparkrun's 2)")


def _env(raw: Any, path: Path, doc: dict, key: str) -> dict[str, str]:
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(str(path), line_of(doc, key), key, "must be a mapping")
    out = {}
    for name, value in raw.items():
        if SECRET_NAMES.search(str(name)) and value not in (None, ""):
            raise ConfigError(str(path), line_of(raw, name), f"{key}.{name}",
                              "looks like a secret; sparktop passes it from your environment by name instead")
        out[str(name)] = "" if value is None else str(value)
    return out


def _eugr_v1(doc: dict, path: Path) -> Recipe:
    for required in ("name", "container", "command"):
        if not doc.get(required):
            raise ConfigError(str(path), getattr(doc, "line", None), required, "is required in a recipe_version 1 "
                                                                             "recipe")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(str(path), line_of(doc, "defaults"), "defaults", "must be a mapping")
    template = str(doc["command"])
    for match in _PLACEHOLDER.finditer(template):
        if match.group(1) not in defaults:
            start = line_of(doc, "command")
            line = start + template[: match.start()].count("\n") + 1 if start is not None else None
            raise ConfigError(str(path), line, f"command.{{{match.group(1)}}}",
                              f"placeholder has no value in defaults (known: {', '.join(defaults) or 'none'})")
    command = _PLACEHOLDER.sub(lambda m: str(defaults[m.group(1)]), template)
    try:
        argv = shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:
        raise ConfigError(str(path), line_of(doc, "command"), "command",
                          f"cannot be split into arguments: {exc}") from None
    model, served, flags, extra = runtime_for(DEFAULT).split_command(argv)  # eugr's recipes are vLLM's
    model = model or doc.get("model")
    if not model:
        raise ConfigError(str(path), line_of(doc, "command"), "command", "names no model (vllm serve MODEL)")
    recipe = Recipe(id=path.stem, name=str(doc["name"]), model=str(doc.get("model") or model), path=path,
                    format="eugr-v1")
    notes = []
    if doc.get("mods"):
        notes.append("eugr mods not applied by sparktop: " + ", ".join(map(str, doc["mods"])))
    if doc.get("build_args"):
        notes.append("built with eugr build_args " + " ".join(map(str, doc["build_args"])))
    recipe.description = " — ".join([str(doc.get("description") or "")] + notes).strip(" —")
    recipe.image = str(doc["container"])
    recipe.flags = flags
    recipe.extra_args = extra
    recipe.env = _env(doc.get("env"), path, doc, "env")
    recipe.solo_only = bool(doc.get("solo_only", False))
    recipe.cluster_only = bool(doc.get("cluster_only", False))
    if recipe.cluster_only:
        recipe.min_nodes = 2
    if "port" in defaults:
        try:
            recipe.port = int(cast(Any, defaults["port"]))  # a bad value raises, and is reported, below
        except (TypeError, ValueError):
            raise ConfigError(str(path), line_of(defaults, "port"), "defaults.port", "must be a port number") from None
    if served:
        recipe.served_model_name = served
    return recipe


_DTYPE_BITS = {"bf16": 16, "fp16": 16, "float16": 16, "bfloat16": 16, "fp8": 8, "int8": 8, "mxfp4": 4.25,
               "nvfp4": 4.5, "int4": 4.25, "fp4": 4.5}
_ENV_REF = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")


def _params_b(text: Any) -> float | None:
    match = re.match(r"^\s*([\d.]+)\s*([bBmM]?)", str(text or ""))
    if not match:
        return None
    value = float(match.group(1))
    return value / 1000 if match.group(2).lower() == "m" else value


def _sparkrun_v2(doc: dict, path: Path) -> Recipe:
    if not doc.get("model"):
        raise ConfigError(str(path), getattr(doc, "line", None), "model", "is required in a sparkrun recipe")
    if not doc.get("container"):
        raise ConfigError(str(path), getattr(doc, "line", None), "container", "is required in a sparkrun recipe")
    try:
        runtime = runtime_id(str(doc.get("runtime") or DEFAULT))
    except UnknownRuntime as exc:
        raise ConfigError(str(path), line_of(doc, "runtime"), "runtime", str(exc)) from None
    defaults = dict(doc.get("defaults") or {})
    if not isinstance(doc.get("defaults") or {}, dict):
        raise ConfigError(str(path), line_of(doc, "defaults"), "defaults", "must be a mapping")
    values = {"model": doc["model"], **defaults}
    if doc.get("command"):
        template = str(doc["command"])
        for match in _PLACEHOLDER.finditer(template):
            if match.group(1) not in values:
                start = line_of(doc, "command")
                line = start + template[: match.start()].count("\n") + 1 if start is not None else None
                raise ConfigError(str(path), line, f"command.{{{match.group(1)}}}",
                                  f"placeholder has no value in defaults (known: {', '.join(values)})")
        command = template
        for _ in range(5):  # sparkrun substitutes until nothing changes
            command = _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), command)
        try:
            argv = shlex.split(command.replace("\\\n", " "))
        except ValueError as exc:
            raise ConfigError(str(path), line_of(doc, "command"), "command", f"cannot be split: {exc}") from None
        model, served_flag, flags, extra = runtime_for(runtime).split_command(argv)
        if served_flag:
            flags["served_model_name"] = served_flag
    else:
        model = doc["model"]
        flags = runtime_for(runtime).sparkrun_flags(defaults)
        extra = []
    metadata = doc.get("metadata") or {}
    recipe = Recipe(id=path.stem, name=path.stem, model=str(doc["model"] or model), path=path, format="sparkrun-v2",
                    runtime=runtime)
    for key, (section, name) in runtime_for(runtime).sparkrun_config.items():
        if key in defaults:
            recipe.engine_config.setdefault(section, {})[name] = _number(defaults[key])
    recipe.description = str(doc.get("description") or metadata.get("description") or "")
    recipe.image = str(doc["container"])
    if served := flags.pop("served_model_name", None) or defaults.get("served_model_name"):
        recipe.served_model_name = str(served)
    recipe.flags = flags
    recipe.extra_args = extra
    env = {}
    pass_env = []
    for name, value in (doc.get("env") or {}).items():
        ref = _ENV_REF.match(str(value)) if value is not None else None
        if ref:
            pass_env.append(ref.group(1))
            continue
        if SECRET_NAMES.search(str(name)) and value not in (None, ""):
            raise ConfigError(str(path), line_of(doc["env"], name), f"env.{name}",
                              "looks like a secret; write ${" + str(name) + "} to pass it from your environment")
        env[str(name)] = "" if value is None else str(value)
    recipe.env = env
    recipe.pass_env = pass_env
    mode = str(doc.get("mode") or "auto")
    tp = defaults.get("tensor_parallel")
    recipe.min_nodes = int(doc.get("min_nodes") or 1)
    recipe.max_nodes = int(doc["max_nodes"]) if doc.get("max_nodes") else 2
    recipe.solo_only = bool(doc.get("solo_only")) or mode == "solo" or recipe.max_nodes == 1
    recipe.cluster_only = bool(doc.get("cluster_only")) or mode == "cluster" or recipe.min_nodes > 1
    if recipe.cluster_only:
        recipe.min_nodes = max(2, recipe.min_nodes, int(str(tp)) if str(tp or "").isdigit() else 2)
    if "port" in defaults:
        recipe.port = int(defaults["port"])
    recipe.params_b = _params_b(metadata.get("model_params"))
    recipe.bits = _DTYPE_BITS.get(str(metadata.get("model_dtype") or "").lower())
    if metadata.get("model_vram"):
        with contextlib.suppress(ValueError):
            recipe.weights_gib = float(str(metadata["model_vram"]).lower().removesuffix("gib").removesuffix("gb"))
    return recipe
