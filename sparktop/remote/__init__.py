"""How a node is reached: one Transport protocol, local and SSH implementations.

`SSHTransport` (and asyncssh, a large import) is loaded only when a node
needs it, so watching just this node starts faster.
"""

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


def __getattr__(name: str):
    if name == "SSHTransport":
        from sparktop.remote.ssh import SSHTransport

        return SSHTransport
    raise AttributeError(name)


def transport_for(node) -> Transport:
    """The transport for an inventory node (settings.Node)."""
    if node.is_local:
        return LocalTransport(node.name, env=node.env or None)
    from sparktop.remote.ssh import SSHTransport

    return SSHTransport(node.host, user=node.user, port=node.port, name=node.name, env=node.env or None)
