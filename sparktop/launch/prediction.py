"""Subjects of a prediction from what launch knows: a recipe, a plan, a card,
a running engine. `sparktop.model.forecast` does the predicting; this only
says what is predicted, the same way for `predict`, the launcher, the sweep
screen, the cards, studies and the twin a plan starts (through its labels)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from sparktop.model.forecast import Subject

if TYPE_CHECKING:
    from sparktop.launch.plan import Plan
    from sparktop.launch.recipe import Recipe
    from sparktop.model.cards import ModelCard
    from sparktop.settings import Inventory

# The labels a plan's containers carry for the twin (and the monitor) to know what it serves.
CARD_LABEL, QUANT_LABEL, STACK_LABEL, FIT_LABEL = "sparktop.card", "sparktop.quant", "sparktop.stack", "sparktop.fit"


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


def subject_for_engine(snap: Any, inventory: Inventory | None = None) -> Subject | None:
    """A running engine as the monitor sees it: its served model's card, its kind; None when sparktop has no
    card for it or it is not an engine (a router)."""
    from sparktop.engine_ids import is_router
    from sparktop.model.cards import UnknownModel, find_card
    from sparktop.model.gguf import gguf_card

    model = getattr(snap, "model", None)
    kind = getattr(snap, "kind", None) or "vllm"
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
    speed = inventory.defaults.twin_speed if inventory is not None else 1.0
    return Subject(card=card, runtime=kind, image=getattr(snap, "image", None) or None,
                   inventory_key=_key(inventory) if inventory is not None else None, speed=speed,
                   source=f"engine {model}")


def labels_for(subject: Subject, topology: str) -> dict[str, str]:
    """What a twin needs to serve the prediction: the card, its format and the vLLM stack, as container
    labels; and the inventory's own fit, by the path of its file (a twin on this machine reads it; one
    elsewhere has no such file and runs the published constants)."""
    from sparktop.model.fit import fitted_path
    from sparktop.model.forecast import resolve

    basis = resolve(subject, topology)
    out = {CARD_LABEL: subject.card.name, QUANT_LABEL: subject.card.quant.scheme}
    if basis.stack:
        out[STACK_LABEL] = basis.stack
    if basis.fitted is not None and subject.inventory_key:
        out[FIT_LABEL] = str(fitted_path(subject.inventory_key))
    return out
