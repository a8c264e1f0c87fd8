"""What the app's launcher drives: recipes, plans, preflight, one launch
at a time, and stopping — plain async Python, no UI.

`Launcher` holds the inventory, the recipes and one transport per node
(opened on first use, closed by `close()`). `LaunchRun` follows one launch:
it applies the executor's events to a small state (each step's progress,
each container's startup stage, a log tail) that a screen can draw from at
any time, and it keeps running when nobody is looking.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shlex
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sparktop.engine_ids import DEFAULT
from sparktop.errors import SparktopError
from sparktop.launch.catalog import discover
from sparktop.launch.events import Failed, LaunchEvent, LogLine, Ready, Stage, StepDone, StepStarted, TornDown
from sparktop.launch.executor import DEFAULT_TIMEOUT, Executor, LaunchFailed, teardown
from sparktop.launch.plan import Plan
from sparktop.launch.preflight import Preflight, run_preflight
from sparktop.launch.recipe import RESERVED_FLAGS, Recipe, _flag_map
from sparktop.launch.runtimes import runtime_for
from sparktop.launch.state import LaunchRecord, LaunchState
from sparktop.launch.topology import launch_id, make_plan
from sparktop.layouts import layouts_for, parse_layout
from sparktop.model.hardware import GB10
from sparktop.observe.fabric import Fabric
from sparktop.remote import Transport, TransportError, transport_for
from sparktop.settings import Inventory

# The overrides the launcher offers, as the form names them.
OVERRIDE_FLAGS = ("gpu_memory_utilization", "max_model_len", "max_num_seqs")


@dataclass
class LaunchRequest:
    """What the user chose: a recipe, a topology, where, and what to change."""

    recipe: Recipe
    topology: str
    nodes: list[str] | None = None  # None: the inventory's nodes (the first is the head)
    port: int | None = None
    overrides: dict = field(default_factory=dict)  # the runtime's flag -> value
    extra_args: list[str] = field(default_factory=list)
    launch_id: str | None = None


def parse_overrides(values: dict[str, str], runtime: str = DEFAULT) -> dict:
    """Form text -> overrides of the runtime's flags, validated like a recipe's flags: the form's boxes
    (vLLM's names: gpu_memory_utilization, max_model_len, max_num_seqs) become the runtime's own
    (SGLang's mem_fraction_static, llama.cpp's ctx_size ...). Empty fields keep the recipe's value."""
    import yaml

    raw = {}
    for key, text in values.items():
        text = text.strip()
        if not text:
            continue
        try:
            raw[key] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise SparktopError(f"{key}: {text!r} is not a value") from None
    out = _flag_map(raw, "override", {}, None, "override", DEFAULT)  # the boxes are named as vLLM names them
    rt = runtime_for(runtime)
    for key in list(out):
        if key in rt.form_flags and rt.form_flags[key] != key:
            flag = rt.form_flags[key]
            if flag is None:
                raise SparktopError(f"{key}: {rt.name} has no such setting")
            out[flag] = out[key]
    util = out.get("gpu_memory_utilization")
    if util is not None and (not isinstance(util, (int, float)) or not 0 < float(util) <= 1):
        raise SparktopError(f"gpu_memory_utilization must be between 0 and 1, got {util!r}")
    for key in ("max_model_len", "max_num_seqs"):
        value = out.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise SparktopError(f"{key} must be a whole number above 0, got {value!r}")
    return {k: v for k, v in out.items() if k not in rt.form_flags or rt.form_flags[k] == k}


def overrides_for(overrides: dict, source: str, target: str) -> dict:
    """`--set` overrides written for the `source` runtime's recipe, as the `target` runtime spells them (a study
    across runtimes): what the launcher's form offers every runtime (memory share, context, batch) is
    translated; another flag belongs to its runtime alone, and is an error for the others."""
    src, dst = runtime_for(source), runtime_for(target)
    if src.id == dst.id:
        return dict(overrides)
    form = {flag: key for key, flag in src.form_flags.items() if flag}  # the source's flag -> the form's box
    out = {}
    for key, value in overrides.items():
        box = form.get(key)
        flag = dst.form_flags.get(box) if box else None
        if flag is None:
            shared = ", ".join(k for k, f in src.form_flags.items() if f and dst.form_flags.get(k))
            raise SparktopError(f"--set {key}: {dst.name} has no such setting; across runtimes --set takes "
                                f"only what each has ({shared or 'none'}), in {src.name}'s names")
        out[flag] = value
    return out


def parse_port(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise SparktopError(f"port must be a number from 1 to 65535, got {text!r}")
    return int(text)


def parse_extra_args(text: str) -> list[str]:
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise SparktopError(f"extra args: {exc}") from None
    for arg in args:
        if arg.startswith("--") and arg[2:].split("=")[0] in RESERVED_FLAGS:
            raise SparktopError(f"extra args: {arg} is set by sparktop from the topology")
    return args


@dataclass
class StepProgress:
    title: str
    node: str
    status: str = "pending"  # pending | running | done | failed
    seconds: float | None = None


@dataclass
class LaunchRun:
    """One launch as it happens, built from the executor's events."""

    plan: Plan
    steps: list[StepProgress]
    started: float = field(default_factory=time.monotonic)
    status: str = "running"  # running | ready | failed | cancelled
    reason: str | None = None
    lines: list[str] = field(default_factory=list)  # the log lines that say why it failed
    stages: dict[str, str] = field(default_factory=dict)  # container -> startup stage
    stage_nodes: dict[str, str] = field(default_factory=dict)  # container -> node
    log: deque = field(default_factory=lambda: deque(maxlen=500))  # (node, container, line)
    log_total: int = 0  # lines ever logged (a screen appends the ones it has not shown)
    removed: int | None = None
    seconds: float | None = None
    version: int = 0

    @classmethod
    def for_plan(cls, plan: Plan) -> LaunchRun:
        return cls(plan, [StepProgress(s.title, s.node) for s in plan.steps])

    @property
    def elapsed(self) -> float:
        return self.seconds if self.seconds is not None else time.monotonic() - self.started

    @property
    def current_stage(self) -> str | None:
        """The head engine's stage (what a user waits on), else any."""
        for endpoint in self.plan.endpoints:
            if endpoint.container in self.stages:
                return self.stages[endpoint.container]
        return next(reversed(self.stages.values()), None) if self.stages else None

    def apply(self, event: LaunchEvent) -> None:
        self.version += 1
        match event:
            case StepStarted(index=i):
                self.steps[i].status = "running"
            case StepDone(index=i, seconds=seconds):
                self.steps[i].status = "done"
                self.steps[i].seconds = seconds
            case Stage(node=node, container=container, stage=stage):
                self.stages[container] = stage
                self.stage_nodes[container] = node
            case LogLine(node=node, container=container, line=line):
                self.log.append((node, container, line))
                self.log_total += 1
            case Failed(reason=reason, lines=lines):
                self.status, self.reason, self.lines = "failed", reason, list(lines)
                for step in self.steps:
                    if step.status == "running":
                        step.status = "failed"
                self.seconds = time.monotonic() - self.started
            case TornDown(removed=removed):
                self.removed = removed
            case Ready(seconds=seconds):
                self.status = "ready"
                self.seconds = seconds


class Launcher:
    def __init__(self, inventory: Inventory, recipe_dirs: list[str] | None = None, timeout: float = DEFAULT_TIMEOUT):
        self.inventory = inventory
        self.recipe_dirs = recipe_dirs
        self.timeout = timeout
        self.state = LaunchState(inventory)
        self._transports: dict[str, Transport] = {}
        # Per launch id: what was asked for, and the fabric preflight detected
        # for it (the launch is planned again with it).
        self._requests: dict[str, LaunchRequest] = {}
        self._fabric: dict[str, dict[str, Fabric]] = {}
        self.run: LaunchRun | None = None
        self._executor: Executor | None = None
        self._task: asyncio.Task | None = None  # the task following the launch, to cancel it

    # -- choosing --------------------------------------------------------------

    def recipes(self) -> tuple[dict[str, Recipe], list[str]]:
        return discover(self.recipe_dirs)

    def topologies(self, recipe: Recipe) -> list[str]:
        """The layouts offered for `recipe`: the five two-node names it allows,
        then, with more than two nodes, every layout of three nodes or more
        whose weights fit its nodes (HAProxy leastconn for replicas, as `--layout 2x tp=2`). With two nodes
        or more, two solo replicas behind HAProxy come right after the five."""
        count = len(self.inventory.nodes)
        names = recipe.allowed_topologies(count)
        if "shuffle" in names:  # two solo replicas are allowed: behind the default router too
            names.append(parse_layout("2x solo").name)
        if count <= 2:
            return names
        card = recipe.twin_card()
        weights = recipe.estimated_weights_gib()
        for layout in layouts_for(count, moe=bool(card and card.is_moe)):
            if layout.nodes <= 2 or recipe.why_not_layout(layout, count) is not None:
                continue
            if weights and weights / layout.nodes_per_engine > 0.9 * GB10.memory_gib:
                continue
            names.append(layout.name)
        return names

    def plan(self, request: LaunchRequest) -> Plan:
        recipe = request.recipe
        if request.extra_args:
            recipe = dataclasses.replace(recipe, extra_args=[*recipe.extra_args, *request.extra_args])
        nodes = request.nodes or [n.name for n in self.inventory.nodes]
        if request.launch_id is None:
            port = request.port or recipe.port or self.inventory.defaults.port
            request.launch_id = launch_id(recipe, request.topology, nodes, port)
        self._requests[request.launch_id] = request
        return make_plan(recipe, request.topology, self.inventory, request.nodes, request.overrides,
                         request.port, lid=request.launch_id, fabric=self._fabric.get(request.launch_id))

    def transports(self, names: list[str]) -> dict[str, Transport]:
        for name in names:
            if name not in self._transports:
                self._transports[name] = transport_for(self.inventory.node(name))
        return {name: self._transports[name] for name in names}

    async def preflight(self, plan: Plan, recipe: Recipe) -> Preflight:
        result = await run_preflight(plan, recipe, self.inventory, self.transports(plan.nodes))
        self._fabric[plan.launch_id] = result.fabric
        return result

    def with_fabric(self, plan: Plan) -> Plan:
        """`plan` made again with the fabric its preflight detected (the same
        plan when there was nothing to detect)."""
        request = self._requests.get(plan.launch_id)
        if not self._fabric.get(plan.launch_id) or request is None:
            return plan
        return self.plan(request)

    # -- launching -------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def begin(self, plan: Plan) -> LaunchRun:
        """Make the launch of `plan` the current one; `follow()` runs it."""
        if self.run is not None and (self.busy or (self._executor is not None and self.run.status == "running")):
            raise SparktopError(f"{self.run.plan.launch_id} is still launching")
        plan = self.with_fabric(plan)
        self.run = LaunchRun.for_plan(plan)
        self._executor = Executor(plan, self.transports(plan.nodes), self.state, timeout=self.timeout)
        return self.run

    async def follow(self) -> AsyncIterator[LaunchEvent]:
        """Run the launch `begin()` made, as its events, folding each into
        `self.run` first. A failure ends the iterator (the run says why);
        cancelling the consumer cancels the launch, which removes what it
        started."""
        run, executor = self.run, self._executor
        if run is None or executor is None:
            raise SparktopError("nothing to launch: begin() a plan first")
        self._task = asyncio.current_task()
        try:
            async for event in executor.run():
                run.apply(event)
                yield event
        except LaunchFailed:
            pass  # already in the run as a Failed event
        except asyncio.CancelledError:
            run.status, run.reason = "cancelled", "cancelled"
            raise
        except Exception as exc:  # a launch must never take the app down
            run.status, run.reason = "failed", f"{type(exc).__name__}: {exc}"
            await executor.teardown()
        finally:
            self._task, self._executor = None, None

    # -- stopping --------------------------------------------------------------

    def active(self) -> list[LaunchRecord]:
        return self.state.active()

    async def stop(self, launch_ids: list[str]) -> dict[str, int]:
        """Tear down each launch on every node of the inventory; removed containers per launch."""
        if self._task is not None and self.busy and self.run is not None and self.run.plan.launch_id in launch_ids:
            self._task.cancel()  # the executor tears down what it started
            await asyncio.gather(self._task, return_exceptions=True)
        names = [n.name for n in self.inventory.nodes]
        return await stop_launches(self.state, launch_ids, self.transports(names))

    async def close(self) -> None:
        if self._task is not None and self.busy:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for transport in self._transports.values():
            with contextlib.suppress(TransportError):
                await transport.close()
        self._transports.clear()


async def stop_launches(state: LaunchState, launch_ids: list[str], transports: dict[str, Transport]) -> dict[str, int]:
    removed: dict[str, int] = {}
    names = list(transports)
    for lid in launch_ids:
        record = state.get(lid)
        removed[lid] = await teardown(lid, names, transports, record.state_dir if record else None)
        state.update(lid, status="stopped")
        state.drop_key(lid)
    return removed


async def running_launch_ids(state: LaunchState, transports: dict[str, Transport]) -> list[str]:
    """Launches in the state file plus any whose containers (by label) outlived their record."""
    ids = [r.id for r in state.active()]
    found = await asyncio.gather(*(t.run(["docker", "ps", "-a", "--filter", "label=sparktop.launch",
                                          "--format", '{{.Label "sparktop.launch"}}'], timeout=30)
                                   for t in transports.values()), return_exceptions=True)
    for result in found:
        if not isinstance(result, BaseException):
            ids += [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return list(dict.fromkeys(ids))
