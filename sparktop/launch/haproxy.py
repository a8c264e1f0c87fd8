"""The HAProxy config sparktop writes for replicas behind `leastconn` (the
default router, `model.routers`): one frontend on the head that checks the
API key as LiteLLM checks its master key (the same `Authorization: Bearer`,
the same 401 body), and one backend of the replicas balanced by the requests
each has in flight, each health-checked on its `/health`.

The key never enters the file: HAProxy reads it from its environment
(`${LITELLM_MASTER_KEY}`, from the router's `--env-file`, as LiteLLM does),
and the `.if` guard stops it from starting without one (otherwise HAProxy
substitutes an empty string and the check would let anyone in). Streams
pass unbuffered (no `http-buffer-request`, no compression); `/metrics` is
HAProxy's own Prometheus exporter, behind the key like everything but
`/haproxy/health` (answered first: 503 when no replica is up). Every
answer, its own 401s too, says `Via: 1.1 haproxy`, which is how the monitor
tells it from the replica whose model list it passes on
(`observe/engines/haproxy.py`).

Values from the inventory are checked, never trusted into the file: a node
name or an address with anything but the characters a host name or an
address has is a PlanError naming it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from sparktop.errors import SparktopError

CONFIG = "haproxy.cfg"
# What the monitor reads (observe/engines/haproxy.py names them too; a unit test keeps them alike).
BACKEND = "replicas"
HEALTH = "/haproxy/health"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*|[0-9.]+)$")
# LiteLLM's own answer to a missing or wrong key, so clients see one router whichever runs.
UNAUTHORIZED = ('{"error":{"message":"Authentication Error, missing or invalid API key",'
                '"type":"auth_error","code":"401"}}')


class ConfigError(SparktopError):
    pass


def _server(name: str, url: str) -> tuple[str, str]:
    """(server name, host:port) of a replica's base URL, both checked."""
    if not _NAME.match(name):
        raise ConfigError(f"router: replica name {name!r} has characters HAProxy's config cannot take "
                          "(letters, digits, '.', '-', '_')")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:  # a port that is no number
        host, port = "", None
    if parts.scheme != "http" or port is None or not _HOST.match(f"[{host}]" if ":" in host else host):
        raise ConfigError(f"router: replica {name} at {url!r} is not http://HOST:PORT")
    return name, (f"[{host}]" if ":" in host else host) + f":{port}"


def haproxy_config(bind_host: str, port: int, backends: list[tuple[str, str]], key_env: str,
                   health: str = "/health") -> str:
    """The config's text: the frontend on `bind_host:port`, the key read from the environment variable
    `key_env`, and one server per (name, base URL) of `backends`, checked on `health`."""
    if not re.match(r"^[A-Z_][A-Z0-9_]*$", key_env):
        raise ConfigError(f"router: {key_env!r} is not an environment variable's name")
    if not _HOST.match(bind_host if ":" not in bind_host.strip("[]") else f"[{bind_host.strip('[]')}]"):
        raise ConfigError(f"router: bind address {bind_host!r} is not a host name or an address")
    bind = f"[{bind_host.strip('[]')}]" if ":" in bind_host.strip("[]") else bind_host
    if not backends:
        raise ConfigError("router: no replicas to route to")
    servers = [_server(name, url) for name, url in backends]
    if len({n for n, _ in servers}) != len(servers):
        raise ConfigError(f"router: two replicas named alike ({', '.join(n for n, _ in servers)})")
    lines = [
        "# Written by sparktop: replicas behind HAProxy leastconn. The API key is read from the",
        f"# environment ({key_env}, the router's --env-file); it is never written here.",
        f'.if !defined({key_env}) || streq("${key_env}","")',
        f'.alert "{key_env} is not set: the router would let every request in"',
        ".endif",
        "global",
        "    log stdout format raw local0 info",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    timeout connect 5s",
        # A long generation streams for minutes: the client and server timeouts are an hour's.
        "    timeout client 1h",
        "    timeout server 1h",
        "    timeout http-request 30s",
        "    timeout http-keep-alive 10s",
        "    timeout check 5s",
        "frontend router",
        f'    bind "{bind}:{int(port)}"',
        f"    monitor-uri {HEALTH}",
        f"    monitor fail if {{ nbsrv({BACKEND}) eq 0 }}",
        '    http-after-response add-header Via "1.1 haproxy"',
        # req.fhdr, not req.hdr: hdr splits a value at its commas.
        f"    http-request return status 401 content-type application/json string '{UNAUTHORIZED}' "
        f'unless {{ req.fhdr(authorization) -m str "Bearer ${{{key_env}}}" }}',
        "    http-request use-service prometheus-exporter if { path /metrics }",
        f"    default_backend {BACKEND}",
        f"backend {BACKEND}",
        "    balance leastconn",
        f"    option httpchk GET {health}",
        "    http-check expect status 200",
        # A replica that fails three checks 2 s apart is out; two passing bring it back.
        "    default-server check inter 2s fall 3 rise 2",
        *(f'    server "{name}" "{address}"' for name, address in servers),
    ]
    return "\n".join(lines) + "\n"
