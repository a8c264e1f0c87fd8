"""llama.cpp: `llama-server` in a container (`ghcr.io/ggml-org/llama.cpp:
server-cuda`, whose entrypoint is `/app/llama-server`; sparkrun's
`scitrera/dgx-spark-llama-cpp`, with it on the PATH), always with
`--metrics` (sparktop reads its /metrics and /slots) and the recipe's served
name as `--alias`. The model is a GGUF: `REPO:QUANT` (downloaded by
llama-server with `-hf` into the node's Hugging Face cache) or a `.gguf`
path on the node (`-m`, mounted read-only). Over several nodes llama.cpp
splits the model's *layers*: every worker runs `rpc-server` and the head
names them with `--rpc` (built with GGML_RPC, as NVIDIA's Spark playbook
builds it), so its layouts are `pp=N`, not tensor parallel.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar

from sparktop import engine_ids
from sparktop.launch.plan import Endpoint, Step, Wait
from sparktop.launch.runtimes.base import Runtime
from sparktop.layouts import Layout
from sparktop.model.gguf import is_gguf_path

if TYPE_CHECKING:
    from sparktop.launch.topology import Builder
    from sparktop.settings import Node

RPC_PORT = 50052  # rpc-server's default
CACHE_IN_CONTAINER = "/root/.cache/huggingface/llama.cpp"  # -hf downloads land in the mounted HF cache
AUTO_SLOTS = 4  # llama-server's slots without -np


class LlamaCppRuntime(Runtime):
    # Its row's default image is sparkrun's arm64 CUDA build for the Spark, with rpc-server on its PATH
    # (ggml-org's server-cuda image is built for amd64 and ships llama-server alone: llama.cpp issue 17321).
    row = engine_ids.get("llama.cpp")
    memory = "fixed"
    programs = ("llama-server", "/app/llama-server")
    model_flags = ("hf", "hf_repo", "hfr", "m", "model")
    served_flags = ("alias", "a")
    # llama-server's short flags (common/arg.cpp at b11434) by the long names recipes and plans use.
    short_flags: ClassVar[dict[str, str]] = {
        "c": "ctx_size", "np": "parallel", "ngl": "n_gpu_layers", "fa": "flash_attn", "b": "batch_size",
        "ub": "ubatch_size", "t": "threads", "tb": "threads_batch", "ctk": "cache_type_k", "ctv": "cache_type_v",
        "ts": "tensor_split", "sm": "split_mode", "mg": "main_gpu", "cb": "cont_batching", "n": "n_predict",
        "s": "seed", "ot": "override_tensor", "ncmoe": "n_cpu_moe", "cmoe": "cpu_moe", "kvu": "kv_unified",
        "to": "timeout", "v": "verbose", "lv": "verbosity", "dev": "device", "md": "model_draft",
        "ngld": "gpu_layers_draft", "cd": "ctx_size_draft", "hff": "hf_file", "mu": "model_url",
        "dt": "defrag_thold", "nkvo": "no_kv_offload", "sps": "slot_prompt_similarity"}
    sparkrun_defaults: ClassVar[dict[str, str]] = {
        "n_gpu_layers": "n_gpu_layers", "ctx_size": "ctx_size", "max_model_len": "ctx_size",
        "parallel": "parallel", "flash_attn": "flash_attn"}
    compiles = False  # no torch.compile by default
    weights = "gguf"
    reserved = frozenset({"model", "m", "hf_repo", "hf", "hfr", "host", "port", "rpc", "alias", "a"})
    form_flags: ClassVar[dict[str, str | None]] = {
        "gpu_memory_utilization": None, "max_model_len": "ctx_size",
        "max_num_seqs": "parallel"}
    serving_names: ClassVar[dict[str, str]] = {"parallel": "max_num_seqs", "np": "max_num_seqs",
                                               "batch_size": "max_num_batched_tokens"}

    def listen_ports(self, layout: Layout, defaults: Any, head: bool) -> list[int]:
        return [] if head or not layout.spans_nodes else [RPC_PORT]  # each worker's rpc-server

    def why_not(self, layout: Layout) -> str | None:
        if layout.tp > 1:
            return (f"llama.cpp spreads a model over nodes by its layers (rpc-server): use pp={layout.tp} "
                    f"instead of tp={layout.tp}")
        if layout.backend == "ray" or layout.ep:
            return "llama.cpp has no Ray or expert parallel: use pp=N or solo replicas"
        return None

    def serving_flags(self, args: dict[str, Any]) -> dict[str, Any]:
        out = super().serving_flags(args)
        slots = args.get("parallel") or args.get("np")
        slots = int(slots) if isinstance(slots, int) and slots > 0 else AUTO_SLOTS
        out["max_num_seqs"] = slots
        ctx = args.get("ctx_size") or args.get("c")
        if isinstance(ctx, int) and ctx > 0:
            unified = args.get("kv_unified") is True or not (args.get("parallel") or args.get("np"))
            out["max_model_len"] = ctx if unified else ctx // slots  # what one request may hold
            out["kv_tokens"] = ctx
        return out

    @staticmethod
    def _entry(b: Builder, tool: str) -> str:
        """The server's path in the image: ggml-org's images keep their binaries in /app, off the PATH."""
        return f"/app/{tool}" if "ggml-org/llama.cpp" in (b.image or "") else tool

    def model_args(self, b: Builder) -> tuple[list[str], list[str]]:
        """(the model's flags, volumes) for the recipe's GGUF."""
        model = b.recipe.model
        if is_gguf_path(model):
            folder = os.path.dirname(model) or "."
            return ["-m", model], [f"{folder}:{folder}:ro"]
        return ["-hf", model], []

    def serve_args(self, b: Builder, node: Node, extra: list[str]) -> list[str]:
        model, _ = self.model_args(b)
        return [*model, "--alias", b.recipe.served_name, "--host", node.bind, "--port", str(b.port), "--metrics",
                *extra, *self.flag_args(b.flags), *b.extra]

    def engine_steps(self, b: Builder, nodes: list[Node], suffix: str) -> Endpoint:
        head = nodes[0]
        url = b.url(head, b.port)
        _, volumes = self.model_args(b)
        env = {**b.env, "LLAMA_CACHE": CACHE_IN_CONTAINER}
        rpc: list[str] = []
        for rank, node in enumerate(nodes[1:], 1):
            address = b.peer_address(node)
            wname, wargv = b.docker_run(node, f"rpc{rank}{suffix}", {**env, **b.network_env(node, head)},
                                        self._entry(b, "rpc-server"), ["-H", address, "-p", str(RPC_PORT)])
            b.steps.append(Step(node.name, wargv, f"start llama.cpp rpc-server on {node.name} ({address}:{RPC_PORT})",
                                container=wname, wait=Wait("running", container=wname), role="worker"))
            rpc.append(f"{address}:{RPC_PORT}")
        extra = ["--rpc", ",".join(rpc)] if rpc else []
        net = b.network_env(head, head) if rpc else {}
        name, argv = b.docker_run(head, f"llama{suffix}", {**env, **net}, self._entry(b, "llama-server"),
                                  self.serve_args(b, head, extra), endpoint=url, kind=self.id, volumes=volumes)
        what = f"layers over {len(nodes)} nodes" if rpc else "one node"
        b.steps.append(Step(head.name, argv, f"start llama-server ({b.recipe.served_name}, {what}) on {head.name}",
                            container=name, wait=Wait("running", container=name), role="engine"))
        endpoint = Endpoint(url, self.id, head.name, b.recipe.served_name, b.topology, name)
        b.endpoints.append(endpoint)
        return endpoint
