"""The poller: every node and every engine polled on its own schedule.

Each target has one task that polls, waits for the answer, and only then
schedules the next poll (`interval` after the previous one started), so a
slow node never piles up overlapping polls and never delays the others.
Results come out of `events()` as plain dataclasses: `NodeSnapshot`,
`EngineSnapshot`, `EngineGone`.

A target that stops answering keeps its last figures and changes state:
stale after two missed polls (or two intervals without an answer), then
down / unreachable after `down_after` seconds, or at once when the failure
is definite (connection refused twice, a name that resolves to no address
once). Retries back off from one interval
to at most 3 s, so a returning node is seen within a few seconds; recovery
needs nothing from the user.

All of it is on one clock, the `Clock` the poller is given (`sparktop.clock`,
the system's by default): its schedule, the health timings above and its
probes' (the slow tier, the link's window, the engines' rate windows) on its
`now()`, each snapshot's time on its `wall()`. Waiting is `asyncio.sleep`,
on the running loop, which is that same clock unless a test runs the loop on
virtual time and gives the poller the loop's clock (`loop_clock`).

Engines are found four ways: given (`--engine URL`), discovered from the
containers a node runs (any engine's server command, LiteLLM, or sparktop's
labels), discovered from its process list (engines started outside Docker,
on the port they listen on), or candidates (the default port on each node),
which are shown only once they have answered. Each says how
(`EngineSnapshot.found`); what it is, it says by what it answers
(`observe.engines.recognise`, `EngineSnapshot.recognised`). An address
that answers as no engine is shown as such, with why (`unrecognised`).
An engine is keyed by one name however it is reached: an address given is
named as its node would find it (`targets.engine_key`: no credentials,
`localhost` as 127.0.0.1), so given and found it is one engine, the user's,
read at the address as typed with the credentials it carried.

With a `CanaryPolicy` (`canary`, off by default) each engine is also sent
a tiny request now and then while it is idle (`observe.canary`): its
verdict goes to the engine's `HangWatch`, and what it cost is taken out of
the counters of every snapshot yielded, so nobody downstream (the state,
the history, the exporter) counts it as the user's.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp

from sparktop.clock import SYSTEM, Clock
from sparktop.engine_ids import DEFAULT, GENERIC, is_router
from sparktop.observe.canary import Canary, CanaryPolicy
from sparktop.observe.engine_log import latest_run, runtime_failure, startup_state
from sparktop.observe.engine_probe import HISTOGRAM_EVERY_S, EngineProbe, EngineUnreachable, NotAnEngine
from sparktop.observe.engines import Engine, by_id
from sparktop.observe.hang import HUNG_AFTER_S, HangWatch
from sparktop.observe.host_probe import HostProbe, engines_in, process_engine
from sparktop.observe.notices import NoticeDetector
from sparktop.observe.prometheus import LATENCY_WINDOW_S, RATE_WINDOW_S
from sparktop.observe.snapshot import EngineGone, EngineSnapshot, NodeSnapshot, Notice, ObserveEvent
from sparktop.remote import CommandTimeout, Transport, TransportError

MAX_BACKOFF = 3.0
OUTAGE_POLLS = 3  # failed polls in a row that make an engine's silence an outage (its rates start afresh)


Event = ObserveEvent  # the poller yields observation events (snapshots and the notices they give)


@dataclass
class NodeTarget:
    name: str
    transport: Transport
    address: str = "127.0.0.1"


@dataclass
class EngineTarget:
    url: str
    node: str | None = None
    origin: str = "given"  # given | discovered | candidate
    container: str | None = None
    topology: str | None = None
    kind: str | None = None  # the engine (or `router`) its container or process suggests; what answers decides
    model: str | None = None  # as launched, until the engine says
    process: str | None = None  # discovered in the process list: "process 4242 (vllm serve, port 8000)"
    argv: list[str] | None = None  # its server's command line, where it was read
    image: str | None = None  # its container's image
    serves: dict[str, str] = field(default_factory=dict)  # what its launch labelled it with (`labels.PREDICTION`)
    # Given: where it is read when that is not `url` (its name, `targets.engine_key`), the address as typed
    # (`localhost`), and the credentials the typed URL carried (an `Authorization: Basic` value), never shown
    address: str | None = None
    auth: str | None = field(default=None, repr=False)

    @property
    def found(self) -> str:
        """How the engine was found, for people."""
        if self.origin == "given":
            return "given (--engine)"
        if self.container:
            return f"container {self.container}"
        if self.process:
            return self.process
        if self.origin == "candidate":
            return f"default port {self.url.rsplit(':', 1)[-1]}"
        return self.origin


def unresolved(reason: str) -> bool:
    """Whether a failure is a name that resolves to no address (the transports' and probes' "cannot resolve
    HOST"): nothing will answer there until the name or the inventory changes."""
    return reason.startswith("cannot resolve ")


@dataclass
class Health:
    """Success/failure bookkeeping that decides ok / stale / down, on the
    poller's clock (`now`: its monotonic seconds)."""

    now: Callable[[], float] = SYSTEM.now
    last_ok: float | None = None
    failures: int = 0
    definite: int = 0  # consecutive failures that leave no doubt (refused)
    final: bool = False  # the last failure will not pass by itself (its name resolves to no address)
    reason: str | None = None
    started: float = field(init=False)  # when watching began

    def __post_init__(self) -> None:
        self.started = self.now()

    def ok(self) -> None:
        self.last_ok = self.now()
        self.failures = self.definite = 0
        self.final = False
        self.reason = None

    def fail(self, reason: str, definite: bool = False) -> None:
        self.failures += 1
        self.definite = self.definite + 1 if definite else 0
        self.final = unresolved(reason)
        self.reason = reason

    def state(self, interval: float, down_after: float, now: float | None = None) -> str:
        now = self.now() if now is None else now
        if self.failures == 0 and self.last_ok is not None and now - self.last_ok <= 2 * interval + 0.1:
            return "ok"
        since = now - (self.last_ok if self.last_ok is not None else self.started)
        if self.final or self.definite >= 2 or since >= down_after:
            return "down"
        # A refused connection leaves no doubt: show it at once.
        if self.definite >= 1 or self.failures >= 2 or (self.last_ok is not None and since > 2 * interval + 0.1):
            return "stale"
        return "ok" if self.last_ok is not None else "connecting"

    def backoff(self, interval: float) -> float:
        return min(MAX_BACKOFF, interval * (1.5 ** max(0, self.failures - 1)))


@dataclass
class _NodeWorker:
    target: NodeTarget
    probe: HostProbe
    health: Health
    last: NodeSnapshot | None = None
    shown_state: str = "connecting"
    task: asyncio.Task | None = None
    listed_at: float | None = None  # when its containers and processes were first read (the slow tier)


@dataclass
class _EngineWorker:
    target: EngineTarget
    probe: EngineProbe
    health: Health
    last: EngineSnapshot | None = None
    shown_state: str = "connecting"
    ever_ready: bool = False
    log_at: float | None = None  # when its log was last read for its start-up stage
    stage: str | None = None
    exited: str | None = None  # the container's status once it has exited
    error: str | None = None  # why it died at run time, from its container's log
    error_at: float | None = None  # when its log was last read for a failure
    task: asyncio.Task | None = None
    polled_at: float | None = None  # when its last poll ended, whatever it found
    hang: HangWatch = field(default_factory=HangWatch)  # whether it makes tokens while requests wait
    canary: Canary | None = None  # its canary requests (`observe.canary`), when they are asked for


class Poller:
    def __init__(self, nodes: list[NodeTarget], engines: list[EngineTarget] | None = None, *,
                 interval: float = 1.0, down_after: float = 10.0, discover: bool = True,
                 default_port: int | None = 8000, api_key: str | None = None,
                 router_key: Callable[[str], str | None] | None = None,
                 rate_window: float = RATE_WINDOW_S, latency_window: float = LATENCY_WINDOW_S,
                 histogram_every: float = HISTOGRAM_EVERY_S, clock: Clock = SYSTEM,
                 hung_after: float | None = HUNG_AFTER_S, canary: CanaryPolicy | None = None):
        """`router_key(url)` finds the key of a router this poller did not
        launch (sparktop's launch state keeps them; observe never reads it).
        `clock`: what its schedule, its health and its probes read, and what
        stamps its snapshots. `hung_after`: seconds an engine may make no
        tokens while requests wait before it is shown hung (`observe.hang`;
        None or 0: never). `canary`: send each idle engine a tiny request now
        and then, as it says (`observe.canary`; None: never)."""
        self.clock = clock
        self.hung_after = hung_after
        self.canary = canary
        self._interval = interval
        self.down_after = down_after
        self.discover = discover
        self.default_port = default_port
        self.api_key = api_key
        self.router_key = router_key
        # Token rates over `rate_window` s, percentiles over `latency_window` s; `status --seconds N` sets
        # both to N, with histograms read on every poll, so its figures mean its whole N seconds.
        self.rate_window = rate_window
        self.latency_window = latency_window
        self.histogram_every = histogram_every
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._notices = NoticeDetector()
        self._client: aiohttp.ClientSession | None = None
        self._nodes: dict[str, _NodeWorker] = {}
        self._engines: dict[str, _EngineWorker] = {}
        self._node_targets = nodes
        self._engine_targets = list(engines or [])
        self._running = asyncio.Event()
        self._running.set()
        self._wake = asyncio.Event()
        self._watchdog: asyncio.Task | None = None
        self._closed = False

    # -- control --------------------------------------------------------------

    def nodes_settled(self) -> bool:
        """Whether every node has answered once (or failed), its containers and processes read where it
        answered: the engines it runs are known."""
        for n in self._nodes.values():
            if n.last is None and n.health.failures == 0:
                return False  # not answered yet
            if n.last is not None and n.health.failures == 0 and self.discover and n.listed_at is None:
                return False  # answered, but its containers are still to be read
        return True

    def settled(self) -> bool:
        """Whether what has been shown is whole: the nodes settled (`nodes_settled`) and every engine polled
        since its node's containers were first read, so each shows where it runs and its layout. What a
        one-shot reader (`status`) waits for when the nodes are slow to answer (a busy host, a slow link)."""
        if not self.nodes_settled():
            return False
        for e in self._engines.values():
            node = self._nodes.get(e.target.node or "")
            listed = node.listed_at if node is not None else None
            if e.polled_at is None or (listed is not None and e.polled_at < listed):
                return False
        return True

    @property
    def interval(self) -> float:
        return self._interval

    @interval.setter
    def interval(self, value: float) -> None:
        self._interval = max(0.2, min(60.0, value))
        self._wake.set()  # let sleeping workers pick the new interval up

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def refresh(self, nodes: list[str] | None = None) -> None:
        """Something changed on these nodes (all by default): a launch started or
        stopped containers. Their slow tier (containers, processes, addresses) is
        read on their next poll instead of up to DOCKER_EVERY_S later."""
        for name, worker in self._nodes.items():
            if nodes is None or name in nodes:
                worker.probe.refresh_docker()

    async def start(self, settle_nodes: float = 0.0) -> Poller:
        """Start polling. With `settle_nodes`, engines are polled only once every node has answered and its
        containers are read (`nodes_settled`), or that many seconds have passed: a one-shot reader's window
        (`status --seconds N`) is then N seconds of engines placed on their nodes, not a slow node's wait."""
        self._client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=30))
        for node in self._node_targets:
            self._add_node(node)
        waited = 0.0
        while settle_nodes and waited < settle_nodes and not self.nodes_settled():
            await asyncio.sleep(0.05)
            waited += 0.05
        for engine in self._engine_targets:
            self._add_engine(engine)
        if self.default_port:
            for node in self._node_targets:
                self._add_engine(EngineTarget(f"http://{node.address}:{self.default_port}", node=node.name,
                                              origin="candidate"))
        self._watchdog = asyncio.create_task(self._watch(), name="poller-watchdog")
        return self

    async def close(self) -> None:
        self._closed = True
        tasks = [w.task for w in list(self._nodes.values()) + list(self._engines.values()) if w.task]
        tasks += [w.canary.task for w in self._engines.values() if w.canary is not None and w.canary.task]
        if self._watchdog:
            tasks.append(self._watchdog)
        for task in tasks:
            task.cancel()
        self._wake.set()  # a worker that missed its cancel (see `_node_loop`) stops sleeping, and ends
        self._running.set()  # ... and one paused stops waiting to be resumed
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client:
            await self._client.close()
        for target in self._node_targets:
            with contextlib.suppress(Exception):  # closing is best effort
                await target.transport.close()

    async def events(self) -> AsyncIterator[Event]:
        while not self._closed:
            yield await self._queue.get()

    def publish(self, notice: Notice) -> None:
        """Put a notice of someone else's (the watchdog's) in this poller's stream, among its own: whoever
        reads `events()` (the app, `collect`, a recording) keeps it as it keeps the poller's."""
        self._queue.put_nowait(notice)

    @property
    def node_transports(self) -> dict[str, Transport]:
        """Each node's transport, by node name: what the poller reaches it by, for another part to run a
        command there on the same connection."""
        return {t.name: t.transport for t in self._node_targets}

    # -- workers --------------------------------------------------------------

    def _add_node(self, target: NodeTarget) -> None:
        worker = _NodeWorker(target, HostProbe(target.name, target.transport,
                                               timeout=max(2.0, min(10.0, self._interval * 2)),
                                               link_window=self.rate_window, clock=self.clock),
                             Health(self.clock.now))
        self._nodes[target.name] = worker
        worker.task = asyncio.create_task(self._node_loop(worker), name=f"node-{target.name}")

    def _add_engine(self, target: EngineTarget) -> None:
        key = target.url.rstrip("/")
        if key in self._engines:
            existing = self._engines[key]
            # A candidate that turns out to be a known container gains its details.
            if target.origin != "candidate":
                for attr in ("container", "topology", "kind", "model", "argv", "image", "serves"):
                    if getattr(target, attr):
                        setattr(existing.target, attr, getattr(target, attr))
                if target.origin == "given":
                    # What the user named stays theirs, however it was found first: as if named from the start.
                    existing.target.origin, existing.target.node, existing.target.process = "given", target.node, None
                    existing.target.address, existing.target.auth = target.address, target.auth
                    existing.probe.address, existing.probe.auth = target.address, target.auth
                elif existing.target.origin == "candidate":
                    existing.target.origin = target.origin
                existing.probe.hint = existing.target.kind
                existing.probe.argv, existing.probe.image = existing.target.argv, existing.target.image
                existing.probe.serves = existing.target.serves
            return
        node = self._nodes.get(target.node) if target.node else None
        api_key = self.api_key
        if is_router(target.kind) and api_key is None and self.router_key is not None:
            api_key = self.router_key(key)
        assert self._client is not None, "engines are added once the poller has started"
        probe = EngineProbe(key, self._client, node.target.transport if node else None,
                            timeout=max(1.0, min(3.0, self._interval * 1.5)), api_key=api_key, hint=target.kind,
                            argv=target.argv, image=target.image, serves=target.serves, address=target.address,
                            auth=target.auth,
                            rate_window=self.rate_window,
                            latency_window=self.latency_window,
                            histogram_every=self.histogram_every, poll_interval=self._interval, clock=self.clock)
        worker = _EngineWorker(target, probe, Health(self.clock.now), hang=HangWatch(self.hung_after),
                               canary=Canary(self.canary) if self.canary is not None else None)
        self._engines[key] = worker
        worker.task = asyncio.create_task(self._engine_loop(worker), name=f"engine-{key}")

    def _remove_engine(self, key: str) -> None:
        worker = self._engines.pop(key, None)
        if worker and worker.task:
            worker.task.cancel()
        if worker and worker.canary is not None and worker.canary.task is not None:
            worker.canary.task.cancel()
        if worker and self._visible(worker):
            gone = EngineGone(key)
            self._queue.put_nowait(gone)
            for notice in self._notices.gone(gone):
                self._queue.put_nowait(notice)

    @staticmethod
    def _visible(w: _EngineWorker) -> bool:
        return w.target.origin != "candidate" or w.ever_ready

    async def _sleep_until(self, deadline: float) -> None:
        """Until `deadline` on the poller's clock, or sooner when the interval is made shorter."""
        while True:
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                # A deadline on this task: `wait_for` would start a task for the wait and, at the timeout
                # (every poll's end), cancel it and wait for it, each loop every second.
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
            except TimeoutError:
                return
            if self._closed:
                return
            # Interval changed: keep the original deadline unless it got shorter.
            deadline = min(deadline, self.clock.now() + self._interval)

    async def _node_loop(self, w: _NodeWorker) -> None:
        # Until closed, not only until cancelled: on Python 3.11 a cancel that comes as a wait ends can be lost
        # (the transports use asyncio.timeout for that reason), and `close()` would wait for this loop for ever.
        while not self._closed:
            await self._running.wait()
            started = self.clock.now()
            try:
                async with asyncio.timeout(w.probe.timeout + 1):  # in this task: no task a poll to run it
                    snap = await w.probe.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is shown, none stops the loop
                reason, definite = self._node_reason(exc)
                w.health.fail(reason, definite)
                self._emit_node(w)
                delay = w.health.backoff(self._interval)
            else:
                w.health.ok()
                w.last = snap
                self._emit_node(w)
                if self.discover and w.probe.read_slow_tier:  # between, the same lists: the same engines
                    self._discover(w, snap)
                    if w.listed_at is None:
                        w.listed_at = self.clock.now()
                delay = self._interval
            await self._sleep_until(started + delay)

    @staticmethod
    def _node_reason(exc: Exception) -> tuple[str, bool]:
        if isinstance(exc, (asyncio.TimeoutError, CommandTimeout)):
            return "no answer (timed out)", False
        if isinstance(exc, TransportError):
            text = exc.message
            return text, "refused" in text.lower() or "host key" in text.lower()
        return f"{type(exc).__name__}: {exc}", False

    def _emit_node(self, w: _NodeWorker) -> None:
        state = w.health.state(self._interval, self.down_after)
        w.shown_state = state
        if w.last is None:
            snap = NodeSnapshot(name=w.target.name, t=self.clock.wall(), state=state, reason=w.health.reason)
        else:
            snap = copy.copy(w.last)
            snap.state = state
            snap.reason = w.health.reason if state != "ok" else None
            if state != "ok":
                w.last = snap
        self._queue.put_nowait(snap)
        for notice in self._notices.node(snap):
            self._queue.put_nowait(notice)

    def _discover(self, w: _NodeWorker, snap: NodeSnapshot) -> None:
        seen: set[str] = set()
        docker = snap.docker_status == "ok"
        # Running containers first, so a restarted engine wins over its exited predecessor.
        for container in sorted(snap.containers if docker else [], key=lambda c: c.state != "running"):
            found = engines_in(container, w.target.address)
            if not found:
                continue
            key = found.url.rstrip("/")
            if key in seen:
                continue
            seen.add(key)
            if container.state == "running":
                self._add_engine(EngineTarget(found.url, node=w.target.name, origin="discovered",
                                              container=found.container, topology=found.topology, kind=found.kind,
                                              model=found.model, argv=found.argv, image=found.image,
                                              serves=found.serves))
                self._engines[key].exited = None
            elif key in self._engines and self._engines[key].target.container == container.name:
                # A crashed engine stays on screen, with why, until its container is removed.
                self._engines[key].exited = container.status
        self._discover_processes(w, snap, seen)
        for key, ew in list(self._engines.items()):
            # Without a container list only a process engine can be known gone (its process is not listed).
            if ew.target.origin == "discovered" and ew.target.node == w.target.name and key not in seen and (
                    docker or (ew.target.process and not ew.target.container)):
                self._remove_engine(key)

    def _discover_processes(self, w: _NodeWorker, snap: NodeSnapshot, seen: set[str]) -> None:
        """Engines started outside Docker, from the node's process list."""
        others = {n.target.address for n in self._nodes.values() if n is not w}
        for server in snap.servers:
            found = process_engine(server, w.target.address, others)
            if found is None:
                continue
            key = found.url.rstrip("/")
            existing = self._engines.get(key)
            if key in seen or (existing is not None and existing.target.container):
                # A container's engine (the twin's containers are processes): the container list says when
                # it is gone, and a process still serving its URL is found on the next poll.
                continue
            seen.add(key)
            self._add_engine(EngineTarget(found.url, node=w.target.name, origin="discovered", kind=found.kind,
                                          topology=found.topology, model=found.model, process=found.found,
                                          argv=found.argv))
            target = self._engines[key].target
            if target.origin == "discovered":  # a candidate it answered as, or a restart on the same port
                target.process = found.found

    async def _engine_loop(self, w: _EngineWorker) -> None:
        while not self._closed:  # as `_node_loop`
            await self._running.wait()
            started = self.clock.now()
            try:
                snap = await w.probe.poll()
            except asyncio.CancelledError:
                raise
            except NotAnEngine as exc:
                # It answers, as nothing sparktop knows: said once per poll, asked again now and then.
                w.health.ok()
                self._not_an_engine(w, exc.reason)
                delay = self._interval
            except EngineUnreachable as exc:
                definite = "refused" in exc.reason
                w.health.fail(exc.reason, definite)
                # Gone (refused), or silent for several polls: whatever answers next is recognised again and
                # rated afresh. One slow answer from a busy engine is not an outage: its counters go on, and
                # forgetting them would read a window's tokens as none (a restart shows in the counters).
                if w.ever_ready and (definite and w.health.failures == 1 or w.health.failures == OUTAGE_POLLS):
                    w.probe.forget()
                    w.hang.reset()  # whatever answers next is judged afresh
                await self._engine_failed(w, exc)
                delay = w.health.backoff(self._interval)
            except Exception as exc:  # noqa: BLE001
                w.health.fail(f"{type(exc).__name__}: {exc}")
                await self._engine_failed(w, None)
                delay = w.health.backoff(self._interval)
            else:
                w.health.ok()
                if not w.ever_ready and not w.target.container and not w.target.process:
                    # An address that just started answering: which container or process serves it (and
                    # so its topology and model) is read on the node's next poll, not seconds later.
                    node = self._nodes.get(w.target.node or "")
                    if node is not None:
                        node.probe.refresh_docker()
                w.ever_ready = True
                w.stage = None
                w.error = None
                snap.node = w.target.node
                snap.container = w.target.container
                snap.topology = w.target.topology
                snap.found = w.target.found
                snap.model = snap.model or w.target.model
                canary = w.canary
                in_flight = canary is not None and canary.in_flight
                # Judged on the engine's own counters (a canary's tokens are progress too), and shown without
                # the canaries' (they are nobody's traffic).
                hung = w.hang.judge(snap, self.clock.now(), in_flight=int(in_flight))
                if hung is not None:
                    snap.state, snap.reason = "hung", hung
                if canary is not None:
                    canary.ledger.apply(snap, holding=in_flight)
                w.last = snap
                w.shown_state = snap.state
                self._put_engine(snap)
                if canary is not None:
                    self._send_canary(w, canary, snap)
                delay = self._interval
            w.polled_at = self.clock.now()
            await self._sleep_until(started + delay)

    def _send_canary(self, w: _EngineWorker, canary: Canary, snap: EngineSnapshot) -> None:
        """A canary to the engine just read, if one is due (idle, not a router, not one too recently)."""
        now = self.clock.now()
        if self._client is None or not canary.due(snap, now):
            return
        probe = w.probe
        # Its own gate, as its polls pass it: the key, else the user and password its URL was given with.
        auth = f"Bearer {probe.api_key}" if probe.api_key else probe.auth
        model = (probe.engine.model if probe.engine is not None else None) or snap.model or w.target.model
        key = w.probe.url.rstrip("/")

        def refused(reason: str) -> None:
            self.publish(Notice(self.clock.wall(), "engine", key, "canary_refused", "warn",
                                f"{reason}: the canary is not watching this engine until it answers one"))

        canary.start(self._client, probe.base, model, w.hang, now, headers={"Authorization": auth} if auth else None,
                     name=f"canary-{w.probe.url}", refused=refused)

    def _not_an_engine(self, w: _EngineWorker, reason: str) -> None:
        if not self._visible(w):
            return  # a candidate port where something else listens: not shown
        snap = EngineSnapshot(key=w.probe.url, url=w.probe.url, t=self.clock.wall(), state="unrecognised",
                              reason=reason, node=w.target.node, container=w.target.container,
                              topology=w.target.topology, kind=w.target.kind or GENERIC, model=w.target.model)
        snap.found = w.target.found
        w.last = snap
        w.shown_state = "unrecognised"
        self._put_engine(snap)

    async def _engine_failed(self, w: _EngineWorker, exc: EngineUnreachable | None) -> None:
        node = self._nodes.get(w.target.node or "")
        if node is not None and w.health.failures == 1:
            node.probe.refresh_docker()  # did its container exit? read the list on the node's next poll
        if not self._visible(w):
            return
        health = w.health.state(self._interval, self.down_after)
        starting = False
        if w.ever_ready and w.target.container and (health in ("stale", "down") or w.exited):
            await self._read_failure(w)
        if w.error:
            state = "failed"
        elif w.exited:
            await self._read_stage(w)  # the log says why it died
            w.health.reason = f"container {w.target.container} {w.exited.lower()}" + (
                f": {w.health.reason}" if w.stage == "failed" and w.health.reason else "")
            state = "unreachable"
        else:
            if w.target.container and (not w.ever_ready or health == "down"):
                starting = await self._read_stage(w)
            if starting:
                state = "starting"
            else:
                state = {"ok": "ready", "connecting": "connecting", "stale": "stale", "down": "unreachable"}[health]
        engine = w.probe.engine  # recognised, though this poll's read failed: say what it is
        # Never recognised: what its container or process suggests, or, for an address given that never
        # answered, nothing ("": what it is is not known, it is not called a vLLM).
        snap = copy.copy(w.last) if w.last else EngineSnapshot(
            key=w.probe.url, url=w.probe.url, t=self.clock.wall(), node=w.target.node, container=w.target.container,
            topology=w.target.topology, kind=engine.id if engine is not None
            else w.target.kind or "", model=w.target.model or (engine.model if engine is not None else None),
            engine=engine.name if engine is not None else None,
            recognised=engine.how if engine is not None else None)
        snap.found = w.target.found
        snap.state = state
        snap.reason = w.health.reason if state not in ("ready",) else None
        snap.stage = w.stage if state == "starting" else None
        snap.error = w.error if state == "failed" else None
        if state != "ready":
            w.last = snap
        w.shown_state = state
        self._put_engine(snap)

    def _put_engine(self, snap: EngineSnapshot) -> None:
        self._queue.put_nowait(snap)
        for notice in self._notices.engine(snap):
            self._queue.put_nowait(notice)

    @staticmethod
    def _log_patterns(w: _EngineWorker):
        """How its engine words its log: what answers once recognised, else what its container suggests."""
        engine = w.probe.engine.__class__ if w.probe.engine is not None else by_id(w.target.kind)
        return (engine or by_id(DEFAULT) or Engine).log  # before it answers, a container reads as the default's

    async def _read_stage(self, w: _EngineWorker) -> bool:
        """Whether the engine's container is still starting; reads its log."""
        node = self._nodes.get(w.target.node or "")
        if node is None or not w.target.container:
            return False
        now = self.clock.now()
        if w.log_at is not None and now - w.log_at < 2.0 and w.stage is not None:
            return w.stage not in ("failed",)
        w.log_at = now
        try:
            result = await node.target.transport.run(
                ["docker", "logs", "--tail", "80", w.target.container], timeout=5)
        except (TimeoutError, TransportError):
            return False
        if not result.ok:
            return False
        patterns = self._log_patterns(w)
        state = startup_state(latest_run((result.stdout + result.stderr).splitlines(), patterns), patterns)
        if state.failed:
            w.stage = "failed"
            w.health.reason = state.reason or "failed to start"
            return False
        if state.stage in (None, "ready"):
            return False
        w.stage = state.stage
        return True

    async def _read_failure(self, w: _EngineWorker) -> None:
        """A ready engine that stopped answering: did it die? Its log says
        (`EngineCore encountered a fatal error`); read every 2 s at most."""
        node = self._nodes.get(w.target.node or "")
        now = self.clock.now()
        if node is None or not w.target.container or (w.error_at is not None and now - w.error_at < 2.0):
            return
        w.error_at = now
        try:
            result = await node.target.transport.run(
                ["docker", "logs", "--tail", "200", w.target.container], timeout=5)
        except (TimeoutError, TransportError):
            return
        if result.ok:
            # docker logs interleaves stdout and stderr; vLLM writes its log to stderr.
            patterns = self._log_patterns(w)
            lines = (result.stdout + result.stderr).splitlines()
            run = latest_run(lines, patterns)
            found = runtime_failure(run, patterns)
            # A death stays said until it answers again, unless the container has started anew since (a
            # restart: its earlier run's death is not this one's).
            w.error = found if found or run is not lines else w.error

    async def _watch(self) -> None:
        """Turn silence into state changes even while a poll is stuck."""
        while True:
            await asyncio.sleep(max(0.2, self._interval / 2))
            if self.paused:
                continue
            for w in self._nodes.values():
                state = w.health.state(self._interval, self.down_after)
                if state != w.shown_state and not (state == "ok" and w.health.failures == 0):
                    if w.health.reason is None and state != "ok":
                        w.health.reason = "no answer"
                    self._emit_node(w)
