"""Replaying recorded traffic: a trace in the Mooncake format that AIPerf
and GuideLLM read, one JSON object per line:

    {"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1, 2, ...]}

`timestamp` is when the request arrived, in milliseconds (from any origin:
the replay starts at the first); `input_length` and `output_length` are its
prompt and output tokens; `hash_ids` (optional) name its prompt's blocks of
512 tokens, so two requests with the same leading ids share that prefix
(and an engine's prefix cache can reuse it), as in the recorded traffic.
`prefix_id` (optional, instead) shares one whole prefix of `prefix_tokens`.

A replay sends each request at its own time with a prompt of its own length
(the blocks' words drawn from a generator seeded by the block's id, so the
same id is the same text every time) and asks for exactly its output length.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from sparktop.bench.prompts import words_text
from sparktop.errors import SparktopError

BLOCK_TOKENS = 512  # Mooncake's hash block


@dataclass(frozen=True)
class TraceRequest:
    line: int
    offset_s: float  # from the trace's first request
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    prefix_id: str | None = None
    prefix_tokens: int = 0


@dataclass
class Trace:
    path: Path
    requests: list[TraceRequest] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].offset_s if self.requests else 0.0

    @property
    def rate(self) -> float | None:
        """Its mean arrival rate, requests per second."""
        return (len(self.requests) - 1) / self.duration_s if self.duration_s > 0 else None


def _int(value, path: Path, line: int, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        raise SparktopError(f"{path}:{line}: {key} must be a whole number of at least {minimum} (got {value!r})")
    return int(value)


def load_trace(path: str | Path) -> Trace:
    """The trace at `path`, its requests in arrival order. A line without the fields a replay needs is an
    error naming the file, the line and the field."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SparktopError(f"--trace {path}: {exc.strerror or exc}") from None
    raw: list[TraceRequest] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SparktopError(f"{path}:{n}: not a JSON object ({exc.msg})") from None
        if not isinstance(d, dict):
            raise SparktopError(f"{path}:{n}: not a JSON object")
        for key in ("timestamp", "input_length", "output_length"):
            if key not in d:
                raise SparktopError(f"{path}:{n}: missing {key} (a trace line needs timestamp in ms, "
                                    "input_length and output_length)")
        stamp = d["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or stamp < 0:
            raise SparktopError(f"{path}:{n}: timestamp must be milliseconds, 0 or more (got {stamp!r})")
        ids = d.get("hash_ids") or []
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise SparktopError(f"{path}:{n}: hash_ids must be a list of integers")
        prefix = d.get("prefix_id")
        raw.append(TraceRequest(
            line=n, offset_s=float(stamp) / 1000.0,
            input_tokens=_int(d["input_length"], path, n, "input_length", 1),
            output_tokens=_int(d["output_length"], path, n, "output_length", 1),
            hash_ids=tuple(ids), prefix_id=None if prefix is None else str(prefix),
            prefix_tokens=_int(d.get("prefix_tokens", 0), path, n, "prefix_tokens", 0)))
    if not raw:
        raise SparktopError(f"{path}: no requests in the trace")
    raw.sort(key=lambda r: (r.offset_s, r.line))
    first = raw[0].offset_s
    return Trace(path, [TraceRequest(r.line, r.offset_s - first, r.input_tokens, r.output_tokens, r.hash_ids,
                                     r.prefix_id, r.prefix_tokens) for r in raw])


class TracePrompts:
    """Prompt text of a trace request's length, its shared blocks the same text wherever they recur.
    `words_per_token`: from the sweep's calibration against the server."""

    def __init__(self, words_per_token: float, seed: int = 0):
        self.words_per_token = words_per_token
        self.seed = seed
        self._blocks: dict[object, str] = {}
        self._rng = random.Random(seed)

    def _block(self, key: object, tokens: int) -> str:
        text = self._blocks.get(key)
        if text is None:
            text = self._blocks[key] = words_text(self._words(tokens), random.Random(f"{self.seed}:{key}"))
        return text

    def _words(self, tokens: int) -> int:
        return max(1, round(tokens * self.words_per_token))

    def text(self, r: TraceRequest) -> str:
        parts: list[str] = []
        left = r.input_tokens
        if r.hash_ids:
            for block in r.hash_ids:
                if left <= 0:
                    break
                size = min(BLOCK_TOKENS, left)
                # A block cut short (a request's last) is its own text: only whole blocks are shared.
                parts.append(self._block(block if size == BLOCK_TOKENS else (block, size), size))
                left -= size
        elif r.prefix_id is not None and r.prefix_tokens:
            size = min(r.prefix_tokens, left)
            parts.append(self._block(("prefix", r.prefix_id, size), size))
            left -= size
        if left > 0:
            parts.append(words_text(self._words(left), self._rng))
        return " ".join(parts)
