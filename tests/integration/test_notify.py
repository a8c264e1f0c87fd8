"""Alerts posted to real webhook receivers (an aiohttp server standing in for Slack, Discord, ntfy and a
script): each in its own format, in order, retried when the receiver fails, and the webhook's key never
printed."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from sparktop.errors import SparktopError
from sparktop.history.notify import Notifier, parse_target
from sparktop.observe.alerts import FIRE, RESOLVE
from sparktop.observe.snapshot import Notice


async def receiver(fail_first: int = 0, status: int = 500):
    got: list[tuple[str, dict, bytes]] = []
    left = {"fail": fail_first}

    async def hook(request: web.Request) -> web.Response:
        if left["fail"]:
            left["fail"] -= 1
            return web.Response(status=status)
        got.append((request.path, dict(request.headers), await request.read()))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/{tail:.*}", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}", got


def notice(kind: str, text: str, level: str = "error") -> Notice:
    return Notice(1000.0, "engine", "http://127.0.0.2:8000", kind, level, text)


async def no_wait(_s: float) -> None:
    await asyncio.sleep(0)


async def test_every_format_gets_the_heartbeat_then_the_alert_then_its_resolution():
    runner, base, got = await receiver()
    said: list[str] = []
    targets = [parse_target(f"json:{base}/hook/SECRET1"), parse_target(f"slack:{base}/services/SECRET2"),
               parse_target(f"discord:{base}/api/webhooks/1/SECRET3"), parse_target(f"ntfy:{base}/sparktop-alerts")]
    notifier = Notifier(targets, say=said.append, host="spark-a", sleep=no_wait)
    try:
        await notifier.start(notice("heartbeat", "started: watching 2 nodes, 2 engines", "info"))
        notifier.send(notice(FIRE, "engine_down [critical]: engine gpt-oss-120b unreachable: connection refused"))
        notifier.send(notice(RESOLVE, "engine_down resolved: engine gpt-oss-120b unreachable", "info"))
        await notifier.close()
    finally:
        await runner.cleanup()
    assert notifier.sent == 12 and said == []
    by_path: dict[str, list] = {}
    for path, headers, body in got:
        by_path.setdefault(path.split("/")[1], []).append((headers, body))
    generic = [json.loads(b) for _, b in by_path["hook"]]
    assert [(g["state"], g["alert"], g["severity"]) for g in generic] == [
        ("heartbeat", "heartbeat", "info"), ("firing", "engine_down", "critical"), ("resolved", "engine_down", "info")]
    assert generic[1]["key"] == "http://127.0.0.2:8000" and generic[1]["host"] == "spark-a"
    slack = [json.loads(b)["text"] for _, b in by_path["services"]]
    assert slack[1] == ("🔴 sparktop on spark-a: engine_down [critical]: engine gpt-oss-120b unreachable: "
                        "connection refused") and slack[2].startswith("✅")
    assert [json.loads(b)["content"][:1] for _, b in by_path["api"]] == ["💓", "🔴", "✅"]
    ntfy = by_path["sparktop-alerts"]
    assert [(h["Title"], h["Priority"]) for h, _ in ntfy] == [
        ("sparktop started", "min"), ("sparktop engine_down firing", "high"), ("sparktop engine_down resolved", "low")]
    assert ntfy[1][1].decode().startswith("engine_down [critical]")


async def test_a_failing_receiver_is_retried_then_said_once_without_its_key():
    runner, base, got = await receiver(fail_first=2)
    said: list[str] = []
    notifier = Notifier([parse_target(f"{base}/hook/SECRET-KEY")], say=said.append, host="h", sleep=no_wait)
    try:
        await notifier.start(notice("heartbeat", "started", "info"))  # two 500s, then taken: delivered
        await notifier.close()
    finally:
        await runner.cleanup()
    assert len(got) == 1 and notifier.sent == 1 and said == []
    runner, base, got = await receiver(fail_first=99, status=403)
    notifier = Notifier([parse_target(f"{base}/hook/SECRET-KEY")], say=said.append, host="h", sleep=no_wait)
    try:
        await notifier.start(notice("heartbeat", "started", "info"))
        notifier.send(notice(FIRE, "node_lost [critical]: node spark-b down"))
        await notifier.close()
    finally:
        await runner.cleanup()
    assert got == [] and len(said) == 1 and "HTTP 403" in said[0] and "SECRET" not in said[0]


def test_a_target_is_a_url_and_its_format_follows_its_host():
    assert parse_target("https://hooks.slack.com/services/T/B/X").kind == "slack"
    assert parse_target("https://discord.com/api/webhooks/1/x").kind == "discord"
    assert parse_target("https://ntfy.sh/mytopic").kind == "ntfy"
    assert parse_target("https://example.org/hook").kind == "json"
    assert parse_target("ntfy:https://push.example.org/t").kind == "ntfy"
    with pytest.raises(SparktopError, match="expected an http"):
        parse_target("hooks.slack.com/services/x")
    assert "x/y" not in parse_target("https://hooks.slack.com/x/y").shown
