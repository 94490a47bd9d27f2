"""The draft-runtime interface: one small contract that the llama.cpp, ONNX Runtime and torch
backends all implement, so the session client never knows which one drafts.

A runtime holds one sequence's KV cache. `position` is the number of tokens in it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from edge.runtime.errors import ContextFull


@dataclass
class RuntimeSpeed:
    """Running totals of what the runtime computed, for tokens/s and the draft-length controller."""
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s else 0.0

    @property
    def decode_s_per_token(self) -> float:
        return self.decode_s / self.decode_tokens if self.decode_tokens else 0.0

    def record(self, n_tokens: int, seconds: float) -> None:
        """Count one extend: more than one token is a prefill (one batched pass), one is a decode step."""
        if n_tokens > 1:
            self.prefill_tokens += n_tokens
            self.prefill_s += seconds
        else:
            self.decode_tokens += n_tokens
            self.decode_s += seconds


class DraftRuntime(ABC):
    """One draft model with one KV cache."""

    name: str          # backend name: "llama.cpp", "onnxruntime", "torch"
    vocab_size: int
    n_ctx: int         # most tokens the KV cache holds

    def __init__(self) -> None:
        self.speed = RuntimeSpeed()

    @property
    @abstractmethod
    def position(self) -> int:
        """Tokens currently in the KV cache."""

    @abstractmethod
    def extend(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Append tokens to the cache; return float32 logits [len(token_ids), vocab] where row i
        is the next-token distribution after token_ids[i]."""

    @abstractmethod
    def rollback(self, position: int) -> None:
        """Drop every cached token at index >= position (0 <= position <= self.position)."""

    @abstractmethod
    def fingerprint(self) -> str:
        """Tokenizer fingerprint (tandem.fingerprint) of the vocabulary this model reads."""

    def _check_extend(self, token_ids: Sequence[int]) -> None:
        """Shared argument checks of extend(), so every backend fails the same way."""
        if len(token_ids) == 0:
            raise ValueError("extend() needs at least one token")
        if self.position + len(token_ids) > self.n_ctx:
            raise ContextFull(f"{self.name}: {self.position} cached + {len(token_ids)} new tokens "
                              f"exceed n_ctx={self.n_ctx}")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{self.name}: token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")

    def _check_rollback(self, position: int) -> None:
        if not 0 <= position <= self.position:
            raise ValueError(f"{self.name}: rollback to {position} but the cache holds {self.position} tokens")

    def prefill(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Reset the cache to exactly token_ids; return logits [vocab] after the last one."""
        self.rollback(0)
        return self.extend(token_ids)[-1]

    def close(self) -> None:
        """Release native resources (optional)."""
