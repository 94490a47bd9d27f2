"""Tokenizer fingerprint: a hash of the vocabulary, so that a draft and a target that would
read the same ids differently are refused before any compute."""
from __future__ import annotations

import hashlib
from collections.abc import Mapping


def vocab_fingerprint(vocab: Mapping[str, int]) -> str:
    """sha256 over "id<TAB>token" lines in id order; stable across runtimes that share the
    byte-level token strings (HF tokenizers, GGUF's tokenizer.ggml.tokens)."""
    h = hashlib.sha256()
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    return "sha256:" + h.hexdigest()[:32]


def tokenizer_fingerprint(tokenizer) -> str:
    """Fingerprint of an HF tokenizer (fast or slow), including added special tokens."""
    return vocab_fingerprint(tokenizer.get_vocab())
