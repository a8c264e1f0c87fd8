"""The launcher (`l`), a launch's progress, and stopping (`x`).

The screens only draw and ask: the recipes, the plan, preflight, the
launch itself and stopping all live in `sparktop.launch.session.Launcher`,
which keeps running a launch when its screen is closed.
"""

from __future__ import annotations

import re
import time

from rich.markup import escape
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import (
    Button,
    DataTable,
    Input,
    Label,
    OptionList,
    RichLog,
    Select,
    SelectionList,
    Static,
)
from textual.widgets.option_list import Option

from sparktop.engine_ids import DEFAULT
from sparktop.errors import SparktopError
from sparktop.launch.plan import Plan
from sparktop.launch.preflight import Preflight
from sparktop.launch.recipe import Recipe
from sparktop.launch.runtimes import runtime_for
from sparktop.launch.session import (
    OVERRIDE_FLAGS,
    Launcher,
    LaunchRequest,
    LaunchRun,
    parse_extra_args,
    parse_overrides,
    parse_port,
)
from sparktop.layouts import describe, layout_of
from sparktop.observe.engine_log import strip_prefix
from sparktop.settings import Inventory
from sparktop.ui.footer import KeyFooter
from sparktop.ui.messages import LaunchProgress, LaunchRequested, LaunchSeen, StopRequested, StudyPlanRequested
from sparktop.ui.screens import LiveScreen, StatusLine
from sparktop.units import ago, fmt

TOPOLOGY_TEXT = {"solo": "one node", "cluster-ray": "TP=2 over Ray", "cluster-mp": "TP=2, no Ray",
                 "shuffle": "solo x2 + LiteLLM shuffle", "least-busy": "solo x2 + LiteLLM least-busy"}
PLACEHOLDER = {"gpu_memory_utilization": "gpu util", "max_model_len": "model len", "max_num_seqs": "max seqs"}
MARK = {"pass": ("ok  ", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "bold red")}
STEP_MARK = {"pending": ("·", "dim"), "running": ("▶", "yellow"), "done": ("✓", "green"), "failed": ("✗", "bold red")}


LOG_PREFIX = re.compile(r"^(?P<level>INFO|WARNING|ERROR|DEBUG|CRITICAL)(?::\s+|\s+\d\d-\d\d \d\d:\d\d:\d\d\s+"
                        r"(?:\[[^\]]+\]\s*)?)")


def short_log_line(line: str) -> Text:
    """A vLLM log line without the process, date and source prefix; warnings
    and errors keep their level, in colour."""
    line = strip_prefix(line)
    m = LOG_PREFIX.match(line)
    if not m:
        return Text(line)
    level, rest = m.group("level"), line[m.end():]
    if level == "INFO" or level == "DEBUG":
        return Text(rest)
    return Text.assemble((level + " ", "bold red" if level in ("ERROR", "CRITICAL") else "yellow"), rest)


def nodes_text(topologies: list[str]) -> str:
    """The nodes a recipe's layouts take: "1", "1 or 2", "1–4"."""
    counts = sorted({layout.nodes for t in topologies if (layout := layout_of(t)) is not None})
    if not counts:
        return "none here"
    if len(counts) <= 2:
        return " or ".join(map(str, counts))
    return f"{counts[0]}–{counts[-1]}"


OPTION_WIDTH = 30  # what the drop-down shows on one line at 120 columns


def option_text(topology: str) -> str:
    """"cluster-mp · TP=2, no Ray"; a long layout name alone, never wrapped onto two lines."""
    text = f"{topology} · {topology_text(topology)}"
    return text if len(text) <= OPTION_WIDTH else topology


def topology_text(topology: str) -> str:
    layout = layout_of(topology)
    return TOPOLOGY_TEXT.get(topology) or (describe(layout) if layout else topology)


def preflight_text(preflight: Preflight | None, error: str | None = None, running: bool = False) -> Text:
    if error:
        return Text(error, style="bold red")
    if preflight is None:
        return Text("checking the nodes…" if running else "", style="dim")
    text = Text()
    for check in preflight.checks:
        mark, style = MARK[check.status]
        text.append(f"[{mark}] ", style=style)
        text.append(f"{check.node:8} {check.name:9} ", style="bold" if check.status != "pass" else "")
        text.append(check.message + "\n")
    if running:
        text.append("re-checking…", style="dim")
    return text


def prediction_text(recipe: Recipe, topology: str, inventory: Inventory | None = None,
                    plan: Plan | None = None) -> Text | None:
    """What `sparktop predict` says for this recipe and topology (pp1024 tg128): `forecast` of the plan as
    launched (the form's overrides and image), with the constants fitted to this inventory's own studies
    when there are some, at the nodes' pace."""
    from sparktop.launch.prediction import subject_for_plan, subject_for_recipe
    from sparktop.model.forecast import forecast
    from sparktop.settings import Inventory as _Inventory

    card = recipe.twin_card()
    if card is None:
        return None
    inv = inventory if inventory is not None else _Inventory(nodes=[])
    subject = subject_for_plan(plan, recipe, inv) if plan is not None else subject_for_recipe(recipe, inv)
    fc = forecast(subject, [topology], [1, 8, 64], 1024, 128)
    fitted = fc.basis[topology].fitted is not None
    rows = fc.rows
    if not rows:
        return Text(f"predicted: sparktop cannot model {recipe.runtime} (no published Spark figures of it)",
                    style="dim")
    text = Text("predicted ", style="bold cyan")
    source = "fitted to your studies" if fitted else "sparktop predict"
    if fc.speed != 1:
        source += f", twins at ×{fc.speed:g}"
    text.append(f"(pp1024 tg128, {source}): ", style="dim")
    for i, r in enumerate(rows):
        text.append(("" if i == 0 else " · ") + f"c{r.concurrency} ")
        text.append(f"{fmt(r.decode_tps)} t/s", style="cyan")
        text.append(f" TTFT {fmt(r.ttft_ms, 'ms')} ms")
        if not r.fits:
            text.append(" KV full", style="red")
    return text


class LaunchScreen(LiveScreen):
    """Pick a recipe and a topology, adjust, read the plan and preflight, launch."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("enter", "launch", "Launch"),
        Binding("ctrl+r", "recheck", "Re-check"),
        Binding("b", "study", "Study all"),  # every topology in turn
    ]
    # Below 90 columns the list goes above the form (-tiny).
    HORIZONTAL_BREAKPOINTS = [(0, "-tiny"), (90, "-narrow"), (110, "-medium"), (150, "-wide")]

    def __init__(self, launcher: Launcher):
        super().__init__()
        self.launcher = launcher
        self.recipes: dict[str, Recipe] = {}
        self.recipe: Recipe | None = None
        self.request: LaunchRequest | None = None
        self.plan: Plan | None = None
        self.preflight: Preflight | None = None
        self.preflight_for: str | None = None  # the plan text preflight checked
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with Horizontal(id="launcher"):
            with Vertical(id="recipes-pane"):
                yield DataTable(id="recipes", cursor_type="row", zebra_stripes=True)
                yield Static(id="recipe-info")
            with Vertical(id="form-pane"):
                with Horizontal(classes="form-row"):
                    yield Label("topology", classes="label")
                    yield Select([], id="topology", allow_blank=True, prompt="topology")
                    yield Label("on", classes="label")
                    yield Select([], id="node", allow_blank=True, prompt="head: the first node")
                # With more than two nodes: which of them (the head first, then these in order).
                yield SelectionList(id="pick-nodes", compact=True)
                with Horizontal(classes="form-row", id="overrides"):
                    yield Input(id="port", placeholder="port", type="integer", classes="small")
                    yield Input(id="gpu_memory_utilization", placeholder="gpu mem util", classes="small")
                    yield Input(id="max_model_len", placeholder="max_model_len", type="integer", classes="small")
                    yield Input(id="max_num_seqs", placeholder="max_num_seqs", type="integer", classes="small")
                with Horizontal(classes="form-row"):
                    yield Input(id="extra_args", placeholder="extra engine args, e.g. --enable-auto-tool-choice")
                    yield Button("Launch", id="go", variant="success")
                with VerticalScroll(id="preflight-box"):
                    yield Static(id="preflight")
                with VerticalScroll(id="plan-box"):
                    yield Static(id="plan")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#preflight-box").border_title = "preflight"
        self.query_one("#plan-box").border_title = "plan (exactly what will run)"
        table = self.query_one("#recipes", DataTable)
        # What a narrow list cuts off first is on the right.
        table.add_column("recipe", key="recipe")
        table.add_column("runtime", key="runtime")
        table.add_column("weights", key="weights")
        table.add_column("nodes", key="nodes")
        table.add_column("quant", key="quant")
        recipes, errors = self.launcher.recipes()
        self.recipes = recipes
        for rid in sorted(recipes):
            r = recipes[rid]
            weights = r.estimated_weights_gib()
            table.add_row(rid, runtime_for(r.runtime).name, f"{weights:.0f} GiB" if weights else "—",
                          nodes_text(self.launcher.topologies(r)),
                          r.quant_shown(), key=rid)
        for error in errors:
            self.notify(error, title="recipe skipped", severity="warning", timeout=8)
        nodes = [(n.name, n.name) for n in self.launcher.inventory.nodes]
        self.query_one("#node", Select).set_options(nodes)
        pick = self.query_one("#pick-nodes", SelectionList)
        pick.border_title = "nodes (space: in or out)"
        pick.add_options([(name, name, True) for name, _ in nodes])
        pick.display = len(nodes) > 2
        for select in self.query(Select):
            self.watch(select, "expanded", self._dropdown, init=False)
        table.focus()
        if recipes:
            self.choose(sorted(recipes)[0])

    # -- choosing --------------------------------------------------------------

    @on(DataTable.RowHighlighted, "#recipes")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value and (self.recipe is None or event.row_key.value != self.recipe.id):
            self.choose(event.row_key.value)

    @on(DataTable.RowSelected, "#recipes")
    def _selected(self, event: DataTable.RowSelected) -> None:
        self.action_launch()  # what Enter launches is on screen: the plan and preflight beside the list

    def choose(self, rid: str) -> None:
        recipe = self.recipes[rid]
        self.recipe = recipe
        topologies = self.launcher.topologies(recipe)
        select = self.query_one("#topology", Select)
        with self.prevent(Select.Changed):
            select.set_options([(option_text(t), t) for t in topologies])
            if topologies:
                select.value = topologies[0]
        args, _, _, _, port = recipe.settings(topologies[0] if topologies else "solo")
        own = runtime_for(recipe.runtime).form_flags
        for key in OVERRIDE_FLAGS:
            box = self.query_one(f"#{key}", Input)
            box.value = ""
            flag = own.get(key, key)
            box.placeholder = f"{PLACEHOLDER[key]} {args.get(flag, '—')}" if flag else f"{PLACEHOLDER[key]}: n/a"
            box.disabled = flag is None
        port_box = self.query_one("#port", Input)
        port_box.value = ""
        port_box.placeholder = f"port {port or self.launcher.inventory.defaults.port}"
        self.query_one("#extra_args", Input).value = ""
        weights = recipe.estimated_weights_gib()
        info = Text()
        info.append(recipe.model + "\n", style="bold")
        if recipe.description:
            info.append(recipe.description + "\n")
        if weights:
            info.append((f"{recipe.quantization} · " if recipe.quantization else "") + f"weights ~{weights:.1f} GiB",
                        style="cyan")
            info.append(" (of 119.6 GiB unified memory per Spark)\n", style="dim")
        if topologies:
            shown = topologies if len(topologies) <= 6 else [*topologies[:5], f"{len(topologies) - 5} more layouts"]
            info.append("here: " + ", ".join(shown) + "\n", style="dim")
        else:
            info.append(recipe.why_not("solo", len(self.launcher.inventory.nodes)) + "\n", style="yellow")
        info.append(f"{recipe.format}: {recipe.path}", style="dim")
        self.query_one("#recipe-info", Static).update(info)
        self.request = None  # a new launch id for a new choice
        self.replan()

    @on(Select.Changed)
    @on(Input.Changed)
    @on(SelectionList.SelectedChanged)
    def _changed(self, event) -> None:
        if isinstance(event, Select.Changed) and event.select.id == "topology":
            self.request = None
        self.replan()

    def _dropdown(self, expanded: bool) -> None:
        if not expanded:
            # A choice made: back to the list, where Enter launches what the plan now shows.
            self.call_after_refresh(self.query_one("#recipes", DataTable).focus)

    def _request(self) -> LaunchRequest:
        assert self.recipe is not None
        topology = self.query_one("#topology", Select).value
        if topology is Select.NULL:
            raise SparktopError(f"{self.recipe.id} cannot run on these {len(self.launcher.inventory.nodes)} "
                                "node(s)")
        node = self.query_one("#node", Select).value
        nodes = None
        names = [n.name for n in self.launcher.inventory.nodes]
        pick = self.query_one("#pick-nodes", SelectionList)
        if pick.display:
            chosen = set(pick.selected)
            names = [n for n in names if n in chosen or n == node]
        if node is not Select.NULL or pick.display:
            head = [str(node)] if node is not Select.NULL else []
            nodes = head + [n for n in names if n != node]  # the chosen node leads (solo runs there)
            layout = layout_of(str(topology))
            if layout is not None and len(nodes) < layout.nodes:
                raise SparktopError(f"{topology} runs on {layout.nodes} nodes; {len(nodes)} chosen "
                                    f"({', '.join(nodes) or 'none'})")
        overrides = parse_overrides({key: self.query_one(f"#{key}", Input).value for key in OVERRIDE_FLAGS},
                                    self.recipe.runtime if self.recipe else DEFAULT)
        port = parse_port(self.query_one("#port", Input).value)
        extra = parse_extra_args(self.query_one("#extra_args", Input).value)
        launch_id = self.request.launch_id if self.request and self.request.topology == topology else None
        return LaunchRequest(self.recipe, str(topology), nodes, port, overrides, extra, launch_id)

    @property
    def launcher_plan(self) -> Plan:
        """The plan on screen (there is one once a recipe is chosen)."""
        assert self.plan is not None
        return self.plan

    def replan(self) -> None:
        plan_box = self.query_one("#plan", Static)
        try:
            self.request = self._request()
            self.plan = self.launcher.plan(self.request)
        except SparktopError as exc:
            self.plan, self.error = None, str(exc)
            plan_box.update(Text(str(exc), style="bold red"))
            self.query_one("#preflight", Static).update(Text(""))
            return
        self.error = None
        plan_box.update(Text(self.launcher_plan.render()))
        self.check()

    # -- preflight -------------------------------------------------------------

    def check(self) -> None:
        self.query_one("#preflight", Static).update(preflight_text(self.preflight, running=True)
                                                    if self.preflight_for else preflight_text(None, running=True))
        self._preflight()

    @work(group="preflight", exclusive=True)
    async def _preflight(self) -> None:
        import asyncio

        await asyncio.sleep(0.4)  # typing settles before the nodes are asked
        plan, recipe = self.plan, self.recipe
        if plan is None or recipe is None:
            return
        try:
            result = await self.launcher.preflight(plan, recipe)
        except Exception as exc:  # an unreachable node is a preflight answer, not a crash
            self._show_preflight(preflight_text(None, error=f"preflight: {exc}"))
            return
        if plan is not self.plan:
            return
        self.preflight, self.preflight_for = result, plan.render()
        self._show_preflight(preflight_text(result))
        try:
            predicted = await asyncio.to_thread(prediction_text, recipe, plan.topology,
                                                  self.launcher.inventory, plan)
        except Exception:  # noqa: BLE001 - a prediction is a hint; never in the way of a launch
            return
        if plan is self.plan and predicted is not None:
            self._show_preflight(Text.assemble(preflight_text(result), "\n", predicted))

    def _show_preflight(self, text: Text) -> None:
        """The answer, on the screen if it is still there: a check outlives a screen closed meanwhile."""
        if self.is_mounted:
            for box in self.query("#preflight").results(Static):
                box.update(text)

    def action_recheck(self) -> None:
        self.check()

    # -- launching -------------------------------------------------------------

    @on(Input.Submitted)
    @on(Button.Pressed, "#go")
    def _go(self, event) -> None:
        self.action_launch()

    def action_launch(self) -> None:
        if self.error or self.plan is None:
            self.notify(self.error or "choose a recipe first", title="cannot launch", severity="error")
            return
        if self.preflight is None or self.preflight_for != self.plan.render():
            self.notify("preflight is still checking the nodes", title="wait", severity="warning")
            return
        if not self.preflight.ok:
            first = self.preflight.failures[0]
            self.notify(f"{first.node}: {first.name}: {first.message}", title="preflight failed",
                        severity="error", timeout=8)
            return
        if self.launcher.busy and self.launcher.run is not None:
            self.notify(f"{self.launcher.run.plan.launch_id} is still launching", title="cannot launch",
                        severity="error")
            return
        self.app.post_message(LaunchRequested(self.plan))  # the app runs it and shows its progress

    def action_study(self) -> None:
        """`b`: every topology of this recipe, launched, swept and stopped in turn (the app asks first)."""
        if self.recipe is None:
            self.notify("choose a recipe first", title="cannot study", severity="error")
            return
        try:
            overrides = parse_overrides(runtime=self.recipe.runtime, values={
            key: self.query_one(f"#{key}", Input).value for key in OVERRIDE_FLAGS})
            port = parse_port(self.query_one("#port", Input).value)
        except SparktopError as exc:
            self.notify(str(exc), title="cannot study", severity="error")
            return
        self.app.post_message(StudyPlanRequested(self.recipe, overrides, port))


class ProgressScreen(LiveScreen):
    """One launch as it starts: steps, each container's stage, the log tail."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),  # to the monitor
        Binding("x", "stop", "Stop launch"),
    ]

    def __init__(self, launcher: Launcher, run: LaunchRun):
        super().__init__()
        self.launcher = launcher
        self.run = run
        self._drawn = -1
        self._logged = 0

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield Static(id="run-title")
        with Horizontal(id="progress"):
            yield Static(id="steps")
            yield RichLog(id="log", max_lines=1000, wrap=True, markup=False, highlight=False,
                          min_width=20)  # wrapped to the box, however narrow
        yield Static(id="outcome")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#steps").border_title = "steps"
        self.query_one("#log").border_title = "container logs"
        self.set_interval(1.0, self._draw_title)  # a clock: the elapsed seconds tick between events
        self.draw()

    def on_launch_progress(self, message: LaunchProgress) -> None:
        if message.run is self.run:
            self.draw()

    def _draw_title(self) -> None:
        run = self.run
        plan = run.plan
        title = Text()
        title.append(f" {plan.recipe_id}", style="bold")
        title.append(f" as {plan.topology} on {', '.join(plan.nodes)}")
        title.append(f" · launch {plan.launch_id} · {run.elapsed:.0f}s", style="dim")
        self.query_one("#run-title", Static).update(title)

    def draw(self) -> None:
        run = self.run
        self._draw_title()
        # The log is appended to, not redrawn.
        log = self.query_one("#log", RichLog)
        total = run.log_total
        fresh = list(run.log)[-(total - self._logged):] if total > self._logged else []
        for node, container, line in fresh:
            log.write(Text.assemble((f"{node} ", "cyan"), (container.rsplit('-', 1)[-1] + " ", "dim"),
                                    short_log_line(line)))
        self._logged = total
        if run.version == self._drawn:
            return
        self._drawn = run.version
        steps = Text()
        for i, step in enumerate(run.steps, 1):
            mark, style = STEP_MARK[step.status]
            steps.append(f"{mark} ", style=style)
            steps.append(f"{i}. {step.title}")
            if step.seconds is not None:
                steps.append(f"  {step.seconds:.1f}s", style="dim")
            steps.append("\n")
        if run.stages:
            steps.append("\nstartup stage\n", style="bold")
            for container, stage in run.stages.items():
                steps.append(f"  {run.stage_nodes.get(container, '')} ", style="cyan")
                steps.append(f"{container.rsplit('-', 1)[-1]}: ", style="dim")
                steps.append(stage + "\n", style="green" if stage == "ready" else "")
        self.query_one("#steps", Static).update(steps)
        self.query_one("#outcome", Static).update(outcome_text(run))
        outcome = self.query_one("#outcome")
        outcome.set_class(run.status == "ready", "-ready")
        outcome.set_class(run.status in ("failed", "cancelled"), "-failed")
        if run.status != "running":
            self.app.post_message(LaunchSeen(run))

    def action_stop(self) -> None:
        self.app.push_screen(ConfirmStop([self.run.plan.launch_id], self.launcher))


def outcome_text(run: LaunchRun) -> Text:
    text = Text()
    if run.status == "running":
        stage = run.current_stage
        text.append(f"starting… {stage or ''}", style="yellow")
        text.append("   Esc returns to the monitor; the launch goes on", style="dim")
    elif run.status == "ready":
        text.append(f"ready in {run.seconds:.0f}s", style="bold green")
        text.append("  — the monitor shows the new engines\n")
        for e in run.plan.endpoints:
            key = "   (key: sparktop keeps it in its state dir)" if e.api_key_env else ""
            text.append(f"  {e.url}/v1  {e.kind} {e.model}{key}\n")
    else:
        text.append(f"launch {run.status}: ", style="bold red")
        text.append(f"{run.reason}\n")
        for line in run.lines[-8:]:
            text.append(f"    {line}\n", style="dim")
        if run.removed is not None:
            text.append(f"removed {run.removed} container(s) on {', '.join(run.plan.nodes)}: nothing is left "
                        "running\n")
    return text


class StopScreen(ModalScreen):
    """`x`: which launch to stop (everything sparktop started, or one)."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Cancel")]

    def __init__(self, launcher: Launcher):
        super().__init__()
        self.launcher = launcher

    def compose(self) -> ComposeResult:
        with Container(id="stop-box"):
            yield Static("[b]Stop what sparktop launched[/b]  (Enter picks, Esc cancels)")
            yield OptionList(id="launches")

    def on_mount(self) -> None:
        options = self.query_one("#launches", OptionList)
        active = self.launcher.active()
        now = time.time()
        for r in reversed(active):
            options.add_option(Option(Text.assemble((r.id, "bold"), f"  {r.topology} on {', '.join(r.nodes)}",
                                                    (f"  up {ago(now - r.started)}", "dim")), id=r.id))
        if len(active) > 1:
            options.add_option(Option(Text(f"all {len(active)} launches", style="bold"), id="*all*"))
        if not active:
            options.add_option(Option(Text("nothing of sparktop's is running", style="dim"), id="*none*",
                                      disabled=True))
        options.highlighted = 0
        options.focus()

    @on(OptionList.OptionSelected)
    def _picked(self, event: OptionList.OptionSelected) -> None:
        ids = [r.id for r in self.launcher.active()] if event.option_id == "*all*" else [str(event.option_id)]
        self.app.pop_screen()
        self.app.push_screen(ConfirmStop(ids, self.launcher))


class ConfirmStop(ModalScreen):
    BINDINGS = [Binding("y", "yes", "Stop"), Binding("n,escape", "app.pop_screen", "Keep running")]

    def __init__(self, launch_ids: list[str], launcher: Launcher):
        super().__init__()
        self.launch_ids = launch_ids
        self.launcher = launcher

    def compose(self) -> ComposeResult:
        records = {r.id: r for r in self.launcher.active()}
        nodes = sorted({n for lid in self.launch_ids for n in (records[lid].nodes if lid in records else [])})
        with Container(id="stop-box"):
            yield Static(f"Stop [b]{escape(', '.join(self.launch_ids))}[/b]?\n"
                         f"Its containers (vLLM, Ray, router) are removed on {', '.join(nodes) or 'every node'}.\n\n"
                         "[b]y[/b] stop    [b]n[/b] keep running")

    def action_yes(self) -> None:
        self.app.post_message(StopRequested(self.launch_ids))
        self.app.pop_screen()
