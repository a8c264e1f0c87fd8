"""LocalTransport: commands on the node sparktop runs on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Mapping

from sparktop.remote.base import Command, CommandResult, CommandTimeout, TransportError, as_shell


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # Commands run in their own session so a timeout takes their children too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class LocalTransport:
    """Runs shell commands here with asyncio subprocesses.

    `env` adds or overrides environment variables for every command; the twin
    uses it to give a simulated host its own PATH and state directory.
    """

    def __init__(self, name: str = "localhost", env: Mapping[str, str] | None = None):
        self.name = name
        self._env = {**os.environ, **env} if env else None

    async def run(self, cmd: Command, timeout: float | None = 30.0, input: str | None = None) -> CommandResult:
        line = as_shell(cmd)
        try:
            proc = await asyncio.create_subprocess_shell(
                line,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
                start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(self.name, f"cannot run {line!r}: {exc.strerror}") from None
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose a cancel that arrives as the
            # command ends, and a poller being closed would then poll on for ever.
            async with asyncio.timeout(timeout):
                out, err = await proc.communicate(input.encode() if input is not None else None)
        except TimeoutError:
            _kill_group(proc)
            await proc.wait()
            raise CommandTimeout(self.name, line, timeout or 0) from None
        except asyncio.CancelledError:
            _kill_group(proc)
            # Reaped before the cancel goes on: a command left to the garbage collector after its loop has
            # closed prints "Event loop is closed" tracebacks (`status` ending while a poll runs).
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(proc.wait()), 5)
            raise
        return CommandResult(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))

    @property
    def environ(self) -> Mapping[str, str]:
        """The environment its commands run with (this process's, plus the node's)."""
        return self._env if self._env is not None else os.environ

    async def stream(self, cmd: Command) -> AsyncIterator[str]:
        line = as_shell(cmd)
        proc = await asyncio.create_subprocess_shell(
            line,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._env,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            while True:
                raw = await proc.stdout.readline()
                if not raw:
                    break
                yield raw.decode(errors="replace").rstrip("\r\n")
            await proc.wait()
        finally:
            if proc.returncode is None:
                _kill_group(proc)
                await proc.wait()

    async def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        # The node is this machine: its ports are already ours.
        return remote_port

    async def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"LocalTransport({self.name!r})"
