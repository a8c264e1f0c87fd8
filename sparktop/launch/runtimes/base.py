"""What every runtime module fills in: how one engine of a layout is
started on its nodes, in that runtime's own commands.

`topology.Builder` lays a recipe out (which nodes, replicas, the router,
secrets, labels, the network environment); a runtime turns one engine of
that layout into steps: the containers it starts on each node, in order,
with what to wait for. The flags a recipe gives are the runtime's own
(`--mem-fraction-static` for SGLang, `--ctx-size` for llama.cpp,
`--kv_cache_free_gpu_memory_fraction` for TensorRT-LLM); those the layout
and the inventory decide (host, port, parallel sizes, ranks) are refused in
recipes, per runtime.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from sparktop import engine_ids
from sparktop.engine_ids import EngineId
from sparktop.layouts import Layout

if TYPE_CHECKING:
    from sparktop.launch.plan import Endpoint
    from sparktop.launch.topology import Builder
    from sparktop.settings import Node


class Runtime:
    # The engine it starts: its row of `engine_ids`, which sets the three below (a subclass names its own row).
    row: ClassVar[EngineId] = engine_ids.get(engine_ids.DEFAULT)
    # engine_ids' id: a plan's runtime, the endpoint's kind, what answers (a recipe may say `runtime: llama-cpp`)
    id: ClassVar[str] = row.id
    name: ClassVar[str] = row.name
    default_image: ClassVar[str] = row.default_image  # when neither the recipe nor the inventory names one
    flags_key: ClassVar[str] = "args"  # the recipe key its flags go under (`args:`; vLLM's also `vllm:`)
    weights: ClassVar[str] = "hf"  # what preflight looks for: a Hugging Face repo's snapshot, or "gguf" files
    flag_sep: ClassVar[str] = "-"  # `--max-num-seqs` (vLLM, SGLang, llama.cpp) or `--max_batch_size` (TensorRT-LLM)
    # Flags the layout and the inventory decide (underscored names): refused in a recipe.
    reserved: ClassVar[frozenset[str]] = frozenset()
    # Its flags for what the performance model and preflight read, by the names vLLM gives them.
    serving_names: ClassVar[dict[str, str]] = {}
    # The launcher's three boxes (memory share, context, concurrent requests, by vLLM's names) -> its own flags;
    # None: it has no such setting.
    form_flags: ClassVar[dict[str, str | None]] = {"gpu_memory_utilization": "gpu_memory_utilization",
                                                   "max_model_len": "max_model_len", "max_num_seqs": "max_num_seqs"}
    router_provider: ClassVar[str] = "openai"  # LiteLLM's provider for it (`hosted_vllm` is vLLM's)
    ray: ClassVar[bool] = False  # can join its nodes over Ray
    compiles: ClassVar[bool] = True  # spends start-up compiling the model (torch.compile, TensorRT-LLM's autotuner)
    # How it takes memory (what preflight checks): "share", a share of the whole (vLLM's
    # gpu_memory_utilization, SGLang's mem_fraction_static); "left", a share of what the weights leave
    # (TensorRT-LLM's free_gpu_memory_fraction); "fixed", the weights and a KV cache of as many tokens as
    # it is told (llama.cpp's -c).
    memory: ClassVar[str] = "share"
    options_file: ClassVar[bool] = False  # takes a recipe's `config:` as a YAML options file (TensorRT-LLM)
    share_default: ClassVar[float] = 0.9  # that share when the recipe gives none

    # How its command line reads in someone else's recipe (sparkrun's `command:`): the words that start its
    # server, whether the model comes first (`trtllm-serve MODEL`), the flags naming the model and the
    # name it serves, its short flags' long names, and sparkrun's `defaults:` keys -> its flags.
    programs: ClassVar[tuple[str, ...]] = ()
    model_first: ClassVar[bool] = False
    model_flags: ClassVar[tuple[str, ...]] = ()
    served_flags: ClassVar[tuple[str, ...]] = ()
    short_flags: ClassVar[dict[str, str]] = {}
    value_prefix: ClassVar[str] = "-"  # a token after a flag starting with this is a flag (`--`: `-1` is a value)
    verbatim: ClassVar[bool] = False  # dotted and unknown single-dash flags kept as written (vLLM's -O3, -cc.x)
    sparkrun_defaults: ClassVar[dict[str, str]] = {}
    # sparkrun's `defaults:` keys that go in its options file (TensorRT-LLM): key -> (section, name).
    sparkrun_config: ClassVar[dict[str, tuple[str, str]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.id, cls.name, cls.default_image = cls.row.id, cls.row.name, cls.row.default_image

    # -- someone else's recipe (sparkrun's, eugr's) ------------------------------------

    def split_command(self, argv: list[str]) -> tuple[str | None, str | None, dict[str, Any], list[str]]:
        """Its server's command line -> (model, served name, its own flags, extra args): `vllm serve MODEL ...`,
        SGLang's `python3 -m sglang.launch_server ...`, `llama-server ...`, `trtllm-serve MODEL ...`; flags the
        layout decides are dropped. One parser for every runtime; what differs is data: its `programs`, whether
        the model comes first, its model, served-name and short flags, `value_prefix` (a token starting with it
        is the next flag, not a value, unless it is a number) and `verbatim` (dotted and unknown single-dash
        flags are kept as written)."""
        while argv and (argv[0] in self.programs or argv[0].rsplit("/", 1)[-1] in self.programs):
            argv = argv[1:]
        model = None
        if self.model_first and argv and not argv[0].startswith("-"):
            model, argv = argv[0], argv[1:]
        flags: dict[str, Any] = {}
        extra: list[str] = []
        served = None
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("-"):
                extra.append(arg)
                i += 1
                continue
            name, eq, inline = arg.lstrip("-").partition("=")
            takes_value = not eq and i + 1 < len(argv) and not (argv[i + 1].startswith(self.value_prefix) and
                                                                not is_number(argv[i + 1]))
            value: Any = inline if eq else (argv[i + 1] if takes_value else True)
            i += 1 if eq or not takes_value else 2
            key = self.short_flags.get(name, name).replace("-", "_")  # `-c 8192` is `--ctx-size 8192`
            if key in self.model_flags:
                model = model or str(value)
                continue
            if key in self.served_flags:
                served = str(value)
                continue
            if key in self.reserved:
                continue
            if self.verbatim and ("." in name or not arg.startswith("--")):
                # vLLM's -cc.cudagraph_mode=..., -O3: kept as written, no recipe key names them.
                extra += [arg] if eq or value is True else [arg, str(value)]
                continue
            flags[key] = number(value)
        return model, served, flags, extra

    def sparkrun_flags(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """Its flags from a sparkrun recipe's `defaults:` when the recipe has no `command:`."""
        table = self.sparkrun_defaults
        return {table[k]: number(v) for k, v in defaults.items() if k in table}

    # -- a recipe's flags ------------------------------------------------------------

    def flag_args(self, args: dict[str, Any]) -> list[str]:
        """`{mem_fraction_static: 0.8, trust_remote_code: true}` -> argv items, in this runtime's spelling."""
        out: list[str] = []
        for key, value in args.items():
            flag = "--" + (key.replace("-", "_") if self.flag_sep == "_" else key.replace("_", "-"))
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

    def serving_flags(self, args: dict[str, Any]) -> dict[str, Any]:
        """The recipe's settings by vLLM's names (gpu_memory_utilization, max_model_len, max_num_seqs ...),
        for the performance model and preflight."""
        out = {}
        for ours, theirs in self.serving_names.items():
            if ours in args:
                out[theirs] = args[ours]
        return out

    def why_not(self, layout: Layout) -> str | None:
        """Why this runtime cannot run a layout (None: it can)."""
        return None

    def listen_ports(self, layout: Layout, defaults: Any, head: bool) -> list[int]:
        """The ports an engine over several nodes listens on, besides its API, on its head (`head`) or on a
        worker: preflight checks they are free. vLLM's: the rendezvous of multiprocessing, or Ray's GCS."""
        if not layout.spans_nodes or not head:
            return []
        return [defaults.ray_port if layout.backend == "ray" else defaults.master_port]

    # -- plans -----------------------------------------------------------------------

    def engine_steps(self, b: Builder, nodes: list[Node], suffix: str) -> Endpoint:
        """The steps that start one engine over `nodes` (the head first); its endpoint."""
        raise NotImplementedError

    def ready_path(self) -> str:
        return "/health"

    def served_name(self, b: Builder) -> str:
        return b.recipe.served_name


def is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def number(value: Any) -> Any:
    """A command line's or a recipe's `"8192"` as 8192, `"0.9"` as 0.9; anything else as it is."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return value
