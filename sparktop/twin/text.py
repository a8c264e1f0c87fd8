"""Tokens in and text out for the twin.

The twin needs prompt token counts that behave like a real tokenizer's
(longer text, more tokens; a chat template adds a few) and output text whose
every token can be counted. It uses a small deterministic word-piece
tokenizer by default, or a local `tokenizer.json` (vLLM's `--tokenizer`)
when the `tokenizers` package is installed, so a benchmark tool that
tokenizes with the same file sees exactly the counts the server reports.
"""

from __future__ import annotations

import random
import re
import zlib
from typing import Protocol

_PIECE = re.compile(r"\s*[A-Za-z]{1,6}|\s*\d{1,3}|\s*[^\sA-Za-z\d]|\s+")

WORDS = ["the", "model", "reads", "every", "expert", "weight", "once", "per", "step", "and", "the", "cache", "grows",
         "with", "each", "token", "so", "memory", "bandwidth", "sets", "the", "pace", "while", "compute", "waits",
         "for", "data", "to", "arrive", "from", "unified", "memory", "two", "nodes", "share", "the", "work", "over",
         "the", "link", "and", "each", "layer", "ends", "with", "an", "all", "reduce", "before", "the", "next", "one",
         "starts", "tokens", "stream", "back", "to", "the", "client", "as", "soon", "as", "they", "are", "sampled"]
REASONING = ["let", "me", "think", "about", "this", "step", "by", "step", "first", "I", "need", "to", "understand",
             "what", "is", "being", "asked", "then", "consider", "the", "options", "and", "check", "each", "one",
             "against", "the", "constraints", "before", "I", "answer"]


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class WordPieceTokenizer:
    """Words split into pieces of at most six letters; ids from a stable hash."""

    def __init__(self, vocab_size: int = 128256):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [zlib.crc32(p.encode()) % self.vocab_size for p in _PIECE.findall(text) if p.strip()]


class FileTokenizer:
    """A HuggingFace `tokenizer.json` read with the `tokenizers` package."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer as _Tok  # optional dependency

        self._tok = _Tok.from_file(path)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids


def load_tokenizer(path: str | None, vocab_size: int) -> Tokenizer:
    if path and path.endswith(".json"):
        try:
            return FileTokenizer(path)
        except (ImportError, OSError, Exception):  # noqa: BLE001 - fall back, as documented
            pass
    return WordPieceTokenizer(vocab_size)


def chat_prompt_ids(messages: list[dict], tokenizer: Tokenizer, overhead: int) -> list[int]:
    """Token ids a chat template would produce: a fixed preamble, then each
    message's role marker, its content and an end marker."""
    ids = [1] * overhead
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        ids.append(2)
        ids.append(zlib.crc32(str(message.get("role", "user")).encode()) % 1000 + 3)
        ids.extend(tokenizer.encode(str(content)))
        ids.append(4)
    ids.append(5)  # assistant turn marker
    return ids


class OutputText:
    """The tokens a request generates: reasoning first (if any), then content."""

    def __init__(self, seed: int, reasoning_tokens: int, vocab_size: int):
        self._rng = random.Random(seed)
        self.reasoning_tokens = reasoning_tokens
        self.vocab_size = vocab_size

    def token(self, index: int) -> tuple[str, int, bool]:
        """(text, token id, is_reasoning) of output token `index`."""
        reasoning = index < self.reasoning_tokens
        word = self._rng.choice(REASONING if reasoning else WORDS)
        text = word if index == 0 or index == self.reasoning_tokens else " " + word
        return text, zlib.crc32(word.encode()) % self.vocab_size, reasoning


def natural_lengths(seed: int, reasoning: bool, effort: str | None) -> tuple[int, int]:
    """How long the model would talk if not stopped: (total, reasoning part)."""
    rng = random.Random(seed)
    content = rng.randint(300, 900)
    if not reasoning:
        return content, 0
    share = {"low": 0.15, "medium": 0.5, "high": 0.8}.get(effort or "medium", 0.5)
    think = int(rng.randint(400, 1200) * share / 0.5)
    return content + think, think
