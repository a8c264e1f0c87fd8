"""Prompts and depth contexts of exactly the tokens asked for, with a local tokenizer: the count a sweep
reports (pp 2048, depth 4096) is the count the server sees. Three real tokenizers trained here: one that
splits sparktop's words into several tokens (trained on a book without them), one that holds them whole,
and a byte-level one with no merges at all (no word is one token)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from sparktop.bench.prompts import calibrate, load_local_tokenizer
from tests.helpers.tokenizer import book_text, train_shared_tokenizer, train_tokenizer

TEMPLATE = 7  # what the probe's "server" adds around a user message


@pytest.fixture(scope="module", params=["book", "shared", "bytes"])
def tokenizer(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    if request.param == "book":
        train_tokenizer(path, book_text())
    elif request.param == "shared":
        train_shared_tokenizer(path)
    else:
        train_tokenizer(path, book_text(2000), vocab_size=256)  # the byte alphabet only
    return load_local_tokenizer(str(path))


def maker(tokenizer, target: int, seed: int | None = None):
    async def probe(text: str) -> int:  # a server's usage.prompt_tokens: the text and its template
        return len(tokenizer.encode(text)) + TEMPLATE

    return asyncio.run(calibrate(target, probe, tokenizer, seed=seed))


@pytest.mark.parametrize("target", [16, 256, 2048])
def test_prompts_are_exactly_their_length(tokenizer, target):
    m = maker(tokenizer, target, seed=target)
    counts = Counter(len(tokenizer.encode(m.make())) for _ in range(25))
    assert counts == {target - TEMPLATE: 25}


def test_a_depths_contexts_are_exactly_its_tokens_and_never_alike(tokenizer):
    m = maker(tokenizer, 512, seed=1)
    for depth in (100, 4096):
        made = [m.context(depth).make() for _ in range(4)]
        assert [len(tokenizer.encode(x)) for x in made] == [depth] * 4
        # Each its own words: no two share a prefix a server's cache could reuse across requests.
        assert len({x[:64] for x in made}) == 4


def test_a_target_inside_the_template_still_makes_a_prompt(tokenizer):
    m = maker(tokenizer, TEMPLATE - 2)
    text = m.make()
    assert text and len(tokenizer.encode(text)) == 1
