"""A real HuggingFace tokenizer.json, trained here on a generated book.

Both the twin (vLLM's `--tokenizer`) and the benchmark clients (llama-benchy's
`--tokenizer`, sparktop's `--tokenizer`) read the same file, so all three
count the same tokens — and nothing is downloaded.
"""

from __future__ import annotations

import random
from pathlib import Path

NOUNS = ["node", "memory", "model", "cache", "token", "engine", "batch", "prompt", "layer", "expert", "link", "cluster", "router", "queue", "request", "stream", "kernel", "weight", "tensor", "river", "mountain", "city", "house", "garden", "window", "letter", "story"]
VERBS = ["reads", "writes", "moves", "holds", "waits", "streams", "grows", "falls", "sends", "returns", "finds", "keeps", "shares", "builds"]
OTHER = (["the", "a", "one", "every", "each", "this", "that", "some", "no", "its", "their", "our"],
         ["quickly", "slowly", "again", "soon", "never", "always", "often", "still"],
         ["and", "but", "so", "while", "because", "when", "after", "before"])


def book_text(words: int = 40000, seed: int = 7) -> str:
    """Sentences with punctuation, capitals and paragraphs, like a novel's."""
    rng = random.Random(seed)
    out, n = [], 0
    while n < words:
        para = []
        for _ in range(rng.randint(3, 7)):
            det, adv, conj = (rng.choice(x) for x in OTHER)
            s = f"{det} {rng.choice(NOUNS)} {rng.choice(VERBS)} {adv} {conj} {rng.choice(OTHER[0])} " \
                f"{rng.choice(NOUNS)} {rng.choice(VERBS)} {rng.choice(NOUNS)}"
            if rng.random() < 0.3:
                s += f", {rng.randint(2, 999)} times"
            para.append(s[0].upper() + s[1:] + rng.choice(".!?."))
            n += len(s.split())
        out.append(" ".join(para))
    return "\n\n".join(out) + "\n"


def train_tokenizer(path: Path, text: str, vocab_size: int = 600, special_tokens: list[str] | None = None) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=special_tokens or [])
    tok.train_from_iterator(text.split("\n\n"), trainer)
    tok.save(str(path))
    return path


def train_shared_tokenizer(path: Path) -> Path:
    """A tokenizer whose vocabulary holds both the book's words (llama-benchy's prompts) and sparktop's
    prompt words, one token each, as a real 128k vocabulary holds common English words. Trained on the book
    alone, sparktop's words split into three tokens each, so a prompt of the same token count is half the
    characters of llama-benchy's and the server tokenizes it in half the time: at 6k tokens, 5 ms of server
    CPU that one tool's TTFT holds and the other's does not, and more on a busy machine."""
    from sparktop.bench.prompts import words_text

    rng = random.Random(11)
    words = "\n\n".join(words_text(200, rng) for _ in range(100))
    return train_tokenizer(path, book_text() + "\n\n" + words, vocab_size=2000)
