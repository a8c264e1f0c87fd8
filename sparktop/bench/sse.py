"""A minimal HTTP/1.1 client for one server-sent-events POST.

The sweep's hot path is one network read per streamed token. A general
client turns every read into a future, a task wake-up and a buffer copy;
here the bytes go from the socket callback straight to the SSE line
splitter, stamped with the time they arrived. It speaks just what an
OpenAI-compatible stream needs: a POST, a status line, headers, then a body
that is chunked, sized by Content-Length, or ends with the connection.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

from sparktop.clock import SYSTEM

Line = Callable[[bytes, float], None]  # an SSE line and the time its bytes arrived (the caller's clock)


class HTTPError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class _Stream(asyncio.Protocol):
    def __init__(self, on_line: Line, now: Callable[[], float]):
        self.on_line = on_line
        self.now = now
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        self.head = b""
        self.status: int | None = None
        self.chunked = False
        self.remaining: int | None = None  # Content-Length left, when sized
        self.raw = b""  # chunked framing not yet decoded
        self.lines = b""  # SSE text not yet split into lines
        self.error_body = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        t = self.now()
        if self.status is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end], self.head[end + 4:]
            lines = head.split(b"\r\n")
            try:
                self.status = int(lines[0].split()[1])
            except (IndexError, ValueError):
                self._fail(ConnectionError(f"not an HTTP response: {lines[0][:80]!r}"))
                return
            for h in lines[1:]:
                name, _, value = h.partition(b":")
                name = name.strip().lower()
                if name == b"transfer-encoding" and b"chunked" in value.lower():
                    self.chunked = True
                elif name == b"content-length":
                    self.remaining = int(value.strip() or 0)
            if not data:
                if self.remaining == 0:
                    self._finish()
                return
        if self.chunked:
            self._dechunk(data, t)
        else:
            if self.remaining is not None:
                data = data[: self.remaining]
                self.remaining -= len(data)
            self._body(data, t)
            if self.remaining == 0:
                self._finish()

    def _dechunk(self, data: bytes, t: float) -> None:
        buf = self.raw + data if self.raw else data
        pos = 0
        out: list[bytes] = []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            try:
                size = int(buf[pos:eol].split(b";")[0], 16)
            except ValueError:
                self._fail(ConnectionError("bad chunked encoding"))
                return
            if size == 0:
                self._body(b"".join(out), t)
                self._finish()
                return
            if len(buf) < eol + 2 + size + 2:
                break
            out.append(buf[eol + 2: eol + 2 + size])
            pos = eol + 2 + size + 2
        self.raw = buf[pos:]
        if out:
            self._body(b"".join(out), t)

    def _body(self, data: bytes, t: float) -> None:
        if not data:
            return
        if self.status != 200:
            self.error_body += data
            return
        buf = self.lines + data if self.lines else data
        if b"\n" not in data:
            self.lines = buf
            return
        *lines, self.lines = buf.split(b"\n")
        on_line = self.on_line
        for line in lines:
            if line:
                on_line(line, t)

    def _finish(self) -> None:
        if self.lines and self.status == 200:
            self.on_line(self.lines, self.now())
            self.lines = b""
        if not self.done.done():
            self.done.set_result(None)
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if self.done.done():
            return
        if self.status is not None and not self.chunked and self.remaining is None:
            self._finish()  # a body that ends with the connection
        else:
            self._fail(exc or ConnectionResetError("the server closed the connection mid-response"))


async def post_sse(url: str, payload: dict, on_line: Line, headers: dict | None = None,
                   ssl_context: ssl.SSLContext | None = None, now: Callable[[], float] = SYSTEM.stamp) -> int:
    """POST `payload` as JSON and feed every body line to `on_line`, stamped
    with `now()` as its bytes arrived. Returns the status; a non-200 status
    raises HTTPError with the body's start."""
    u = urlsplit(url)
    secure = u.scheme == "https"
    port = u.port or (443 if secure else 80)
    body = json.dumps(payload, separators=(",", ":")).encode()
    host = u.hostname or "127.0.0.1"
    hdrs = {"Host": f"{host}:{port}" if u.port else host, "Content-Type": "application/json",
            "Accept": "text/event-stream", "Content-Length": str(len(body)), "Connection": "close"}
    hdrs.update(headers or {})
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    request = (f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode()
    loop = asyncio.get_running_loop()
    ctx = (ssl_context or ssl.create_default_context()) if secure else None
    transport, proto = await loop.create_connection(lambda: _Stream(on_line, now), host, port, ssl=ctx)
    try:
        transport.write(request + body)
        await proto.done
    finally:
        transport.close()
    if proto.status != 200:
        text = proto.error_body.decode("utf-8", "replace")[:300].replace("\n", " ")
        try:
            err = json.loads(proto.error_body).get("error")
            text = err.get("message", text) if isinstance(err, dict) else (str(err) if err else text)
        except (ValueError, AttributeError):
            pass
        raise HTTPError(proto.status or 0, text)  # 0: the connection closed before a status line
    return proto.status
