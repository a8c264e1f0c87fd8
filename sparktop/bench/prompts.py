"""Prompts of an exact token length, with nothing downloaded at run time.

A prompt is a run of common English words picked at random (so two
requests never share a prefix the engine could cache). The length that
matters is the one the server counts, chat template included:

- with a local `tokenizer.json` (and the `tokenizers` package) the words are
  counted locally and one probe learns what the chat template adds;
- without one, probes calibrate against the server's `usage.prompt_tokens`:
  how many tokens a word costs and what the template adds, then a last probe
  at the target length corrects any remainder.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

# Short, frequent words (at most six letters): one token each in the GPT, Llama, Qwen and Gemma
# vocabularies when preceded by a space, so a word count maps to a token count.
WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "that", "on", "with", "as", "by", "at", "from", "his", "her", "are", "this", "be", "have", "not", "but", "had", "they", "you", "which", "one", "were", "all", "we", "when", "there", "can", "an", "their", "what", "so", "up", "out", "if", "about", "who", "them", "some", "could", "him", "into", "its", "then", "two", "more", "these", "time", "very", "first", "new", "like", "our", "over", "such", "only", "other", "may", "after", "most", "made", "any", "also", "back", "year", "work", "way", "well", "even", "must", "how", "where", "much", "good", "before", "long", "day", "see", "each", "those", "people", "world", "just", "great", "state", "both", "life", "under", "never", "same", "know", "while", "last", "might", "us", "high", "part", "place", "found", "water", "small", "number", "three", "still", "old", "home", "house", "light", "power", "system", "point", "group", "market", "city", "game", "line", "end", "room", "night", "car"]

Probe = Callable[[str], Awaitable[int]]  # user content -> usage.prompt_tokens


class LocalTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


def load_local_tokenizer(path: str) -> LocalTokenizer:
    """A HuggingFace tokenizer.json. Raises ValueError with a one-line reason."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(f"{path}: reading a tokenizer file needs the 'tokenizers' package "
                         "(pip install tokenizers), or leave --tokenizer out to calibrate "
                         "against the server") from None
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types
        raise ValueError(f"{path}: not a tokenizer.json ({str(e).splitlines()[0][:120]})") from None

    class _Tok:
        def encode(self, text: str) -> list[int]:
            return tok.encode(text, add_special_tokens=False).ids

        def token_ends(self, text: str) -> list[int]:
            """Where each token of `text` ends (a character offset)."""
            return [end for _, end in tok.encode(text, add_special_tokens=False).offsets]

        def cut(self, text: str, n: int) -> str:
            """The text of the first n tokens."""
            enc = tok.encode(text, add_special_tokens=False)
            if len(enc.ids) <= n:
                return text
            return text[: enc.offsets[n][0]].rstrip()

    return _Tok()


def tokens_per_piece(tokenizer: LocalTokenizer, pieces: list[str]) -> list[int]:
    """How many tokens of the pieces' joined text end in each piece (a
    streamed text's tokens per chunk: one split across chunks counts where
    it ends, when it was whole)."""
    ends = getattr(tokenizer, "token_ends", None)
    if ends is None:  # no offsets: each piece on its own
        return [len(tokenizer.encode(p)) if p else 0 for p in pieces]
    counts = [0] * len(pieces)
    if not pieces:
        return counts
    bounds = list(itertools.accumulate(len(p) for p in pieces))
    last = len(pieces) - 1
    for end in ends("".join(pieces)):
        counts[min(bisect.bisect_left(bounds, end), last)] += 1
    return counts


def words_text(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(0, n)))


@dataclass
class PromptMaker:
    """Makes user prompts that the server counts as `target` tokens."""

    target: int
    words: int  # words per prompt that hit the target
    template: int  # tokens the chat template adds around one user message
    exact: bool  # whether the last check landed exactly on target
    tokenizer: LocalTokenizer | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def make(self) -> str:
        text = words_text(self.words, self._rng)
        if self.tokenizer is None:
            return text
        # Cut near the target at a token boundary, take whole words off while over (a cut word can encode
        # to more tokens than it was a part of), pad with words while far short, then close the gap with
        # words that are one token each: after a space a word is a token run of its own, so each adds one.
        # A last count checks it; a tokenizer where that does not hold gets the slow way, word by word.
        body = max(1, self.target - self.template)
        cut = getattr(self.tokenizer, "cut", None)
        if cut is not None:
            text = cut(text + " " + words_text(max(8, self.words // 8), self._rng), body)
        text, ids = self._trim(text, body)
        guard = 0
        while len(ids) < body - 8 and guard < 64:  # a quarter of the gap in words: no word is under a token
            text += " " + words_text(max(1, (body - len(ids)) // 4), self._rng)
            ids = self.tokenizer.encode(text)
            guard += 1
        if guard:
            text, ids = self._trim(text, body)
        ones = self._ones
        if ones and len(ids) < body:
            text += "".join(" " + self._rng.choice(ones) for _ in range(body - len(ids)))
            ids = self.tokenizer.encode(text)
        for _ in range(8):
            if len(ids) == body:
                break
            if len(ids) > body:
                text, ids = self._trim(text, body)
                continue
            # Short by a few: whatever grows the count by exactly one (a tokenizer with no one-token word,
            # or one that merges across spaces); a character on its own is a token in every vocabulary.
            for tail in ([" " + self._rng.choice(ones)] if ones else []) + [" a", ".", " .", "a", ",", "!"]:
                grown = self.tokenizer.encode(text + tail)
                if len(grown) == len(ids) + 1:
                    text, ids = text + tail, grown
                    break
            else:
                break
        return text

    def _trim(self, text: str, body: int) -> tuple[str, list[int]]:
        """Whole words off the end until the text is at most `body` tokens."""
        assert self.tokenizer is not None
        ids = self.tokenizer.encode(text)
        while len(ids) > body and " " in text:
            text = text.rsplit(" ", 1)[0]
            ids = self.tokenizer.encode(text)
        return text, ids

    @functools.cached_property
    def _ones(self) -> list[str]:
        """The words that are one token each after a space."""
        assert self.tokenizer is not None
        base = len(self.tokenizer.encode("the"))
        return [w for w in WORDS if len(self.tokenizer.encode("the " + w)) - base == 1]

    def context(self, tokens: int) -> PromptMaker:
        """A maker of contexts of `tokens` tokens (a system message before the prompt: `--depth`), counted as
        llama-benchy counts a depth, the text's own tokens without the template's. Exact with a local
        tokenizer; without one, from the words per token the server's counts gave."""
        if self.tokenizer is not None:
            # `words` is only the first guess `make` trims or pads from; the words per token it implies runs
            # high (contexts 8 % over their depth came out of it), so measure the ratio on the text itself.
            sample = words_text(512, random.Random(self.seed))
            per_token = 512 / max(1, len(self.tokenizer.encode(sample)))
            # No seed: two depths' contexts must not begin alike (a shared prefix the cache would reuse).
            return PromptMaker(tokens, max(1, round(tokens * per_token)), 0, True, tokenizer=self.tokenizer)
        per_token = self.words / max(1, self.target - self.template)
        return PromptMaker(tokens, max(1, round(tokens * per_token)), 0, False)


async def calibrate(target: int, probe: Probe, tokenizer: LocalTokenizer | None = None,
                    seed: int | None = None) -> PromptMaker:
    """Work out how many words make `target` prompt tokens on this server."""
    rng = random.Random(seed)
    if tokenizer is not None:
        text = words_text(32, rng)
        template = await probe(text) - len(tokenizer.encode(text))
        body = max(1, target - template)
        ratio = len(tokenizer.encode(words_text(256, rng))) / 256
        maker = PromptMaker(target, max(1, round(body / max(ratio, 1e-6))), template, True,
                            tokenizer=tokenizer, seed=seed)
        return maker
    # Short probes first, then one as long as the target at most: a probe
    # longer than the requested prompt could exceed the server's context
    # (llama-server's slots hold a few hundred tokens each), and words are
    # worth very different numbers of tokens from one tokenizer to another.
    a, b = 16, 32
    ta = await probe(words_text(a, rng))
    tb = await probe(words_text(b, rng))
    per_word = max((tb - ta) / (b - a), 1e-3)
    c = a + round((min(target, 2048) - ta) / per_word)
    if c > 2 * b:
        tc = await probe(words_text(c, rng))
        per_word = max((tc - ta) / (c - a), 1e-3)
    template = round(ta - a * per_word)
    words = max(1, round((target - template) / per_word))
    exact = False
    for _ in range(3):
        got = await probe(words_text(words, rng))
        if got == target:
            exact = True
            break
        words = max(1, words + round((target - got) / per_word))
    return PromptMaker(target, words, template, exact, seed=seed)
