"""The exact path: a target the slot pool cannot serve exactly (its attention needs something
the slot attention does not implement, or it holds recurrent state) runs the model's own
forward, one session per pass, over the session's whole context each time.

Slower than the slot pool (a pass recomputes the context: O(context) per round instead of
O(new tokens)), but exact by construction: every logit is the model's own full forward, the
definition `generate` computes incrementally. Rollback is a length change on the kept tokens.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import torch


class ExactState:
    """One session on the exact path: the tokens its context holds."""

    def __init__(self, bytes_per_token: int) -> None:
        self.tokens: list[int] = []
        self.bytes_per_token = bytes_per_token

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """What the session table charges: the activations' KV-equivalent a pass rebuilds."""
        return self.length * self.bytes_per_token

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}: the session holds {self.length} "
                             "positions")
        del self.tokens[length:]

    def release(self) -> None:
        self.tokens.clear()


@torch.inference_mode()
def exact_forward(model: torch.nn.Module, device: torch.device,
                  batch: Sequence[tuple[ExactState, Sequence[int]]]) -> list[torch.Tensor]:
    """Per session (one model call each): append its new tokens and return float32 logits
    [len(new), vocab] on `device`, row j the next-token distribution after new[j]."""
    rows = []
    for state, tokens in batch:
        state.tokens.extend(tokens)
        ids = torch.tensor([state.tokens], dtype=torch.long, device=device)       # [1, L]
        keep = {"logits_to_keep": len(tokens)} if _keeps_logits(model) else {}
        logits = model(input_ids=ids, use_cache=False, **keep).logits
        rows.append(logits[0, -len(tokens):].float())                            # [n, vocab]
    return rows


@functools.cache
def _keeps_logits_of(forward_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(forward_type.forward).parameters


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the model computes the head on its last rows only when asked (most do)."""
    return _keeps_logits_of(type(model))
