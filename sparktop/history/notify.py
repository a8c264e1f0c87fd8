"""Alerts delivered: `sparktop collect --notify URL` (repeatable) posts each alert as it fires and as it
resolves (`observe.alerts`), and a heartbeat when the collector starts, to a webhook.

Four formats, chosen by a prefix or by the URL's host: a generic JSON body (`json:` or any other URL: the
alert's fields, for a script or an automation tool), Slack's incoming webhooks (`slack:` or hooks.slack.com:
`{"text": ...}`), Discord's (`discord:` or discord.com/api/webhooks: `{"content": ...}`) and ntfy
(`ntfy:` or ntfy.sh: the text as the body, the title, priority and tags as headers). A webhook URL is a
secret (its path is the key): it is never printed or logged, only its scheme and host.

Delivery never holds up the collector: messages queue and a task posts them in order, retrying a failed post
a few times with a growing pause; a target that keeps failing is said once, and again when it works.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sparktop.errors import SparktopError
from sparktop.masking import mask

if TYPE_CHECKING:
    from collections.abc import Callable

    import aiohttp

    from sparktop.observe.snapshot import Notice

KINDS = ("json", "slack", "discord", "ntfy")
RETRIES = (1.0, 4.0, 15.0)  # seconds before each new try of a post that failed
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Target:
    url: str
    kind: str  # json | slack | discord | ntfy

    @property
    def shown(self) -> str:
        """The target as it may be printed: its format, scheme and host, never the path (the key)."""
        parts = urlsplit(self.url)
        return f"{self.kind} {parts.scheme}://{parts.hostname or '?'}/…"


def parse_target(text: str) -> Target:
    """`slack:https://hooks.slack.com/...`, `ntfy:https://ntfy.example/topic`, or a URL whose host says which."""
    kind, sep, rest = text.partition(":")
    if sep and kind in KINDS and rest.startswith(("http://", "https://")):
        url = rest
    else:
        kind, url = "", text
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SparktopError(f"--notify {mask(text)[:60]!r}: expected an http(s) URL, optionally after json:, "
                            "slack:, discord: or ntfy:")
    if not kind:
        host = parts.hostname.lower()
        kind = ("slack" if host == "hooks.slack.com" else
                "discord" if host.endswith(("discord.com", "discordapp.com")) and "/api/webhooks/" in parts.path
                else "ntfy" if host == "ntfy.sh" else "json")
    return Target(url, kind)


def _fields(notice: Notice, host: str) -> dict[str, Any]:
    name, _, rest = notice.text.partition(" ")
    state = "resolved" if notice.kind == "alert_resolved" else "heartbeat" if notice.kind == "heartbeat" \
        else "firing"
    severity = "critical" if notice.level == "error" else "warning" if notice.level == "warn" else "info"
    return {"source": "sparktop", "host": host, "alert": "heartbeat" if state == "heartbeat" else name.rstrip(":"),
            "state": state, "severity": severity,
            "subject": notice.subject, "key": notice.key, "text": notice.text, "at": notice.t}


def request_for(target: Target, notice: Notice, host: str) -> tuple[bytes, dict[str, str]]:
    """The body and headers that post `notice` to `target`."""
    f = _fields(notice, host)
    mark = {"firing": "🔴" if f["severity"] == "critical" else "🟠", "resolved": "✅", "heartbeat": "💓"}[f["state"]]
    line = f"{mark} sparktop on {host}: {notice.text}"
    if target.kind == "slack":
        return json.dumps({"text": line}).encode(), {"Content-Type": "application/json"}
    if target.kind == "discord":
        return json.dumps({"content": line}).encode(), {"Content-Type": "application/json"}
    if target.kind == "ntfy":
        priority = {"firing": "high" if f["severity"] == "critical" else "default", "resolved": "low",
                    "heartbeat": "min"}[f["state"]]
        tags = {"firing": "rotating_light", "resolved": "white_check_mark", "heartbeat": "heartbeat"}[f["state"]]
        title = f"sparktop {f['alert']} {f['state']}" if f["state"] != "heartbeat" else "sparktop started"
        return notice.text.encode(), {"Title": title, "Priority": priority, "Tags": tags,
                                      "Content-Type": "text/plain; charset=utf-8"}
    return json.dumps(f).encode(), {"Content-Type": "application/json"}


class Notifier:
    """Posts notices to every target, in order, without holding up its caller."""

    def __init__(self, targets: list[Target], say: Callable[[str], None] = print, host: str | None = None,
                 sleep: Callable[[float], Any] = asyncio.sleep):
        self.targets = targets
        self.say = say
        self.host = host or socket.gethostname()
        self._sleep = sleep
        self._queue: asyncio.Queue[Notice | None] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._failing: set[str] = set()
        self.sent = 0  # posts that a target accepted (2xx)

    async def start(self, heartbeat: Notice) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
        self._task = asyncio.create_task(self._run(), name="notify")
        self.send(heartbeat)

    def send(self, notice: Notice) -> None:
        if self.targets:
            self._queue.put_nowait(notice)

    async def close(self, drain_s: float = 5.0) -> None:
        """Deliver what is queued (up to `drain_s`), then stop."""
        if self._task is None:
            return
        self._queue.put_nowait(None)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._task), drain_s)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._session.close()

    async def _run(self) -> None:
        while True:
            notice = await self._queue.get()
            if notice is None:
                return
            for target in self.targets:
                await self._post(self._session, target, notice)

    async def _post(self, session: aiohttp.ClientSession, target: Target, notice: Notice) -> None:
        import aiohttp

        body, headers = request_for(target, notice, self.host)
        why = ""
        for pause in (0.0, *RETRIES):
            if pause:
                await self._sleep(pause)
            try:
                async with session.post(target.url, data=body, headers=headers) as r:
                    if 200 <= r.status < 300:
                        self.sent += 1
                        if target.url in self._failing:
                            self._failing.discard(target.url)
                            self.say(f"notify: {target.shown} delivers again")
                        return
                    why = f"HTTP {r.status}"
                    if 400 <= r.status < 500 and r.status != 429:
                        break  # refused for what it is: sending it again changes nothing
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                why = type(exc).__name__
        if target.url not in self._failing:
            self._failing.add(target.url)
            self.say(f"notify: {target.shown} did not take an alert ({why}); later ones are still sent")
