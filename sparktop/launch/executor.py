"""Running a plan, watching it start, and tearing it down.

`Executor.run()` is an async iterator of `launch.events.LaunchEvent`
(StepStarted, StepDone, LogLine, Stage, Ready, Failed, TornDown) that the
CLI prints and the app turns into messages. Steps run in order; each waits for what it
declares (a container running, Ray members, the API answering /health with
the model listed in /v1/models). While waiting, every container the plan
started is watched: one that exits fails the launch at once, with the lines
of its log that say why. On any failure everything the plan started is
removed on every node (by the `sparktop.launch` label) before the executor
reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import secrets as pysecrets
import shlex
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import aiohttp

from sparktop.engine_ids import DEFAULT
from sparktop.events import emitting
from sparktop.launch.events import Failed, LaunchEvent, LogLine, Ready, Stage, StepDone, StepStarted, TornDown
from sparktop.launch.plan import Home, Plan, Step
from sparktop.launch.state import LaunchRecord, LaunchState
from sparktop.launch.topology import ROUTER_KEY_ENV
from sparktop.observe.engine_log import LogPatterns, startup_state, strip_prefix
from sparktop.observe.engines import by_id
from sparktop.remote import Transport, TransportError

DEFAULT_TIMEOUT = 30 * 60.0  # a 120B model takes ~15 minutes to load on a Spark; leave room


class LaunchFailed(Exception):
    def __init__(self, reason: str, lines: list[str] | None = None):
        super().__init__(reason)
        self.reason = reason
        self.lines = lines or []


def teardown_command(launch_id: str, state_dir: str | None = None) -> str:
    """Remove every container of a launch (found by label) and its files."""
    label = shlex.quote(f"label=sparktop.launch={launch_id}")
    cmd = f"ids=$(docker ps -aq --filter {label}); [ -z \"$ids\" ] || docker rm -f $ids >/dev/null; echo $ids | wc -w"
    if state_dir:
        cmd += f"; rm -rf {Home(state_dir).render()}"
    return cmd


class Executor:
    def __init__(self, plan: Plan, transports: dict[str, Transport], state: LaunchState | None = None,
                 timeout: float = DEFAULT_TIMEOUT, poll: float = 1.0):
        self.plan = plan
        self.transports = transports
        self.state = state
        self.timeout = timeout
        self.poll = poll
        self.router_key = pysecrets.token_urlsafe(24) if ROUTER_KEY_ENV in plan.secrets else None
        self._emit: Callable[[LaunchEvent], None] = lambda event: None
        self._logs: dict[str, deque] = {}
        self._stages: dict[str, str] = {}
        self._followers: list[asyncio.Task] = []
        self.started = time.monotonic()

    # -- secrets ---------------------------------------------------------------

    def _secret(self, name: str) -> str:
        if name == ROUTER_KEY_ENV and self.router_key:
            return self.router_key
        value = os.environ.get(name)
        if value is None:
            raise LaunchFailed(f"{name} is not set in this environment")
        return value

    def api_key(self, name: str | None) -> str | None:
        return self._secret(name) if name else None

    # -- running ---------------------------------------------------------------

    def run(self) -> AsyncIterator[LaunchEvent]:
        """The launch, as its events. Ends after Ready, or raises LaunchFailed
        after Failed and TornDown; closing the iterator early (or cancelling
        its consumer) cancels the launch, which removes what it started."""
        return emitting(self._run)

    def _record(self) -> LaunchRecord:
        return LaunchRecord(
            id=self.plan.launch_id, recipe=self.plan.recipe_id, topology=self.plan.topology, nodes=self.plan.nodes,
            containers=self.plan.containers, state_dir=self.plan.state_dir,
            endpoints=[{"url": e.url, "kind": e.kind, "node": e.node, "model": e.model, "topology": e.topology,
                        "container": e.container, "api_key_env": e.api_key_env,
                        "members": [list(m) for m in e.members]} for e in self.plan.endpoints],
        )

    async def _run(self, emit: Callable[[LaunchEvent], None]) -> None:
        self._emit = emit
        if self.state is not None:
            self.state.save(self._record())
            if self.router_key:
                self.state.save_key(self.plan.launch_id, self.router_key)
        try:
            for index, step in enumerate(self.plan.steps):
                self._emit(StepStarted(index, step))
                began = time.monotonic()
                await self._do(step)
                await self._wait(step)
                self._emit(StepDone(index, step, time.monotonic() - began))
        except (TimeoutError, LaunchFailed, TransportError) as exc:
            reason = exc.reason if isinstance(exc, LaunchFailed) else str(exc) or "timed out"
            lines = exc.lines if isinstance(exc, LaunchFailed) else []
            self._emit(Failed(reason, lines))
            await self._stop_followers()
            removed = await self.teardown()
            self._emit(TornDown(self.plan.launch_id, self.plan.nodes, removed))
            if self.state is not None:
                self.state.update(self.plan.launch_id, status="failed", reason=reason)
                self.state.drop_key(self.plan.launch_id)
            raise LaunchFailed(reason, lines) from None
        except asyncio.CancelledError:
            await self._stop_followers()
            await self.teardown()
            if self.state is not None:
                self.state.update(self.plan.launch_id, status="failed", reason="cancelled")
            raise
        await self._stop_followers()
        if self.state is not None:
            self.state.update(self.plan.launch_id, status="ready")
        self._emit(Ready(self.plan, time.monotonic() - self.started))

    async def _do(self, step: Step) -> None:
        if not step.argv:
            return
        transport = self.transports[step.node]
        stdin = None
        if step.stdin_secrets:
            stdin = "".join(f"{name}={self._secret(name)}\n" for name in step.stdin_secrets)
        elif step.stdin_text is not None:
            stdin = step.stdin_text
        result = await transport.run(step.command, timeout=120, input=stdin)
        if not result.ok:
            raise LaunchFailed(f"{step.node}: {step.title} failed: {result.first_error_line()}",
                               [line for line in (result.stderr + result.stdout).splitlines() if line.strip()][-8:])
        if step.container:
            self._follow(step.node, step.container)

    # -- waiting ---------------------------------------------------------------

    async def _wait(self, step: Step) -> None:
        wait = step.wait
        if wait.kind == "none":
            return
        deadline = time.monotonic() + self.timeout
        async with aiohttp.ClientSession() as http:
            while True:
                await self._check_containers()
                if await self._satisfied(step, http):
                    return
                if time.monotonic() > deadline:
                    stage = self._stages.get(wait.container or "", "unknown")
                    raise LaunchFailed(f"not ready after {self.timeout:.0f}s (last stage: {stage})",
                                       self._tail(wait.container))
                await asyncio.sleep(self.poll)

    async def _satisfied(self, step: Step, http: aiohttp.ClientSession) -> bool:
        wait = step.wait
        container = wait.container or ""  # running and ray-nodes waits always name one
        if wait.kind == "running":
            return await self._running(step.node, container)
        if wait.kind == "ray-nodes":
            head = next(n for n, cs in self.plan.containers.items() if container in cs)
            ray = await self.transports[head].run(["docker", "exec", container, "ray", "status"], timeout=30)
            return ray.ok and ray.stdout.count(" node_") >= wait.count
        if wait.kind == "http":
            headers = {}
            if wait.api_key_env:
                headers["Authorization"] = f"Bearer {self._secret(wait.api_key_env)}"
            try:
                base = wait.url or ""
                if await self._reachable(http, base + "/health", headers):
                    async with http.get(base + "/v1/models", headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=5)) as r:
                        if r.status == 200:
                            data = await r.json()
                            names = [m.get("id") for m in data.get("data", [])]
                            return wait.model in names
            except (TimeoutError, aiohttp.ClientError, ValueError):
                pass
            return False
        return True

    async def _reachable(self, http: aiohttp.ClientSession, url: str, headers: dict) -> bool:
        try:
            async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=3)) as r:
                if r.status == 200:
                    return True
        except (TimeoutError, aiohttp.ClientError):
            pass
        if url.endswith("/health"):  # LiteLLM answers readiness here
            try:
                async with http.get(url + "/liveliness", headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=3)) as r:
                    return r.status == 200
            except (TimeoutError, aiohttp.ClientError):
                return False
        return False

    async def _running(self, node: str, container: str) -> bool:
        r = await self.transports[node].run(
            ["docker", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container], timeout=30)
        status = r.stdout.split()
        if not r.ok or not status:
            raise LaunchFailed(f"{node}: container {container} is gone", self._tail(container))
        if status[0] == "running":
            return True
        if status[0] in ("exited", "dead"):
            raise await self._died(node, container, status[1] if len(status) > 1 else "?")
        return False

    async def _check_containers(self) -> None:
        """Any container of the plan that has died fails the launch now, named by the one that died first:
        when one node's worker dies, the head and the other workers follow it (NCCL aborts), and a slow
        round of checks can find them all gone; the first to finish is the cause, the others its echo."""
        asked = [(node, [n for n in names if n in self._logs]) for node, names in self.plan.containers.items()]
        asked = [(node, started) for node, started in asked if started]
        results = await asyncio.gather(*(self.transports[node].run(
            ["docker", "inspect", "--format",
             "{{.Name}} {{.State.Status}} {{.State.ExitCode}} {{.State.FinishedAt}}", *started], timeout=30)
            for node, started in asked))
        dead: list[tuple[dt.datetime, int, str, str, str]] = []
        for (node, started), r in zip(asked, results, strict=True):
            for line in r.stdout.splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[1] in ("exited", "dead"):
                    dead.append((_finished_at(parts[3] if len(parts) > 3 else ""), len(dead), node,
                                 parts[0].lstrip("/"), parts[2] if len(parts) > 2 else "?"))
            # Removed (`docker rm -f`, by someone or something else): no time to sort by, and no crash of the
            # launch's own to be the echo of, so it comes first.
            for name in started:
                if any("no such" in line.lower() and line.rstrip().endswith(name)
                       for line in r.stderr.splitlines()):
                    dead.append((dt.datetime.min.replace(tzinfo=dt.UTC), len(dead), node, name, ""))
        if dead:
            _, _, node, container, code = min(dead)
            if not code:
                raise LaunchFailed(f"{node}: container {container} is gone", self._tail(container))
            raise await self._died(node, container, code)

    async def _died(self, node: str, container: str, code: str) -> LaunchFailed:
        r = await self.transports[node].run(["docker", "logs", "--tail", "200", container], timeout=30)
        lines = (r.stdout + r.stderr).splitlines() or list(self._logs.get(container, []))
        state = startup_state(lines, self._log)
        why = state.reason or next((strip_prefix(line, self._log) for line in reversed(lines)
                                    if "error" in line.lower()), None)
        reason = f"{node}: {container} exited with code {code}" + (f": {why}" if why else "")
        return LaunchFailed(reason, [strip_prefix(line, self._log) for line in lines if line.strip()][-12:])

    @property
    def _log(self) -> LogPatterns:
        """How the plan's engine words its log."""
        engine = by_id(self.plan.runtime) or by_id(DEFAULT)
        assert engine is not None  # observe knows DEFAULT's engine
        return engine.log

    # -- logs ------------------------------------------------------------------

    def _follow(self, node: str, container: str) -> None:
        self._logs[container] = deque(maxlen=400)
        self._followers.append(asyncio.create_task(self._follow_loop(node, container)))

    async def _follow_loop(self, node: str, container: str) -> None:
        buf = self._logs[container]
        try:
            async for line in self.transports[node].stream(["docker", "logs", "-f", container]):
                buf.append(line)
                self._emit(LogLine(node, container, line))
                stage = startup_state([line], self._log).stage
                if stage and stage != self._stages.get(container):
                    self._stages[container] = stage
                    self._emit(Stage(node, container, stage))
        except (TransportError, OSError):
            pass

    def _tail(self, container: str | None, n: int = 12) -> list[str]:
        if not container or container not in self._logs:
            return []
        return [strip_prefix(line, self._log) for line in list(self._logs[container])[-n:]]

    async def _stop_followers(self) -> None:
        for task in self._followers:
            task.cancel()
        await asyncio.gather(*self._followers, return_exceptions=True)
        self._followers.clear()

    # -- teardown --------------------------------------------------------------

    async def teardown(self) -> int:
        return await teardown(self.plan.launch_id, self.plan.nodes, self.transports, self.plan.state_dir)


async def teardown(launch_id: str, nodes: list[str], transports: dict[str, Transport],
                   state_dir: str | None = None) -> int:
    """Remove everything of `launch_id` on every node; how many containers went."""
    removed = 0
    results = await asyncio.gather(*(transports[n].run(teardown_command(launch_id, state_dir), timeout=120)
                                     for n in nodes), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            continue
        with contextlib.suppress(ValueError, IndexError):
            removed += int(result.stdout.strip().splitlines()[-1])
    return removed


def _finished_at(stamp: str) -> dt.datetime:
    """docker's `.State.FinishedAt` (RFC 3339, nanoseconds; Python 3.11 reads them, truncated to micro-
    seconds); the far future when it is unset or unreadable, so a container with a time sorts first."""
    try:
        when = dt.datetime.fromisoformat(stamp)
    except ValueError:
        when = dt.datetime.min
    if when.year < 2000:  # docker's zero time, "0001-01-01T00:00:00Z": never finished
        return dt.datetime.max.replace(tzinfo=dt.UTC)
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)
