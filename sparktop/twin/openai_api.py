"""The twin's OpenAI-compatible HTTP API, as vLLM's API server answers it.

Routes: /health, /ping, /version, /load, /metrics, /v1/models,
/v1/chat/completions and /v1/completions (SSE streaming with
`stream_options.include_usage`, and not), with vLLM's error JSON, chunk and
usage shapes. `OpenAIRoutes` is a mixin for TwinServer: the handlers read the
server's args, card, tokenizer, plan, engine, metrics and log, which exist
once start-up has reached the API server stage.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
import zlib
from typing import TYPE_CHECKING

from aiohttp import web

from sparktop import __version__
from sparktop.twin.engine import FinishEvent, Sequence, TokenEvent
from sparktop.twin.text import OutputText, Tokenizer, chat_prompt_ids, natural_lengths

if TYPE_CHECKING:
    from sparktop.model.cards import ModelCard
    from sparktop.twin.args import ServeArgs
    from sparktop.twin.engine import Engine
    from sparktop.twin.metrics import VllmMetrics
    from sparktop.twin.startup import StartupPlan
    from sparktop.twin.vlog import VllmLog

VLLM_VERSION = f"0.20.1+sparktop.twin{__version__.replace('.', '')}"


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status=status
    )


class OpenAIRoutes:
    """The request handlers of a TwinServer."""

    # The server's state the handlers read (TwinServer.__init__ sets it;
    # engine, metrics and plan exist once start-up reaches the API server).
    args: ServeArgs
    card: ModelCard
    log: VllmLog
    tokenizer: Tokenizer
    engine: Engine | None
    metrics: VllmMetrics | None
    plan: StartupPlan | None
    speed: float
    failure: str | None
    _ids: itertools.count[int]
    _created: int

    def _application(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/load", self.load)
        app.router.add_get("/metrics", self.metrics_route)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        return app

    def _authorized(self, request: web.Request) -> bool:
        key = self.args.api_key
        if not key or not request.path.startswith("/v1"):
            return True
        return request.headers.get("Authorization", "") == f"Bearer {key}"

    def _access(self, request: web.Request, status: int) -> None:
        peer = request.remote or "-"
        self.log.raw(f'INFO:     {peer} - "{request.method} {request.path} HTTP/1.1" {status} '
                     f'{"OK" if status == 200 else ""}'.rstrip())

    async def health(self, request: web.Request) -> web.Response:
        if self.failure:
            return web.Response(status=503)
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def load(self, request: web.Request) -> web.Response:
        engine = self.engine
        assert engine is not None, "the API server starts after the engine"
        return web.json_response({"server_load": len(engine.running) + len(engine.waiting)})

    async def metrics_route(self, request: web.Request) -> web.Response:
        engine, metrics = self.engine, self.metrics
        assert engine is not None and metrics is not None, "the API server starts after the engine"
        metrics.set_idle(len(engine.running), len(engine.waiting), engine.kv_usage)
        return web.Response(body=metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        self._access(request, 200)
        assert self.plan is not None, "the API server starts after the plan"
        return web.json_response({"object": "list", "data": [{
            "id": self.args.name, "object": "model", "created": self._created, "owned_by": "vllm",
            "root": self.args.model, "parent": None, "max_model_len": self.plan.max_model_len,
        }]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        engine, plan = self.engine, self.plan
        assert engine is not None and plan is not None, "the API server starts after the engine"
        if not self._authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "The request body is not valid JSON.", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.", "BadRequestError")
        model = body.get("model")
        if model not in (None, self.args.name):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        failure = self.failure or engine.failed
        if failure:
            return _error(500, failure, "InternalServerError")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "messages must be a non-empty list", "BadRequestError", "messages")
            prompt_ids = chat_prompt_ids(messages, self.tokenizer, self.card.chat_overhead_tokens)
            seed_text = json.dumps(messages, sort_keys=True)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                prompt_ids = list(prompt)
            elif isinstance(prompt, str):
                prompt_ids = [1] + self.tokenizer.encode(prompt)
            else:
                return _error(400, "prompt must be a string or a list of token ids", "BadRequestError", "prompt")
            seed_text = str(prompt)
        max_len = plan.max_model_len
        prompt_len = len(prompt_ids)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is None:
            max_tokens = max_len - prompt_len
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, f"max_tokens must be at least 1, got {max_tokens}.", "BadRequestError", "max_tokens")
        if prompt_len + max_tokens > max_len:
            return _error(400, (
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."), "BadRequestError")
        effort = body.get("reasoning_effort") or (body.get("chat_template_kwargs") or {}).get("reasoning_effort")
        seed = zlib.crc32(seed_text.encode()) ^ next(self._ids)
        natural, think = natural_lengths(seed, self.card.reasoning and chat, effort)
        seq = Sequence(
            request_id=f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(16)}",
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            min_tokens=int(body.get("min_tokens") or 0),
            ignore_eos=bool(body.get("ignore_eos", False)),
            natural_len=natural,
        )
        out = OutputText(seed, think, self.card.vocab_size)
        engine.submit(seq)
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        try:
            if stream:
                return await self._stream(request, seq, out, chat, bool(opts.get("include_usage")),
                                          bool(opts.get("continuous_usage_stats")),
                                          bool(body.get("return_token_ids")))
            return await self._complete(request, seq, out, chat, bool(body.get("return_token_ids")))
        except ConnectionResetError:
            # The client went away mid-stream: what it asked for is dropped, as in vLLM.
            engine.abort(seq)
            return web.Response(status=499)
        except asyncio.CancelledError:
            engine.abort(seq)
            raise
        finally:
            if not seq.finished:
                engine.abort(seq)

    def _chunk(self, seq: Sequence, chat: bool, choice: dict | None, usage: dict | None = None) -> bytes:
        data: dict[str, object] = {
            "id": seq.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.args.name,
            "choices": [choice] if choice is not None else [],
        }
        if usage is not None:
            data["usage"] = usage
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    @staticmethod
    def _usage(prompt: int, completion: int, cached: int) -> dict:
        usage: dict[str, int | dict[str, int]] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                                  "completion_tokens": completion}
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    async def _stream(self, request, seq: Sequence, out: OutputText, chat: bool, include_usage: bool,
                      continuous: bool, token_ids: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        self._access(request, 200)
        index = 0
        token_finish = None
        while True:
            event = await seq.events.get()
            if isinstance(event, TokenEvent):
                parts = []
                if event.first and chat:
                    parts.append(self._chunk(seq, chat, {
                        "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None}))
                for _ in range(event.count):
                    text, tid, reasoning = out.token(index)
                    index += 1
                    if chat:
                        delta = {"reasoning_content": text} if reasoning else {"content": text}
                        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                    else:
                        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
                    if token_ids:
                        choice["token_ids"] = [tid]
                    if event.finish:
                        choice["finish_reason"] = token_finish = event.finish
                    usage = self._usage(seq.prompt_len, index, seq.cached_tokens) if continuous else None
                    parts.append(self._chunk(seq, chat, choice, usage))
                await resp.write(b"".join(parts))
            elif isinstance(event, FinishEvent):
                if event.reason == "error":
                    err = {"error": {"message": event.message, "type": "InternalServerError", "code": 500}}
                    await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                else:
                    if token_finish is None:
                        final = ({"index": 0, "delta": {}, "logprobs": None, "finish_reason": event.reason}
                                 if chat else {"index": 0, "text": "", "logprobs": None,
                                               "finish_reason": event.reason})
                        await resp.write(self._chunk(seq, chat, final))
                    if include_usage:
                        await resp.write(self._chunk(
                            seq, chat, None, self._usage(event.prompt_tokens, event.completion_tokens,
                                                         event.cached_tokens)))
                await resp.write(b"data: [DONE]\n\n")
                break
        await resp.write_eof()
        return resp

    async def _complete(self, request, seq: Sequence, out: OutputText, chat: bool, token_ids: bool) -> web.Response:
        while True:
            event = await seq.events.get()
            if isinstance(event, FinishEvent):
                break
        if event.reason == "error":
            return _error(500, event.message, "InternalServerError")
        texts = [out.token(i) for i in range(event.completion_tokens)]
        reasoning = "".join(t for t, _, r in texts if r)
        content = "".join(t for t, _, r in texts if not r)
        if chat:
            message = {"role": "assistant", "content": content or None}
            if reasoning:
                message["reasoning_content"] = reasoning
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": event.reason}
        else:
            choice = {"index": 0, "text": reasoning + content, "logprobs": None, "finish_reason": event.reason}
        if token_ids:
            choice["token_ids"] = [tid for _, tid, _ in texts]
        self._access(request, 200)
        return web.json_response({
            "id": seq.request_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": self.args.name, "choices": [choice],
            "usage": self._usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens),
        })
