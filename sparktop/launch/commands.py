"""`sparktop recipes`, `sparktop predict`, `sparktop launch` and `sparktop stop` for the terminal.

The same pieces the app uses (recipes, plan, preflight, executor, state),
printed with rich; a failure prints the lines that say why and exits
non-zero after everything started has been removed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sparktop import engine_ids
from sparktop.errors import ConfigError, SparktopError
from sparktop.launch.catalog import discover, find_recipe, runtime_recipes
from sparktop.launch.events import Failed, LaunchEvent, LogLine, Ready, Stage, StepDone, StepStarted, TornDown
from sparktop.launch.recipe import Recipe, parse_sets
from sparktop.launch.runtimes import RUNTIMES, runtime_id
from sparktop.layouts import ROUTERS, LayoutError, layout_of, layouts_for, parse_layout, split_layouts
from sparktop.model.cards import ModelCard, UnknownModel, find_card
from sparktop.model.simulate import TOPOLOGIES
from sparktop.settings import Inventory, load_inventory
from sparktop.units import fmt

if TYPE_CHECKING:
    from sparktop.launch.executor import DEFAULT_TIMEOUT, Executor, LaunchFailed
    from sparktop.launch.preflight import Preflight, run_preflight
    from sparktop.launch.state import LaunchState
    from sparktop.launch.topology import make_plan
    from sparktop.launch.watchdog import Policy
    from sparktop.observe.snapshot import Notice
    from sparktop.remote import transport_for

# What launching and stopping need (the executor, preflight, SSH, aiohttp through the engines' probes), imported
# when something launches or stops: `sparktop predict` and `sparktop recipes` never load them. They are module
# attributes all the same (`commands.Executor`), so a test may replace one.
_LAUNCHING = {"DEFAULT_TIMEOUT": "sparktop.launch.executor", "Executor": "sparktop.launch.executor",
              "LaunchFailed": "sparktop.launch.executor", "run_preflight": "sparktop.launch.preflight",
              "LaunchState": "sparktop.launch.state", "make_plan": "sparktop.launch.topology",
              "transport_for": "sparktop.remote"}


def _import_launching() -> None:
    """Bind what launching needs as this module's globals, keeping any already bound (a test's stand-in)."""
    for name in _LAUNCHING:
        if name not in globals():
            globals()[name] = getattr(importlib.import_module(_LAUNCHING[name]), name)


def __getattr__(name: str) -> Any:
    if name in _LAUNCHING:
        _import_launching()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cmd_recipes(extra_dirs: list[str] | None, as_json: bool, console: Console | None = None) -> int:
    console = console or Console()
    recipes, errors = discover(extra_dirs)
    if as_json:
        json.dump([recipe_json(r) for r in recipes.values()], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.cells import cell_len

    from sparktop.tables import fit_columns

    rows = []
    for r in sorted(recipes.values(), key=lambda r: r.id):
        weights = r.estimated_weights_gib()
        rows.append({"recipe": r.id, "runtime": r.runtime, "model": r.model, "quant": r.quant_shown(),
                     "weights": f"{weights:.1f} GiB" if weights else "—",
                     "topologies (2 nodes)": ", ".join(r.allowed_topologies(2)), "from": f"{r.format}: {r.path}"})
    heads = ("recipe", "runtime", "model", "quant", "weights", "topologies (2 nodes)", "from")
    wraps = ("topologies (2 nodes)", "from")  # a name a line, a path folded; the others whole or left out

    def needs(col: str) -> int:
        if col == "topologies (2 nodes)":
            return max(cell_len(word) + 1 for text in [col, *(row[col] for row in rows)] for word in text.split())
        return max(cell_len(col), *(cell_len(row[col]) for row in rows)) if col != "from" else 24
    # What does not fit the terminal goes, least needed first (as the sweep screen's tables drop theirs): the
    # recipe stays whole, then its runtime, quant, weights and topologies; the model's full name and the file
    # go first (--json has them).
    shown = fit_columns({c: needs(c) for c in heads},
                        ("recipe", "runtime", "quant", "weights", "topologies (2 nodes)", "model", "from"),
                        console.width, gap=2)
    table = Table(title="recipes", title_justify="left", header_style="bold underline", box=None, pad_edge=False)
    for col in heads:
        if col in shown:
            table.add_column(col, no_wrap=col not in wraps, overflow="fold" if col == "from" else "ellipsis")
    for row in rows:
        table.add_row(*(row[col] for col in heads if col in shown))
    if len(shown) < len(heads):
        table.caption = f"left out at {console.width} columns: {', '.join(c for c in heads if c not in shown)} " \
                        "(--json has every field)"
        table.caption_justify = "left"
    console.print(table)
    for error in errors:
        console.print(f"[yellow]skipped[/] {error}", highlight=False)
    return 0


def recipe_json(r: Recipe) -> dict:
    return {"id": r.id, "name": r.name, "runtime": r.runtime, "model": r.model, "served_model_name": r.served_name,
            "format": r.format,
            "path": str(r.path), "quantization": r.quantization, "weights_gib": r.estimated_weights_gib(),
            "topologies": r.allowed_topologies(2), "description": r.description}


def transports_for(inventory: Inventory, names: list[str]):
    _import_launching()
    return {name: transport_for(inventory.node(name)) for name in names}


async def _launch(recipe: Recipe, topology: str, inventory: Inventory, nodes: list[str] | None,
                  overrides: dict, port: int | None, dry_run: bool, yes: bool, timeout: float,
                  console: Console, watchdog: Policy | None = None, hung_after: float | None = None) -> int:
    _import_launching()
    plan = make_plan(recipe, topology, inventory, nodes, overrides, port)
    if dry_run:
        sys.stdout.write(plan.render())
        return 0
    console.print(f"[bold]{recipe.id}[/] as [bold]{topology}[/] on {', '.join(plan.nodes)}  (launch {plan.launch_id})")
    for note in plan.notes:  # which router runs in front of replicas, and why
        if note.startswith("router:"):
            console.print(note, highlight=False, markup=False, soft_wrap=True)
    transports = transports_for(inventory, plan.nodes)
    try:
        preflight = await run_preflight(plan, recipe, inventory, transports)
        console.print(preflight.render(), highlight=False, markup=False)
        if not yes and await _copy_what_is_missing(preflight, inventory, console):
            preflight = await run_preflight(plan, recipe, inventory, transports)
            console.print(preflight.render(), highlight=False, markup=False)
        if not preflight.ok:
            first = preflight.failures[0]
            raise SparktopError(f"preflight failed on {first.node}: {first.name}: {first.message}")
        if preflight.fabric:  # the fabric preflight found where the inventory gives none: the plan uses it
            plan = make_plan(recipe, topology, inventory, nodes, overrides, port, lid=plan.launch_id,
                             fabric=preflight.fabric)
        if not yes:
            if not sys.stdin.isatty():
                raise SparktopError("not launching without confirmation: add --yes (or run in a terminal)")
            if not _ask("Launch? [y/N] "):
                console.print("Not launched.")
                return 1
        executor = Executor(plan, transports, LaunchState(inventory), timeout=timeout)
        try:
            async for event in executor.run():
                print_event(event, plan, console)
        except LaunchFailed:
            return 1
    finally:
        for t in transports.values():
            await t.close()
    if watchdog is not None:
        return await _guard(inventory, plan.launch_id, watchdog, hung_after, console)
    return 0


def _ask(question: str) -> bool:
    """A yes from the terminal. Blocking on purpose: nothing else runs while a question waits, and Ctrl-C then
    stops at once; Ctrl-D (or a closed input) is a no."""
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:
        print()
        return False


async def _copy_what_is_missing(preflight: Preflight, inventory: Inventory, console: Console) -> bool:
    """Where preflight found weights or an image missing on a node and another node has them: at a terminal,
    offer to run the `sparktop sync` commands it named (each in its own process, on this terminal, so its bar
    shows); whether they ran and all succeeded (then preflight runs again). Never asked with --yes: copying
    tens of gigabytes is not what a yes to launching says."""
    fixes = list(dict.fromkeys(c.fix for c in preflight.checks if c.fix and c.status in ("fail", "warn")))
    if not fixes or inventory.path is None or not sys.stdin.isatty():
        return False
    commands = [["sparktop", *fix, "--inventory", str(inventory.path)] for fix in fixes]
    console.print("What is missing can be copied from a node that has it:")
    for argv in commands:
        console.print("  " + shlex.join(argv), highlight=False, markup=False, soft_wrap=True)
    if not _ask("Copy it now? [y/N] "):
        return False
    for argv in commands:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", *argv)
        if await proc.wait() != 0:
            console.print(f"not copied: {shlex.join(argv)} exited {proc.returncode}", highlight=False, markup=False)
            return False
    return True


async def _guard(inventory: Inventory, launch_id: str, policy: Policy, hung_after: float | None,
                 console: Console) -> int:
    """`launch --watchdog`: what happens to the launch's engines, printed, until Ctrl-C (`launch.watchdog`);
    130 once Ctrl-C ended it, as a command a Ctrl-C ends exits."""
    import signal

    from sparktop.launch.watchdog import guard
    from sparktop.observe.hang import HUNG_AFTER_S

    console.print(f"[bold]watchdog[/] on {launch_id}: a hung or dead engine is restarted (at most "
                  f"{policy.cap_text()}); Ctrl-C stops watching, the engines keep running", highlight=False)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def interrupted() -> None:
        # The first Ctrl-C ends the watch (a restart under way is let finish: a half-restarted engine is worse
        # than a hung one); a second one is Python's own KeyboardInterrupt, at once.
        console.print("stopping the watch (a restart under way finishes first; Ctrl-C again to leave now); "
                      "the engines keep running", highlight=False)
        loop.remove_signal_handler(signal.SIGINT)
        stop.set()

    loop.add_signal_handler(signal.SIGINT, interrupted)
    try:
        async for notice in guard(inventory, launch_id, policy=policy, stop=stop,
                                  hung_after=HUNG_AFTER_S if hung_after is None else hung_after):
            print_notice(notice, console)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return 130


def print_notice(notice: Notice, console: Console) -> None:
    """One line of an engine's event log (and the log lines the watchdog saw before it acted)."""
    import time

    style = {"error": "bold red", "warn": "yellow"}.get(notice.level, "green")
    stamp = time.strftime("%H:%M:%S", time.localtime(notice.t))
    console.print(Text.assemble((stamp, "dim"), " ", (notice.key, "cyan"), " ", (notice.text, style)))
    for line in notice.lines:
        console.print(Text("    " + line, style="dim"))


def print_event(event: LaunchEvent, plan, console: Console) -> None:
    match event:
        case StepStarted(index=index, step=step):
            console.print(f"[dim]{index + 1}/{len(plan.steps)}[/] {step.title} …", highlight=False)
        case StepDone(step=step, seconds=seconds):
            console.print(f"[green]✓[/] {step.title} [dim]({seconds:.1f}s)[/]", highlight=False)
        case Stage(node=node, stage=stage):
            console.print(f"    [cyan]{node}[/] {stage}", highlight=False)
        case LogLine():
            pass  # the stage lines say enough on a terminal; the app shows the log tail
        case Failed(reason=reason, lines=lines):
            # On stderr, so that a script sees why; the log lines as they are (no markup in them).
            err = Console(stderr=True, highlight=False, soft_wrap=True)
            err.print(f"[bold red]launch failed:[/] {escape(reason)}")
            for line in lines:
                err.print(Text("    " + line, style="dim"))
        case TornDown(launch_id=lid, nodes=nodes, removed=removed):
            console.print(f"removed {removed} container(s) of {lid} on {', '.join(nodes)}")
        case Ready(seconds=seconds):
            console.print(f"[bold green]ready[/] in {seconds:.0f}s:")
            for e in plan.endpoints:
                key = f"  (key: {e.api_key_env} in sparktop's state)" if e.api_key_env else ""
                console.print(f"  {e.url}/v1  {e.kind} {e.model}{key}", highlight=False)


def cmd_launch(ref: str, topology: str, inventory: Inventory, nodes: list[str] | None = None,
               sets: list[str] | None = None, port: int | None = None, dry_run: bool = False, yes: bool = False,
               timeout: float | None = None, recipe_dirs: list[str] | None = None, watchdog: Policy | None = None,
               hung_after: float | None = None) -> int:
    _import_launching()
    recipe = find_recipe(ref, recipe_dirs)
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    console = Console(stderr=False)
    return asyncio.run(_launch(recipe, topology, inventory, nodes, parse_sets(sets, recipe.runtime), port, dry_run,
                               yes, timeout, console, watchdog, hung_after))


async def _stop(inventory: Inventory, launch_id: str | None, everything: bool, console: Console) -> int:
    from sparktop.launch.session import running_launch_ids, stop_launches

    _import_launching()
    state = LaunchState(inventory)
    transports = transports_for(inventory, [n.name for n in inventory.nodes])
    try:
        if launch_id:
            ids = [launch_id]
            if state.get(launch_id) is None:
                console.print(f"{launch_id} is not in sparktop's state; removing containers labelled with it")
        else:
            ids = await running_launch_ids(state, transports)
            if not ids:
                console.print("Nothing of sparktop's is running.")
                return 0
            if len(ids) > 1 and not everything:
                raise SparktopError(f"{len(ids)} launches are running ({', '.join(ids)}): name one, or use --all")
        for lid, removed in (await stop_launches(state, ids, transports)).items():
            console.print(f"stopped {lid}: removed {removed} container(s)")
        return 0
    finally:
        for t in transports.values():
            await t.close()


def cmd_stop(inventory: Inventory, launch_id: str | None, everything: bool) -> int:
    return asyncio.run(_stop(inventory, launch_id, everything, Console()))


def _predict_subject(args) -> tuple[Recipe | None, ModelCard]:
    """What `predict` was given: a recipe (its card), a card's name, or a config.json."""
    from sparktop.model.quant import Quantization

    if bool(args.recipe) == bool(args.model):
        raise SparktopError("predict: give a RECIPE or --model CARD (one of them)")
    if args.recipe and args.recipe.endswith(".json"):
        args.model, args.recipe = args.recipe, None  # a model's config.json, not a recipe
    recipe = None
    if args.recipe:
        try:
            recipe = find_recipe(args.recipe, args.recipes)
        except ConfigError as exc:
            try:  # a model card's name works as well as a recipe's
                find_card(args.recipe)
            except UnknownModel:
                if args.recipe.endswith((".yaml", ".yml")) or Path(args.recipe).expanduser().is_file():
                    raise exc from None  # a file: what is wrong in it (its YAML at its line, a key), or its absence
                raise SparktopError(f"predict: {args.recipe!r} is neither a recipe nor a model card "
                                    "(see `sparktop recipes` and `sparktop twin cards`)") from None
            args.model = args.recipe
    if recipe is not None:
        card = recipe.twin_card()
        if card is None:
            raise SparktopError(f"{recipe.path}: model {recipe.model!r} has no model card; name a card with "
                                "`card:` (see `sparktop twin cards`) or predict with --model path/to/config.json")
    else:
        card = find_card(args.model)
    if getattr(args, "quant", None):
        card = dataclasses.replace(card, quant=Quantization.of(args.quant), measured_weights_gib=None)
    return recipe, card


def _predict_topologies(args, recipe: Recipe | None, card: ModelCard, nodes: int) -> tuple[list[str], str | None]:
    """The layouts to predict, and a note on why, when it is not obvious.
    `all` is the five two-node names on two nodes or fewer, and every layout
    of the inventory's nodes beyond that whose weights fit its nodes."""
    from sparktop.model.hardware import GB10

    note = None
    if args.topology == "all" and nodes > 2:
        fits = [layout for layout in layouts_for(nodes, moe=card.is_moe, routers=ROUTERS)
                if card.weights_gib / layout.nodes_per_engine < 0.9 * GB10.memory_gib
                and (recipe is None or recipe.why_not_layout(layout, nodes) is None)]
        topologies = [layout.name for layout in fits]
        note = f"every layout of {nodes} nodes whose weights fit its nodes: {len(topologies)}"
    elif args.topology == "all":
        topologies = [t for t in TOPOLOGIES if recipe is None or t in recipe.allowed_topologies(2)]
        if "shuffle" in topologies:  # the two solo replicas behind the default router, HAProxy, too
            topologies.append(parse_layout("2x solo").name)
    elif args.topology:
        topologies = []
        for text in split_layouts(args.topology):
            try:
                layout = parse_layout(text)
            except LayoutError as exc:
                raise SparktopError(f"--layout: {exc}") from None
            # A prediction may be for nodes not bought yet: only the recipe's own limits count.
            why = recipe.why_not_layout(layout, layout.nodes) if recipe is not None else None
            if why:
                raise SparktopError(f"--layout {text}: {why}")
            topologies.append(layout.name)
    else:
        topologies = recipe.allowed_topologies(nodes) if recipe else (list(TOPOLOGIES) if nodes > 1 else ["solo"])
        if recipe is None and card.weights_gib > 0.9 * GB10.memory_gib:
            topologies = [t for t in TOPOLOGIES if t.startswith("cluster")]
            note = f"{card.name} ({card.weights_gib:.0f} GiB of weights) does not fit one node: TP=2 only"
        elif nodes < 2:
            note = "this inventory has one node; --layout all adds the two-node layouts"
    if not topologies:
        raise SparktopError(f"{recipe.id if recipe else card.name}: no layout fits {nodes} node(s); "
                            "try --layout all")
    return topologies, note


def _base(runtime: str) -> bool:
    """Whether the runtime's engine is the one the shared constants (and the stacks) are fitted to: vLLM."""
    row = engine_ids.lookup(runtime)
    return row is not None and row.base_model


def stack_text(stack: str, note: str | None, factors: dict[str, float]) -> str:
    """What `predict` says of the stack: its name, its factors, or why it was assumed."""
    from sparktop.model.fit import YOURS
    from sparktop.model.stacks import load_stacks

    name = "fitted to your studies" if stack == YOURS else load_stacks().get(stack).name
    what = ", ".join(f"{n} x{v:.2f}" for n, v in factors.items()) or "the shared constants (no factors of its own)"
    return f"stack {stack} ({name}): {what}" + (f"; {note}" if note else "")


def cmd_predict(args) -> int:
    from sparktop.launch.prediction import subject_for_card, subject_for_recipe
    from sparktop.model.fit import FITTED, inventory_key
    from sparktop.model.forecast import base_constants, forecast
    from sparktop.model.predict import bands, crossover_lines, error_json, recommend, row_band, uncertainty
    from sparktop.model.serving import Serving

    recipe, card = _predict_subject(args)
    asked = getattr(args, "runtime", None)
    from sparktop.model.runtimes import RUNTIMES as MODELLED

    row = engine_ids.lookup(asked)
    if row is not None and row.id not in RUNTIMES and row.id in MODELLED:
        runtime = row.id  # an engine sparktop does not launch, but watches (TGI, Ollama): predicted when it can be
    else:
        runtime = runtime_id(asked) if asked else (recipe.runtime if recipe else engine_ids.DEFAULT)
    launched = runtime in RUNTIMES  # a runtime sparktop launches has recipes and settings of its own
    if recipe is not None and launched and runtime != recipe.runtime:
        # The model as that runtime's own recipe serves it (its slots, its context), where there is one.
        try:
            recipe = runtime_recipes(recipe, runtime, args.recipes)[runtime]
        except SparktopError:
            recipe = None
    overrides = parse_sets(getattr(args, "set", None), runtime if launched else engine_ids.DEFAULT)
    inventory = load_inventory(args.inventory) if args.inventory else load_inventory()
    topologies, note = _predict_topologies(args, recipe, card, len(inventory.nodes))
    topologies, refused = _runtime_layouts(runtime, topologies)
    if not topologies:
        raise SparktopError("predict: " + "; ".join(refused))
    if refused:
        note = "; ".join([*([note] if note else []), *refused])
    serving: Serving | Callable[[str], Serving]
    if recipe is not None:
        serving = functools.partial(recipe.serving, overrides=overrides)  # per topology, as the recipe says
    else:  # no recipe: the runtime's own defaults (llama-server's slots), then --set
        serving = Serving.from_flags(RUNTIMES[runtime].serving_flags(overrides) if launched else overrides)
    for topology in topologies:  # requests the engine would refuse have no speed to predict
        limit = (serving(topology) if callable(serving) else serving).max_model_len
        if limit and args.pp + args.tg > limit:
            raise SparktopError(f"predict: --pp {args.pp} + --tg {args.tg} = {args.pp + args.tg} tokens is more than "
                                f"one request may hold ({limit}, the engine's context per request): it would "
                                "refuse them; lower --pp/--tg or raise the context")
    key = inventory_key(inventory)
    modeled = runtime_model(runtime)  # which engine the figures are of, or why there are none
    asked_stack = getattr(args, "stack", None)
    if asked_stack and not _base(runtime):
        raise SparktopError(f"predict: --stack chooses a vLLM build; {runtime} has its own constants")
    speed = getattr(args, "speed", None)
    if speed is not None and speed <= 0:
        raise SparktopError(f"predict: --speed must be positive, got {speed}")
    if recipe is not None:
        subject = subject_for_recipe(recipe, inventory, overrides, stack=asked_stack, card=card, speed=speed)
    else:
        subject = subject_for_card(card, inventory, runtime, serving, stack=asked_stack, speed=speed)
    subject = dataclasses.replace(subject, runtime=runtime, serving=serving)
    from sparktop.bench.levels import parse_levels

    fc = forecast(subject, topologies, parse_levels(args.concurrency), args.pp, args.tg)
    rows = fc.rows
    basis = fc.basis[topologies[0]]
    fitted = basis.fitted  # this inventory's own fit (`sparktop twin fit --runs`), if there is one
    sources = [str(s) for s in (fitted or {}).get("sources") or []]
    stack, stack_note = basis.stack, basis.stack_note
    if not rows:
        raise SparktopError(f"predict: {modeled}")
    recs = recommend(rows)
    cross = crossover_lines(rows) if len(topologies) > 1 else []
    spread = [t for t in topologies if (shape := layout_of(t)) is not None and shape.spans_nodes]
    if spread and not _fitted_over_nodes(runtime):
        # Only vLLM's and TensorRT-LLM's published figures span nodes: the others' link costs are vLLM's.
        far = f"{', '.join(spread)}: no published multi-node figures of {runtime}; extrapolated with vLLM's link model"
        note = f"{note}; {far}" if note else far
    unsure = uncertainty(card) if _base(runtime) else ""  # the leave-one-model-out error is vLLM's fit's
    used = (f"constants fitted to your measurements (study {', '.join(sources) or '?'})" if fitted is not None
            else f"the published constants ({FITTED.name}; `sparktop twin fit --runs STUDY` fits them to yours)")
    if args.json:
        stated = bands() if _base(runtime) else {}  # the bands are vLLM's fit's, as the uncertainty is
        print(json.dumps({"rows": [{**r.as_dict(), "band": row_band(r, stated)} for r in rows],
                          "recommendation": recs, "crossovers": cross,
                          "uncertainty": unsure, "error": error_json() if stated else {},
                          "runtime": {"id": runtime, "text": modeled},
                          "stack": {"id": stack, "assumed": stack_note},
                          "constants": {"inventory_key": key, "fitted": fitted is not None,
                                        "sources": sources, "text": used}, "speed": fc.speed,
                          "router": fc.router_json()}, indent=2))
        return 0
    console = Console()
    console.print(_prediction_table(basis.card, rows, args.pp, args.tg))
    for rec in recs:
        margin = f" (+{rec['margin']:.0%} over the next)" if rec["margin"] and rec["metric"] != "ttft_ms" else \
            (f" ({-rec['margin']:.0%} lower than the next)" if rec["margin"] else "")
        cs = "/".join(f"c{c}" for c in rec["concurrency"])
        console.print(f"[bold]{rec['workload']}[/] ({cs}): {rec['topology']}{margin}")
    for line in cross:
        console.print(f"  {line}")
    if note:
        console.print(f"[dim]{note}[/]")
    if stack:
        factors = base_constants(key)[0].stack_factor_map(stack)
        console.print(f"[dim]{escape(stack_text(stack, stack_note, factors))}[/]", highlight=False, soft_wrap=True)
    if unsure:
        console.print(f"[dim]{unsure}[/]")
    console.print(f"[dim]predicted with {escape(used)}[/]", highlight=False, soft_wrap=True)
    if fc.speed != 1:
        console.print(f"[dim]scaled to nodes at ×{fc.speed:g} a GB10's pace (defaults.twin_speed or --speed): "
                      "rates ×, times ÷[/]", highlight=False, soft_wrap=True)
    console.print(f"[dim]engine modelled: {escape(modeled)}[/]", highlight=False, soft_wrap=True)
    for line in fc.router_lines():
        console.print(f"[dim]{escape(line)}[/]", highlight=False, soft_wrap=True)
    return 0


def _fitted_over_nodes(runtime: str) -> bool:
    from sparktop.model.runtimes import CannotModel, fitted_over_nodes

    try:
        return fitted_over_nodes(runtime)
    except CannotModel:
        return False


def _runtime_layouts(runtime: str, topologies: list[str]) -> tuple[list[str], list[str]]:
    """The layouts the runtime can run, and why it cannot run the others (llama.cpp spreads layers, not
    tensors; Ollama and TGI serve from one node)."""
    kept, refused = [], []
    for topology in topologies:
        layout = layout_of(topology)
        if layout is None:
            kept.append(topology)
            continue
        if runtime in RUNTIMES:
            why = RUNTIMES[runtime].why_not(layout)
        else:
            why = f"{runtime} serves from one node" if layout.spans_nodes else None
        if why:
            refused.append(f"{topology}: {why}")
        else:
            kept.append(topology)
    return kept, refused


def runtime_model(runtime: str) -> str:
    """What `predict` says of the engine it models: vLLM, or another runtime fitted to its own published figures,
    or why it cannot model it."""
    if _base(runtime):
        return "vLLM (the constants above)"
    from sparktop.model.runtimes import CannotModel, describe

    try:
        return describe(runtime)
    except CannotModel as exc:
        return str(exc)


def _prediction_table(card: ModelCard, rows: list, pp: int, tg: int) -> Table:
    table = Table(title=f"{card.name} · {card.quant_text()} · pp{pp} tg{tg} · predicted", box=None,
                  header_style="bold", title_justify="left")
    for col in ("topology", "c", "decode t/s", "per req", "prefill t/s", "TTFT", "e2e t/s", "wall", "KV", "fits"):
        # The topology never wraps or shortens: "cluster…" could be either cluster.
        table.add_column(col, justify="left" if col == "topology" else "right", no_wrap=col == "topology",
                         min_width=11 if col == "topology" else None)
    for i, r in enumerate(rows):
        fits = "yes" if r.fits else "[red]KV full: preempts[/]"
        table.add_row(r.topology, f"c{r.concurrency}", fmt(r.decode_tps), fmt(r.per_request_tps),
                      fmt(r.prefill_tps), fmt(r.ttft_ms, "ms"), fmt(r.e2e_tps_total),
                      f"{r.wall_s_mean:.1f} s" if r.wall_s_mean else "—", f"{r.kv_cache_usage:.0%}", fits,
                      end_section=i + 1 < len(rows) and rows[i + 1].topology != r.topology)
    return table
