"""The watchdog: what sparktop launched, kept serving.

Opt-in: `sparktop launch --watchdog` (that launch, while the command stays in the foreground) and
`sparktop collect --watchdog` (every launch of the inventory, for as long as the collector runs). It reads
the monitor's own events (`observe`: each engine's snapshots, `hung` included, `observe.hang`) and acts on an
engine of one of sparktop's launches that is

- **hung**: it answers, but has made no tokens for the poller's `hung_after` seconds with requests
  waiting; or
- **dead**: unreachable or failed (its container exited, its log's fatal error) for `dead_after` seconds,
  after it had served while the watchdog watched (one that never came up is the launch's failure, not
  the watchdog's; one starting up is never dead).

What it restarts is only ever sparktop's: the engine must be an endpoint of a launch in sparktop's launch
state for this inventory (`launch.state`, status ready), and each container it restarts must carry that
launch's `sparktop.launch` label on its node (`docker ps --filter label=...`, as `sparktop stop` finds
them). An engine started by hand, a container without the label, a `sparktop twin serve` process: never.
A container that was removed (the engine is gone) is not brought back.

A restart is the engine's containers, every one of them for an engine over several nodes, restarted in
place: stopped in the reverse of the order the plan started them (the head first, so no worker outlives its
head's session), then started in the plan's order (`Endpoint.members`: vLLM's headless workers before the
head that waits for them, a Ray head before the workers that join it, llama.cpp's rpc-servers before
llama-server). `docker start` runs each container's own command again with its own environment, which is
what relaunching its step would do without needing the recipe, the flags or the secrets again; the
containers keep their names, labels and logs, so `sparktop stop` and the monitor find them as before.

Restarts back off and are capped: after a restart the engine gets `backoff` seconds (doubled with each
restart in the window) before it is judged again, and when `max_restarts` restarts in `window` seconds
have not kept it serving the watchdog gives up on that launch for good, says so, and leaves it as it is
(`LaunchRecord.gave_up`; a new launch starts afresh). The restarts are kept in the launch state, so every
watchdog counts the same ones, and one lock per launch (a file under the state's `watchdog/`) makes sure
only one watchdog guards a launch at a time.

Every action is a `WatchdogAction` with its reason and the last lines of the engine's log before it; its
`notice()` is a `Notice` (kinds `watchdog_restart`, `watchdog_restart_failed`, `watchdog_gave_up`, and
`watchdog_elsewhere` when another watchdog holds the launch; keyed by the engine's URL), which the callers
put in the poller's stream (`Poller.publish`), so the event log, the history and a recording keep it like
any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sparktop.clock import SYSTEM, Clock
from sparktop.engine_ids import DEFAULT
from sparktop.launch.state import LaunchRecord, LaunchState
from sparktop.observe.engine_log import strip_prefix
from sparktop.observe.engines import by_id
from sparktop.observe.hang import HUNG_AFTER_S, seconds_text
from sparktop.observe.snapshot import EngineGone, EngineSnapshot, Notice, ObserveEvent
from sparktop.remote import Transport, TransportError
from sparktop.settings import Inventory

if TYPE_CHECKING:
    from sparktop.observe.poller import Poller

RESTART = "watchdog_restart"
RESTART_FAILED = "watchdog_restart_failed"
GAVE_UP = "watchdog_gave_up"
ELSEWHERE = "watchdog_elsewhere"  # info: another watchdog guards this launch (its lock is held), this one does not
KINDS = (RESTART, RESTART_FAILED, GAVE_UP, ELSEWHERE)  # the kinds of the notices the watchdog gives

LOG_LINES = 12  # the engine's log lines an action carries
STOP_TIMEOUT_S = 10  # `docker stop -t`: what an engine gets to exit before it is killed
REFRESH_S = 5.0  # how often the launch state is read again


@dataclass(frozen=True)
class Policy:
    """When the watchdog acts and how often: the cap (`max_restarts` in `window` seconds), how long an
    engine is unreachable or failed before it is dead (`dead_after`), and the quiet after a restart
    (`backoff`, doubled with each restart in the window), all on the watchdog's clock."""

    max_restarts: int = 3
    window: float = 30 * 60.0
    dead_after: float = 60.0
    backoff: float = 120.0

    def cap_text(self) -> str:
        """"3 restarts in 30 min"."""
        n = self.max_restarts
        return f"{n} restart{'s' if n != 1 else ''} in {seconds_text(self.window)}"


@dataclass(frozen=True)
class WatchdogAction:
    """One thing the watchdog did (or gave up doing), with why and the engine's last log lines before it."""

    t: float  # epoch seconds
    launch_id: str
    url: str  # the engine's endpoint: the key its snapshots and notices carry
    kind: str  # one of KINDS
    text: str
    lines: tuple[str, ...] = ()
    containers: tuple[tuple[str, str], ...] = ()  # (node, name) it acted on, in order

    @property
    def level(self) -> str:
        return {RESTART: "warn", ELSEWHERE: "info"}.get(self.kind, "error")

    def notice(self) -> Notice:
        return Notice(self.t, "engine", self.url, self.kind, self.level, self.text, lines=list(self.lines))


@dataclass
class _Guarded:
    """What the watchdog knows of one engine of a launch."""

    launch_id: str
    url: str
    node: str
    container: str
    kind: str
    members: list[tuple[str, str]]
    seen_live: bool = False  # it served while watched: dead is then the watchdog's to mend
    dead_since: float | None = None
    quiet_until: float = 0.0  # no action before (the watchdog's now): a restart's grace
    busy: bool = False  # a restart of it is under way
    gone: bool = False  # its container was removed: never brought back


@dataclass
class Watchdog:
    """Feed it the monitor's events (`observe`); it restarts the engines of sparktop's launches that are
    hung or dead, within `policy`, on `transports` (by node name), and tells `report` each action.
    `launch_ids`: only these launches (None: every launch of the state)."""

    state: LaunchState
    transports: dict[str, Transport]
    policy: Policy = field(default_factory=Policy)
    clock: Clock = SYSTEM
    report: Callable[[WatchdogAction], None] = lambda action: None
    launch_ids: set[str] | None = None
    guarded: dict[str, _Guarded] = field(default_factory=dict)  # by URL
    elsewhere: set[str] = field(default_factory=set)  # launches another watchdog guards (its lock is held)
    _read_at: float | None = None
    _locks: dict[str, int] = field(default_factory=dict)  # launch -> the lock file's descriptor
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _said_gave_up: set[str] = field(default_factory=set)
    _said_elsewhere: set[str] = field(default_factory=set)

    # -- what is guarded ----------------------------------------------------------------

    def _refresh(self) -> None:
        now = self.clock.now()
        if self._read_at is not None and now - self._read_at < REFRESH_S:
            return
        self._read_at = now
        live: set[str] = set()
        for record in self.state.active():
            if record.status != "ready" or (self.launch_ids is not None and record.id not in self.launch_ids):
                continue
            if not self._claim(record.id):
                self._say_elsewhere(record)
                continue
            for e in record.endpoints:
                url = str(e.get("url", "")).rstrip("/")
                if not url:
                    continue
                live.add(url)
                if url not in self.guarded:
                    node, container = str(e.get("node", "")), str(e.get("container", ""))
                    # A launch recorded before its endpoints listed their containers: the engine's own one.
                    members = [(str(n), str(c)) for n, c in e.get("members") or []] or [(node, container)]
                    self.guarded[url] = _Guarded(record.id, url, node, container, str(e.get("kind", DEFAULT)),
                                                 members)
        for url in [u for u, g in self.guarded.items() if u not in live and not g.busy]:
            del self.guarded[url]  # stopped, failed, or no longer this watchdog's

    def _say_elsewhere(self, record: LaunchRecord) -> None:
        """Once: this launch is another watchdog's (`launch --watchdog` and `collect --watchdog` both running)."""
        if record.id in self._said_elsewhere or not record.endpoints:
            return
        self._said_elsewhere.add(record.id)
        path = self.state.root / "watchdog" / f"{record.id}.lock"
        try:
            holder = f"pid {int(path.read_text().split()[0])}"
        except (OSError, ValueError, IndexError):
            holder = "another sparktop"
        url = str(record.endpoints[0].get("url", "")).rstrip("/")
        self.report(WatchdogAction(self.clock.wall(), record.id, url, ELSEWHERE,
                                   f"watchdog: {record.id} is guarded by {holder}'s watchdog; this one leaves it to "
                                   "that one"))

    def _claim(self, launch_id: str) -> bool:
        """Whether this watchdog guards `launch_id`: it holds (or now takes) its lock."""
        if launch_id in self._locks:
            return True
        path = self.state.root / "watchdog" / f"{launch_id}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            self.elsewhere.add(launch_id)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._locks[launch_id] = fd
        self.elsewhere.discard(launch_id)
        self._said_elsewhere.discard(launch_id)
        return True

    # -- judging ------------------------------------------------------------------------

    def observe(self, event: ObserveEvent) -> None:
        """One of the monitor's events; a restart it calls for runs as a task of its own."""
        if isinstance(event, EngineGone):
            g = self.guarded.get(event.key.rstrip("/"))
            if g is not None:
                g.gone = True
            return
        if not isinstance(event, EngineSnapshot):
            return
        self._refresh()
        g = self.guarded.get(event.key.rstrip("/"))
        if g is None or g.busy or g.gone or g.launch_id in self._said_gave_up:
            return
        now = self.clock.now()
        trouble = None
        if event.state in ("ready", "sleeping"):
            g.seen_live, g.dead_since = True, None
        elif event.state == "hung":
            g.seen_live, g.dead_since = True, None
            trouble = f"hung: {event.reason or 'no tokens while requests wait'}"
        elif event.state in ("unreachable", "failed"):
            if not g.seen_live:
                return
            g.dead_since = now if g.dead_since is None else g.dead_since
            if now - g.dead_since >= self.policy.dead_after:
                why = event.error or event.reason or "it stopped answering"
                trouble = f"{'failed' if event.state == 'failed' else 'down'} for " \
                          f"{seconds_text(now - g.dead_since)}: {why}"
        elif event.state == "starting":
            g.dead_since = None  # starting up is not dead, however long it takes
        if trouble is None or now < g.quiet_until:
            return
        record = self.state.get(g.launch_id)
        if record is None or record.status != "ready":
            return
        if record.gave_up:
            self._gave_up(g, record.gave_up, said=True)
            return
        recent = [t for t in record.restarts if t > self.clock.wall() - self.policy.window]
        if len(recent) >= self.policy.max_restarts:
            why = (f"gave up on {g.launch_id} after {self.policy.cap_text()}: {trouble}; {g.url} is left as "
                   "it is")
            self.state.update(g.launch_id, gave_up=why)
            self._gave_up(g, why)
            return
        g.busy = True
        task = asyncio.get_running_loop().create_task(self._restart(g, trouble, len(recent) + 1),
                                                      name=f"watchdog-{g.launch_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _gave_up(self, g: _Guarded, why: str, said: bool = False) -> None:
        if g.launch_id in self._said_gave_up:
            return
        self._said_gave_up.add(g.launch_id)
        if not said:
            self.report(WatchdogAction(self.clock.wall(), g.launch_id, g.url, GAVE_UP, f"watchdog {why}"))

    # -- acting ---------------------------------------------------------------------------

    async def _run(self, node: str, argv: list[str], timeout: float = 60) -> tuple[bool, str]:
        transport = self.transports.get(node)
        if transport is None:
            return False, f"{node} is not one of the watched nodes"
        try:
            result = await transport.run(argv, timeout=timeout)
        except (TimeoutError, TransportError) as exc:
            return False, f"{node}: {exc}"
        return result.ok, result.stdout if result.ok else f"{node}: {result.first_error_line()}"

    async def _labelled(self, launch_id: str, nodes: list[str]) -> dict[tuple[str, str], str]:
        """The containers on `nodes` that carry `sparktop.launch=<launch_id>`, each with docker's status of it
        ("Up 3 minutes", "Exited (137) 2 seconds ago")."""
        found: dict[tuple[str, str], str] = {}
        for node in nodes:
            ok, out = await self._run(node, ["docker", "ps", "-a", "--filter", f"label=sparktop.launch={launch_id}",
                                             "--format", "{{.Names}}\t{{.Status}}"], timeout=30)
            if ok:
                for line in out.splitlines():
                    name, _, status = line.strip().partition("\t")
                    if name:
                        found[(node, name)] = status.strip()
        return found

    async def _log_tail(self, g: _Guarded) -> list[str]:
        """The last lines of the engine's log (its head container's), as the launch shows them."""
        transport = self.transports.get(g.node)
        if transport is None:
            return []
        try:
            result = await transport.run(["docker", "logs", "--tail", str(LOG_LINES * 2), g.container], timeout=30)
        except (TimeoutError, TransportError):
            return []
        engine = by_id(g.kind) or by_id(DEFAULT)
        lines = (result.stdout + result.stderr).splitlines()
        if engine is not None:
            lines = [strip_prefix(line, engine.log) for line in lines]
        return [line for line in lines if line.strip()][-LOG_LINES:]

    async def _restart(self, g: _Guarded, trouble: str, attempt: int) -> None:
        try:
            labelled = await self._labelled(g.launch_id, list(dict.fromkeys(n for n, _ in g.members)))
            missing = [f"{name} on {node}" for node, name in g.members if (node, name) not in labelled]
            lines = await self._log_tail(g)
            if missing:
                self.report(WatchdogAction(
                    self.clock.wall(), g.launch_id, g.url, RESTART_FAILED,
                    f"watchdog: not restarting {g.url} ({trouble}): {', '.join(missing)} carries no "
                    f"sparktop.launch={g.launch_id} label (removed, or not sparktop's): left alone", tuple(lines)))
                g.gone = True
                return
            record = self.state.get(g.launch_id)
            if record is not None:  # counted before acting: a restart cut short still counts
                self.state.update(g.launch_id, restarts=[*record.restarts, self.clock.wall()])
            names = ", ".join(name for _, name in g.members)
            # What docker says of a member that is not up, read now: the poller may not have listed the
            # containers since the engine stopped answering, so its reason can lack the exit.
            exits = [f"container {name} {status[0].lower()}{status[1:]}" for (_, name), status in labelled.items()
                     if status and not status.startswith("Up") and f"container {name} " not in trouble]
            if exits:
                trouble = f"{trouble}; {'; '.join(exits)}"
            self.report(WatchdogAction(
                self.clock.wall(), g.launch_id, g.url, RESTART,
                f"watchdog: restarting {names} (restart {attempt}, at most {self.policy.cap_text()}): {trouble}",
                tuple(lines), tuple(g.members)))
            failure = await self._stop_start(g.members)
            if failure:
                self.report(WatchdogAction(self.clock.wall(), g.launch_id, g.url, RESTART_FAILED,
                                           f"watchdog: restarting {g.url} failed: {failure}", tuple(lines),
                                           tuple(g.members)))
        finally:
            g.busy = False
            g.dead_since = None
            g.quiet_until = self.clock.now() + self.policy.backoff * 2 ** (attempt - 1)

    async def _stop_start(self, members: list[tuple[str, str]]) -> str | None:
        """Stop the containers in the reverse of their order, then start them in it; what failed, or None."""
        for node, name in reversed(members):
            ok, out = await self._run(node, ["docker", "stop", "-t", str(STOP_TIMEOUT_S), name],
                                      timeout=STOP_TIMEOUT_S + 60)
            if not ok:
                return f"docker stop {name}: {out}"
        for node, name in members:
            ok, out = await self._run(node, ["docker", "start", name])
            if not ok:
                return f"docker start {name}: {out}"
        return None

    async def settle(self) -> None:
        """Until the restarts under way have ended."""
        while pending := [t for t in self._tasks if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        """Wait for a restart under way (a half-restarted engine is worse than a hung one), then let go of
        the launches' locks."""
        await self.settle()
        for fd in self._locks.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._locks.clear()


def watching(poller: Poller, inventory: Inventory, policy: Policy | None = None, *, clock: Clock = SYSTEM,
             launch_ids: set[str] | None = None, root: Path | None = None) -> Watchdog:
    """A watchdog over the inventory's launches on `poller`'s nodes, its actions put in the poller's stream
    (`Poller.publish`); feed it the poller's events (`observe`) and close it before the poller."""
    return Watchdog(LaunchState(inventory, root), poller.node_transports, policy=policy or Policy(), clock=clock,
                    report=lambda action: poller.publish(action.notice()), launch_ids=launch_ids)


async def guard(inventory: Inventory, launch_id: str, *, hung_after: float = HUNG_AFTER_S,
                policy: Policy | None = None, interval: float = 1.0, clock: Clock = SYSTEM,
                root: Path | None = None, stop: asyncio.Event | None = None) -> AsyncIterator[Notice]:
    """Watch one launch's nodes and keep its engines serving (`sparktop launch --watchdog`): a poller over its
    nodes, its engines found by their labels, and a watchdog on its launch. Yields the notices about its
    engines (the monitor's and the watchdog's) until `stop` is set (or it is closed or cancelled); the engines
    keep running after. `stop` rather than a cancel is how Ctrl-C ends it: on Python 3.11 a cancel that comes
    as a wait ends can be lost (see `Poller._node_loop`), and the watch would then never end."""
    from sparktop.launch.state import api_key_for
    from sparktop.observe.poller import Poller
    from sparktop.observe.targets import node_targets

    state = LaunchState(inventory, root)
    record: LaunchRecord | None = state.get(launch_id)
    nodes = set(record.nodes) if record is not None else {n.name for n in inventory.nodes}
    urls = {str(e.get("url", "")).rstrip("/") for e in (record.endpoints if record is not None else [])}
    targets = [t for t in node_targets(inventory) if t.name in nodes]
    poller = Poller(targets, interval=interval, default_port=None, router_key=api_key_for, hung_after=hung_after,
                    clock=clock)
    await poller.start()
    watchdog = watching(poller, inventory, policy, clock=clock, launch_ids={launch_id}, root=root)
    stop = stop or asyncio.Event()
    events = aiter(poller.events())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            nxt = asyncio.ensure_future(anext(events))
            await asyncio.wait((nxt, stopped), return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                nxt.cancel()
                await asyncio.gather(nxt, return_exceptions=True)
                break
            event = nxt.result()
            watchdog.observe(event)
            if isinstance(event, Notice) and event.key.rstrip("/") in urls:
                yield event
    finally:
        stopped.cancel()
        await watchdog.close()
        await poller.close()
