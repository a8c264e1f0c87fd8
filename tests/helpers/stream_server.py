"""A scripted OpenAI-compatible streaming server whose rates are known exactly.

It streams the shapes engines, speculative decoding and proxies send —
several tokens per chunk, an empty role chunk before prefill, no usage, no
token ids, reasoning instead of content — on a timeline fixed in advance, so
a test knows the true prefill rate, TTFT and decode rate to compare the
sweep's figures with.

One server serves every script: the script is the first path segment, so
`Script(...).url(base)` is an endpoint of its own
(`/<script>/v1/chat/completions`, `/<script>/v1/models`, `/<script>/version`),
and `/<script>/sent` lists when each of its streamed requests arrived and
when its first and last chunks went out.

The timeline of one streamed request, against the monotonic clock from its
arrival (t0), never as a sum of sleeps (a late wake-up delays one chunk, not
all that follow):

- `role_first`: an empty `{"role": "assistant"}` chunk the moment the
  headers go out; otherwise vLLM's `{"role": "assistant", "content": ""}`
  goes with the first token;
- prefill: the first chunk (`first_chunk` tokens, default `per_chunk`)
  leaves at t0 + prompt_tokens / prefill_tps;
- decode: each later chunk of `per_chunk` tokens (the last may hold fewer)
  leaves when its tokens are done at `decode_tps` after the first chunk:
  at t0 + prefill + (tokens in the chunks after the first so far) / decode_tps.

So whatever the chunking, the true TTFT is prompt_tokens / prefill_tps, the
true prefill rate `prefill_tps` (times c at concurrency c: requests do not
share anything), and the true decode rate `decode_tps` per request: the
tokens after the first chunk over the time from the first chunk to the last.

A request gets exactly `max_tokens` tokens. Prompt tokens are the words of
the messages plus `TEMPLATE` — or, with `tokenizer` (and the server started
with one), that tokenizer's count; then every output token is a word the
tokenizer reads as one token, so a client counting the streamed text locally
finds exactly the tokens sent. Usage and token ids come only when the
request asks for them (`stream_options.include_usage`, `return_token_ids`)
and the script allows them; a non-streaming answer always has its usage.

Two ways to run it:

- in this process, on the running event loop: `async with serving() as
  (base, server)`. On a virtual-time loop (`@simulated`) its timeline and
  the client's stamps are on one simulated clock, so every chunk leaves and
  arrives exactly when the script says, however busy the machine is;
- in a process of its own, for a client that runs its own loop (the CLI):
  `with stream_server() as base`, or `python -m tests.helpers.stream_server
  --port N [--tokenizer FILE]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from aiohttp import web

TEMPLATE = 7  # tokens "the chat template" adds around the messages
MODEL = "scripted"
ROOT = Path(__file__).resolve().parents[2]
# Output words without a tokenizer (any words do: nothing counts them).
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]


@dataclass(frozen=True)
class Script:
    prefill_tps: float = 2000.0  # prompt tokens per second of prefill
    decode_tps: float = 50.0  # tokens per second after the first chunk
    per_chunk: int = 1  # tokens per chunk after the first
    first_chunk: int = 0  # tokens in the first chunk (0: per_chunk)
    role_first: bool = False  # an empty role chunk as the headers go out, before prefill
    usage: bool = True  # stream usage when asked for
    token_ids: bool = True  # token ids per chunk when asked for
    reasoning: bool = False  # stream `reasoning_content` instead of `content`
    tokenizer: bool = False  # count prompts and choose output words with the server's tokenizer

    def path(self) -> str:
        return ",".join(f"{f.name}={_text(getattr(self, f.name))}" for f in fields(self))

    def url(self, base: str) -> str:
        """The endpoint that streams this script (`base`: the server's http://host:port)."""
        return f"{base}/{self.path()}"

    @classmethod
    def parse(cls, path: str) -> Script:
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict = {}
        for item in path.split(","):
            key, _, value = item.partition("=")
            if key not in kinds:
                raise ValueError(f"unknown script key {key!r}")
            kind = kinds[key]
            values[key] = (value == "1" if kind == "bool" else float(value) if kind == "float" else int(value))
        return cls(**values)

    def chunk_sizes(self, n: int) -> list[int]:
        first = min(n, self.first_chunk or self.per_chunk)
        sizes = [first] if n else []
        left = n - first
        while left > 0:
            sizes.append(min(self.per_chunk, left))
            left -= sizes[-1]
        return sizes


def _text(v: object) -> str:
    return ("1" if v else "0") if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v)


def single_token_words(tokenizer) -> list[tuple[str, int]]:
    """(word, id) for alphabetic words the tokenizer reads as one token after a space."""
    out = []
    for token, tid in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        if token.startswith("Ġ") and len(token) > 2 and token[1:].isalpha() and token[1:].isascii():
            word = token[1:]
            if tokenizer.encode(" " + word, add_special_tokens=False).ids == [tid]:
                out.append((word, tid))
    return out


async def _until(deadline: float) -> None:
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


def _sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class StreamServer:
    def __init__(self, tokenizer_path: str | None = None):
        self.tokenizer = None
        self.vocab_words: list[tuple[str, int]] = []
        if tokenizer_path:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(tokenizer_path)
            self.vocab_words = single_token_words(self.tokenizer)
        # Per script, each streamed request's timeline as it happened, on the loop's monotonic clock: [arrival,
        # max_tokens, first chunk sent, last chunk sent]. A loaded machine wakes the server late: its true
        # rates are those of the chunks it sent when it sent them, not of the script's plan.
        self.sent: dict[str, list[list]] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/{script}/v1/models", self.models)
        app.router.add_get("/{script}/version", self.version)
        app.router.add_post("/{script}/v1/chat/completions", self.chat)
        app.router.add_get("/{script}/sent", self.sent_route)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def sent_route(self, request: web.Request) -> web.Response:
        return web.json_response(self.sent.get(request.match_info["script"], []))

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "scripted-1"})

    def prompt_tokens(self, messages: list[dict], script: Script) -> int:
        n = TEMPLATE
        for m in messages:
            content = m.get("content") or ""
            if script.tokenizer and self.tokenizer is not None:
                n += len(self.tokenizer.encode(content, add_special_tokens=False).ids)
            else:
                n += len(content.split())
        return n

    def token(self, i: int, script: Script) -> tuple[str, int]:
        if script.tokenizer:
            if not self.vocab_words:
                raise web.HTTPBadRequest(text="this script needs the server started with --tokenizer")
            word, tid = self.vocab_words[(i * 7) % len(self.vocab_words)]
            return " " + word, tid
        return " " + WORDS[i % len(WORDS)], 1000 + i % len(WORDS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        t0 = asyncio.get_running_loop().time()
        script = Script.parse(request.match_info["script"])
        body = await request.json()
        prompt = self.prompt_tokens(body.get("messages") or [], script)
        n = int(body.get("max_tokens") or 16)
        base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": MODEL}
        if not body.get("stream"):
            text, _ = self.token(0, script)
            return web.json_response({
                **base, "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}})
        timeline = [t0, n, None, None]
        self.sent.setdefault(request.match_info["script"], []).append(timeline)
        ids = script.token_ids and bool(body.get("return_token_ids"))
        usage = script.usage and bool((body.get("stream_options") or {}).get("include_usage"))
        key = "reasoning_content" if script.reasoning else "content"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        role = {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                     "finish_reason": None}]}
        if script.role_first:
            await resp.write(_sse(role))  # as the headers go out, long before any token
        prefill = prompt / script.prefill_tps
        sizes = script.chunk_sizes(n)
        sent = after_first = 0
        for j, size in enumerate(sizes):
            if j:
                after_first += size
            await _until(t0 + prefill + after_first / script.decode_tps)
            tokens = [self.token(i, script) for i in range(sent, sent + size)]
            sent += size
            choice: dict = {"index": 0, "delta": {key: "".join(t for t, _ in tokens)}, "logprobs": None,
                            "finish_reason": "length" if sent == n else None}
            if ids:
                choice["token_ids"] = [tid for _, tid in tokens]
            parts = []
            if j == 0 and not script.role_first:  # vLLM's role chunk, with the first token
                parts.append(_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                        "logprobs": None, "finish_reason": None}]}))
            parts.append(_sse({**base, "choices": [choice]}))
            timeline[2 if j == 0 else 3] = asyncio.get_running_loop().time()
            await resp.write(b"".join(parts))
        if usage:
            await resp.write(_sse({**base, "choices": [], "usage": {
                "prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@contextlib.asynccontextmanager
async def serving(tokenizer: str | Path | None = None) -> AsyncIterator[tuple[str, StreamServer]]:
    """The server on the running loop, on a free port of 127.0.0.1: `(http://host:port, the StreamServer)`,
    whose `sent` is its log of what it streamed when. Stopped after."""
    server = StreamServer(str(tokenizer) if tokenizer is not None else None)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        await runner.cleanup()


def start_stream_server(tokenizer: str | Path | None = None, port: int | None = None
                        ) -> tuple[subprocess.Popen, str]:
    """The server in its own process (its timing is not at the mercy of the
    client's event loop), started and answering; (process, http://host:port)."""
    import httpx

    from tests.conftest import free_port

    port = port or free_port()
    cmd = [sys.executable, "-m", "tests.helpers.stream_server", "--port", str(port)]
    if tokenizer is not None:
        cmd += ["--tokenizer", str(tokenizer)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the stream server exited: {(proc.stderr.read() if proc.stderr else '')[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the stream server did not start on port {port}")


@contextlib.contextmanager
def stream_server(tokenizer: str | Path | None = None) -> Iterator[str]:
    """`with stream_server() as base: Script(...).url(base)`."""
    proc, url = start_stream_server(tokenizer)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokenizer", help="a tokenizer.json, for scripts with tokenizer=1")
    args = parser.parse_args()
    web.run_app(StreamServer(args.tokenizer).app(), host=args.host, port=args.port, print=None,
                access_log=None)


if __name__ == "__main__":
    main()
