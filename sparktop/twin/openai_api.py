"""The OpenAI-compatible API every dialect serves: /v1/models,
/v1/chat/completions and /v1/completions (SSE streaming with
`stream_options.include_usage` and `continuous_usage_stats`, and not),
in its dialect's words.

`OpenAIRoutes` is a mixin for TwinServer: the handlers read the server's
args, card, tokenizer, plan, engine, metrics and log, which exist once
start-up has reached the API server stage. The dialect adds its own routes
first (`Dialect.routes`: health, metrics, version, vLLM's sleep routes,
SGLang's and llama.cpp's native ones) and says what is its own: the model
list, the errors (`too_long`, `invalid`, `unparsable`, `unknown_model`),
the admission check (`admit`: vLLM's queue limits), the completion default
(`completion_max_tokens`), the fingerprint and what usage objects and last
chunks carry beyond OpenAI's. llama.cpp answers chat and completions with
its own handlers (its dialect's middleware), so what reaches these is vLLM,
SGLang and TensorRT-LLM.

What is not yet any dialect's: the bodies' keys and their order, and the
order of the checks (`_max_tokens`), are vLLM 0.32's (a streamed chat opens
with a role chunk carrying `prompt_token_ids` and `prompt_text`, every
choice carries `token_ids`, the last one `stop_reason`, `system_fingerprint`
rides on the usage chunk or on the finish chunk when there is none), and
the SGLang and TensorRT-LLM twins answer with them too. Every response
carries an `X-Sparktop-Twin` header (sparktop's version) to tell the twin
apart.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO, cast

from aiohttp import web

from sparktop import __version__
from sparktop.clock import Clock
from sparktop.twin.dialects.base import TWIN, openai_error
from sparktop.twin.engine import BLOCK, FinishEvent, Sequence, TokenEvent
from sparktop.twin.text import OutputText, Tokenizer, chat_prompt_ids, natural_lengths

if TYPE_CHECKING:
    from sparktop.model.cards import ModelCard
    from sparktop.twin.args import ServeArgs
    from sparktop.twin.dialects.base import Dialect, TwinLog, TwinMetrics
    from sparktop.twin.engine import Engine
    from sparktop.twin.server import TwinServer
    from sparktop.twin.startup import StartupPlan

TWIN_HEADER = "X-Sparktop-Twin"
HANG_ROUTE = "/twin/hang"  # the twin's own route (no engine has it): POST hangs its engine, {"hung": false} frees it
STALL_ROUTE = "/twin/stall"  # the twin's own too: POST {"after": N} stalls every stream after N tokens, null frees


@dataclass
class _Request:
    """What one generation request asked for, beyond its tokens."""

    chat: bool
    stream: bool
    include_usage: bool
    continuous: bool
    token_ids: bool
    prompt_ids: list[int]
    received: float = 0.0  # when the handler began (monotonic), for --request-log
    first_sent: float | None = None  # when the first token's chunk was written
    last_sent: float | None = None  # when the last chunk was written, before the stream closes


class OpenAIRoutes:
    """The request handlers of a TwinServer."""

    # The server's state the handlers read (TwinServer.__init__ sets it;
    # engine, metrics and plan exist once start-up reaches the API server).
    args: ServeArgs
    card: ModelCard
    dialect: Dialect
    log: TwinLog
    tokenizer: Tokenizer
    engine: Engine | None
    metrics: TwinMetrics | None
    plan: StartupPlan | None
    speed: float
    failure: str | None
    _ids: itertools.count[int]
    _created: int
    clock: Clock
    _request_log: TextIO | None = None  # --request-log, opened at the first request

    @property
    def _twin(self) -> TwinServer:
        return cast("TwinServer", self)  # the mixin is only ever part of a TwinServer

    def _application(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[TWIN] = self
        app.on_response_prepare.append(self._mark_twin)
        self.dialect.routes(app, self._twin)  # its own: health, metrics, version, info, sleep routes
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        # The twin's own, in every dialect: make its engine hang (and let it go), for a watchdog to catch.
        app.router.add_get(HANG_ROUTE, self.hang_state)
        app.router.add_post(HANG_ROUTE, self.hang)
        app.router.add_get(STALL_ROUTE, self.stall_state)
        app.router.add_post(STALL_ROUTE, self.stall)
        return app

    async def _mark_twin(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[TWIN_HEADER] = __version__
        if self.dialect.server_header:
            response.headers["Server"] = self.dialect.server_header

    def _authorized(self, request: web.Request) -> bool:
        key = self.args.api_key
        if not key or not request.path.startswith("/v1"):
            return True
        return request.headers.get("Authorization", "") == f"Bearer {key}"

    def _access(self, request: web.Request, status: int) -> None:
        self.dialect.access(self._twin, request, status)

    @property
    def system_fingerprint(self) -> str | None:
        """The fingerprint its responses carry, as its dialect builds it (vLLM's `full` one), or none."""
        return self.dialect.fingerprint(self._twin)

    # -- small routes -------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        self._access(request, 200)
        return web.json_response(self.dialect.models_body(self._twin))

    # -- the twin's own -------------------------------------------------------------

    async def hang(self, request: web.Request) -> web.Response:
        """`POST /twin/hang`: the engine stops making tokens (`Engine.hang`) while every route, /health too,
        answers as before; a body `{"hung": false}` lets it go again. Answers `{"hung": ...}`."""
        engine = self.engine
        assert engine is not None, "the API server starts after the engine"
        on = True
        if request.can_read_body:
            try:
                body = await request.json()
            except (ValueError, UnicodeDecodeError):
                body = None
            if not isinstance(body, dict) or not isinstance(body.get("hung", True), bool):
                return web.json_response({"error": 'expected no body or {"hung": true|false}'}, status=400)
            on = body.get("hung", True)
        engine.hang(on)
        return web.json_response({"hung": engine.hung})

    async def hang_state(self, request: web.Request) -> web.Response:
        engine = self.engine
        return web.json_response({"hung": bool(engine and engine.hung)})

    async def stall(self, request: web.Request) -> web.Response:
        """`POST /twin/stall`: every stream stalls once it has made `after` tokens (`Engine.stall`; no body: 1),
        the rest served as before; `{"after": null}` lets them go on. Answers `{"after": ...}`."""
        engine = self.engine
        assert engine is not None, "the API server starts after the engine"
        after: object = 1
        if request.can_read_body:
            try:
                body = await request.json()
            except (ValueError, UnicodeDecodeError):
                body = None
            after = body.get("after", 1) if isinstance(body, dict) else "?"
            if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 1):
                return web.json_response({"error": 'expected no body or {"after": N (1 or more) | null}'},
                                         status=400)
        engine.stall(cast("int | None", after))
        return web.json_response({"after": engine.stall_after})

    async def stall_state(self, request: web.Request) -> web.Response:
        engine = self.engine
        return web.json_response({"after": engine.stall_after if engine is not None else None})

    # -- generation -------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    def _prompt(self, body: dict, chat: bool) -> tuple[list[int], bool, str] | web.Response:
        """(token ids, whether they were tokenized from text, seed text), or an error."""
        say = self.dialect
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list):
                return say.unparsable("body.messages", "list_type", "Input should be a valid list", messages)
            if not messages:
                return openai_error(400, "messages must be a non-empty list", "BadRequestError", "messages")
            return (chat_prompt_ids(messages, self.tokenizer, self.card.chat_overhead_tokens), True,
                    json.dumps(messages, sort_keys=True))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt), False, str(prompt)
        if isinstance(prompt, str):
            return [1] + self.tokenizer.encode(prompt), True, prompt
        return openai_error(400, "prompt must be a string or a list of token ids", "BadRequestError", "prompt")

    def _max_tokens(self, body: dict, prompt_len: int, from_text: bool, chat: bool = True) -> int | web.Response:
        """vLLM 0.32's checks, in its order (the dialects that reach here keep it; each words its errors): the
        max_tokens parameter, then the prompt's length; then max_tokens is clamped to what the context leaves."""
        say = self.dialect
        max_len = self.plan.max_model_len if self.plan else 0
        requested = body.get("max_completion_tokens")
        if requested is None:
            requested = body.get("max_tokens")
        if requested is None and not chat:
            requested = say.completion_max_tokens
        if requested is not None:
            if not isinstance(requested, int) or isinstance(requested, bool):
                return say.unparsable("body.max_tokens", "int_type", "Input should be a valid integer", requested)
            if requested < 1:
                return say.invalid(f"max_tokens must be at least 1, got {requested}.", "max_tokens", requested)
            if requested > max_len:
                return say.invalid(f"max_tokens={requested} cannot be greater than max_model_len={max_len}. "
                                   "Please request fewer output tokens.", "max_tokens", requested)
        if prompt_len > max_len:
            return say.too_long(self._twin, prompt_len, max_len, from_text)
        room = max_len - prompt_len
        if room < 1:
            return say.invalid(f"max_tokens must be at least 1, got {room}.", "max_tokens", room)
        return room if requested is None else min(requested, room)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        engine, plan = self.engine, self.plan
        assert engine is not None and plan is not None, "the API server starts after the engine"
        if not self._authorized(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        received = self.clock.now()
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "msg", "Invalid JSON")
            return self.dialect.unparsable("body.0", "json_invalid", "JSON decode error", "<dict of 0 items>",
                                           {"error": reason})
        if not isinstance(body, dict):
            return self.dialect.unparsable("body", "model_attributes_type", "Input should be a valid dictionary or "
                                           "object to extract fields from", body)
        model = body.get("model")
        if model not in (None, self.args.name):
            refused = self.dialect.unknown_model(self._twin, str(model))
            if refused is not None:
                return refused
        failure = self.failure or engine.failed
        if failure:
            return openai_error(500, failure, "InternalServerError")
        prompt = self._prompt(body, chat)
        if isinstance(prompt, web.Response):
            return prompt
        prompt_ids, from_text, seed_text = prompt
        max_tokens = self._max_tokens(body, len(prompt_ids), from_text, chat)
        if isinstance(max_tokens, web.Response):
            return max_tokens
        rejected = self.dialect.admit(self._twin)
        if rejected is not None:
            return rejected
        effort = body.get("reasoning_effort") or (body.get("chat_template_kwargs") or {}).get("reasoning_effort")
        seed = zlib.crc32(seed_text.encode()) ^ next(self._ids)
        natural, think = natural_lengths(seed, self.card.reasoning and chat, effort)
        seq = Sequence(
            request_id=f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(8)}",
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            min_tokens=int(body.get("min_tokens") or 0),
            ignore_eos=bool(body.get("ignore_eos", False)),
            natural_len=natural,
        )
        out = OutputText(seed, think, self.card.vocab_size)
        opts = body.get("stream_options") or {}
        req = _Request(chat=chat, stream=bool(body.get("stream", False)),
                       include_usage=bool(opts.get("include_usage")),
                       continuous=bool(opts.get("continuous_usage_stats")),
                       token_ids=bool(body.get("return_token_ids")), prompt_ids=prompt_ids, received=received)
        seq.stream = req.stream
        await self._charge_api(received)
        engine.submit(seq)
        try:
            if req.stream:
                return await self._stream(request, seq, out, req)
            return await self._complete(request, seq, out, req)
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
            if self.args.request_log:
                self._log_request(self.args.request_log, seq, req)

    async def _charge_api(self, received: float) -> None:
        """The API server's cost of a generation request (parsing, the chat template, tokenizing), slept before
        the engine sees it. The model (`sparktop.model.simulate.predict`) charges `request_overhead_s` per request
        whatever the runtime, so every dialect's generation path calls this just before `engine.submit`. The
        handling since `received` (its handler's start, on `self.clock`) counts toward it: none on a virtual
        clock, a few milliseconds on the machine's."""
        assert self.plan is not None, "the API server starts after the plan"
        api = self.plan.perf.k.request_overhead_s / self.speed - (self.clock.now() - received)
        if api > 0:
            await asyncio.sleep(api)

    def _log_request(self, path: str, seq: Sequence, req: _Request) -> None:
        """`--request-log`: what the server saw of one request, on the server's clock (`TwinServer.clock`:
        the machine's monotonic one unless a test gives another). `received` is when its handler began
        (headers read); `first_sent` less `received` is the first token as the server delivered it (body read
        and tokenized, scheduled, prefilled, written), so a client's TTFT adds only its own work and the
        connection's. `arrival` to `first_token` is the engine's part alone. A
        request aborted mid-stream has no `last_sent`."""
        line = {"id": seq.request_id, "stream": req.stream, "prompt_tokens": seq.prompt_len,
                "cached_tokens": seq.cached_tokens, "max_tokens": seq.max_tokens, "output_tokens": seq.output_count,
                "received": req.received, "arrival": seq.arrival, "first_token": seq.first_token_t,
                "first_sent": req.first_sent, "last_sent": req.last_sent}
        if self._request_log is None:  # opened once, line-buffered: each line whole on disk as it is written
            self._request_log = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - the server's life
        self._request_log.write(json.dumps(line) + "\n")

    # -- bodies ------------------------------------------------------------------------

    def _chunk(self, seq: Sequence, req: _Request, choices: list[dict], **extra: object) -> bytes:
        data: dict[str, object] = {
            "id": seq.request_id,
            "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": int(self.clock.wall()),
            "model": self.args.name,
            "choices": choices,
            **extra,
        }
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    def _prompt_details(self, seq: Sequence, chat: bool, stream: bool) -> dict | None:
        """`prompt_tokens_details`, only with --enable-prompt-tokens-details (as in
        vLLM); the tokens a prefill wrote to the prefix cache with the chat API."""
        if not self.args.enable_prompt_tokens_details:
            return None
        created = None
        if chat:
            full = (seq.prompt_len // BLOCK) * BLOCK if self.args.enable_prefix_caching else 0
            created = max(0, full - seq.cached_tokens)
        details: dict[str, object] = {"cached_tokens": seq.cached_tokens, "created_cache_tokens": created,
                                      "multimodal_tokens": None}
        if stream:  # the usage chunk is dumped without its nulls
            details = {k: v for k, v in details.items() if v is not None}
        return details

    def _usage(self, seq: Sequence, req: _Request, completion: int, final: bool) -> dict:
        """A usage object as each place in vLLM builds it."""
        usage: dict[str, object] = {"prompt_tokens": seq.prompt_len, "total_tokens": seq.prompt_len + completion,
                                    "completion_tokens": completion, **self.dialect.usage_extra(self._twin)}
        if not req.stream:
            usage["prompt_tokens_details"] = self._prompt_details(seq, req.chat, False)
            usage["completion_tokens_details"] = None
        elif final:
            details = self._prompt_details(seq, req.chat, True)
            if details is not None:
                usage["prompt_tokens_details"] = details
        elif req.chat:  # continuous usage in a chat stream names it, as null
            usage["completion_tokens_details"] = None
        return usage

    def _delta(self, text: str, reasoning: bool) -> dict:
        # vLLM 0.32 names it `reasoning`; see dialects/vllm_differences.py for why the stream
        # still says `reasoning_content`.
        return {"reasoning_content": text} if reasoning else {"content": text}

    def _choice(self, req: _Request, text: str, reasoning: bool, tid: int | None, finish: str | None,
                first: bool) -> dict:
        """One streamed choice: a token (tid) or, with tid None, an empty finish."""
        choice: dict[str, object] = {"index": 0}
        if req.chat:
            choice["delta"] = self._delta(text, reasoning)
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        if finish is not None or not req.chat:
            choice["stop_reason"] = None
        if not req.chat:
            choice["prompt_token_ids"] = req.prompt_ids if first and req.token_ids else None
        choice["token_ids"] = [tid] if req.token_ids and tid is not None else None
        return choice

    def _role_chunk(self, seq: Sequence, req: _Request) -> bytes:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        extra: dict[str, object] = {}
        if req.continuous:
            extra["usage"] = self._usage(seq, req, 0, final=False)
        extra["prompt_token_ids"] = req.prompt_ids if req.token_ids else None
        extra["prompt_text"] = None
        return self._chunk(seq, req, [choice], **extra)

    def _token_chunk(self, seq: Sequence, req: _Request, choice: dict, completion: int) -> bytes:
        extra: dict[str, object] = {}
        if choice["finish_reason"] is not None and not req.include_usage:
            extra["system_fingerprint"] = self.system_fingerprint
            extra.update(self.dialect.final_chunk_extra(self._twin, seq, completion))
        if req.continuous:
            extra["usage"] = self._usage(seq, req, completion, final=False)
        return self._chunk(seq, req, [choice], **extra)

    async def _stream(self, request, seq: Sequence, out: OutputText, req: _Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        self._access(request, 200)
        index = 0
        finished = False
        while True:
            event = await seq.events.get()
            if isinstance(event, TokenEvent):
                parts = []
                if event.first and req.chat:
                    parts.append(self._role_chunk(seq, req))
                for _ in range(event.count):
                    text, tid, reasoning = out.token(index)
                    choice = self._choice(req, text, reasoning, tid, event.finish, first=index == 0)
                    index += 1
                    parts.append(self._token_chunk(seq, req, choice, index))
                finished = finished or event.finish is not None
                await resp.write(b"".join(parts))
                if req.first_sent is None and event.count:
                    req.first_sent = self.clock.now()
            elif isinstance(event, FinishEvent):
                # Taken before the last chunk goes out: a request the client sends once it has read it is
                # received later, whatever the write waits for.
                req.last_sent = self.clock.now()
                await resp.write(self._stream_end(seq, req, event, finished))
                break
        await resp.write_eof()
        return resp

    def _stream_end(self, seq: Sequence, req: _Request, event: FinishEvent, finished: bool) -> bytes:
        """The finish chunk (when no token carried it), the usage chunk, [DONE]."""
        if event.reason == "error":
            err = {"error": {"message": event.message, "type": "InternalServerError", "param": None, "code": 500}}
            return b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n"
        parts = []
        if not finished:
            choice = self._choice(req, "", False, None, event.reason, first=event.completion_tokens == 0)
            parts.append(self._token_chunk(seq, req, choice, event.completion_tokens))
        if req.include_usage:
            parts.append(self._chunk(seq, req, [], usage=self._usage(seq, req, event.completion_tokens, final=True),
                                     system_fingerprint=self.system_fingerprint,
                                     **self.dialect.final_chunk_extra(self._twin, seq, event.completion_tokens)))
        parts.append(b"data: [DONE]\n\n")
        return b"".join(parts)

    async def _complete(self, request, seq: Sequence, out: OutputText, req: _Request) -> web.Response:
        while True:
            event = await seq.events.get()
            if isinstance(event, FinishEvent):
                break
        if event.reason == "error":
            return openai_error(500, event.message, "InternalServerError")
        texts = [out.token(i) for i in range(event.completion_tokens)]
        token_ids = [tid for _, tid, _ in texts] if req.token_ids else None
        prompt_ids = req.prompt_ids if req.token_ids else None
        self._access(request, 200)
        usage = self._usage(seq, req, event.completion_tokens, final=True)
        if req.chat:
            reasoning = "".join(t for t, _, r in texts if r)
            content = "".join(t for t, _, r in texts if not r)
            message = {"role": "assistant", "content": content or None, "refusal": None, "annotations": None,
                       "audio": None, "function_call": None, "reasoning": reasoning or None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": event.reason,
                      "stop_reason": None, "token_ids": token_ids, "routed_experts": None}
            tail = {"prompt_logprobs": None, "prompt_token_ids": prompt_ids, "prompt_text": None}
        else:
            choice = {"index": 0, "text": "".join(t for t, _, _ in texts), "logprobs": None,
                      "finish_reason": event.reason, "stop_reason": None, "token_ids": token_ids,
                      "prompt_logprobs": None, "prompt_token_ids": prompt_ids, "routed_experts": None}
            tail = {}
        return web.json_response({
            "id": seq.request_id, "object": "chat.completion" if req.chat else "text_completion",
            "created": int(self.clock.wall()), "model": self.args.name, "choices": [choice], "service_tier": None,
            "system_fingerprint": self.system_fingerprint, "usage": usage, **tail,
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
        })

