"""Tokenizer fingerprint: a hash of the vocabulary and of the tokenizer's kind, so that a draft
and a target that would read the same ids differently are refused before any compute.

The kind is how token strings turn into text: "byte-level" (GPT-2's byte alphabet, "Ġ" for a
space: Llama-3, Qwen, the shipped tokenizer), "sentencepiece" ("▁" for a space, "<0xNN>" byte
fallback tokens: Llama-2, Mistral, Gemma), else the model's type ("wordpiece", ...). Two
tokenizers with the same token strings but different kinds map the same ids to different text.
A byte-level tokenizer is hashed as its vocabulary alone, exactly as before kinds were hashed,
so its fingerprint (and tandem/qpriors/<fingerprint>.npy, keyed by it) does not move."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

BYTE_LEVEL = "byte-level"
SENTENCEPIECE = "sentencepiece"


def vocab_fingerprint(vocab: Mapping[str, int], kind: str = BYTE_LEVEL) -> str:
    """sha256 over an optional "kind<TAB>KIND" line, then "id<TAB>token" lines in id order;
    stable across runtimes that share the token strings (HF tokenizers, GGUF's
    tokenizer.ggml.tokens)."""
    h = hashlib.sha256()
    if kind != BYTE_LEVEL:
        h.update(f"kind\t{kind}\n".encode())
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    return "sha256:" + h.hexdigest()[:32]


def _types(node: dict | None) -> set[str]:
    """The component types of a tokenizer.json pipeline stage, Sequence members included."""
    if not node:
        return set()
    found = {node.get("type", "")}
    for key in ("pretokenizers", "decoders", "normalizers"):
        for member in node.get(key) or ():
            found |= _types(member)
    return found


def tokenizer_json_kind(spec: Mapping) -> str:
    """The kind of a tokenizer from its tokenizer.json (parsed)."""
    model = spec.get("model") or {}
    stages = _types(spec.get("decoder")) | _types(spec.get("pre_tokenizer"))
    if "ByteLevel" in stages:
        return BYTE_LEVEL
    if model.get("byte_fallback") or stages & {"Metaspace", "ByteFallback"}:
        return SENTENCEPIECE
    return str(model.get("type", "unknown")).lower()


def tokenizer_fingerprint(tokenizer) -> str:
    """Fingerprint of an HF tokenizer (transformers fast or slow, or a `tokenizers.Tokenizer`),
    including added special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if hasattr(backend, "to_str"):
        kind = tokenizer_json_kind(json.loads(backend.to_str()))
    else:  # a slow tokenizer: SentencePiece-backed ones hold an sp_model
        kind = SENTENCEPIECE if hasattr(tokenizer, "sp_model") else BYTE_LEVEL
    return vocab_fingerprint(tokenizer.get_vocab(), kind)
