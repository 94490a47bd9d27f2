"""The daemon streams text through the `tokenizers` library's native decode stream
(NativeDetokenizer) instead of the hand-written IncrementalDetokenizer, because it gives the same
text: on every held-out prompt, on multi-byte characters split across tokens and on random ids
(invalid UTF-8 included) the concatenated output equals a full decode, and it never releases
text later than the hand-written one did (per push, its output so far extends the other's)."""
from __future__ import annotations

import random

import pytest

from edge.daemon.detokenizer import IncrementalDetokenizer, NativeDetokenizer, make_detokenizer
from edge.tokenizer import EdgeTokenizer

pytestmark = pytest.mark.unit  # module-level tier (pyproject.toml)

MULTIBYTE = ["héllo 中文 🙂 naïve café Ω≈ç√ 😀😃 ∑ 日本語のテキスト", "é" * 50, "🙂" * 30,
             "# -*- coding: utf-8 -*-\nprint('Grüße, мир, 世界')\n"]


def _stream(detok, ids: list[int], sizes: list[int]) -> list[str]:
    out, i = [], 0
    for n in sizes:
        out.append(detok.push(ids[i:i + n]))
        i += n
    return out + [detok.flush()]


def _sizes(rng: random.Random, n: int) -> list[int]:
    sizes = []
    while n > 0:
        sizes.append(min(rng.randint(1, 5), n))
        n -= sizes[-1]
    return sizes


@pytest.fixture(scope="module")
def tokenizer(draft_dir) -> EdgeTokenizer:
    return EdgeTokenizer(draft_dir)


def test_native_stream_gives_the_same_text(tokenizer, heldout_prompts):
    rng = random.Random(0)
    cases = [tokenizer.encode(p) for p in [*heldout_prompts, *MULTIBYTE]]
    cases += [[rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 60))]
              for _ in range(200)]
    for ids in cases:
        sizes = _sizes(rng, len(ids))
        native = _stream(NativeDetokenizer(tokenizer.hf_tokenizer, tokenizer.decode), ids, sizes)
        handwritten = _stream(IncrementalDetokenizer(tokenizer.decode), ids, sizes)
        assert "".join(native) == "".join(handwritten) == tokenizer.decode(ids)
        so_far_native = so_far_hand = ""
        for a, b in zip(native, handwritten):
            so_far_native, so_far_hand = so_far_native + a, so_far_hand + b
            assert so_far_native.startswith(so_far_hand)


def test_the_daemon_uses_the_native_stream(tokenizer):
    assert isinstance(make_detokenizer(tokenizer), NativeDetokenizer)
