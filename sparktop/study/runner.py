"""Running a study: each topology in turn launched, swept, stopped, verified.

For every topology not yet finished: preflight → launch (the executor) →
ready → sweep (which waits for an idle engine and warms up before each
level) → stop → teardown verified on every node → the next. A topology that
fails anywhere is recorded with its reason and the log lines that show it,
and the study goes on. `study.json` is rewritten after every change and
each sweep writes its requests as they finish, so a study killed at any
moment resumes from the first unmeasured batch: `remove_leftovers()` first
removes whatever the study had running, then the unfinished topology is
launched again and its sweep run resumed (`Sweep(resume=...)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable

import aiohttp

from sparktop import __version__
from sparktop.bench.events import LevelDone, LevelStarted, RateLevelStarted, SweepFinished, SweepStarted
from sparktop.bench.load import RateSweep
from sparktop.bench.sweep import Sweep, SweepSettings
from sparktop.engine_ids import is_router
from sparktop.events import emitting
from sparktop.launch.events import Stage
from sparktop.launch.executor import DEFAULT_TIMEOUT, Executor, LaunchFailed, teardown
from sparktop.launch.plan import Plan
from sparktop.launch.preflight import Preflight, ports_released, run_preflight
from sparktop.launch.recipe import Recipe
from sparktop.launch.session import overrides_for, stop_launches
from sparktop.launch.state import LaunchState
from sparktop.launch.topology import make_plan
from sparktop.masking import mask
from sparktop.observe.engine_log import strip_prefix
from sparktop.observe.power import NodesPower
from sparktop.remote import Transport, TransportError, transport_for
from sparktop.settings import Inventory
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
from sparktop.study.state import (
    CANCELLED,
    DONE,
    FAILED,
    LAUNCHING,
    PENDING,
    PREFLIGHT,
    STOPPING,
    SWEEPING,
    Study,
    TopologyState,
)


class StudyRunner:
    """`async for event in StudyRunner(study, recipe, inventory).events()`."""

    def __init__(self, study: Study, recipe: Recipe, inventory: Inventory, *, timeout: float = DEFAULT_TIMEOUT,
                 port: int | None = None, max_error_rate: float = 0.10,
                 transports: dict[str, Transport] | None = None):
        self.study = study
        self.recipe = recipe
        self.inventory = inventory
        self.timeout = timeout
        self.port = port
        self.max_error_rate = max_error_rate
        self._own_transports = transports is None
        self.transports = transports or {n.name: transport_for(n) for n in inventory.nodes}
        self.state = LaunchState(inventory)
        self._emit: Callable[[StudyEvent], None] = lambda event: None
        self._cancelled = False  # cancel() was asked: the study ends `cancelled`, not `interrupted`
        self._executor: Executor | None = None
        self._recipes: dict[str, Recipe] = {}  # the other runtimes' recipes of a study across runtimes

    # -- running -----------------------------------------------------------

    def events(self) -> AsyncIterator[StudyEvent]:
        """The study, as its events; the last is StudyFinished. Cancelling the
        consumer stops the current topology, removes what it started and
        leaves the study resumable (`interrupted`, or `cancelled` after
        `cancel()`)."""
        return emitting(self._run)

    async def run(self) -> StudyFinished:
        finished = None
        async for event in self.events():
            finished = event
        assert isinstance(finished, StudyFinished)
        return finished

    def cancel(self) -> None:
        """Say the coming cancellation is the user's (the app's Esc), not a crash."""
        self._cancelled = True

    def _save(self) -> None:
        self.study.save()

    def _stage(self, t: TopologyState, stage: str) -> None:
        t.stage = stage
        self.study.stage = f"{self.study.topologies.index(t) + 1}/{len(self.study.topologies)} {t.name}: {stage}"
        self._save()
        self._emit(StageChanged(t.name, stage))

    async def _run(self, emit: Callable[[StudyEvent], None]) -> StudyFinished:
        self._emit = emit
        study = self.study
        resumed = any(t.status != PENDING for t in study.topologies)
        study.status, study.pid, study.ended = "running", os.getpid(), None
        study.sparktop_version = __version__
        self._save()
        try:
            removed = await self.remove_leftovers()
            emit(StudyStarted(study, resumed, removed))
            for index, t in enumerate(study.topologies):
                if t.finished:
                    continue
                emit(TopologyStarted(t.name, index, len(study.topologies)))
                await self._topology(t)
                emit(TopologyFinished(t.name, t.status, t.reason, list(t.lines)))
            study.status = "done"
        except asyncio.CancelledError:
            study.status = "cancelled" if self._cancelled else "interrupted"
            for t in study.topologies:
                if not t.finished and t.status != PENDING:
                    t.stage = "interrupted"
            raise
        finally:
            study.ended = time.time()
            study.stage = "" if study.status == "done" else study.status
            study.pid = None
            self._save()
            if self._own_transports:
                for tr in self.transports.values():
                    with contextlib.suppress(TransportError, OSError):
                        await tr.close()
        finished = StudyFinished(study, study.status)
        emit(finished)
        return finished

    # -- leftovers -----------------------------------------------------------

    async def remove_leftovers(self) -> int:
        """Remove everything this study launched that may still run (after a
        kill, a dropped session, a reboot); verified on every node."""
        ids = [t.launch_id for t in self.study.topologies if t.launch_id]
        if not ids:
            return 0
        removed = sum((await stop_launches(self.state, ids, self.transports)).values())
        for lid in ids:
            await self._verify_gone(lid)
        return removed

    async def _verify_gone(self, launch_id: str) -> None:
        """The same check as `sparktop stop`: no container labelled with the
        launch on any node. A leftover is removed once more, then reported."""
        for attempt in range(2):
            left: list[str] = []
            for name, tr in self.transports.items():
                r = await tr.run(["docker", "ps", "-aq", "--filter", f"label=sparktop.launch={launch_id}"],
                                 timeout=30)
                if r.ok and r.stdout.strip():
                    left.append(f"{name}: {len(r.stdout.split())} container(s)")
            if not left:
                return
            if attempt == 0:
                await teardown(launch_id, list(self.transports), self.transports)
        raise TransportError(left[0].split(":")[0], f"{launch_id} is still running after teardown ({'; '.join(left)})")

    # -- one topology --------------------------------------------------------

    def _fail(self, t: TopologyState, reason: str, lines: list[str] | None = None) -> None:
        t.status, t.reason, t.lines = FAILED, reason, list(lines or [])[-20:]

    async def _topology(self, t: TopologyState) -> None:
        t.started = t.started or time.time()
        t.reason, t.lines = None, []
        t.status = PREFLIGHT
        self._stage(t, "preflight")
        try:
            recipe = self.recipe_of(t)
            overrides = overrides_for(self.study.overrides, self.recipe.runtime, recipe.runtime)
            plan = make_plan(recipe, t.layout_name, self.inventory, self.study.nodes or None, overrides, self.port)
        except Exception as exc:  # noqa: BLE001 - a plan error is this topology's failure, not the study's
            self._fail(t, str(exc))
            t.ended = time.time()
            self._save()
            return
        t.launch_id = plan.launch_id
        t.nodes = list(plan.nodes)
        t.commands = [mask(step.command) for step in plan.steps if step.argv]
        self.study.image = self.study.image or plan.image
        self._save()
        try:
            preflight = await self._preflight(t, plan)
            if preflight is not None and preflight.fabric:  # planned again with the fabric preflight found
                plan = make_plan(recipe, t.layout_name, self.inventory, self.study.nodes or None, overrides,
                                 self.port, lid=plan.launch_id, fabric=preflight.fabric)
                t.commands = [mask(step.command) for step in plan.steps if step.argv]
                self._save()
            if preflight is not None and await self._launch(t, plan):
                await self._sweep(t, plan)
        except TransportError as exc:
            self._fail(t, f"lost a node: {exc}")
        finally:
            # Cancelled or not, nothing of this topology outlives it.
            await asyncio.shield(self._stop(t, plan))
        if t.status not in (FAILED, CANCELLED):
            t.status = DONE
        t.stage = t.status
        t.ended = time.time()
        self._save()

    async def _preflight(self, t: TopologyState, plan: Plan) -> Preflight | None:
        """Preflight's answer when it passed; None (and the topology failed) when not."""
        transports = {n: self.transports[n] for n in plan.nodes}
        result = await run_preflight(plan, self.recipe_of(t), self.inventory, transports)
        if result.ok:
            return result
        first = result.failures[0]
        self._fail(t, f"preflight failed on {first.node}: {first.name}: {first.message}",
                   [c.line() for c in result.failures])
        return None

    async def _launch(self, t: TopologyState, plan: Plan) -> bool:
        t.status = LAUNCHING
        self._stage(t, "launching")
        self._executor = Executor(plan, {n: self.transports[n] for n in plan.nodes}, self.state,
                                  timeout=self.timeout)
        began = time.monotonic()
        try:
            async for event in self._executor.run():
                self._emit(LaunchUpdate(t.name, event))
                if isinstance(event, Stage):
                    self._stage(t, f"launching: {event.stage}")
        except LaunchFailed as exc:
            self._fail(t, exc.reason, exc.lines)
            return False
        t.startup_s = time.monotonic() - began
        t.vllm_version = await self._version(plan)
        self._save()
        return True

    async def _version(self, plan: Plan) -> str | None:
        """The engine's version, as it says it (vLLM's /version, llama.cpp's build, SGLang's server info)."""
        from sparktop.observe.engines import Answer, EngineUnreachable, NotAnEngine, recognise

        engine = next((e for e in plan.endpoints if not is_router(e.kind)), None)
        if engine is None:
            return None
        async with aiohttp.ClientSession() as http:
            async def get(path: str) -> Answer:
                try:
                    async with http.get(engine.url + path, timeout=aiohttp.ClientTimeout(total=5)) as r:
                        return Answer(path, r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read(),
                                      time.monotonic())
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    raise EngineUnreachable(str(exc)) from None

            try:
                return (await recognise(get, plan.runtime)).version
            except (EngineUnreachable, NotAnEngine):
                return None

    def recipe_of(self, t: TopologyState) -> Recipe:
        """The recipe an entry runs: the study's, or in a study across runtimes, its runtime's."""
        if not t.recipe or t.recipe == self.recipe.id:
            return self.recipe
        if t.recipe not in self._recipes:
            from sparktop.launch.catalog import find_recipe

            self._recipes[t.recipe] = find_recipe(t.recipe_path or t.recipe)
        return self._recipes[t.recipe]

    async def _sweep(self, t: TopologyState, plan: Plan) -> None:
        study = self.study
        t.status = SWEEPING
        self._stage(t, "sweeping")
        # What a user of the layout calls: its router when it has one, else its (one) engine.
        api = next((e for e in plan.endpoints if is_router(e.kind)), plan.endpoints[0])
        by_rate = bool(study.rates or study.find_max_rate)
        settings = SweepSettings(
            endpoint=api.url, levels=list(study.levels), runs=study.runs, pp=study.pp, tg=study.tg,
            extra_body=dict(study.extra_body), max_error_rate=self.max_error_rate, recipe=self.recipe_of(t).id,
            topology=t.layout_name, nodes=list(plan.nodes), label=t.name, runtime=plan.runtime,
            depths=list(study.depths) if study.depths and not by_rate else None,
            depth=(study.depths or [0])[0] if by_rate else 0, prefix_cache=study.prefix_cache,
            rates=list(study.rates or [1.0]) if by_rate else None, slo=study.slo,
            find_max_rate=study.find_max_rate, arrivals=study.arrivals, requests=study.requests,
            duration=study.duration)
        # The guard watches the engines themselves: a router has no vLLM metrics.
        settings.guard_urls = [e.url for e in plan.endpoints if not is_router(e.kind)]
        executor = self._executor
        assert executor is not None, "the sweep follows a launch"
        key = executor.api_key(api.api_key_env) if api.api_key_env else None
        previous = study.run_dir(t)
        # Energy per token: the GPU power of every node the topology runs on, read during each level.
        power = NodesPower({n: self.transports[n] for n in plan.nodes if n in self.transports})
        if by_rate:
            # A rate topology is measured afresh on a resume: its levels are not batches that add up.
            sweep: Sweep = RateSweep(settings, study.runs_dir, api_key=key, power=power)
        else:
            sweep = Sweep(settings, study.runs_dir, resume=previous if previous and previous.exists() else None,
                          api_key=key, power=power)
        began = time.monotonic()
        finished: SweepFinished | None = None
        async for event in sweep.events():
            self._emit(SweepUpdate(t.name, event))
            match event:
                case SweepStarted(path=path):
                    t.run = path.name
                    self._save()
                case LevelStarted(concurrency=c, warmup=warm):
                    self._stage(t, f"sweeping c{c}" + (" (warm-up)" if warm else ""))
                case RateLevelStarted(rate=rate):
                    self._stage(t, f"sweeping {rate:g} requests/s" if rate is not None else "replaying a trace")
                case LevelDone(stats=stats):
                    if getattr(stats, "contaminated", False) and stats.concurrency not in t.contaminated:
                        t.contaminated.append(stats.concurrency)
                        self._save()
                case SweepFinished():
                    finished = event
        t.sweep_s = (t.sweep_s or 0.0) + time.monotonic() - began
        if finished is not None and finished.status != "done":
            died = await self._dead_container(plan)
            reason = finished.reason or finished.status
            if died is not None:
                reason, lines = f"{died[0]} (the sweep: {reason})", died[1]
            else:
                lines = []
            self._fail(t, reason, lines)

    async def _dead_container(self, plan: Plan) -> tuple[str, list[str]] | None:
        """A container of the plan that is no longer running, with its last log lines."""
        for node, names in plan.containers.items():
            tr = self.transports[node]
            for name in names:
                r = await tr.run(["docker", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name],
                                 timeout=30)
                status = r.stdout.split()
                if r.ok and status and status[0] == "running":
                    continue
                logs = await tr.run(["docker", "logs", "--tail", "40", name], timeout=30)
                lines = [strip_prefix(line) for line in (logs.stdout + logs.stderr).splitlines() if line.strip()]
                what = f"exited with code {status[1]}" if len(status) > 1 else "is gone"
                return f"{node}: {name} {what} during the sweep", lines[-12:]
        return None

    async def _stop(self, t: TopologyState, plan: Plan) -> None:
        if t.status != FAILED:
            t.status = STOPPING
        self._stage(t, "stopping")
        try:
            await stop_launches(self.state, [plan.launch_id], self.transports)
            await self._verify_gone(plan.launch_id)
            # The next layout's preflight checks the same ports: a stopped engine's last process can take
            # seconds to close its sockets on a loaded node (a real vLLM's did, once: "port 8000 already in use").
            await ports_released(plan, self.inventory, self.transports)
        except TransportError as exc:
            if t.status != FAILED:
                self._fail(t, f"could not verify the teardown: {exc}")
