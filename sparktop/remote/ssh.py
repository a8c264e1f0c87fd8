"""SSHTransport: commands on a node over one reused asyncssh connection.

- `~/.ssh/config` is honoured: its path is passed as `config=` to every
  connect, so `Host` blocks match the host being connected to (an options
  object built once would read the file before the host is known).
- Host keys are checked against known_hosts (asyncssh's default, or
  `UserKnownHostsFile` from the config). An unknown or changed key is a
  HostKeyError that says how to trust the host; it is never accepted here.
- Keepalives detect a dead peer; a lost connection is dropped and the next
  command reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import asyncssh

from sparktop.remote.base import Command, CommandResult, CommandTimeout, HostKeyError, TransportError, as_shell

DEFAULT_CONFIG = "~/.ssh/config"  # expanded when a transport is made, so HOME is read then

# Errors that mean the connection itself is gone (not that a command failed).
_CONNECTION_ERRORS = (
    asyncssh.ConnectionLost,
    asyncssh.DisconnectError,
    asyncssh.ChannelOpenError,
    BrokenPipeError,
    ConnectionResetError,
    EOFError,
)


class _Client(asyncssh.SSHClient):
    def __init__(self, transport: SSHTransport):
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport._on_lost(self, exc)


class SSHTransport:
    """One node reached over SSH.

    `host` may be an alias from the ssh config. `config` lists ssh config
    files (default: ~/.ssh/config when it exists). `known_hosts` is passed to
    asyncssh unchanged; leave it as `()` to use the user's known_hosts.
    """

    def __init__(
        self,
        host: str,
        *,
        user: str | None = None,
        port: int | None = None,
        name: str | None = None,
        config: Sequence[str | Path] | None = None,
        known_hosts: object = (),
        client_keys: Sequence[str | Path] | None = None,
        connect_timeout: float = 10.0,
        keepalive_interval: float = 10.0,
        keepalive_count_max: int = 3,
        env: dict[str, str] | None = None,
    ):
        self.host = host
        self.name = name or host
        self._user = user
        self._port = port
        if config is None:
            default = Path(DEFAULT_CONFIG).expanduser()
            config = [default] if default.exists() else []
        self._config = [str(Path(p).expanduser()) for p in config]
        self._known_hosts = known_hosts
        self._client_keys = [str(Path(k).expanduser()) for k in client_keys] if client_keys else None
        self._connect_timeout = connect_timeout
        self._keepalive_interval = keepalive_interval
        self._keepalive_count_max = keepalive_count_max
        # Exported in front of every command (values quoted), e.g. a PATH.
        self._prefix = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
        self._conn: asyncssh.SSHClientConnection | None = None
        self._client: _Client | None = None
        self._lock = asyncio.Lock()
        self._listeners: dict[tuple[str, int], asyncssh.SSHListener] = {}
        self.connects = 0  # how many connections were opened (reuse is observable)
        self.last_error: str | None = None

    # -- connection ---------------------------------------------------------

    def _on_lost(self, client: _Client, exc: Exception | None) -> None:
        if client is self._client:
            self._conn = None
            self._client = None
            self._listeners.clear()
            if exc is not None:
                self.last_error = str(exc) or type(exc).__name__

    def _connect_kwargs(self) -> dict:
        kwargs: dict = {
            "config": self._config,
            "connect_timeout": self._connect_timeout,
            "keepalive_interval": self._keepalive_interval,
            "keepalive_count_max": self._keepalive_count_max,
        }
        if self._known_hosts != ():
            kwargs["known_hosts"] = self._known_hosts
        if self._user:
            kwargs["username"] = self._user
        if self._port:
            kwargs["port"] = self._port
        if self._client_keys is not None:
            kwargs["client_keys"] = self._client_keys
        return kwargs

    async def connection(self) -> asyncssh.SSHClientConnection:
        """The live connection, opening one if there is none."""
        async with self._lock:
            if self._conn is not None:
                return self._conn
            client_holder: list[_Client] = []

            def factory() -> _Client:
                client = _Client(self)
                client_holder.append(client)
                return client

            try:
                conn, client = await asyncssh.create_connection(factory, self.host, **self._connect_kwargs())
            except asyncssh.HostKeyNotVerifiable as exc:
                raise HostKeyError(self.name, self._host_key_hint(str(exc))) from None
            except asyncssh.PermissionDenied:
                raise TransportError(self.name, "ssh authentication failed "
                                     "(check your key and User in ~/.ssh/config)") from None
            except asyncssh.DisconnectError as exc:
                raise TransportError(self.name, f"ssh disconnected: {exc.reason}") from None
            except TimeoutError:
                raise TransportError(self.name, f"ssh connect timed out after {self._connect_timeout:g}s") from None
            except ConnectionRefusedError:
                raise TransportError(self.name, "cannot connect: connection refused (is sshd running?)") from None
            except socket.gaierror as exc:  # the name (an inventory node's host, or its name) has no address
                why = "" if exc.errno == socket.EAI_NONAME else f" ({(exc.strerror or str(exc)).lower()})"
                raise TransportError(self.name, f"cannot resolve {self.host}{why}") from None
            except OSError as exc:
                reason = exc.strerror or str(exc) or type(exc).__name__
                raise TransportError(self.name, f"cannot connect: {reason}") from None
            self._conn = conn
            self._client = client_holder[0]  # the same object as `client`, typed as ours
            self.connects += 1
            self.last_error = None
            return conn

    async def server_host_key(self) -> str | None:
        """The host key this connection verified against known_hosts, as `algorithm base64` (what another node's
        known_hosts may be given for this host: never a key read and trusted blindly)."""
        key = (await self.connection()).get_server_host_key()
        if key is None:
            return None
        return " ".join(key.export_public_key("openssh").decode().split()[:2])

    def _host_key_hint(self, detail: str) -> str:
        port = f"-p {self._port} " if self._port else ""
        if "mismatch" in detail.lower() or "changed" in detail.lower():
            return (
                f"host key does not match known_hosts ({detail}); if the node was reinstalled, "
                f"remove the old key with `ssh-keygen -R {self.host}` and connect once with `ssh {self.host}`"
            )
        return (
            f"host key is not in known_hosts ({detail}); check its fingerprint and trust it with "
            f"`ssh {port}{self.host}` once, or `ssh-keyscan {port}{self.host} >> ~/.ssh/known_hosts`"
        )

    def _drop(self) -> None:
        conn, self._conn, self._client = self._conn, None, None
        self._listeners.clear()
        if conn is not None:
            conn.abort()

    # -- Transport ----------------------------------------------------------

    async def _open_process(self, line: str, **kwargs) -> asyncssh.SSHClientProcess:
        """Start a remote process; retry once on a fresh connection when the
        old one turned out to be dead before the command could start."""
        for attempt in (1, 2):
            conn = await self.connection()
            try:
                return await conn.create_process(line, **kwargs)
            except _CONNECTION_ERRORS as exc:
                self._drop()
                if attempt == 2:
                    raise TransportError(self.name, f"connection lost: {exc}") from None
        raise AssertionError("unreachable")

    async def run(self, cmd: Command, timeout: float | None = 30.0, input: str | None = None) -> CommandResult:
        line = self._prefix + as_shell(cmd)
        if input is None:
            proc = await self._open_process(line, encoding="utf-8", errors="replace", stdin=asyncssh.DEVNULL)
        else:
            proc = await self._open_process(line, encoding="utf-8", errors="replace")
            proc.stdin.write(input)
            proc.stdin.write_eof()
        try:
            async with asyncio.timeout(timeout):  # not wait_for: see LocalTransport.run
                completed = await proc.wait(check=False)
        except TimeoutError:
            self._abandon(proc)
            raise CommandTimeout(self.name, line, timeout or 0) from None
        except asyncio.CancelledError:
            self._abandon(proc)
            raise
        except _CONNECTION_ERRORS as exc:
            self._drop()
            raise TransportError(self.name, f"connection lost while running {line[:60]!r}: {exc}") from None
        status = completed.exit_status
        if status is None:
            # Killed by a signal, or the channel closed without a status.
            status = 128 + 9 if completed.exit_signal else 255
        return CommandResult(status, str(completed.stdout or ""), str(completed.stderr or ""))

    @staticmethod
    def _abandon(proc: asyncssh.SSHClientProcess) -> None:
        with contextlib.suppress(OSError, asyncssh.Error, ValueError):
            proc.send_signal("KILL")
        proc.close()

    async def stream(self, cmd: Command) -> AsyncIterator[str]:
        line = self._prefix + as_shell(cmd)
        proc = await self._open_process(
            line, encoding="utf-8", errors="replace", stdin=asyncssh.DEVNULL, stderr=asyncssh.STDOUT
        )
        try:
            async for out in proc.stdout:
                if not out:  # EOF
                    break
                yield out.rstrip("\r\n")
        except _CONNECTION_ERRORS as exc:
            self._drop()
            raise TransportError(self.name, f"connection lost while streaming: {exc}") from None
        finally:
            if proc.exit_status is None:
                self._abandon(proc)

    async def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        """A local port forwarded to the node; the same one while the
        connection lives, a new one after a reconnect."""
        conn = await self.connection()
        existing = self._listeners.get((remote_host, remote_port))
        if existing is not None:
            return existing.get_port()
        try:
            listener = await conn.forward_local_port("127.0.0.1", 0, remote_host, remote_port)
        except _CONNECTION_ERRORS as exc:
            self._drop()
            raise TransportError(self.name, f"cannot forward port {remote_port}: {exc}") from None
        self._listeners[(remote_host, remote_port)] = listener
        return listener.get_port()

    async def close(self) -> None:
        conn, self._conn, self._client = self._conn, None, None
        for listener in self._listeners.values():
            listener.close()
        self._listeners.clear()
        if conn is not None:
            conn.close()
            with contextlib.suppress(TimeoutError, OSError, asyncssh.Error):
                async with asyncio.timeout(5):
                    await conn.wait_closed()

    def __repr__(self) -> str:
        return f"SSHTransport({self.name!r})"
