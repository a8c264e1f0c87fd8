"""The one protocol every way of reaching a node implements.

A command is either a shell command line (`str`, which the caller built with
`shlex.quote` for every value) or an argument list, which is joined with
`shlex.join` so no value is ever interpreted by the remote shell.
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sparktop.errors import SparktopError

Command = str | Sequence[str]


def as_shell(cmd: Command) -> str:
    """A command line: strings pass through, argument lists are quoted."""
    if isinstance(cmd, str):
        return cmd
    return shlex.join(str(part) for part in cmd)


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def first_error_line(self) -> str:
        for text in (self.stderr, self.stdout):
            for line in text.splitlines():
                if line.strip():
                    return line.strip()
        return f"exit status {self.exit_status}"


class TransportError(SparktopError):
    """A node could not be reached or a command could not be run there."""

    def __init__(self, host: str, message: str):
        self.host = host
        self.message = message
        super().__init__(f"{host}: {message}")


class CommandTimeout(TransportError):
    def __init__(self, host: str, cmd: str, timeout: float):
        self.cmd = cmd
        self.timeout = timeout
        short = cmd if len(cmd) <= 60 else cmd[:57] + "..."
        super().__init__(host, f"command timed out after {timeout:g}s: {short}")


class HostKeyError(TransportError):
    """The host's key is unknown or does not match: never accepted silently."""


@runtime_checkable
class Transport(Protocol):
    """Runs commands on one node."""

    name: str

    async def run(self, cmd: Command, timeout: float | None = 30.0, input: str | None = None) -> CommandResult:
        """Run to completion; raise CommandTimeout after `timeout` seconds.
        `input` goes to the command's standard input (how secrets travel:
        never on a command line)."""

    def stream(self, cmd: Command) -> AsyncIterator[str]:
        """Yield the command's output lines (stdout and stderr) as they come."""

    async def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        """A local port that reaches `remote_host:remote_port` as seen from the node."""

    async def close(self) -> None:
        """Release connections and forwards."""
