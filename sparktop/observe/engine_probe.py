"""One poll of one engine over HTTP, whatever the engine: when it is first
seen (and after an outage) it is recognised by what it answers
(`observe.engines.recognise`); every poll after reads what that engine
exports (`Engine.read`: vLLM's /metrics, llama.cpp's /metrics and /slots,
TensorRT-LLM's /prometheus/metrics, ...), and its model and version now and
then.

aiohttp's client does this with a quarter of httpx's CPU per request
(measured: 0.41 vs 1.76 ms for a vLLM-sized /metrics), which matters for a
monitor that polls every engine every second.

An engine whose port cannot be reached from here is read through an SSH
local forward from its node (the transport's `forward`), so a vLLM bound to
127.0.0.1 on a remote Spark is still watched without opening its port.

Time is the probe's `clock` (`sparktop.clock`, the system's unless the
poller gives another): each answer's arrival, which the rates are taken
over, on its `now()`; the snapshot's time on its `wall()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from sparktop.clock import SYSTEM, Clock
from sparktop.masking import mask_argv
from sparktop.observe.engines import Answer, Engine, EngineUnreachable, NotAnEngine, recognise
from sparktop.observe.engines.base import MODEL_REFRESH_S
from sparktop.observe.prometheus import LATENCY_WINDOW_S, RATE_WINDOW_S
from sparktop.observe.snapshot import EngineSnapshot
from sparktop.remote import Transport, TransportError

__all__ = ["EngineProbe", "EngineUnreachable", "NotAnEngine", "describe"]

HISTOGRAM_EVERY_S = 5.0  # latency percentiles over a minute need no finer steps
RECOGNISE_AGAIN_S = 30.0  # what answered as no engine is asked again this often (a server still starting)


def _os_errors(exc: BaseException) -> list[OSError]:
    """The OS errors behind a client error, outermost first."""
    found: list[OSError] = []
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, OSError):
            found.append(at)
        at = getattr(at, "os_error", None) or at.__cause__ or at.__context__
    return found


def describe(exc: BaseException) -> tuple[str, bool]:
    """A short reason a person understands, and whether the port was bound
    (it accepted the connection but did not answer: a vLLM still starting)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect timed out", False
    if isinstance(exc, (aiohttp.SocketTimeoutError, asyncio.TimeoutError)):
        return "no answer (timed out)", True
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "connection closed", True
    if isinstance(exc, aiohttp.ClientConnectorDNSError):  # the name resolves to no address: nothing to reach
        cause = exc.os_error
        why = "" if cause.errno == socket.EAI_NONAME else f" ({(cause.strerror or str(cause)).lower()})"
        return f"cannot resolve {exc.host}{why}", False
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ClientOSError, OSError)):
        errors = _os_errors(exc)
        if any(isinstance(e, ConnectionRefusedError) for e in errors) or "refused" in str(exc).lower():
            return "connection refused", False
        specific = next((e for e in errors if e.errno), None)
        if specific is not None:
            return f"cannot connect: {(specific.strerror or str(specific)).lower()}", False
        return f"cannot connect ({str(exc)[:80] or type(exc).__name__})", False
    return f"{type(exc).__name__}: {str(exc)[:80]}", False


CLIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


@dataclass
class EngineProbe:
    url: str
    client: aiohttp.ClientSession
    transport: Transport | None = None  # the engine's node, for a forward
    timeout: float = 2.0
    api_key: str | None = None
    hint: str | None = None  # the engine its container or process suggests (`Engine.id`): asked first
    argv: list[str] | None = None  # its server's command line, where discovery read it
    image: str | None = None  # its container's image, where it runs in one
    serves: dict[str, str] = field(default_factory=dict)  # what its launch labelled it with (`labels.PREDICTION`)
    address: str | None = None  # where it is read, when not at `url` (its name): a given URL as typed
    auth: str | None = field(default=None, repr=False)  # that URL's user and password: `Basic ...`
    rate_window: float = RATE_WINDOW_S  # token rates over this many seconds
    latency_window: float = LATENCY_WINDOW_S  # percentiles over this many
    histogram_every: float = HISTOGRAM_EVERY_S
    poll_interval: float = 1.0
    clock: Clock = SYSTEM  # the bodies' arrival (rates) on its now(), the snapshot's time on its wall()
    engine: Engine | None = None  # what answers, once recognised
    _base: str | None = None
    _model_at: float | None = None  # wall time the model and version were last asked for
    _forwarded: bool = False
    _histograms_at: float | None = None  # when the histograms were last read (None: on the next poll)
    _not_engine: tuple[float, str] | None = None  # when it last answered as no engine, and why

    @property
    def direct(self) -> str:
        """The engine's own address, without /v1 (what `base` is unless reached through a forward)."""
        return (self.address or self.url).rstrip("/").removesuffix("/v1")

    @property
    def base(self) -> str:
        if self._base is None:
            self._base = self.direct
        return self._base

    async def _get(self, path: str) -> Answer:
        # Every path: llama-server's key guards /metrics and /slots too; the others ignore it there.
        # A key is the engine's own gate, sent alone; else the user and password its URL was given with.
        auth = f"Bearer {self.api_key}" if self.api_key else self.auth
        headers = {"Authorization": auth} if auth else None
        timeout = aiohttp.ClientTimeout(total=self.timeout, sock_connect=self.timeout / 2)
        async with self.client.get(self.base + path, timeout=timeout, headers=headers) as r:
            body = await r.read()
            return Answer(path, r.status, {k.lower(): v for k, v in r.headers.items()}, body, self.clock.now())

    async def get(self, path: str) -> Answer:
        """GET `path` of the engine: directly, else through a forward from its
        node; raises EngineUnreachable with why, in words."""
        try:
            return await self._get(path)
        except CLIENT_ERRORS as exc:
            reason, bound = describe(exc)
            if self._forwarded:
                # Through a forward the local end always accepts, so any error
                # means the engine (or the SSH connection) is gone: start afresh
                # next time, directly first.
                self._forwarded = False
                self._base = None
                raise EngineUnreachable(reason, bound) from None
            forwarded = None if bound else await self._forward(path)
            if forwarded is None:
                raise EngineUnreachable(reason, bound) from None
            return forwarded

    async def _forward(self, path: str) -> Answer | None:
        """Read `path` through an SSH forward to the engine's port on its node:
        first to the address in its URL (what the node itself uses when the
        engine binds one address), then to the node's 127.0.0.1 (bound to all)."""
        if self.transport is None or self._forwarded:
            return None
        parts = urlsplit(self.url)
        for host in dict.fromkeys([parts.hostname or "127.0.0.1", "127.0.0.1"]):
            try:
                local = await self.transport.forward(parts.port or 80, host)
            except TransportError:
                return None
            if f"http://127.0.0.1:{local}" == self.direct:
                continue  # the node is this machine: that is the address just refused
            self._base = f"http://127.0.0.1:{local}"
            try:
                answer = await self._get(path)
            except CLIENT_ERRORS:
                continue
            self._forwarded = True
            return answer
        self._base = None
        return None

    async def poll(self) -> EngineSnapshot:
        clock = self.clock
        started = clock.now()
        engine = self.engine or await self._recognise(started)
        mono = clock.now()
        with_histograms = self._histograms_at is None or mono - self._histograms_at >= self.histogram_every
        derived = await engine.read(self.get, mono, with_histograms)
        if with_histograms:
            self._histograms_at = mono
        # The snapshot's time is when its figures were true (the body's arrival, on the wall clock), as the
        # rates' own clock is: parsing, or asking for the model after, must not move it.
        now = clock.wall() - (clock.now() - derived.read_at if derived.read_at else 0.0)
        if engine.model is None or self._model_at is None or now - self._model_at > MODEL_REFRESH_S:
            self._model_at = now
            # The figures are read; should the model and version not be, they come next time.
            with contextlib.suppress(EngineUnreachable, ValueError, AttributeError, KeyError, TypeError):
                await engine.details(self.get)
        snap = EngineSnapshot(key=self.url, url=self.url, t=now, state="ready")
        engine.fill(snap, derived)
        snap.argv, snap.image = (mask_argv(self.argv) if self.argv else []), self.image
        snap.serves = dict(self.serves)
        snap.poll_ms = (clock.now() - started) * 1000
        return snap

    async def _recognise(self, now: float) -> Engine:
        """What answers at the address; NotAnEngine, remembered a while, when nothing sparktop knows does."""
        if self._not_engine is not None and now - self._not_engine[0] < RECOGNISE_AGAIN_S:
            raise NotAnEngine(self._not_engine[1])
        try:
            self.engine = await recognise(self.get, self.hint)
        except NotAnEngine as exc:
            self._not_engine = (now, exc.reason)
            raise
        self._not_engine = None
        if self.argv:
            self.engine.configure(self.argv)
        self.engine.set_windows(self.rate_window, self.latency_window, self.poll_interval)
        self._model_at = self.clock.wall()
        self._histograms_at = None
        return self.engine

    def forget(self) -> None:
        """After an outage: recognise what answers again (another engine may
        have taken the port) and start rates afresh."""
        self.engine = None
        self._not_engine = None
        self._histograms_at = None
