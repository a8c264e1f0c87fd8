"""SGLang: `python3 -m sglang.launch_server` in a container (NVIDIA's Spark
playbook: `lmsysorg/sglang`; sparkrun: `scitrera/dgx-spark-sglang`), always
with `--enable-metrics` (sparktop reads its /metrics). Over several nodes
every node runs the same server with `--nnodes N --node-rank R
--dist-init-addr HEAD:PORT` and the tensor (and pipeline) parallel sizes;
only rank 0 serves the API. Flags are SGLang's own
(`mem_fraction_static: 0.8`, `context_length: 131072`, `attention_backend:
triton`); those the layout decides are refused in a recipe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from sparktop import engine_ids
from sparktop.launch.plan import Endpoint, Step, Wait
from sparktop.launch.runtimes.base import Runtime
from sparktop.layouts import Layout

if TYPE_CHECKING:
    from sparktop.launch.topology import Builder
    from sparktop.settings import Node


class SglangRuntime(Runtime):
    row = engine_ids.get("sglang")
    share_default = 0.88  # mem_fraction_static's default for a GPU of 90 to 160 GiB (memory_hook.py)
    programs = ("python", "python3", "-m", "sglang.launch_server", "sglang", "serve")
    model_flags = ("model_path", "model")
    served_flags = ("served_model_name",)
    sparkrun_defaults: ClassVar[dict[str, str]] = {
        "gpu_memory_utilization": "mem_fraction_static", "max_model_len": "context_length",
        "max_num_seqs": "max_running_requests", "kv_cache_dtype": "kv_cache_dtype",
        "attention_backend": "attention_backend", "quantization": "quantization"}
    compiles = False  # no torch.compile by default
    reserved = frozenset({"host", "port", "model_path", "model", "served_model_name", "tp_size", "tp",
                          "tensor_parallel_size", "pp_size", "pipeline_parallel_size", "nnodes", "node_rank",
                          "dist_init_addr", "dp_size", "dp", "ep_size"})
    form_flags: ClassVar[dict[str, str | None]] = {
        "gpu_memory_utilization": "mem_fraction_static", "max_model_len": "context_length",
        "max_num_seqs": "max_running_requests"}
    serving_names: ClassVar[dict[str, str]] = {
        "mem_fraction_static": "gpu_memory_utilization", "context_length": "max_model_len",
        "max_running_requests": "max_num_seqs", "chunked_prefill_size": "max_num_batched_tokens",
        "kv_cache_dtype": "kv_cache_dtype", "quantization": "quantization"}

    def why_not(self, layout: Layout) -> str | None:
        if layout.backend == "ray":
            return "SGLang joins its nodes itself (--nnodes, --dist-init-addr), not over Ray: drop ,ray"
        return None

    def serve_args(self, b: Builder, node: Node, extra: list[str]) -> list[str]:
        return ["-m", "sglang.launch_server", "--model-path", b.recipe.model, "--served-model-name",
                b.recipe.served_name, "--host", node.bind, "--port", str(b.port), "--enable-metrics", *extra,
                *self.flag_args(b.flags), *b.extra]

    def parallel_args(self, b: Builder) -> list[str]:
        layout = b.layout
        args = ["--tp-size", str(layout.tp)]
        if layout.pp > 1:
            args += ["--pp-size", str(layout.pp)]
        if layout.ep:
            args += ["--ep-size", str(layout.tp)]
        return args

    def engine_steps(self, b: Builder, nodes: list[Node], suffix: str) -> Endpoint:
        head = nodes[0]
        url = b.url(head, b.port)
        if len(nodes) == 1:
            name, argv = b.docker_run(head, f"sglang{suffix}", b.env, "python3", self.serve_args(b, head, []),
                                      endpoint=url, kind=self.id)
            b.steps.append(Step(head.name, argv, f"start SGLang ({b.recipe.served_name}, TP=1) on {head.name}",
                                container=name, wait=Wait("running", container=name), role="engine"))
        else:
            dist = [*self.parallel_args(b), "--nnodes", str(len(nodes)), "--dist-init-addr",
                    f"{b.peer_address(head)}:{b.inv.defaults.master_port}"]
            # Workers first (ranks 1..N-1 serve no API); the head, rank 0, waits for them at the init address.
            for rank, node in enumerate(nodes[1:], 1):
                args = self.serve_args(b, node, [*dist, "--node-rank", str(rank)])
                wname, wargv = b.docker_run(node, f"worker{rank}{suffix}", {**b.env, **b.network_env(node, head)},
                                            "python3", args)
                b.steps.append(Step(node.name, wargv, f"start SGLang node rank {rank} on {node.name}",
                                    container=wname, wait=Wait("running", container=wname), role="worker"))
            name, argv = b.docker_run(head, f"sglang{suffix}", {**b.env, **b.network_env(head, head)}, "python3",
                                      self.serve_args(b, head, [*dist, "--node-rank", "0"]), endpoint=url,
                                      kind=self.id)
            b.steps.append(Step(head.name, argv, f"start SGLang node rank 0 ({b.describe()}) on {head.name}",
                                container=name, wait=Wait("running", container=name), role="engine"))
        endpoint = Endpoint(url, self.id, head.name, b.recipe.served_name, b.topology, name)
        b.endpoints.append(endpoint)
        return endpoint
