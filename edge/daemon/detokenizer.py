"""Incremental detokenization: token ids arrive a few at a time, text leaves as soon as it is
whole.

The shipped tokenizer is byte-level BPE, so one character (e.g. "é", "中") can be split across
tokens. Decoding a prefix that ends inside a character yields U+FFFD at the end; we hold such
text back until the character completes. Decoding restarts from a recent offset, not from the
start, so the cost per step stays small (the same scheme as vLLM's `detokenize_incrementally`).

SentencePiece-style tokenizers with byte fallback (Llama-2, Mistral, Gemma) spell a character
the vocabulary lacks as "<0xNN>" tokens, and their decoder (ByteFallback) turns each run of
consecutive byte tokens into text as a whole: one invalid byte makes every byte of its run
U+FFFD, so text already decoded from a run ("H", or a whole "中") can change when the run grows.
For them text is released only once the ids end with a token that closes the run (any other
token), and the `tokenizers` decode stream, which raises on such a change ("Invalid prefix
encountered"), is not used.

Invariant (tested, for both kinds): the concatenation of every `push` result and `flush()`
equals `decode(all_ids)`, and each release extends what was released before.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Container, Sequence

from edge.tokenizer import EdgeTokenizer

_REPLACEMENT = "\ufffd"

Decode = Callable[[list[int]], str]


class IncrementalDetokenizer:
    """`decode` turns a list of ids into text (e.g. edge.tokenizer.EdgeTokenizer.decode);
    `open_ids`: ids after which the text before them may still change (byte-fallback tokens),
    so nothing is released while the ids end with one."""

    def __init__(self, decode: Decode, open_ids: Container[int] = frozenset()) -> None:
        self._decode_fn = decode
        self._open_ids = open_ids
        self._ids: list[int] = []
        self._prefix_offset = 0  # decoding starts here (already-emitted context for merging)
        self._read_offset = 0    # text of ids before this point has been emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self._decode_fn(list(ids))

    def push(self, ids: Sequence[int]) -> str:
        """Add ids; return the text that became complete (possibly "")."""
        self._ids.extend(int(i) for i in ids)
        if not self._ids or self._ids[-1] in self._open_ids:
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT):
            delta = new_text[len(prefix_text):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """The text still held back (e.g. a truly invalid byte sequence at the very end)."""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text):]


class NativeDetokenizer:
    """The same contract on the `tokenizers` library's own incremental decoder (DecodeStream,
    written in Rust, one step per id). `flush` returns what the stream still holds back (an
    incomplete UTF-8 sequence at the very end) the way a full decode renders it, so the
    invariant above holds here too (tested against IncrementalDetokenizer on the held-out
    prompts, multi-byte characters and random ids)."""

    def __init__(self, tokenizer, decode: Decode) -> None:
        """`tokenizer`: a tokenizers.Tokenizer; `decode`: its full decode (for flush)."""
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=False)
        self._decode_fn = decode
        self._ids: list[int] = []
        self._emitted = 0  # characters released so far

    def push(self, ids: Sequence[int]) -> str:
        pieces = []
        for token in ids:
            self._ids.append(int(token))
            piece = self._stream.step(self._tokenizer, int(token))
            if piece:
                pieces.append(piece)
        text = "".join(pieces)
        self._emitted += len(text)
        return text

    def flush(self) -> str:
        whole = self._decode_fn(self._ids)
        rest = whole[self._emitted:]
        self._emitted = len(whole)
        return rest


def byte_fallback_ids(native) -> frozenset[int]:
    """The "<0xNN>" ids of a `tokenizers.Tokenizer` whose decoder has ByteFallback, else none.
    Cheap on every kind (runs per generation): the decoder's own JSON, 256 look-ups."""
    def types(node) -> set[str]:
        return {node.get("type", ""), *(t for d in node.get("decoders") or () for t in types(d))}

    if native.decoder is None or "ByteFallback" not in types(json.loads(native.decoder.__getstate__())):
        return frozenset()
    ids = (native.token_to_id(f"<0x{byte:02X}>") for byte in range(256))
    return frozenset(i for i in ids if i is not None)


def make_detokenizer(tokenizer: EdgeTokenizer) -> IncrementalDetokenizer | NativeDetokenizer:
    """The native decode stream over the tokenizer's `tokenizers.Tokenizer` when it is of the
    byte-level kind, else the hand-written one over its `decode` (holding text back behind
    byte-fallback tokens, see the module's docstring)."""
    native = tokenizer.hf_tokenizer
    open_ids = byte_fallback_ids(native)
    if open_ids:
        return IncrementalDetokenizer(tokenizer.decode, open_ids)
    return NativeDetokenizer(native, tokenizer.decode)
