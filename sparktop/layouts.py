"""Parallel layouts: how one recipe is spread over some of the inventory's nodes.

A layout is `r` replicas of one engine, each engine over `tp × pp` nodes
(tensor parallel across nodes, pipeline stages across nodes), on vLLM's own
distributed machinery: Ray (`ray`) or `--nnodes/--node-rank` multiprocessing
(`mp`); replicas sit behind a router: HAProxy `leastconn` unless the layout
names one of LiteLLM's strategies (`shuffle`, `least-busy`), for LiteLLM's
own features (its spend tracking, per-key limits, fallbacks), or `litellm`:
LiteLLM in front of HAProxy, its features with HAProxy's split.
Written the way vLLM's flags read, short enough to type:

    solo             one engine on one node
    tp=4             one engine, tensor parallel over 4 nodes (multiprocessing)
    tp=4,ray         the same over Ray
    pp=2             two pipeline stages on two nodes
    tp=2,pp=2        four nodes: two stages, each tensor parallel over two
    tp=2,ep          tensor parallel with expert parallel (MoE models)
    2x tp=2          two engines of two nodes each behind the router (HAProxy leastconn unless told)
    2x solo,leastconn  the same router said outright: a burst of c splits c/2 each, exactly
    4x solo,shuffle  four solo engines behind LiteLLM, simple-shuffle
    2x solo,least-busy  two behind LiteLLM's least-busy
    2x solo,litellm  two behind HAProxy leastconn, LiteLLM in front of it

The five two-node names sparktop started with stay as aliases of their
layouts, so recipes, runs and reports written with them keep reading the
same: solo, cluster-ray (tp=2,ray), cluster-mp (tp=2), shuffle
(2x solo,shuffle), least-busy (2x solo,least-busy). A layout that is one of
them is still *named* by its alias everywhere (`Layout.name`).

This module only describes and checks layouts; the plans, the twin and the
predictions read them (issue 13 builds them out beyond two nodes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparktop.errors import SparktopError

BACKENDS = ("mp", "ray")
ROUTERS = ("leastconn", "shuffle", "least-busy", "litellm")  # the last is CHAINED
DEFAULT_ROUTER = "leastconn"  # counts each replica's requests in flight exactly (model.routers: `even`)
CHAINED = "litellm"  # LiteLLM in front of HAProxy leastconn
# What runs for each router word (the launcher starts it; `model.routers` has each one's behaviour).
ROUTER_PRODUCTS = {"leastconn": "HAProxy leastconn", "shuffle": "LiteLLM shuffle", "least-busy": "LiteLLM least-busy",
                   "litellm": "LiteLLM in front of HAProxy leastconn"}
MAX_NODES = 8  # a QSFP switch's worth of Sparks
ALIASES = {
    "solo": "solo",
    "cluster-ray": "tp=2,ray",
    "cluster-mp": "tp=2",
    "shuffle": "2x solo,shuffle",
    "least-busy": "2x solo,least-busy",
}
_REPLICAS = re.compile(r"^\s*(\d+)\s*[x×*]\s*(.*)$")


class LayoutError(SparktopError):
    pass


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    replicas: int = 1
    backend: str = "mp"  # how the nodes of one engine are joined: mp (--nnodes) or ray
    # with replicas > 1: leastconn (HAProxy) | shuffle | least-busy (LiteLLM) | litellm (LiteLLM before HAProxy)
    router: str | None = None
    ep: bool = False  # expert parallel (vLLM's --enable-expert-parallel) across the tensor-parallel ranks

    @property
    def nodes_per_engine(self) -> int:
        return self.tp * self.pp

    @property
    def nodes(self) -> int:
        return self.replicas * self.nodes_per_engine

    @property
    def spans_nodes(self) -> bool:
        """One engine over more than one node (a Ray cluster or --nnodes)."""
        return self.nodes_per_engine > 1

    @property
    def text(self) -> str:
        """The canonical spelling: `tp=2,pp=2`, `2x tp=2,least-busy`, `4x solo,shuffle`."""
        parts = []
        if self.tp > 1:
            parts.append(f"tp={self.tp}")
        if self.pp > 1:
            parts.append(f"pp={self.pp}")
        if not parts:
            parts.append("solo")
        if self.ep:
            parts.append("ep")
        if self.spans_nodes and self.backend == "ray":
            parts.append("ray")
        if self.router:
            parts.append(self.router)
        body = ",".join(parts)
        return f"{self.replicas}x {body}" if self.replicas > 1 else body

    @property
    def slug(self) -> str:
        """The name as it can stand in a container's name or a path: `tp2-pp2`, `2x-tp2-ray`."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.replace("=", "")).strip("-")

    @property
    def name(self) -> str:
        """What runs, reports and the app call it: the two-node alias when it is one."""
        for alias, text in ALIASES.items():
            if parse_layout(text, aliases=False) == self:
                return alias
        return self.text

    def vllm_flags(self) -> dict[str, object]:
        """The parallel flags of each engine's `vllm serve` (the node flags, --nnodes and
        --node-rank, depend on the node and are the plan's)."""
        flags: dict[str, object] = {}
        if self.tp > 1:
            flags["tensor-parallel-size"] = self.tp
        if self.pp > 1:
            flags["pipeline-parallel-size"] = self.pp
        if self.ep:
            flags["enable-expert-parallel"] = True
        if self.spans_nodes:
            flags["distributed-executor-backend"] = self.backend
        return flags

    def engines(self, nodes: list[str]) -> list[list[str]]:
        """The nodes of each engine, in order (its head first), from the nodes
        the layout was given: `2x tp=2` on a,b,c,d is [[a, b], [c, d]]."""
        if len(nodes) != self.nodes:
            raise LayoutError(f"{self.text} runs on {self.nodes} node{'s' * (self.nodes != 1)}; "
                              f"{len(nodes)} given ({', '.join(nodes) or 'none'})")
        if len(set(nodes)) != len(nodes):
            twice = sorted({n for n in nodes if nodes.count(n) > 1})
            raise LayoutError(f"{self.text}: node {', '.join(twice)} given twice")
        k = self.nodes_per_engine
        return [nodes[i:i + k] for i in range(0, len(nodes), k)]

    def weights_per_node_gib(self, weights_gib: float) -> float:
        """The weights each node of an engine holds: split over its tp × pp ranks."""
        return weights_gib / self.nodes_per_engine


def parse_layout(text: str, *, aliases: bool = True) -> Layout:
    """A layout from its spelling (see the module docstring); a bad one is a
    one-line LayoutError that says what was expected."""
    raw = text
    text = text.strip().lower()
    if aliases and text in ALIASES:
        text = ALIASES[text]
    replicas = 1
    m = _REPLICAS.match(text)
    if m:
        replicas, text = int(m.group(1)), m.group(2)
    if replicas < 1:
        raise LayoutError(f"layout {raw!r}: at least one replica")
    tp = pp = 1
    backend: str | None = None
    router: str | None = None
    ep = solo = False
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise LayoutError(f"layout {raw!r}: empty (solo, tp=N, pp=N, or Nx before them for replicas)")
    for part in parts:
        key, eq, value = part.partition("=")
        key = key.strip()
        if eq and key in ("tp", "pp"):
            if not value.strip().isdigit() or int(value) < 1:
                raise LayoutError(f"layout {raw!r}: {key}= takes a whole number of nodes, not {value.strip()!r}")
            if key == "tp":
                tp = int(value)
            else:
                pp = int(value)
        elif eq:
            raise LayoutError(f"layout {raw!r}: unknown {key!r} (tp=N, pp=N)")
        elif part == "solo":
            solo = True
        elif part == "ep":
            ep = True
        elif part in BACKENDS:
            backend = part
        elif part in ROUTERS:
            router = part
        else:
            raise LayoutError(f"layout {raw!r}: unknown {part!r} (solo, tp=N, pp=N, ep, ray, mp, leastconn, "
                              f"shuffle, least-busy, litellm, or Nx before them for replicas)")
    if solo and (tp > 1 or pp > 1):
        raise LayoutError(f"layout {raw!r}: solo is one node; tp= or pp= spread an engine over several")
    if router and replicas == 1:
        raise LayoutError(f"layout {raw!r}: {router} routes between replicas; write e.g. 2x {text}")
    if backend and tp * pp == 1:
        raise LayoutError(f"layout {raw!r}: {backend} joins the nodes of one engine; solo has one")
    if ep and tp == 1:
        raise LayoutError(f"layout {raw!r}: ep spreads a MoE model's experts over its tp ranks; add tp=N")
    layout = Layout(tp=tp, pp=pp, replicas=replicas, backend=backend or "mp",
                    router=router or (DEFAULT_ROUTER if replicas > 1 else None), ep=ep)
    if layout.nodes > MAX_NODES:
        raise LayoutError(f"layout {raw!r} needs {layout.nodes} nodes; sparktop runs layouts of up to {MAX_NODES}")
    return layout


def describe(layout: Layout) -> str:
    """A layout in words, for a list to choose from: "TP=4 over 4 nodes, Ray",
    "2 engines of TP=2 + HAProxy leastconn"."""
    parts = [f"TP={layout.tp}"] if layout.tp > 1 else []
    parts += [f"PP={layout.pp}"] if layout.pp > 1 else []
    shape = " x ".join(parts) + (" + EP" if layout.ep else "")
    ray = layout.backend == "ray"
    if layout.replicas > 1:
        if not layout.spans_nodes:
            return f"solo x{layout.replicas} + {router_text(layout.router)}"
        return f"{layout.replicas} engines of {shape}{' over Ray' if ray else ''} + {router_text(layout.router)}"
    if not layout.spans_nodes:
        return "one node"
    return f"{shape} over {layout.nodes_per_engine} nodes, " + ("Ray" if ray else "no Ray")


def router_text(router: str | None) -> str:
    """"HAProxy leastconn", "LiteLLM shuffle": a layout's router word with what runs it."""
    return ROUTER_PRODUCTS.get(router or "", f"router {router}")


def order(name: str) -> tuple:
    """Sort key for layout names: the five two-node names in their usual
    order, then the others by the nodes they take, fewest first."""
    if name in ALIASES:
        return (0, list(ALIASES).index(name))
    layout = layout_of(name)
    if layout is None:
        return (2, name)
    return (1, layout.nodes, layout.replicas, -layout.tp, layout.pp, layout.backend, layout.router or "",
            layout.ep)


def to_label(name: str) -> str:
    """A layout's name as a container label can hold it: `docker ps` joins
    the labels with commas, so a comma in a value would split it there."""
    return name.replace(",", ";")


def from_label(value: str | None) -> str | None:
    return value.replace(";", ",") if value else value


def layout_of(topology: str | None) -> Layout | None:
    """The layout a run, a container label or a report names; None for a
    name that is none (an engine sparktop did not launch)."""
    if not topology:
        return None
    try:
        return parse_layout(topology)
    except LayoutError:
        return None


def split_layouts(text: str) -> list[str]:
    """A comma-separated list of layouts, some with commas of their own:
    "solo,cluster-mp" is two, "tp=2,pp=2" one, "tp=4,2x tp=2,ray" two and
    "4x solo,shuffle" one (a router joins the replicas before it).
    Separating them with ";" always works."""
    if ";" in text:
        return [p.strip() for p in text.split(";") if p.strip()]
    groups: list[list[str]] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        low = token.lower()
        current = groups[-1] if groups else None
        head = current[0].lower() if current else ""
        replicas = bool(_REPLICAS.match(head))
        spread = current is not None and head not in ALIASES and (replicas or head.startswith(("tp=", "pp=")))
        joins = current is not None and (
            low in ("ep", "ray", "mp") and spread
            or low in ROUTERS and replicas and not any(t.lower() in ROUTERS for t in current)
            or low.startswith("pp=") and spread and not any(t.lower().startswith("pp=") for t in current))
        if joins and current is not None:
            current.append(token)
        else:
            groups.append([token])
    return [",".join(g) for g in groups]


def layouts_for(node_count: int, *, max_nodes: int | None = None, min_nodes_per_engine: int = 1,
                moe: bool = False, routers: tuple[str, ...] = (DEFAULT_ROUTER,)) -> list[Layout]:
    """Every layout over at most `node_count` nodes (and a recipe's
    `max_nodes`), engines of at least `min_nodes_per_engine` nodes (a model
    that fits no fewer): what `predict --layout all` ranks. Powers of two for
    tp (vLLM needs tp to divide the attention heads), Ray and mp both for one
    engine over nodes, HAProxy leastconn for replicas, ep beside tp for MoE models."""
    limit = min(node_count, max_nodes or node_count, MAX_NODES)
    out: list[Layout] = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            per_engine = tp * pp
            if per_engine > limit or per_engine < min_nodes_per_engine:
                continue
            for replicas in range(1, limit // per_engine + 1):
                backends = BACKENDS if per_engine > 1 else ("mp",)
                for backend in backends:
                    for ep in ((False, True) if moe and tp > 1 else (False,)):
                        for router in (routers if replicas > 1 else (None,)):
                            out.append(Layout(tp=tp, pp=pp, replicas=replicas, backend=backend, router=router,
                                              ep=ep))
    return out
