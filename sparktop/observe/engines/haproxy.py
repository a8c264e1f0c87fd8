"""The HAProxy sparktop puts in front of replicas (`leastconn`, the default):
recognised by the `Via: 1.1 haproxy` header its config adds to every answer
(its own 401s too), the `/v1/models` it passes through being its engines';
found only by its launch's labels or an address given (HAProxy fronts many
things besides models, so no haproxy process or image is taken for one).

Read from its own Prometheus exporter (`/metrics`, behind the router's key,
`launch/haproxy.py`): the requests in flight over its replicas (`running`),
those queued because no replica could take them (`waiting`), its requests
so far, its version, and each replica's state as its health check sees it
(`backends`: UP, DOWN, ...). Its tokens are its engines', so it has no token
figures of its own. Without the key (`/metrics` answers 401) it is read by
liveness alone, at `/haproxy/health` (503 once no replica is up).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from sparktop import engine_ids
from sparktop.engine_ids import HAPROXY
from sparktop.observe.engines.base import Answer, Engine, EngineUnreachable, Get
from sparktop.observe.prometheus import Derived
from sparktop.observe.snapshot import FIGURES, EngineSnapshot

BACKEND = "replicas"  # the backend section sparktop's config names (launch/haproxy.py)
HEALTH = "/haproxy/health"  # its monitor-uri: answered before the key is checked
VIA = "haproxy"  # what its `Via` header says
# The series read, out of the ~50 kB the exporter answers (every proxy's and server's every figure): only
# their lines are parsed, as engines' scrapes are filtered before prometheus-client sees them.
_SERIES = re.compile(r"^(?:haproxy_process_build_info|haproxy_server_status|haproxy_server_current_sessions|"
                     r"haproxy_server_sessions_total|haproxy_backend_current_queue)\{.*$", re.M)


@dataclass(frozen=True)
class Backend:
    """One replica as HAProxy sees it."""

    server: str  # its name in the config: the replica's head node
    state: str  # UP | DOWN | MAINT | DRAIN | NOLB (the exporter's `state` label that is 1)
    in_flight: int  # requests HAProxy has sent it that have not finished
    requests: int  # HTTP requests it has been sent since HAProxy started


@dataclass
class Reading:
    version: str | None = None
    backends: tuple[Backend, ...] = ()
    queued: int | None = None  # waiting in the backend's queue: no replica could take them


def parse(text: str, backend: str = BACKEND) -> Reading:
    """HAProxy's Prometheus exporter as sparktop reads it: its version and each server of `backend`."""
    states: dict[str, str] = {}
    flight: dict[str, float] = {}
    total: dict[str, float] = {}
    out = Reading()
    for family in text_string_to_metric_families("\n".join(_SERIES.findall(text)) + "\n"):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "haproxy_process_build_info":
                out.version = labels.get("version") or out.version
            if labels.get("proxy") != backend:
                continue
            server = labels.get("server")
            if sample.name == "haproxy_server_status" and server is not None and sample.value == 1:
                states[server] = labels.get("state", "?")
            elif sample.name == "haproxy_server_current_sessions" and server is not None:
                flight[server] = sample.value
            elif sample.name in ("haproxy_server_sessions_total", "haproxy_server_sessions") and server is not None:
                total[server] = sample.value
            elif sample.name == "haproxy_backend_current_queue":
                out.queued = int(sample.value)
    servers = list(dict.fromkeys([*states, *flight]))
    out.backends = tuple(Backend(s, states.get(s, "?"), int(flight.get(s, 0)), int(total.get(s, 0)))
                         for s in servers)
    return out


def via_haproxy(answer: Answer) -> bool:
    return VIA in answer.headers.get("via", "").lower()


class Haproxy(Engine):
    row = engine_ids.get(HAPROXY)
    info_path = HEALTH
    metrics_path = "/metrics"

    def __init__(self, how: str = ""):
        super().__init__(how)
        self.backends: tuple[Backend, ...] = ()

    @classmethod
    def claims_models(cls, answer: Answer) -> str | None:
        # Its /v1/models is a replica's (owned_by vllm ...): the header it adds says who answered.
        return "Via: 1.1 haproxy header" if via_haproxy(answer) else None

    @classmethod
    def claims_info(cls, answer: Answer) -> str | None:
        return f"{HEALTH} answered as HAProxy" if via_haproxy(answer) else None

    def fill(self, snap: EngineSnapshot, d: Derived) -> None:
        super().fill(snap, d)
        snap.backends = {b.server: b.state for b in self.backends} or None

    async def read(self, get: Get, t: float, histograms: bool) -> Derived:
        answer = await get("/metrics")
        missing = [f for f in FIGURES if f not in ("running", "waiting")]
        if answer.status in (401, 403):  # watched without the router's key: alive or not is all it says
            health = await get(HEALTH)
            if health.status not in (200, 503):
                raise EngineUnreachable(f"{HEALTH} answered HTTP {health.status}", bound=True)
            self.backends = ()
            return Derived(missing=list(FIGURES))
        if answer.status != 200 or answer.text is None:
            raise EngineUnreachable(f"/metrics answered HTTP {answer.status}", bound=True)
        try:
            reading = parse(answer.text)
        except ValueError as exc:
            raise EngineUnreachable(f"/metrics is not Prometheus text: {exc}", bound=True) from None
        self.version = reading.version or self.version
        self.backends = reading.backends
        derived = Derived(missing=missing)
        derived.running = float(sum(b.in_flight for b in reading.backends))
        derived.waiting = float(reading.queued) if reading.queued is not None else None
        derived.requests = float(sum(b.requests for b in reading.backends))
        derived.read_at = answer.at or t
        return derived
