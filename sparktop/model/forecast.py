"""The one prediction entry point: what a recipe, a card or a running engine
would give, the same figure wherever sparktop shows it.

A `Subject` is everything a prediction depends on, as plain values: the card
(the checkpoint's format, a recipe's `quantization:` applied), the runtime,
the engine's settings, its image (which names the vLLM stack), the
inventory's own fit, and the nodes' pace (`speed`: a twin at x4 runs four
times a GB10's). `resolve` turns it into a `Basis` (the card as the runtime
lays it out, the stack, the constants fully applied) without simulating
anything: the twin and the cards time their engines with it. `forecast`
simulates llama-benchy levels on it, scaled by the speed.

`predict`, the launcher, the sweep screen, the cards, studies and the twin
all come through here (the adapters from recipes, plans and engines are in
`sparktop.launch.prediction`), so one question has one answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparktop import engine_ids, labels
from sparktop.layouts import parse_layout
from sparktop.model.cards import ModelCard
from sparktop.model.perf import Constants, PerfModel
from sparktop.model.predict import Row
from sparktop.model.routers import Router, router_for
from sparktop.model.serving import Serving

# The engine the shared constants (and the stacks) are fitted to: vLLM, by its row.
BASE = next(r.id for r in engine_ids.ROWS if r.base_model)


@dataclass(frozen=True)
class Subject:
    """What is predicted: everything a prediction depends on, as plain values."""

    card: ModelCard  # in the checkpoint's format (a recipe's quantization, --quant applied)
    runtime: str = engine_ids.DEFAULT  # a runtime id or alias (model.runtimes.runtime_id)
    serving: Serving | Callable[[str], Serving] = field(default_factory=Serving)  # or per topology
    image: str | Callable[[str], str | None] | None = None  # the engine's image (per topology): names the stack
    stack: str | None = None  # explicit (--stack, a twin's label); None: from the image
    inventory_key: str | None = None  # model.fit.inventory_key(inventory): its own fit, if saved
    fitted_path: str | None = None  # an inventory fit's file, read directly (a twin's label)
    speed: float = 1.0  # the nodes' pace: rates times it, times divided by it
    source: str = ""  # what it is, for text: "recipe gpt-oss-120b", "card gpt-oss-120b"
    router: str | None = None  # the replicas' router version (model.routers); None: what sparktop launches for the word

    def serving_for(self, topology: str) -> Serving:
        return self.serving(topology) if callable(self.serving) else self.serving

    def image_for(self, topology: str | None) -> str | None:
        if callable(self.image):
            return self.image(topology or "solo")
        return self.image


@dataclass(frozen=True)
class Basis:
    """What a prediction rests on, resolved once (no simulation)."""

    card: ModelCard  # as the runtime lays the checkpoint out
    runtime: str
    stack: str | None  # vLLM's build; None for other runtimes (and a twin told of no image)
    stack_note: str | None  # why the stack was assumed, when it was
    constants: Constants  # fully applied: inventory's or shipped -> stack (vLLM) or runtime factors
    speed: float
    fitted: dict | None  # the inventory's own fit (its summary), None: the published constants
    cannot: str | None = None  # why the model cannot say (TGI, an unfitted runtime): no rows

    def perf(self, topology: str, serving: Serving | None = None) -> PerfModel:
        from sparktop.model.simulate import perf_for

        return perf_for(self.card, topology, self.constants, serving or Serving())


@dataclass
class Forecast:
    basis: dict[str, Basis]  # per topology (an image per topology may change the stack)
    rows: list[Row]  # scaled by the speed
    pp: int
    tg: int
    speed: float
    routers: dict[str, Router] = field(default_factory=dict)  # per routed topology: the router modelled

    def router_lines(self) -> list[str]:
        """"router: LiteLLM 1.106.2 least-busy (as measured: ...) for 2x solo,least-busy", one per router."""
        by: dict[str, list[str]] = {}
        for topology, row in self.routers.items():
            by.setdefault(row.describe(), []).append(topology)
        return [f"router: {text} for {', '.join(tops)}" for text, tops in by.items()]

    def router_json(self) -> dict[str, dict]:
        return {topology: {**row.as_dict(), "text": row.describe()} for topology, row in self.routers.items()}

    def at(self, topology: str, c: int) -> Row | None:
        return next((r for r in self.rows if r.topology == topology and r.concurrency == c), None)


def _runtime_id(runtime: str | None) -> str:
    if runtime in (None, "", BASE):
        return BASE
    from sparktop.model.runtimes import CannotModel, runtime_id

    try:
        return runtime_id(str(runtime))
    except CannotModel:
        return str(runtime)


def base_constants(inventory_key: str | None = None, fitted_path: str | None = None) -> tuple[Constants, dict | None]:
    """The shared constants: an inventory's own fit where there is one, else the shipped ones; with the fit's
    summary (None for the shipped ones)."""
    import json

    from sparktop.model import fit

    if fitted_path and Path(fitted_path).exists():
        try:
            return fit.load_constants(Path(fitted_path)), json.loads(Path(fitted_path).read_text())
        except ValueError:
            pass
    summary = fit.fitted_summary(inventory_key)
    if summary is not None and inventory_key:
        return fit.load_constants(fit.fitted_path(inventory_key)), summary
    return fit.load_constants(), None


def constants_for(runtime: str, stack: str | None, inventory_key: str | None = None,
                  fitted_path: str | None = None) -> Constants:
    """The constants an engine runs with: the inventory's fit (or the shipped one), then the stack's factors for
    vLLM, the runtime's factors for another (CannotModel where it has none)."""
    base, _ = base_constants(inventory_key, fitted_path)
    return _apply(base, _runtime_id(runtime), stack)


def _apply(base: Constants, runtime: str, stack: str | None) -> Constants:
    if runtime == BASE:
        return base.for_stack(stack)
    from sparktop.model.runtimes import apply_runtime as runtime_constants

    return runtime_constants(runtime, base.for_stack(None))


def pick_stack(subject: Subject, runtime: str, fitted: dict | None,
               topology: str | None = None) -> tuple[str | None, str | None]:
    """(the vLLM stack, a note when it is assumed): the subject's own, else the inventory's fitted `yours`, else
    the one its image names; none for another runtime, or when neither a stack nor an image is known."""
    from sparktop.model.fit import YOURS
    from sparktop.model.stacks import load_stacks

    if runtime != BASE:
        return None, None
    stacks = load_stacks()
    if subject.stack:
        if subject.stack != YOURS:
            stacks.get(subject.stack)  # an unknown id: one line naming the known ones
        return subject.stack, None
    if YOURS in ((fitted or {}).get("stacks") or {}):
        return YOURS, None  # `twin fit --runs` measured this inventory's own stack
    image = subject.image_for(topology)
    if image is None:
        return None, None
    return stacks.for_image(image)


def labelled_card(card: ModelCard, labelled: Mapping[str, str]) -> ModelCard:
    """The card a launch labelled its engine with (`labels.CARD`, `labels.QUANT`: a recipe's
    `quantization:` is no flag of the engine's, so it reaches the twin and the monitor only this way);
    `card` where there is no label."""
    import contextlib

    from sparktop.errors import SparktopError
    from sparktop.model.cards import UnknownModel, find_card
    from sparktop.model.quant import Quantization

    if labelled.get(labels.CARD) and labelled[labels.CARD] != card.name:
        with contextlib.suppress(UnknownModel):
            card = find_card(labelled[labels.CARD])
    scheme = labelled.get(labels.QUANT)
    if scheme and scheme != card.quant.scheme:
        with contextlib.suppress(SparktopError):
            quant = Quantization.of(scheme)
            if (quant.experts, quant.linear) != (card.quant.experts, card.quant.linear):
                card = dataclasses.replace(card, quant=quant)
    return card


def card_for_runtime(card: ModelCard, runtime: str) -> ModelCard:
    """The card as `runtime` runs the checkpoint: its own layout of the tensors (llama.cpp's gpt-oss GGUF keeps
    all but the experts in Q8_0), not the kernel path of vLLM's Spark image (`mxfp4-spark`)."""
    if runtime == BASE:
        return card
    from sparktop.model.runtimes import runtime_card

    return runtime_card(runtime, card, card.quant.scheme.lower().removesuffix("-spark"))


def resolve(subject: Subject, topology: str | None = None) -> Basis:
    """The card, stack and constants a subject's engine runs with (on `topology`, whose image may differ)."""
    from sparktop.model.runtimes import CannotModel

    runtime = _runtime_id(subject.runtime)
    base, fitted = base_constants(subject.inventory_key, subject.fitted_path)
    stack, note = pick_stack(subject, runtime, fitted, topology)
    try:
        card = card_for_runtime(subject.card, runtime)
        k = _apply(base, runtime, stack)
        cannot = None
    except CannotModel as exc:
        card, k, cannot = subject.card, base.for_stack(None), str(exc)
    return Basis(card, runtime, stack, note, k, subject.speed, fitted, cannot)


def scaled(row: Row, speed: float) -> Row:
    """A row as nodes `speed` times a GB10's would give it: rates times the speed, times divided by it."""
    if speed == 1:
        return row

    def mul(v: float | None) -> float | None:
        return None if v is None else v * speed

    def div(v: float | None) -> float | None:
        return None if v is None else v / speed

    return dataclasses.replace(row, decode_tps=mul(row.decode_tps), per_request_tps=mul(row.per_request_tps),
                               prefill_tps=mul(row.prefill_tps), ttft_ms=div(row.ttft_ms),
                               e2e_tps_total=mul(row.e2e_tps_total), e2e_tps_req=mul(row.e2e_tps_req),
                               wall_s_mean=div(row.wall_s_mean))


def forecast(subject: Subject, topologies: Sequence[str], levels: Sequence[int], pp: int = 1024,
             tg: int = 128) -> Forecast:
    """llama-benchy levels (lockstep batches of c requests of pp prompt and tg output tokens) per topology, as
    the subject's engine would measure them on nodes of its speed. No rows where the model cannot say."""
    from sparktop.model.simulate import predict

    bases: dict[str, Basis] = {}
    rows: list[Row] = []
    routers: dict[str, Router] = {}
    for topology in topologies:
        basis = bases[topology] = resolve(subject, topology)
        if basis.cannot:
            continue
        layout = parse_layout(topology)
        if layout.router:
            routers[topology] = router_for(layout.router, subject.router)
        sv = subject.serving_for(topology)
        for c in levels:
            p = predict(basis.card, topology, c, pp, tg, basis.constants, sv, router=subject.router)
            s = p.stats
            rows.append(scaled(Row(basis.card.name, topology, c, pp, tg, s.tg_tps_total, s.tg_tps_req,
                                   s.pp_tps_total, s.ttft_ms_mean, round(p.kv_cache_usage, 4), p.fits,
                                   s.e2e_tps_total, s.e2e_tps_req, s.wall_s_mean, p.preempted), subject.speed))
    return Forecast(bases, rows, pp, tg, subject.speed, routers)
