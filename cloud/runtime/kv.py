"""One session's KV cache, kept outside any model-specific Cache object so that the runtime can
pack many sessions into one padded batch and split them back after the forward pass."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class KVState:
    """Keys and values of every layer for the tokens a session has fed so far.

    layers[l] = (keys, values), each [kv_heads, length, head_dim]. Empty until the first forward.
    """
    layers: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    length: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the K/V of the first `length` positions (what the budget charges)."""
        return sum(k[:, : self.length].nbytes + v[:, : self.length].nbytes for k, v in self.layers)

    def append(self, new_layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Append new positions: new_layers[l] = (keys, values), each [kv_heads, n, head_dim]."""
        n = new_layers[0][0].shape[1]
        if not self.layers:
            self.layers = [(k.clone(), v.clone()) for k, v in new_layers]
        else:
            assert len(new_layers) == len(self.layers), "layer count changed"
            self.layers = [(torch.cat([k, nk], dim=1), torch.cat([v, nv], dim=1))
                           for (k, v), (nk, nv) in zip(self.layers, new_layers)]
        self.length += n

    def rollback(self, length: int) -> None:
        """Drop every position >= length (0 <= length <= self.length)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}: the cache holds {self.length} "
                             "positions")
        # A view: the storage of the dropped tail is freed when the next append copies.
        self.layers = [(k[:, :length], v[:, :length]) for k, v in self.layers]
        self.length = length

    def release(self) -> None:
        self.layers = []
        self.length = 0
