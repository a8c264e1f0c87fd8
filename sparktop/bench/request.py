"""One streaming chat request, timed the way llama-benchy times it.

Per request we keep the start, the first response chunk, the first token
(the first chunk that carries one: content, `reasoning_content`,
`reasoning` or token ids — an empty `{"role": "assistant"}` chunk sent
before prefill is a response, not a token), a timestamp per token, the end
of the stream and the server's `usage`.

How many tokens each chunk holds, best source first (`counted_by`):

- `token_ids` on every chunk that carries tokens (vLLM with `return_token_ids`);
- `usage.completion_tokens` spread over the chunks in whole tokens — in
  proportion to the local tokenizer's count of each chunk's text when there
  is one (`--tokenizer`), else evenly;
- the local tokenizer's count of each chunk's text (no usage, no ids);
- one per chunk (`chunks`: an approximation, said so by the level).

A chunk's tokens are stamped between the previous chunk and its own arrival,
the first chunk's all at its arrival, so a request's decode rate is the
tokens after the first chunk over the time from the first chunk to the
last: exact however many tokens a chunk holds (speculative decoding, vLLM's
`--stream-interval`, proxies that batch chunks). llama-benchy instead
interpolates usage (or its tokenizer's) count evenly over that span and so
counts N-1 tokens where the span holds N-k; `decode_tokens_llama_benchy`
keeps its count, to compare like with like.

The hot loop is per network read, not per token, and touches as little
Python as it can (`sse.py`): the client must never be what limits a
measurement. Chunk bodies are kept only with a local tokenizer, and parsed
only after the stream, when no token ids came back.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import re
from dataclasses import asdict, dataclass, field

from sparktop.bench.prompts import LocalTokenizer, tokens_per_piece
from sparktop.bench.sse import HTTPError, post_sse
from sparktop.clock import SYSTEM, Clock

_loads = json.JSONDecoder().decode  # str in: skips json.loads' encoding sniffing per chunk

# The fast path for the chunks that carry tokens (all but the last one or
# two): three byte searches instead of a JSON parse. Quotes inside JSON
# strings are escaped, so these keys cannot be matched inside a text value.
_CHOICE = re.compile(rb'"choices"\s*:\s*\[\s*\{')
_TEXT = re.compile(rb'"(?:content|reasoning_content|reasoning)"\s*:\s*"(?!")')
_IDS = re.compile(rb'"token_ids"\s*:\s*\[([^\]]*)\]')


def scan(body: bytes) -> tuple[bool, bool, int | None] | None:
    """(has a choice, has text, token ids or None) — or None when the chunk
    needs a real parse (usage, an error, anything unusual)."""
    if b'"usage"' in body or b'"error"' in body:
        return None
    if _CHOICE.search(body) is None:
        return None
    has_text = _TEXT.search(body) is not None
    m = _IDS.search(body)
    if m is None:
        return True, has_text, None
    ids = m.group(1).strip()
    return True, has_text, (ids.count(b",") + 1 if ids else 0)


TIMINGS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n")


def now() -> float:
    """The machine's time as records carry it (`Clock.stamp`: wall seconds, steady and fine-grained)."""
    return SYSTEM.stamp()


@dataclass
class RequestRecord:
    """What one request did. Times are wall-clock seconds (float)."""

    level: int  # concurrency of its batch
    run: int  # 1-based batch number within the level
    index: int  # position within the batch
    attempt: int = 1  # which sweep session wrote it (resume adds one)
    start: float = 0.0
    first_response: float | None = None
    first_token: float | None = None
    end: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    status: int | None = None
    error: str | None = None
    timed_out: bool = False
    # How the tokens per chunk were known: "token_ids", "usage" (spread evenly),
    # "usage+tokenizer" (spread by the local count), "tokenizer", "chunks" (one
    # per chunk: approximate); "" in records written before it was kept.
    counted_by: str = ""
    # Tokens (known by their ids) in chunks after the first that streamed no
    # text: vLLM sends `"content": ""` for a token that ends inside a UTF-8
    # character (CJK, emoji, byte-level noise). They are generated tokens and
    # count here; llama-benchy 0.4.0 drops chunks without text, and so them.
    textless_tokens: int = 0
    # The engine's own account of the request where it sends one (llama.cpp's `timings` on its last chunk):
    # prompt_n, prompt_ms, predicted_n, predicted_ms, cache_n. None: the engine sends none.
    server_timings: dict[str, float] | None = None
    # A rate sweep's (bench/load.py): the request rate of its level (None: a lockstep batch, or a replayed
    # trace), when it was due to leave (wall seconds), how long it waited for a slot under
    # --max-concurrency, and the context tokens before its prompt.
    rate: float | None = None
    scheduled: float | None = None
    held_s: float = 0.0
    depth: int = 0
    # Prompt tokens served from the engine's prefix cache: as the server says (usage.prompt_tokens_details,
    # vLLM with --enable-prompt-tokens-details), else the shared context the sweep sent before (None: none).
    cached_tokens: int | None = None
    # A depth level with --prefix-cache on: the request that loaded a context into the engine's cache
    # before the measured one sent it again (llama-benchy's "context load"; Spark Arena's ctx rows).
    context_load: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def last_token(self) -> float | None:
        return self.token_times[-1] if self.token_times else None

    @property
    def decode_tokens(self) -> int:
        """Tokens stamped after the first one: those that came after the
        first chunk (all of its tokens carry its arrival time)."""
        times = self.token_times
        if len(times) < 2:
            return 0
        # Times are in arrival order: the ones after the first stamp.
        return len(times) - bisect.bisect_right(times, times[0])

    @property
    def decode_tokens_llama_benchy(self) -> int:
        """llama-benchy's count over the same span: when it had no token ids it
        spread the count evenly from the first chunk to the last, so every
        token but the first is a decode token, however many the first chunk
        held; with token ids it skipped the chunks that streamed no text."""
        times = self.token_times
        if self.counted_by in INTERPOLATED_BY_LLAMA_BENCHY:
            return len(times) - 1 if len(times) > 1 and times[-1] > times[0] else 0
        return max(0, self.decode_tokens - self.textless_tokens)

    @property
    def approximate(self) -> bool:
        """Counted one token per chunk: the server said nothing better."""
        return self.counted_by == "chunks"

    def to_json(self) -> str:
        d = asdict(self)
        # Token times relative to the start, in microseconds: a third of the
        # bytes and no loss that matters.
        d["token_times"] = [round((t - self.start) * 1e6) for t in self.token_times]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> RequestRecord:
        rec = cls(**{k: v for k, v in d.items() if k in _FIELDS and k != "token_times"})
        rec.token_times = [rec.start + us / 1e6 for us in d.get("token_times") or []]
        return rec


_FIELDS = set(RequestRecord.__dataclass_fields__)
INTERPOLATED_BY_LLAMA_BENCHY = frozenset({"usage", "usage+tokenizer", "tokenizer"})


def spread(times: list[float], counts: list[int], start: float) -> list[float]:
    """One timestamp per token: a chunk of n tokens spreads them evenly
    between the previous chunk and its own arrival (the first chunk's all at
    its arrival when `start` is its time)."""
    out: list[float] = []
    last = start
    for t, n in zip(times, counts, strict=False):
        if n == 1:
            out.append(t)
        elif n > 1:
            step = (t - last) / n
            out.extend(last + step * (i + 1) for i in range(n - 1))
            out.append(t)
        last = t
    return out


def apportion(total: int, weights: list[int]) -> list[int]:
    """`total` tokens over chunks in proportion to `weights`, in whole tokens
    (cumulative rounding, so they add up); evenly when the weights are all 0."""
    if not weights:
        return []
    whole = sum(weights)
    if whole <= 0:
        weights, whole = [1] * len(weights), len(weights)
    out: list[int] = []
    acc = prev = 0
    for w in weights:
        acc += w
        cum = (2 * total * acc + whole) // (2 * whole)  # round(total * acc / whole), halves up
        out.append(cum - prev)
        prev = cum
    return out


def interpolate(times: list[float], total: int) -> list[float]:
    """`total` tokens spread evenly from the first content chunk to the last
    (llama-benchy's stamps without token ids; see `decode_tokens_llama_benchy`)."""
    if total <= 0 or not times:
        return []
    if total == 1 or len(times) == 1 or times[-1] <= times[0]:
        return [times[0]] * total
    step = (times[-1] - times[0]) / (total - 1)
    return [times[0] + step * i for i in range(total)]


def _has_text(delta: dict) -> bool:
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))


def chunk_text(body: bytes) -> str:
    """The text a chunk streams: its reasoning, then its content."""
    try:
        data = _loads(body.decode())
        delta = data["choices"][0].get("delta") or {}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""
    if not isinstance(delta, dict):
        return ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    content = delta.get("content") or ""
    return (reasoning if isinstance(reasoning, str) else "") + (content if isinstance(content, str) else "")


def count_tokens(counts: list[int], all_ids: bool, usage: int | None, bodies: list[bytes] | None,
                 tokenizer: LocalTokenizer | None) -> tuple[list[int], str]:
    """Tokens per chunk that carried any, and how they were known."""
    if all_ids:
        return counts, "token_ids"
    if tokenizer is not None and bodies is not None and len(bodies) == len(counts):
        local = tokens_per_piece(tokenizer, [chunk_text(b) for b in bodies])
        if usage is not None:
            return apportion(usage, local), "usage+tokenizer"
        return local, "tokenizer"
    if usage is not None:
        return apportion(usage, [1] * len(counts)), "usage"
    return [1] * len(counts), "chunks"


async def stream_chat(url: str, payload: dict, record: RequestRecord, timeout: float,
                      headers: dict | None = None, tokenizer: LocalTokenizer | None = None,
                      clock: Clock = SYSTEM) -> RequestRecord:
    """POST a streaming chat completion and fill `record` as it arrives,
    timed on `clock`. With a local `tokenizer`, a stream without token ids is
    counted from its text.

    Never raises for what a server or network does: errors and timeouts
    end up in `record.error` with a reason a person can act on."""
    chunk_times: list[float] = []
    chunk_counts: list[int] = []
    bodies: list[bytes] | None = [] if tokenizer is not None else None
    state = {"ids": True, "usage": None}

    def chunk(t: float, has_text: bool, ids: int | None, body: bytes) -> None:
        """A chunk with a choice: a response; with text or token ids, tokens."""
        if record.first_response is None:
            record.first_response = t
        if not has_text and not ids:
            return
        if record.first_token is None:
            record.first_token = t
        elif not has_text:
            record.textless_tokens += ids or 0
        if ids is None:
            state["ids"] = False
        chunk_counts.append(1 if ids is None else ids)
        chunk_times.append(t)
        if bodies is not None:
            bodies.append(body)

    def on_line(line: bytes, t: float) -> None:
        if not line.startswith(b"data:"):
            return
        body = line[5:].strip()
        if body == b"[DONE]" or not body:
            return
        fast = scan(body)
        if fast is not None:
            _, has_text, ids = fast
            chunk(t, has_text, ids, body)
            return
        try:
            data = _loads(body.decode())
        except ValueError:
            return
        if "error" in data and not data.get("choices"):
            err = data["error"]
            record.error = "server: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
            return
        timings = data.get("timings")
        if isinstance(timings, dict):
            record.server_timings = {k: float(v) for k, v in timings.items()
                                     if k in TIMINGS and isinstance(v, (int, float)) and not isinstance(v, bool)}
            if "cache_n" in record.server_timings:  # llama.cpp: prompt tokens it took from its cache
                record.cached_tokens = int(record.server_timings["cache_n"])
        usage = data.get("usage")
        if usage:
            if isinstance(usage.get("prompt_tokens"), int):
                record.prompt_tokens = usage["prompt_tokens"]
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                record.cached_tokens = details["cached_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                state["usage"] = usage["completion_tokens"]
        choices = data.get("choices")
        if choices:
            ids = choices[0].get("token_ids")
            chunk(t, _has_text(choices[0].get("delta") or {}), len(ids) if isinstance(ids, list) else None, body)

    stamp = clock.stamp
    record.start = stamp()
    try:
        async with asyncio.timeout(timeout):
            record.status = await post_sse(url, payload, on_line, headers, now=stamp)
        record.end = stamp()
    except HTTPError as e:
        record.status = e.status
        record.error = str(e)
        return record
    except TimeoutError:
        record.timed_out = True
        record.error = f"timed out after {timeout:.0f}s ({sum(chunk_counts)} tokens received)"
    except OSError as e:
        record.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    usage_completion = state["usage"]
    if record.error is None and record.first_token is None and not chunk_times:
        if usage_completion:
            record.completion_tokens = usage_completion
        else:
            record.error = "the stream ended without a token"
        return record
    if chunk_times:
        args = (chunk_counts, bool(state["ids"]), usage_completion, bodies, tokenizer)
        if bodies is not None and not state["ids"]:
            # Counted with the tokenizer: up to tens of ms of encoding, off the event loop, where the other
            # streams of the batch are still being read and timed (in it, a c2 decode rate read 0.3 % low).
            counts, record.counted_by = await asyncio.to_thread(count_tokens, *args)
        else:
            counts, record.counted_by = count_tokens(*args)
        record.token_times = spread(chunk_times, counts, record.first_token or record.start)
    record.completion_tokens = len(record.token_times)
    return record
