"""A real SSH server (asyncssh) started inside a test, with generated keys.

`SSHServerFixture.start()` listens on 127.0.0.1 and writes, under a temp
directory, a client key, a known_hosts file holding the server's key and an
ssh config with a `Host` alias for it. Commands run in a real shell on this
machine, or are answered from a table of canned outputs (`canned`), which
is how monitor tests make the server look like a GB10 node.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh


def _killpg(proc) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class _Server(asyncssh.SSHServer):
    def __init__(self, fixture: SSHServerFixture):
        self.fixture = fixture

    def connection_made(self, conn):
        self.fixture.connections += 1
        self.fixture.live.append(conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key) -> bool:
        return key.export_public_key() == self.fixture.client_key.export_public_key()

    def connection_requested(self, dest_host, dest_port, orig_host, orig_port):
        self.fixture.forwards += 1
        return True


@dataclass
class SSHServerFixture:
    root: Path
    alias: str = "spark-test"
    canned: dict[str, tuple[int, str]] | None = None  # command -> (exit, stdout)
    handler: Callable[[str], tuple[int, str, str]] | None = None
    port: int = 0
    connections: int = 0
    forwards: int = 0
    commands: list[str] = field(default_factory=list)
    live: list = field(default_factory=list)
    procs: set = field(default_factory=set)

    def __post_init__(self):
        self.root.mkdir(parents=True, exist_ok=True)
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key_path = self.root / "id_ed25519"
        self.client_key_path.write_bytes(self.client_key.export_private_key())
        self.client_key_path.chmod(0o600)
        self.known_hosts = self.root / "known_hosts"
        self.empty_known_hosts = self.root / "known_hosts.empty"
        self.empty_known_hosts.write_text("")
        self.config = self.root / "ssh_config"
        self._server = None

    async def start(self) -> SSHServerFixture:
        self._server = await asyncssh.create_server(
            lambda: _Server(self), "127.0.0.1", self.port, server_host_keys=[self.host_key],
            process_factory=self._process, keepalive_interval=0,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        pub = self.host_key.export_public_key().decode().strip()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub}\n")
        self.config.write_text(
            f"Host {self.alias}\n"
            f"    HostName 127.0.0.1\n"
            f"    Port {self.port}\n"
            f"    User tester\n"
            f"    IdentityFile {self.client_key_path}\n"
            f"    UserKnownHostsFile {self.known_hosts}\n"
        )
        return self

    async def stop(self) -> None:
        """Like killing sshd: the listener and every open connection go away."""
        for conn in self.live:
            conn.abort()
        self.live.clear()
        for proc in list(self.procs):
            if proc.returncode is None:
                _killpg(proc)
                await proc.wait()
        self.procs.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _process(self, process: asyncssh.SSHServerProcess) -> None:
        command = process.command or ""
        self.commands.append(command)
        if self.handler is not None:
            code, out, err = self.handler(command)
            process.stdout.write(out)
            process.stderr.write(err)
            process.exit(code)
            return
        if self.canned is not None:
            for key, (code, out) in self.canned.items():
                if key in command:
                    process.stdout.write(out)
                    process.exit(code)
                    return
            process.stderr.write(f"sh: command not found: {command}\n")
            process.exit(127)
            return
        stdin_data = await process.stdin.read()  # the client sends EOF at once when it has nothing
        proc = await asyncio.create_subprocess_shell(
            command, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )
        self.procs.add(proc)
        proc.stdin.write(stdin_data.encode() if isinstance(stdin_data, str) else stdin_data)
        proc.stdin.close()
        try:
            while True:
                line = await proc.stdout.readline()
                if not line:
                    break
                process.stdout.write(line.decode())
            err = await proc.stderr.read()
            code = await proc.wait()
            process.stderr.write(err.decode())
            process.exit(code)
        except (asyncssh.BreakReceived, asyncssh.SignalReceived, asyncssh.TerminalSizeChanged,
                BrokenPipeError, ConnectionError):
            _killpg(proc)
            await proc.wait()
        except asyncio.CancelledError:
            _killpg(proc)
            raise
        finally:
            if proc.returncode is None:
                _killpg(proc)
                await proc.wait()
            self.procs.discard(proc)
