"""What to watch: nodes from the inventory (or this node alone) and the
engines given on the command line."""

from __future__ import annotations

from urllib.parse import urlsplit

from sparktop.errors import SparktopError
from sparktop.observe.poller import EngineTarget, NodeTarget
from sparktop.remote import transport_for
from sparktop.settings import Inventory


def check_engine_url(url: str) -> str:
    """`url` when it is an engine's address: http(s)://HOST[:PORT][/v1], or HOST:PORT[/v1] (http is
    assumed); else a one-line SparktopError naming the value and what is expected."""
    text = url.strip()
    expected = f"--engine {url!r}: expected a URL like http://HOST:PORT (or HOST:PORT)"
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


def node_targets(inventory: Inventory) -> list[NodeTarget]:
    return [NodeTarget(node.name, transport_for(node), node.address) for node in inventory.nodes]


def engine_targets(urls: list[str]) -> list[EngineTarget]:
    return [EngineTarget(normalize_url(check_engine_url(url)), origin="given") for url in urls]
