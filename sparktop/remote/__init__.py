"""How a node is reached: one Transport protocol, local and SSH implementations."""

from __future__ import annotations

from sparktop.remote.base import (
    Command,
    CommandResult,
    CommandTimeout,
    HostKeyError,
    Transport,
    TransportError,
    as_shell,
)
from sparktop.remote.local import LocalTransport
from sparktop.remote.ssh import SSHTransport

__all__ = [
    "Command",
    "CommandResult",
    "CommandTimeout",
    "HostKeyError",
    "LocalTransport",
    "SSHTransport",
    "Transport",
    "TransportError",
    "as_shell",
    "transport_for",
]


def transport_for(node) -> Transport:
    """The transport for an inventory node (settings.Node)."""
    if node.is_local:
        return LocalTransport(node.name, env=node.env or None)
    return SSHTransport(node.host, user=node.user, port=node.port, name=node.name, env=node.env or None)
