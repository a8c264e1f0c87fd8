"""Making a study: which topologies, the predictions beside them, and how long it will take.

The estimate is what a person plans an overnight run with: per topology,
the start-up the model's weights imply (read from the nodes' local disk at
GB10's measured rate, then vLLM's compile and graph capture), the sweep the
performance model predicts (warm-up plus `runs` batches per level, each
batch as long as its predicted wall time) and a stop. On the demo's twins
the start-up is the twins' (they start `DEMO_STARTUP_SPEED` times faster than
a Spark) and the sweep is at their pace (`--speed`, already in the forecast).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from sparktop.errors import SparktopError
from sparktop.launch.recipe import Recipe
from sparktop.layouts import LayoutError, parse_layout, split_layouts
from sparktop.model.simulate import TOPOLOGIES
from sparktop.settings import DEMO_INVENTORY, Inventory, demo_inventory_path
from sparktop.study.state import Study, TopologyState, new_study_id, studies_dir

STOP_S = 15.0  # removing containers and checking every node
CALIBRATE_S = 5.0  # the sweep's latency probes and prompt calibration, per topology
EXTRA_START_S = {"cluster-ray": 20.0, "shuffle": 10.0, "least-busy": 10.0}  # Ray's start, the router's
# What `sparktop demo` serves when no model is named (its `--model`, the twin's DEMO_MODEL): `study --demo`
# studies it when no recipe is named.
DEMO_RECIPE = "gpt-oss-120b"
# How much faster than a Spark the demo's twins start (`demo.demo_inventory`'s startup_speed): a demo study's
# start-up, Ray's and the router's included, is the model's divided by it.
DEMO_STARTUP_SPEED = 30.0
DEMO_SPAWN_S = 3.0  # a twin's processes starting, and the launch's steps, on this machine: beside the model's stages
DEMO_STOP_S = 2.0  # removing a twin's containers and checking its nodes: no real engine to wind down
# A layout of replicas puts the real LiteLLM proxy in front of them; the demo's twins run the one on this
# machine's PATH, so without it those layouts are left out of a study on them up front.
NO_LITELLM = "replicas behind LiteLLM, and this machine has no `litellm`: pip install 'litellm[proxy]' to measure them"


@dataclass
class Estimate:
    startup_s: float
    sweep_s: float
    stop_s: float = STOP_S

    @property
    def total_s(self) -> float:
        return self.startup_s + self.sweep_s + self.stop_s


def is_demo_inventory(path: str | None) -> bool:
    """Whether an inventory (as given to `--inventory`, or as a study recorded it) is the demo's twin nodes:
    `demo` (`--demo`, or `--inventory demo` with no file of that name here) or the file `sparktop demo` writes."""
    if not path:
        return False
    if str(path) == DEMO_INVENTORY and not Path(DEMO_INVENTORY).exists():
        return True
    return Path(path).resolve() == demo_inventory_path().resolve()


def routed(t: TopologyState) -> bool:
    """Whether a study entry's layout puts replicas behind a router (LiteLLM)."""
    from sparktop.layouts import layout_of

    layout = layout_of(t.layout_name) or layout_of(t.name)
    return layout is not None and layout.replicas > 1


def left_out_here(entries: list[TopologyState], on_demo: bool,
                  has_litellm: bool | None = None) -> tuple[list[TopologyState], list[TopologyState]]:
    """(what runs, what is left out) of a study's entries: on the demo's twins (`--demo` or `--inventory demo`)
    without `litellm` on this machine, the layouts of replicas behind LiteLLM are left out (`NO_LITELLM` says
    why); elsewhere nothing is (a real cluster's router is its own image)."""
    import shutil

    if not on_demo:
        return list(entries), []
    if has_litellm is None:
        has_litellm = shutil.which("litellm") is not None
    if has_litellm:
        return list(entries), []
    out = [t for t in entries if routed(t)]
    return [t for t in entries if t not in out], out


def choose_topologies(recipe: Recipe, text: str, nodes: int) -> list[str]:
    """`all` (the five two-node names the recipe allows on these nodes) or a
    list of layouts (`solo,cluster-mp`, `tp=4,2x tp=2`), checked."""
    allowed = recipe.allowed_topologies(nodes)
    if text.strip() in ("", "all"):
        if not allowed:
            raise SparktopError(f"{recipe.id}: no topology fits {nodes} node(s)")
        chosen = [t for t in TOPOLOGIES if t in allowed]
        # A runtime that spreads one engine over nodes only by its layers (llama.cpp) has none of the two
        # cluster names: its own two-node layout stands in for them.
        spread = [t for t in chosen if parse_layout(t).spans_nodes]
        if not spread and nodes >= 2 and not recipe.why_not_layout(parse_layout("pp=2"), nodes):
            chosen.insert(1 if chosen[:1] == ["solo"] else 0, "pp=2")
        return chosen
    out = []
    for text_ in split_layouts(text):
        try:
            layout = parse_layout(text_)
        except LayoutError as exc:
            raise SparktopError(f"--topologies: {exc}") from None
        why = recipe.why_not_layout(layout, nodes)
        if why:
            raise SparktopError(f"--topologies {text_}: {why}")
        if layout.name not in out:
            out.append(layout.name)
    return out


def study_entries(recipes: dict[str, Recipe], text: str, nodes: int) -> list[TopologyState]:
    """What a study measures: each layout (`choose_topologies`) of each runtime's recipe. One runtime: its
    layouts by their plain names; several: "llama.cpp solo", "SGLang tp=2", the layouts each runtime allows
    (an explicit layout it cannot run is an error)."""
    from sparktop.launch.runtimes import runtime_for

    if len(recipes) == 1:
        (recipe,) = recipes.values()
        return [TopologyState(t) for t in choose_topologies(recipe, text, nodes)]
    out = []
    refused: dict[str, list[str]] = {}
    for rid, recipe in recipes.items():
        for layout in _layouts_of(recipe, text, nodes, refused):
            out.append(TopologyState(f"{runtime_for(rid).name} {layout}", layout=layout, runtime=rid,
                                     recipe=recipe.id, recipe_path=str(recipe.path) if recipe.path else None))
    # A layout is measured by the runtimes that can run it ("tp=2" by vLLM and SGLang, "pp=2" by llama.cpp);
    # one that none of them can run is an error.
    ran = {t.layout_name for t in out}
    for layout, reasons in refused.items():
        if layout not in ran:
            raise SparktopError(f"--topologies {layout}: no runtime of the study runs it ({'; '.join(reasons)})")
    return out


def _layouts_of(recipe: Recipe, text: str, nodes: int, refused: dict[str, list[str]]) -> list[str]:
    """The layouts of `text` this runtime's recipe can run ("all": its own), noting why it cannot run others."""
    if text.strip() in ("", "all"):
        return choose_topologies(recipe, text, nodes)
    out = []
    for item in split_layouts(text):
        try:
            out += [n for n in choose_topologies(recipe, item, nodes) if n not in out]
        except SparktopError as exc:
            try:
                name = parse_layout(item).name
            except LayoutError:
                raise exc from None  # not a layout at all: the error is the same for every runtime
            refused.setdefault(name, []).append(f"{recipe.id}: {str(exc).removeprefix(f'--topologies {item}: ')}")
    return out


def predict_topology(recipe: Recipe, t: TopologyState, study: Study, inventory: Inventory,
                     overrides: dict | None = None) -> Estimate | None:
    """Fill `t.predicted` and `t.serving`; the time it should take (None: no model card). `overrides`: the
    study's, in this recipe's runtime's names (the study's own by default). The predictions are
    `forecast`'s for the recipe on the inventory, at the nodes' pace (`study.speed`)."""
    from sparktop.launch.prediction import subject_for_recipe
    from sparktop.launch.runtimes import runtime_for
    from sparktop.model.forecast import forecast

    name = t.layout_name
    mine = study.overrides if overrides is None else overrides
    serving = recipe.serving(name, mine)
    t.serving = dataclasses.asdict(serving)
    card = recipe.twin_card()
    if card is None:
        return None
    subject = subject_for_recipe(recipe, inventory, mine, card=card, speed=study.speed)
    fc = forecast(subject, [name], list(study.levels), study.pp, study.tg)
    rows = fc.rows
    basis = fc.basis[name]
    t.predicted = {str(r.concurrency): {"tg_tps_total": r.decode_tps, "tg_tps_req": r.per_request_tps,
                                        "pp_tps_total": r.prefill_tps, "ttft_ms_mean": r.ttft_ms}
                   for r in rows}
    perf = basis.perf(name, serving)
    stages = dict(perf.startup_stages())  # the twins' start-up has a pace of its own: not scaled by speed
    if not runtime_for(recipe.runtime).compiles:
        stages.pop("torch.compile", None)
    startup = sum(stages.values()) + EXTRA_START_S.get(name, 0.0)
    demo = is_demo_inventory(study.inventory)
    if demo:  # the demo's twins start in seconds, not minutes, and stop at once
        startup = startup / DEMO_STARTUP_SPEED + DEMO_SPAWN_S
    batches = study.runs + 1  # the warm-up batch is as long as one measured
    sweep = CALIBRATE_S + sum(batches * (r.wall_s_mean or 0.0) for r in rows)
    if study.rates or study.find_max_rate:
        # A rate level sends for its duration, then drains; a search measures about six of them.
        levels = 6 if study.find_max_rate else len(study.rates or [])
        sweep = CALIBRATE_S + levels * (study.duration + max((r.wall_s_mean or 0.0) for r in rows))
    elif study.depths:
        sweep *= len(study.depths)  # at least: a deeper context only adds to each batch
    return Estimate(startup, sweep, DEMO_STOP_S if demo else STOP_S)


def new_study(recipe: Recipe, inventory: Inventory, topologies: list[str] | list[TopologyState], *,
              levels: list[int], runs: int, pp: int, tg: int, extra_body: dict, overrides: dict,
              nodes: list[str] | None, inventory_path: str | None,
              recipes: dict[str, Recipe] | None = None,
              load: dict | None = None) -> tuple[Study, dict[str, Estimate | None]]:
    """A planned study (not yet on disk) and the estimate per topology (entries of `study_entries`, or layout
    names of one recipe); `recipes`: each runtime's recipe, in a study across runtimes."""
    card = recipe.twin_card()
    entries = [t if isinstance(t, TopologyState) else TopologyState(t) for t in topologies]
    study = Study(
        id=new_study_id(recipe.id), recipe=recipe.id, model=recipe.served_name,
        topologies=entries, levels=list(levels), runs=runs, pp=pp, tg=tg,
        extra_body=dict(extra_body), overrides=dict(overrides), recipe_path=str(recipe.path),
        card=card.name if card is not None else None, inventory=inventory_path, nodes=list(nodes or []),
        image=recipe.image or inventory.defaults.image_for(recipe.runtime),
        **(load or {}),  # rates, slo, find_max_rate, arrivals, requests, duration, depths, prefix_cache
    )
    from sparktop.launch.prediction import subject_for_recipe
    from sparktop.model.fit import inventory_key
    from sparktop.model.forecast import resolve

    study.inventory_key = inventory_key(inventory)
    study.speed = inventory.defaults.twin_speed
    if card is not None:
        study.quant = card.quant.scheme
        with contextlib.suppress(SparktopError):
            study.stack = resolve(subject_for_recipe(recipe, inventory, overrides, card=card),
                                  study.topologies[0].layout_name if study.topologies else "solo").stack
    by_runtime = recipes or {}
    from sparktop.launch.session import overrides_for

    estimates = {}
    for t in study.topologies:
        mine = by_runtime.get(t.runtime, recipe)
        estimates[t.name] = predict_topology(mine, t, study, inventory, overrides_for(study.overrides, recipe.runtime,
                                                                              mine.runtime))
    known = [e for e in estimates.values() if e is not None]
    study.estimate_s = sum(e.total_s for e in known) if len(known) == len(estimates) else None
    study.path = studies_dir() / study.id
    return study, estimates
