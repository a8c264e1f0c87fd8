"""One streaming chat request, timed the way llama-benchy times it.

Per request we keep the start, the first response chunk, the first token
(content, `reasoning_content` or `reasoning`), a timestamp per token, the
last token, the end of the stream and the server's `usage`. Tokens are
counted from `token_ids` when every content chunk carries them (vLLM with
`return_token_ids`), else from `usage.completion_tokens` spread evenly over
the content chunks, else one per chunk — the same order llama-benchy uses,
so both tools count the same tokens on the same server.

The hot loop is per network read, not per token, and touches as little
Python as it can (`sse.py`): the client must never be what limits a
measurement.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import re
import time
from dataclasses import asdict, dataclass, field

from sparktop.bench.sse import HTTPError, post_sse

# perf_counter is monotonic and fine-grained; records carry wall-clock
# seconds so that runs written by different processes line up.
_WALL_OFFSET = time.time() - time.perf_counter()


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
    if _TEXT.search(body) is None:
        return True, False, None
    m = _IDS.search(body)
    if m is None:
        return True, True, None
    ids = m.group(1).strip()
    return True, True, (ids.count(b",") + 1 if ids else 0)


def now() -> float:
    return time.perf_counter() + _WALL_OFFSET


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

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def last_token(self) -> float | None:
        return self.token_times[-1] if self.token_times else None

    @property
    def decode_tokens(self) -> int:
        """Tokens stamped after the first one (llama-benchy's count)."""
        times = self.token_times
        if len(times) < 2:
            return 0
        # Times are in arrival order: the ones after the first stamp.
        return len(times) - bisect.bisect_right(times, times[0])

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


def spread(times: list[float], counts: list[int], start: float) -> list[float]:
    """One timestamp per token: a chunk of n tokens spreads them evenly
    between the previous chunk and its own arrival."""
    out: list[float] = []
    last = start
    for t, n in zip(times, counts, strict=False):
        if n == 1:
            out.append(t)
        elif n > 1:
            step = (t - last) / n
            out.extend(last + step * (i + 1) for i in range(n))
        if n:
            last = out[-1]
    return out


def interpolate(times: list[float], total: int) -> list[float]:
    """`total` tokens spread evenly from the first content chunk to the last."""
    if total <= 0 or not times:
        return []
    if total == 1 or len(times) == 1 or times[-1] <= times[0]:
        return [times[0]] * total
    step = (times[-1] - times[0]) / (total - 1)
    return [times[0] + step * i for i in range(total)]


def _has_text(delta: dict) -> bool:
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))


async def stream_chat(url: str, payload: dict, record: RequestRecord, timeout: float,
                      headers: dict | None = None) -> RequestRecord:
    """POST a streaming chat completion and fill `record` as it arrives.

    Never raises for what a server or network does: errors and timeouts
    end up in `record.error` with a reason a person can act on."""
    chunk_times: list[float] = []
    chunk_counts: list[int] = []
    state = {"ids": True, "usage": None}

    def chunk(t: float, has_text: bool, ids: int | None) -> None:
        """A chunk with a choice: a response; with text, tokens (ids or one)."""
        if record.first_response is None:
            record.first_response = t
        if not has_text:
            return
        if record.first_token is None:
            record.first_token = t
        if ids is None:
            state["ids"] = False
        chunk_counts.append(1 if ids is None else ids)
        chunk_times.append(t)

    def on_line(line: bytes, t: float) -> None:
        if not line.startswith(b"data:"):
            return
        body = line[5:].strip()
        if body == b"[DONE]" or not body:
            return
        t += _WALL_OFFSET
        fast = scan(body)
        if fast is not None:
            _, has_text, ids = fast
            chunk(t, has_text, ids)
            return
        try:
            data = _loads(body.decode())
        except ValueError:
            return
        if "error" in data and not data.get("choices"):
            err = data["error"]
            record.error = "server: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
            return
        usage = data.get("usage")
        if usage:
            if isinstance(usage.get("prompt_tokens"), int):
                record.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                state["usage"] = usage["completion_tokens"]
        choices = data.get("choices")
        if choices:
            ids = choices[0].get("token_ids")
            chunk(t, _has_text(choices[0].get("delta") or {}), len(ids) if isinstance(ids, list) else None)

    record.start = now()
    try:
        async with asyncio.timeout(timeout):
            record.status = await post_sse(url, payload, on_line, headers)
        record.end = now()
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
    if chunk_times and state["ids"]:
        record.token_times = spread(chunk_times, chunk_counts, record.first_token or record.start)
    elif chunk_times and usage_completion is not None:
        record.token_times = interpolate(chunk_times, usage_completion)
    else:
        record.token_times = chunk_times
    record.completion_tokens = len(record.token_times)
    return record
