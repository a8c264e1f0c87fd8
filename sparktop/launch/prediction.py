"""Subjects of a prediction from what launch knows: a recipe, a plan, a card,
a running engine. `sparktop.model.forecast` does the predicting; this only
says what is predicted, the same way for `predict`, the launcher, the sweep
screen, the cards, studies and the twin a plan starts (through its labels)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from sparktop import labels
from sparktop.model.forecast import Subject

if TYPE_CHECKING:
    from sparktop.launch.plan import Plan
    from sparktop.launch.recipe import Recipe
    from sparktop.model.cards import ModelCard
    from sparktop.settings import Inventory



def engine_image(recipe: Recipe, topology: str, inventory: Inventory) -> str:
    """The image the engine of `topology` runs: the recipe's (or its topology's), else the inventory's for the
    runtime (vLLM's `defaults.image`, another's `defaults.images` or its own default)."""

    image = recipe.settings(topology)[3]
    if image:
        return image
    return inventory.defaults.image_for(recipe.runtime)


def _key(inventory: Inventory) -> str:
    from sparktop.model.fit import inventory_key

    return inventory_key(inventory)


def subject_for_recipe(recipe: Recipe, inventory: Inventory, overrides: dict | None = None, *,
                       stack: str | None = None, card: ModelCard | None = None,
                       speed: float | None = None) -> Subject:
    """A recipe as launched on this inventory's nodes, with `--set` overrides."""
    from sparktop.errors import SparktopError

    card = card or recipe.twin_card()
    if card is None:
        raise SparktopError(f"{recipe.path}: model {recipe.model!r} has no model card")
    return Subject(card=card, runtime=recipe.runtime,
                   serving=lambda t: recipe.serving(t, overrides=overrides),
                   image=lambda t: engine_image(recipe, t, inventory), stack=stack,
                   inventory_key=_key(inventory),
                   speed=inventory.defaults.twin_speed if speed is None else speed,
                   source=f"recipe {recipe.id}")


def subject_for_plan(plan: Plan, recipe: Recipe, inventory: Inventory) -> Subject:
    """Exactly what a plan launches: its image and its engine's flags (the recipe's, the topology's and the
    form's overrides)."""
    from sparktop.launch.runtimes import runtime_for
    from sparktop.model.serving import Serving

    flags = runtime_for(plan.runtime).serving_flags(dict(plan.flags))
    serving = Serving.from_flags({k: v for k, v in flags.items() if k != "kv_cache_free_fraction"},
                                 where=str(recipe.path))
    subject = subject_for_recipe(recipe, inventory)
    return dataclasses.replace(subject, runtime=plan.runtime, serving=serving,
                               image=plan.image or subject.image)


def subject_for_card(card: ModelCard, inventory: Inventory, runtime: str = "vllm", serving: Any = None, *,
                     stack: str | None = None, speed: float | None = None) -> Subject:
    """A bare card (`predict --model`, a config.json) on the inventory's default image."""
    from sparktop.model.serving import Serving

    image = inventory.defaults.image_for(runtime)
    return Subject(card=card, runtime=runtime, serving=serving if serving is not None else Serving(),
                   image=image or inventory.defaults.image, stack=stack, inventory_key=_key(inventory),
                   speed=inventory.defaults.twin_speed if speed is None else speed, source=f"card {card.name}")


def engine_serving(kind: str, argv: list[str]) -> Any:
    """The serving settings (`model.serving.Serving`) an engine's command line gives, read by its runtime's
    parser (`Runtime.split_command`) and named as the model names them; the defaults for what it does not
    say, or for an engine sparktop does not launch (its flags are not known)."""
    from sparktop.errors import SparktopError
    from sparktop.launch.runtimes import UnknownRuntime, runtime_for
    from sparktop.model.serving import Serving

    if not argv:
        return Serving()
    try:
        runtime = runtime_for(kind)
    except UnknownRuntime:
        return Serving()
    _, _, flags, _ = runtime.split_command(list(argv))
    try:
        return Serving.from_flags(runtime.serving_flags(flags), where=f"the {runtime.name} command line")
    except SparktopError:
        return Serving()


def engine_topology(snap: Any) -> str:
    """An engine's own layout as the model names it (`solo`, `tp=2`, `tp=2,pp=2`): its replicas are other
    engines, so a replica of `2x tp=2` is a `tp=2`."""
    from sparktop.layouts import layout_of

    layout = layout_of(getattr(snap, "topology", None))
    if layout is None:
        return "solo"
    if layout.pp > 1:
        return f"tp={layout.tp},pp={layout.pp}"
    return f"tp={layout.tp}" if layout.tp > 1 else "solo"


def subject_for_engine(snap: Any, inventory: Inventory | None = None) -> Subject | None:
    """A running engine as the monitor sees it: its served model's card, its kind, its image and the serving
    flags of its command line (where discovery read one); None when sparktop has no card for it or it is not
    an engine (a router)."""
    from sparktop.engine_ids import DEFAULT, is_router
    from sparktop.model.cards import UnknownModel, find_card
    from sparktop.model.forecast import labelled_card
    from sparktop.model.gguf import gguf_card

    model = getattr(snap, "model", None)
    kind = getattr(snap, "kind", None) or DEFAULT
    if not model or is_router(kind):
        return None
    card = None
    for find in (find_card, gguf_card):
        try:
            card = find(model)
            break
        except (UnknownModel, ValueError):
            continue
    if card is None:
        return None
    # What its launch labelled it with (a recipe's format and stack, which no flag says), as the twin reads them.
    labelled = getattr(snap, "serves", None) or {}
    card = labelled_card(card, labelled)
    speed = inventory.defaults.twin_speed if inventory is not None else 1.0
    # Its container's image names its build; an engine outside one runs what the inventory runs by default.
    image = getattr(snap, "image", None) or (inventory.defaults.image_for(kind) if inventory is not None else None)
    return Subject(card=card, runtime=kind, serving=engine_serving(kind, getattr(snap, "argv", None) or []),
                   image=image, stack=labelled.get(labels.STACK) or None,
                   inventory_key=_key(inventory) if inventory is not None else None,
                   fitted_path=None if inventory is not None else labelled.get(labels.FIT) or None, speed=speed,
                   source=f"engine {model}")


def predicted_for_engine(snap: Any, inventory: Inventory | None, c: int, pp: int = 1024, tg: int = 128,
                         topology: str | None = None) -> Any:
    """What the model says an engine serves at `c` requests at once (`forecast`'s row: decode t/s in all,
    TTFT ...), with its flags, at the inventory's twin speed, in `topology` (a layout with replicas, for a
    router swept as a whole) or its own; None for an engine sparktop has no card for. What the sweep screen
    shows beside each level and `status` beside each engine."""
    from sparktop.errors import SparktopError
    from sparktop.model.forecast import forecast

    subject = subject_for_engine(snap, inventory)
    if subject is None:
        return None
    topology = topology or engine_topology(snap)
    try:
        return forecast(subject, [topology], [max(1, c)], pp, tg).at(topology, max(1, c))
    except SparktopError:
        return None


def labels_for(subject: Subject, topology: str) -> dict[str, str]:
    """What a twin needs to serve the prediction: the card, its format and the vLLM stack, as container
    labels; and the inventory's own fit, by the path of its file (a twin on this machine reads it; one
    elsewhere has no such file and runs the published constants)."""
    from sparktop.model.fit import fitted_path
    from sparktop.model.forecast import resolve

    basis = resolve(subject, topology)
    out = {labels.CARD: subject.card.name, labels.QUANT: subject.card.quant.scheme}
    if basis.stack:
        out[labels.STACK] = basis.stack
    if basis.fitted is not None and subject.inventory_key:
        out[labels.FIT] = str(fitted_path(subject.inventory_key))
    return out


def predicted_now(snap: Any, inventory: Inventory | None) -> Any:
    """What the model says an engine should serve under the load it has now: `predicted_for_engine` at the
    requests it runs, with the mean prompt and output of the requests it has finished (1,024 and 128 before
    any has); None while it runs nothing or sparktop has no card for it."""
    running = getattr(snap, "running", None)
    if not running or running < 0.5:
        return None
    done = getattr(snap, "requests", None)
    prompt, generated = getattr(snap, "prompt_tokens_total", None), getattr(snap, "gen_tokens_total", None)
    pp, tg = 1024, 128
    if done and prompt and generated:
        pp, tg = max(1, round(prompt / done)), max(1, round(generated / done))
    return predicted_for_engine(snap, inventory, round(running), pp, tg)
