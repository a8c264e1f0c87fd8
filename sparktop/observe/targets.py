"""What to watch: nodes from the inventory (or this node alone) and the
engines given on the command line."""

from __future__ import annotations

import base64
from urllib.parse import unquote, urlsplit

from sparktop.errors import SparktopError
from sparktop.masking import without_credentials
from sparktop.observe.poller import EngineTarget, NodeTarget
from sparktop.remote import transport_for
from sparktop.settings import Inventory


def check_engine_url(url: str) -> str:
    """`url` when it is an engine's address: http(s)://HOST[:PORT][/v1], or HOST:PORT[/v1] (http is
    assumed); else a one-line SparktopError naming the value and what is expected."""
    text = url.strip()
    expected = f"--engine {without_credentials(url)!r}: expected a URL like http://HOST:PORT (or HOST:PORT)"
    scheme = "://" in text
    try:
        parts = urlsplit(text if scheme else "http://" + text)
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise SparktopError(f"{expected}: {exc}") from None
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = 0
    if port == 0:
        raise SparktopError(f"{expected}: its port must be a number from 1 to 65535")
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https"):
        raise SparktopError(f"{expected}: the scheme must be http or https, not {parts.scheme!r}")
    if not host or any(c.isspace() for c in host):
        raise SparktopError(f"{expected}: it names no host")
    if not scheme and port is None:  # a bare word ("not-a-url") is no address: without a scheme, a port
        raise SparktopError(f"{expected}: it has no port")
    return text


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url.removesuffix("/v1")


# This machine's names: an engine on it is found (in its node's containers and processes) at 127.0.0.1.
LOOPBACK = "127.0.0.1"
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "::1", "0.0.0.0", "::",
                   LOOPBACK}


def engine_key(url: str) -> str:
    """The one name an engine goes by however it was typed: without credentials, and this machine by one
    name (`localhost`, `[::1]` and `0.0.0.0` are 127.0.0.1, where the local node finds its engines), so an
    engine given as `http://user:pw@localhost:8000` and found as `http://127.0.0.1:8000` is one engine."""
    parts = urlsplit(normalize_url(without_credentials(url)))
    if (parts.hostname or "") not in _LOOPBACK_NAMES:
        return parts.geturl()
    netloc = LOOPBACK if parts.port is None else f"{LOOPBACK}:{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def basic_auth(url: str) -> str | None:
    """The `user:password@` of a URL as an HTTP basic `Authorization` header's value (the probe sends it;
    nothing shows it)."""
    parts = urlsplit(url)
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


def node_targets(inventory: Inventory) -> list[NodeTarget]:
    return [NodeTarget(node.name, transport_for(node), node.address) for node in inventory.nodes]


def engine_targets(urls: list[str]) -> list[EngineTarget]:
    """The engines given (`--engine`), each named by `engine_key` and read at the address as typed, with
    the credentials it carried."""
    targets = []
    for url in urls:
        given = normalize_url(check_engine_url(url))
        address, key = without_credentials(given), engine_key(given)
        targets.append(EngineTarget(key, origin="given", address=None if address == key else address,
                                    auth=basic_auth(given)))
    return targets
