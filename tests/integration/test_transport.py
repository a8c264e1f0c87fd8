"""Transports against real peers: a real asyncssh server started in the
test (generated keys, known_hosts, an ssh config alias) and real local
subprocesses."""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx
import pytest
from aiohttp import web

from sparktop.remote import CommandTimeout, HostKeyError, LocalTransport, SSHTransport, TransportError
from tests.helpers.sshd import SSHServerFixture


@pytest.fixture
async def sshd(tmp_path):
    server = await SSHServerFixture(tmp_path / "ssh").start()
    yield server
    await server.stop()


def via_alias(server: SSHServerFixture, **kw) -> SSHTransport:
    return SSHTransport(server.alias, config=[server.config], connect_timeout=5, **kw)


async def test_alias_from_ssh_config_runs_a_command(sshd):
    t = via_alias(sshd)
    try:
        result = await t.run("echo hello; echo oops >&2; exit 3")
    finally:
        await t.close()
    assert result.exit_status == 3
    assert result.stdout == "hello\n"
    assert result.stderr == "oops\n"


async def test_one_connection_is_reused_for_every_command(sshd):
    t = via_alias(sshd)
    try:
        for i in range(5):
            assert (await t.run(f"echo {i}")).stdout == f"{i}\n"
        results = await asyncio.gather(*(t.run("echo x") for _ in range(4)))
    finally:
        await t.close()
    assert all(r.ok for r in results)
    assert t.connects == 1
    assert sshd.connections == 1


async def test_unknown_host_key_is_refused_with_a_hint(sshd):
    # Same server, but a known_hosts file that does not hold its key.
    t = SSHTransport("127.0.0.1", port=sshd.port, user="tester", client_keys=[sshd.client_key_path],
                     known_hosts=str(sshd.empty_known_hosts), config=[], connect_timeout=5)
    with pytest.raises(HostKeyError) as info:
        await t.run("echo should-not-run")
    message = str(info.value)
    assert "ssh-keyscan" in message and "known_hosts" in message
    assert "\n" not in message
    assert sshd.commands == []  # nothing ran on an unverified host


async def test_changed_host_key_is_refused(sshd, tmp_path):
    import asyncssh

    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    wrong = tmp_path / "known_hosts.wrong"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {other}\n")
    t = SSHTransport("127.0.0.1", port=sshd.port, user="tester", client_keys=[sshd.client_key_path],
                     known_hosts=str(wrong), config=[], connect_timeout=5)
    with pytest.raises(HostKeyError):
        await t.run("true")
    assert sshd.commands == []


async def test_reconnects_after_the_server_dies_and_returns(sshd):
    t = via_alias(sshd)
    try:
        assert (await t.run("echo one")).ok
        await sshd.stop()
        await asyncio.sleep(0.1)
        with pytest.raises(TransportError):
            await t.run("echo two")
        await sshd.start()  # same port, same host key
        result = await t.run("echo three")
    finally:
        await t.close()
    assert result.stdout == "three\n"
    assert t.connects == 2


async def test_unreachable_host_is_a_one_line_error():
    t = SSHTransport("127.0.0.1", port=1, config=[], known_hosts=None, connect_timeout=3)
    with pytest.raises(TransportError) as info:
        await t.run("true")
    assert "cannot connect" in str(info.value)


async def test_a_command_that_hangs_times_out_and_the_connection_survives(sshd):
    t = via_alias(sshd)
    try:
        # Cut at its timeout: a run that waited for the command would return it, finished, instead.
        with pytest.raises(CommandTimeout) as info:
            await t.run("sleep 60", timeout=0.5)
        assert "timed out after 0.5s" in str(info.value)
        assert (await t.run("echo still-here")).stdout == "still-here\n"
    finally:
        await t.close()
    assert t.connects == 1


async def test_stream_yields_lines_as_they_come(sshd):
    t = via_alias(sshd)
    try:
        lines = [line async for line in t.stream("for i in 1 2 3; do echo line$i; done")]
    finally:
        await t.close()
    assert lines == ["line1", "line2", "line3"]


async def test_forward_reaches_an_http_server_on_the_node(sshd):
    app = web.Application()
    async def health(request):
        return web.json_response({"ok": True})

    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    remote_port = site._server.sockets[0].getsockname()[1]
    t = via_alias(sshd)
    try:
        local = await t.forward(remote_port)
        assert local != remote_port
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://127.0.0.1:{local}/health")
        assert r.json() == {"ok": True}
        assert await t.forward(remote_port) == local  # reused while connected
        assert sshd.forwards >= 1
    finally:
        await t.close()
        await runner.cleanup()


async def test_env_is_exported_quoted(sshd):
    t = via_alias(sshd, env={"SPARK_NOTE": "a b; $(echo no)"})
    try:
        result = await t.run('printf %s "$SPARK_NOTE"')
    finally:
        await t.close()
    assert result.stdout == "a b; $(echo no)"


async def test_argument_lists_are_quoted(sshd):
    t = via_alias(sshd)
    try:
        result = await t.run(["printf", "%s|", "a b", "$(id)", "; echo pwned"])
    finally:
        await t.close()
    assert result.stdout == "a b|$(id)|; echo pwned|"


# -- local ---------------------------------------------------------------------


async def test_local_run_stream_and_env():
    t = LocalTransport("here", env={"SPARK_X": "42"})
    result = await t.run('echo "$SPARK_X"; exit 4')
    assert (result.exit_status, result.stdout) == (4, "42\n")
    assert [line async for line in t.stream("echo a; echo b >&2")] == ["a", "b"]
    assert await t.forward(8000) == 8000


async def test_local_timeout_kills_the_whole_command():
    t = LocalTransport()
    # A length no other command on this machine sleeps for (another worker may run this test too).
    length = f"61.{secrets.randbelow(10**6):06d}"
    with pytest.raises(CommandTimeout):  # a run that waited for the sleeps would return, not raise
        await t.run(f"sleep {length} & sleep {length}; wait", timeout=0.3)
    # Both sleeps were killed (SIGKILL to the group), the one in the background too: gone long before they
    # would have ended on their own.
    pattern = f"[s]leep {length}"

    async def left() -> str:
        return (await t.run(f"pgrep -f '{pattern}' || true")).stdout.strip()

    deadline = time.monotonic() + 30
    while (pids := await left()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert pids == "", f"still running: {pids}"


async def test_input_goes_to_stdin_not_the_command_line(sshd):
    t = via_alias(sshd)
    try:
        result = await t.run("cat", input="S3CRET=value\n")
    finally:
        await t.close()
    assert result.stdout == "S3CRET=value\n"
    assert all("S3CRET" not in c for c in sshd.commands)
    local = await LocalTransport().run("cat", input="x=1\n")
    assert local.stdout == "x=1\n"
