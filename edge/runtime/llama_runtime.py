"""Draft runtime on llama.cpp (llama-cpp-python) for the f32 GGUF from models.export.gguf.

Two settings matter for exactness: an f32 KV cache (the default f16 one moves logits by ~2e-3
against torch; f32 by ~1e-6), and logits_all=True so that Llama.scores holds a row for every
token of a batch, which extend() must return."""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import torch

from edge.runtime.base import DraftRuntime
from tandem.fingerprint import BYTE_LEVEL, SENTENCEPIECE, vocab_fingerprint

SEQ_ID = 0  # the one sequence this runtime's context holds
MAX_BATCH = 512


class LlamaDraftRuntime(DraftRuntime):
    name = "llama.cpp"

    def __init__(self, model_path: Path, n_ctx: int = 1024, threads: int = 1) -> None:
        super().__init__()
        self.llm = llama_cpp.Llama(
            model_path=str(model_path), n_ctx=n_ctx, n_batch=min(n_ctx, MAX_BATCH),
            n_threads=threads, n_threads_batch=threads, logits_all=True,
            type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
        self.vocab_size = self.llm.n_vocab()
        # Not llm.n_ctx(): llama.cpp rounds a small context up (16 -> 256), but the Python
        # wrapper sizes its scores/input_ids buffers by the n_ctx we asked for.
        self.n_ctx = n_ctx
        assert self.llm.n_ctx() >= n_ctx
        self._fingerprint = vocab_fingerprint(gguf_vocab(self.llm), gguf_tokenizer_kind(self.llm))

    @property
    def position(self) -> int:
        return self.llm.n_tokens

    def extend(self, token_ids: Sequence[int]) -> torch.Tensor:
        self._check_extend(token_ids)
        start = time.perf_counter()
        p, n = self.llm.n_tokens, len(token_ids)
        self.llm.eval(list(token_ids))
        # scores is llama-cpp-python's reusable [n_ctx, vocab] buffer: copy the rows out.
        logits = torch.from_numpy(self.llm.scores[p:p + n].copy())                        # [n, vocab]
        self.speed.record(n, time.perf_counter() - start)
        return logits

    def rollback(self, position: int) -> None:
        self._check_rollback(position)
        if position == self.llm.n_tokens:
            return
        memory = llama_cpp.llama_get_memory(self.llm.ctx)
        if not llama_cpp.llama_memory_seq_rm(memory, SEQ_ID, position, -1):
            raise RuntimeError(f"llama.cpp could not drop cached positions >= {position}")
        self.llm.n_tokens = position

    def fingerprint(self) -> str:
        return self._fingerprint

    def close(self) -> None:
        self.llm.close()


def gguf_vocab(llm: llama_cpp.Llama) -> dict[str, int]:
    """token string -> id of the vocabulary stored in the GGUF itself (tokenizer.ggml.tokens).

    Spare embedding rows ("[PAD…]", type UNUSED) are left out: no tokenizer produces them, and
    the HF tokenizer's vocabulary does not have them either."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    tokens: dict[str, int] = {}
    for idx in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        if llama_cpp.llama_vocab_get_attr(vocab, idx) & llama_cpp.LLAMA_TOKEN_ATTR_UNUSED:
            continue
        tokens[llama_cpp.llama_vocab_get_text(vocab, idx).decode("utf-8", "surrogateescape")] = idx
    return tokens


def gguf_tokenizer_kind(llm: llama_cpp.Llama) -> str:
    """The tokenizer kind (tandem.fingerprint) of the GGUF's vocabulary type: llama.cpp's BPE is
    byte-level, its SPM ("llama") and UGM ("t5") vocabularies are SentencePiece's."""
    vocab_type = llama_cpp.llama_vocab_type(llama_cpp.llama_model_get_vocab(llm.model))
    kinds = {llama_cpp.LLAMA_VOCAB_TYPE_BPE: BYTE_LEVEL, llama_cpp.LLAMA_VOCAB_TYPE_SPM: SENTENCEPIECE,
             llama_cpp.LLAMA_VOCAB_TYPE_UGM: SENTENCEPIECE, llama_cpp.LLAMA_VOCAB_TYPE_WPM: "wordpiece"}
    return kinds.get(vocab_type, f"llama.cpp-vocab-{vocab_type}")
