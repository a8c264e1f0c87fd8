"""`sparktop study`, `sparktop studies` and `sparktop report` for the terminal.

A study prints one line per thing that happened (it is meant to run
unattended, under nohup or tmux, and be read afterwards), asks once before
it starts, and on Ctrl-C stops what it started and says how to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparktop.bench.events import LevelDone, SweepStarted
from sparktop.bench.levels import parse_depths, parse_levels
from sparktop.bench.sweep import parse_extra_body
from sparktop.errors import SparktopError
from sparktop.launch.catalog import find_recipe, load_recipe_file, runtime_recipes
from sparktop.launch.events import Stage
from sparktop.launch.recipe import Recipe, parse_sets
from sparktop.launch.session import overrides_for
from sparktop.settings import DEMO_INVENTORY, Inventory, demo_inventory_path, inventory_from_hosts, load_inventory
from sparktop.study.events import (
    LaunchUpdate,
    StageChanged,
    StudyEvent,
    StudyFinished,
    StudyStarted,
    SweepUpdate,
    TopologyFinished,
    TopologyStarted,
)
from sparktop.study.planning import (
    DEMO_RECIPE,
    NO_LITELLM,
    Estimate,
    is_demo_inventory,
    left_out_here,
    new_study,
    study_entries,
)
from sparktop.study.runner import StudyRunner
from sparktop.study.state import DONE, FAILED, Study, list_studies, load_study
from sparktop.units import ago, fmt


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return ago(seconds) if seconds >= 1 else "<1s"


def plan_table(study: Study, estimates: dict[str, Estimate | None]) -> Table:
    table = Table(title=f"study {study.id}: {study.recipe} · c{','.join(map(str, study.levels))} · "
                        f"{study.runs} runs · pp{study.pp} tg{study.tg}", title_justify="left", box=None,
                  header_style="bold")
    for col in ("#", "topology", "start-up", "sweep", f"decode c{study.levels[0]} → c{study.levels[-1]} (predicted)"):
        table.add_column(col, justify="left" if col in ("#", "topology") else "right", no_wrap=True)
    for i, t in enumerate(study.topologies, 1):
        e = estimates.get(t.name)
        first, last = t.predicted.get(str(study.levels[0]), {}), t.predicted.get(str(study.levels[-1]), {})
        decode = f"{fmt(first.get('tg_tps_total'))} → {fmt(last.get('tg_tps_total'))} t/s" if t.predicted else "—"
        table.add_row(str(i), t.name, _duration(e.startup_s) if e else "—", _duration(e.sweep_s) if e else "—",
                      decode)
    return table


def _resolve_recipe(study: Study, recipe_dirs: list[str] | None) -> Recipe:
    if study.recipe_path and Path(study.recipe_path).exists():
        try:
            return load_recipe_file(Path(study.recipe_path))
        except SparktopError:
            pass
    return find_recipe(study.recipe, recipe_dirs)


def _inventory_for(study: Study | None, args) -> Inventory:
    path = args.inventory or (study.inventory if study else None)
    if getattr(args, "nodes", None) and not path:
        return inventory_from_hosts([h.strip() for h in args.nodes.split(",") if h.strip()])
    return load_inventory(path) if path else load_inventory()


def print_event(event: StudyEvent, console: Console) -> None:
    match event:
        case StudyStarted(study=study, resumed=resumed, removed=removed):
            if resumed:
                console.print(f"resuming {study.id}" + (f": removed {removed} container(s) it left running"
                                                         if removed else ""))
        case TopologyStarted(name=name, index=index, total=total):
            console.print(f"[bold]{index + 1}/{total} {name}[/]", highlight=False)
        case StageChanged(name=name, stage=stage):
            if not stage.startswith(("sweeping", "launching:")):
                console.print(f"    {name}: {stage}", highlight=False)
        case LaunchUpdate(name=name, event=Stage(node=node, stage=stage)):
            console.print(f"    {name}: {node} {stage}", highlight=False)
        case LaunchUpdate():
            pass
        case SweepUpdate(name=name, event=SweepStarted(path=path, resumed_requests=resumed)):
            console.print(f"    {name}: sweeping → {path}" + (f" (resumed: {resumed} requests kept)"
                                                                if resumed else ""), highlight=False)
        case SweepUpdate(name=name, event=LevelDone(stats=s)):
            warn = ""
            if getattr(s, "contaminated", False):
                warn = f"  [yellow]contaminated: {getattr(s, 'contamination', None) or 'foreign traffic'}[/]"
            console.print(f"    {name} c{s.concurrency}: decode {fmt(s.tg_tps_total)} t/s · per request "
                          f"{fmt(s.tg_tps_req)} · prefill {fmt(s.pp_tps_total)} t/s · TTFT "
                          f"{fmt(s.ttft_ms_mean, 'ms')}{warn}", highlight=False)
        case SweepUpdate():
            pass
        case TopologyFinished(name=name, status=status, reason=reason, lines=lines):
            if status == DONE:
                console.print(f"[green]✓[/] {name} measured", highlight=False)
            else:
                console.print(f"[red]✗ {name} failed:[/] {reason}", highlight=False)
                for line in lines[-8:]:
                    console.print(Text("      " + line, style="dim"), highlight=False)
        case StudyFinished():
            pass


async def _run(runner: StudyRunner, console: Console) -> StudyFinished:
    finished = None
    async for event in runner.events():
        print_event(event, console)
        if isinstance(event, StudyFinished):
            finished = event
    assert finished is not None
    return finished


def _write_reports(study: Study, console: Console) -> None:
    from sparktop.study import report

    try:
        paths = report.write_all(study)
        console.print("report: " + " and ".join(str(p) for p in paths), highlight=False)
    except Exception as exc:  # noqa: BLE001 - the measurements are safe on disk; the report can be redone
        console.print(f"[yellow]the report could not be written ({type(exc).__name__}: {exc}); "
                      f"run `sparktop report {study.id}`[/]", highlight=False)


def cmd_study(args, inventory: Inventory | None = None) -> int:
    # Lines, not a live display: a study runs for hours, often under nohup; a
    # log must not be hard-wrapped at 80 columns.
    console = Console(soft_wrap=True)
    if args.resume:
        study = load_study(args.resume)
        if study.running_here():
            raise SparktopError(f"{study.id} is running (pid {study.pid}); attach with `sparktop --study {study.id}`")
        recipe = _resolve_recipe(study, args.recipes)
        inventory = inventory or _inventory_for(study, args)
        done = sum(1 for t in study.topologies if t.finished)
        console.print(f"resuming {study.id}: {done} of {len(study.topologies)} topologies finished")
    else:
        demo = inventory is not None  # `--demo`: the CLI set up the demo's twin nodes
        on_demo = demo or is_demo_inventory(args.inventory)  # `--demo`, or `--inventory demo`: the twins
        if on_demo:
            refuse_busy_demo(inventory or _inventory_for(None, args), args.recipe or DEMO_RECIPE)
        if not args.recipe and demo:
            args.recipe = DEMO_RECIPE
            console.print(f"no recipe named: studying the demo's model, {DEMO_RECIPE}", highlight=False)
        if not args.recipe:
            raise SparktopError("study: name a RECIPE (see `sparktop recipes`), or --resume ID")
        recipe = find_recipe(args.recipe, args.recipes)
        inventory = inventory or _inventory_for(None, args)
        picked = args.nodes and (args.inventory or demo)
        nodes = [inventory.node(h.strip()).name for h in args.nodes.split(",")] if picked else None
        count = len(nodes) if nodes else len(inventory.nodes)
        recipes = runtime_recipes(recipe, getattr(args, "runtimes", None), args.recipes)
        overrides = parse_sets(args.set, recipe.runtime)
        for other in recipes.values():  # each runtime takes the overrides in its own names, or says why not
            overrides_for(overrides, recipe.runtime, other.runtime)
        entries = _runnable_here(study_entries(recipes, args.topologies, count), on_demo, console)
        study, estimates = new_study(
            recipe, inventory, entries,
            levels=parse_levels(args.concurrency), runs=args.runs, pp=args.pp, tg=args.tg,
            extra_body=parse_extra_body(args.extra_body), overrides=overrides,
            nodes=nodes, recipes=recipes, load=_load_options(args),
            inventory_path=DEMO_INVENTORY if demo else str(demo_inventory_path()) if on_demo
            else str(Path(args.inventory).resolve()) if args.inventory else None)
        console.print(plan_table(study, estimates))
        total = "about " + _duration(study.estimate_s) if study.estimate_s else "unknown (no model card)"
        if on_demo:  # the twins' own start-up and pace, not a Spark's
            pace = "on the demo's twins" + (f" at ×{study.speed:g}" if study.speed != 1 else "")
        else:
            pace = "at GB10 speed" if study.speed == 1 else f"with the twins at ×{study.speed:g}"
        console.print(f"estimated wall time {pace}: {total}; results in {study.dir}", highlight=False)
        quick = _quick_variant(args, study)
        if quick:
            console.print(f"a quicker look: {quick}", highlight=False)
        if not args.yes:
            if not sys.stdin.isatty():
                raise SparktopError("not starting without confirmation: add --yes (or run in a terminal)")
            if input("Start the study? [y/N] ").strip().lower() not in ("y", "yes"):
                console.print("Not started.")
                return 1
        study.save()
    runner = StudyRunner(study, recipe, inventory, timeout=args.timeout, port=args.port,
                         max_error_rate=args.max_error_rate)
    try:
        finished = asyncio.run(_run(runner, console))
    except KeyboardInterrupt:
        console.print(f"\ninterrupted: everything it started was removed; resume with "
                      f"`sparktop study --resume {study.id}`", highlight=False)
        return 130
    failed = [t for t in finished.study.topologies if t.status == FAILED]
    console.print(f"study {study.id}: {len(study.topologies) - len(failed)} measured, {len(failed)} failed, "
                  f"in {_duration((study.ended or time.time()) - study.created)}", highlight=False)
    _write_reports(study, console)
    if failed:  # a layout that failed is an answer missing: scripts and CI must see it
        console.print("failed: " + "; ".join(f"{t.name}: {t.reason or 'failed'}" for t in failed), highlight=False)
        return 1
    return 0


def _runnable_here(entries: list, on_demo: bool, console: Console) -> list:
    """The layouts that can run here (`planning.left_out_here`): on the demo's twins (`--demo` or `--inventory
    demo`) without `litellm` on this machine, those with replicas behind LiteLLM are left out up front, with
    how to add it (not launched to fail)."""
    kept, out = left_out_here(entries, on_demo)
    if not out:
        return entries
    console.print(f"left out: {', '.join(t.name for t in out)} ({NO_LITELLM})", highlight=False, markup=False)
    if not kept:
        raise SparktopError("study on the demo: every layout asked for puts LiteLLM in front of replicas, and "
                            "this machine has no `litellm`: pip install 'litellm[proxy]'")
    return kept


def refuse_busy_demo(inventory: Inventory, recipe: str) -> None:
    """A study launches its own layouts on the demo's nodes, on the ports and memory a running `sparktop demo`
    holds: every layout would fail preflight ("port 8000 already in use"). Say so before anything starts, and
    what works instead."""
    busy = asyncio.run(_running_containers(inventory))
    if busy:
        where = "; ".join(f"{node}: {', '.join(names)}" for node, names in busy.items())
        raise SparktopError(f"a demo is running on the demo's nodes ({where}), and a study launches its own layouts "
                            "there, on the ports and memory it holds: stop the demo first (`sparktop demo --stop`), "
                            f"then `sparktop study {recipe} --demo`; or leave it running and measure its engines with "
                            "`sparktop sweep --endpoint URL`")


async def _running_containers(inventory: Inventory) -> dict[str, list[str]]:
    """The containers running on each node of an inventory (the nodes that run any)."""
    from sparktop.remote import TransportError, transport_for

    out: dict[str, list[str]] = {}
    for node in inventory.nodes:
        tr = transport_for(node)
        try:
            r = await tr.run(["docker", "ps", "--format", "{{.Names}}"], timeout=30)
        except (TransportError, OSError):
            continue
        finally:
            with contextlib.suppress(TransportError, OSError):
                await tr.close()
        if r.ok and r.stdout.split():
            out[node.name] = r.stdout.split()
    return out


def _quick_variant(args, study: Study) -> str | None:
    """The same study at two levels and two runs each, as a command, when this one asks for more."""
    if getattr(args, "rate", None) or (len(study.levels) <= 2 and study.runs <= 2):
        return None
    levels = sorted({study.levels[0], study.levels[min(len(study.levels) - 1, len(study.levels) // 2)]})
    words = ["sparktop", "study", args.recipe, "-c", ",".join(map(str, levels)), "--runs", "2"]
    if study.inventory == DEMO_INVENTORY:
        words += ["--demo"] + (["--speed", f"{study.speed:g}"] if study.speed != 1 else [])
    elif is_demo_inventory(args.inventory):
        words += ["--inventory", DEMO_INVENTORY]
    elif args.inventory:
        words += ["--inventory", args.inventory]
    if args.topologies and args.topologies != "all":
        words += ["--topologies", args.topologies]
    return " ".join(shlex.quote(w) for w in words)


def cmd_studies(args) -> int:
    studies = list_studies()
    if args.json:
        print(json.dumps([{"id": s.id, "recipe": s.recipe, "state": s.state, "outcome": s.outcome, "stage": s.stage,
                           "topologies": {t.name: t.status for t in s.topologies}, "created": s.created,
                           "path": str(s.dir)} for s in studies], indent=2))
        return 0
    if not studies:
        print("No studies yet: `sparktop study RECIPE` starts one.")
        return 0
    table = Table(box=None, header_style="bold")
    for col in ("study", "state", "topologies", "now", "started"):
        table.add_column(col, no_wrap=col in ("study", "state", "started"))  # the layouts' marks wrap instead
    for s in studies:
        marks = " ".join(f"{t.name}:{'✓' if t.status == DONE else '✗' if t.status == FAILED else '·'}"
                         for t in s.topologies)
        table.add_row(s.id, s.outcome, marks, s.stage or "", ago(time.time() - s.created) + " ago")
    Console().print(table)
    return 0


def cmd_report(args) -> int:
    from sparktop.study import report

    study = load_study(args.study)
    if args.json:
        print(json.dumps(report.build(study), indent=2, default=str))
        return 0
    if args.html:
        Path(args.html).write_text(report.html(study))
        print(f"wrote {args.html}")
        return 0
    out = study.report_dir
    out.mkdir(parents=True, exist_ok=True)
    text = report.markdown(study, out)
    (out / "report.md").write_text(text)
    sys.stdout.write(text)
    return 0



def _load_options(args) -> dict:
    """A study's rate, SLO and depth options (`--rate`, `--slo`, `--find-max-rate`, `--depth`, ...), checked as
    a sweep would check them."""
    from sparktop.bench.load import parse_rates
    from sparktop.bench.stats import parse_slo

    out: dict = {}
    if getattr(args, "rate", None):
        out["rates"] = parse_rates(args.rate)
    if getattr(args, "slo", None):
        parse_slo(args.slo)
        out["slo"] = args.slo
    if getattr(args, "find_max_rate", False):
        if not out.get("slo"):
            raise SparktopError("--find-max-rate needs --slo (e.g. --slo ttft_p95=2s,itl_p95=100ms)")
        out["find_max_rate"] = True
        out.setdefault("rates", [1.0])
    if getattr(args, "depth", None):
        depths = parse_depths(args.depth)
        if depths != [0]:
            out["depths"] = depths
    for key in ("arrivals", "requests", "duration"):
        if getattr(args, key, None) is not None:
            out[key] = getattr(args, key)
    out["prefix_cache"] = getattr(args, "prefix_cache", "off") == "on"
    return out
