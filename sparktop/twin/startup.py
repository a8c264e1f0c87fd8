"""How vLLM sizes memory at start-up, and how it fails when a model does not fit.

`plan_startup` is the pure part of a TwinServer's start: given the model card,
the serve arguments and what other processes already hold on the GPU, it sizes
the weights, the KV cache and the context length, or raises StartupError with
the message vLLM would log last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from sparktop import labels as label
from sparktop.engine_ids import DEFAULT
from sparktop.model.cards import GIB, ModelCard
from sparktop.model.forecast import Basis, Subject, resolve
from sparktop.model.perf import PerfModel
from sparktop.twin.args import ServeArgs
from sparktop.twin.host import BASE_USED_KB


def engine_perf(basis: Basis, args: ServeArgs) -> PerfModel:
    """The engine's performance model as its argv lays it out, on the resolved card and constants."""
    kv_dtype = 1 if args.kv_cache_dtype.startswith("fp8") else None
    return PerfModel(basis.card, tp=args.tensor_parallel_size, pp=args.pipeline_parallel_size,
                     kv_dtype_bytes=kv_dtype, ray=args.ray, enforce_eager=args.enforce_eager, k=basis.constants)


class StartupError(Exception):
    """vLLM would have failed to start: the message is what it logs last."""


@dataclass
class StartupPlan:
    perf: PerfModel
    kv_budget_gib: float
    kv_tokens: int
    max_model_len: int
    max_num_batched_tokens: int




def container_labels(environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], str | None]:
    """(the labels, the image) of the twin container this process runs in (twin/containers.py sets them)."""
    env = os.environ if environ is None else environ
    try:
        labels = json.loads(env.get("SPARKTOP_TWIN_LABELS") or "{}")
    except ValueError:
        labels = {}
    return ({str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
            env.get("SPARKTOP_TWIN_IMAGE") or None)


def twin_subject(card: ModelCard, engine: str = DEFAULT, labels: Mapping[str, str] | None = None,
                 image: str | None = None) -> Subject:
    """What the twin serves, as `sparktop predict` would predict it: its engine, the stack its label (or its
    image) names, the fit its label names; at a GB10's pace (the engine divides by its own --speed)."""
    labels = labels or {}
    return Subject(card=card, runtime=engine, image=image, stack=labels.get(label.STACK) or None,
                   fitted_path=labels.get(label.FIT) or None, speed=1.0, source=f"twin {card.name}")


def twin_basis(card: ModelCard, engine: str = DEFAULT, labels: Mapping[str, str] | None = None,
               image: str | None = None) -> Basis:
    """The card and constants the twin runs with: `forecast.resolve` of its subject. An engine the model has
    no figures of runs vLLM's constants and card."""
    return resolve(twin_subject(card, engine, labels, image))


def plan_startup(card: ModelCard, args: ServeArgs, other_used_mib: int = 0, engine: str = DEFAULT,
                 basis: Basis | None = None) -> StartupPlan:
    """Size everything vLLM sizes at startup; raise StartupError where vLLM would. `engine`: whose speed
    (and weight layout) the twin takes; `basis`: what it runs with (default: `twin_basis` of the card)."""
    basis = basis or twin_basis(card, engine)
    perf = engine_perf(basis, args)
    hw = perf.hw
    card = perf.card
    max_len = args.max_model_len or card.max_model_len
    batched = args.max_num_batched_tokens or 8192
    want = args.gpu_memory_utilization * hw.memory_gib
    # The OS and desktop of a Spark hold a few GiB that CUDA cannot have.
    free = hw.memory_gib - BASE_USED_KB / 1024**2 - other_used_mib / 1024
    if other_used_mib and want > free:
        raise StartupError(
            f"ValueError: Free memory on device cuda:0 ({free:.2f}/{hw.memory_gib:.2f} GiB) on startup is "
            f"less than desired GPU memory utilization ({args.gpu_memory_utilization}, {want:.2f} GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes."
        )
    weights = perf.weights_bytes_per_node / GIB
    if weights > free - 1.0:
        raise StartupError(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {weights:.2f} GiB. GPU 0 has a "
            f"total capacity of {hw.memory_gib:.2f} GiB of which {max(0.0, free - 1.0):.2f} GiB is free."
        )
    budget = perf.kv_budget_bytes(args.gpu_memory_utilization, batched) / GIB
    if budget <= 0:
        raise StartupError(
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    tokens = perf.kv_capacity_tokens(args.gpu_memory_utilization, batched)
    per_seq = perf.seq_state_bytes / perf.kv_bytes_per_token
    if tokens < max_len + per_seq:
        needed = (max_len * perf.kv_bytes_per_token + perf.seq_state_bytes) / GIB
        raise StartupError(
            f"ValueError: To serve at least one request with the models's max seq len ({max_len}), "
            f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({budget:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{int(max(0, tokens - per_seq))}. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
    return StartupPlan(perf, budget, tokens, max_len, batched)
