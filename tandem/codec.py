"""Sparse, quantized draft distributions: what travels on the uplink instead of a vocab vector.

The edge turns its draft probabilities into a `SparseDist` (the top `max_entries` ids with
integer weights) and samples its draft token from exactly that distribution. The cloud's
acceptance test then uses the very q the token was drawn from, so quantization costs some
acceptance but never losslessness.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tandem.codec_defaults import DEFAULT_MAX_ENTRIES, DEFAULT_SCALE  # noqa: F401 - re-exported


class InvalidDistribution(ValueError):
    """A sparse distribution that is not a proper distribution over the vocabulary."""


@dataclass(frozen=True)
class SparseDist:
    ids: np.ndarray      # [m] int64, distinct token ids
    weights: np.ndarray  # [m] int64, > 0; q(ids[i]) = weights[i] / weights.sum()

    def validate(self, vocab_size: int, max_entries: int) -> None:
        if len(self.ids) == 0:
            raise InvalidDistribution("empty distribution")
        if len(self.ids) != len(self.weights):
            raise InvalidDistribution(f"{len(self.ids)} ids but {len(self.weights)} weights")
        if len(self.ids) > max_entries:
            raise InvalidDistribution(f"{len(self.ids)} entries, limit is {max_entries}")
        if self.ids.min() < 0 or self.ids.max() >= vocab_size:
            raise InvalidDistribution(f"token id out of range [0, {vocab_size})")
        if len(np.unique(self.ids)) != len(self.ids):
            raise InvalidDistribution("repeated token id")
        if self.weights.min() <= 0:
            raise InvalidDistribution("weights must be positive")

    def prob_of(self, token: int) -> float:
        hit = np.nonzero(self.ids == token)[0]
        return float(self.weights[hit[0]] / self.weights.sum()) if len(hit) else 0.0

    def dense(self, vocab_size: int) -> torch.Tensor:
        """q as a dense [vocab_size] float64 tensor."""
        q = torch.zeros(vocab_size, dtype=torch.float64)
        q[torch.from_numpy(self.ids)] = torch.from_numpy(self.weights).double()
        return q / q.sum()

    def sample(self, generator: torch.Generator) -> int:
        w = torch.from_numpy(self.weights).double()
        return int(self.ids[torch.multinomial(w, 1, generator=generator).item()])


def quantize(probs: torch.Tensor, max_entries: int = DEFAULT_MAX_ENTRIES,
             scale: int = DEFAULT_SCALE) -> SparseDist:
    """probs: [vocab] -> SparseDist over at most max_entries ids, weights in [1, scale].

    Ids whose rounded weight is 0 are dropped; the most likely id always stays.
    """
    if probs.dim() != 1:
        raise ValueError(f"expected [vocab] probabilities, got shape {tuple(probs.shape)}")
    # A NaN or negative entry, or no mass at all, would quantize to garbage or to an empty q:
    # refuse it here rather than let a token be drawn from it.
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()) or not probs.sum() > 0:
        raise InvalidDistribution("probabilities must be finite, non-negative and not all zero")
    top = torch.topk(probs.double(), min(max_entries, probs.shape[0]))
    weights = torch.round(top.values / top.values[0] * scale).long()
    keep = weights > 0
    return SparseDist(ids=top.indices[keep].numpy().astype(np.int64),
                      weights=weights[keep].numpy().astype(np.int64))


def to_proto(dist: SparseDist, message) -> None:
    """Fill a tandem.v1.SparseDistribution message in place."""
    message.ids.extend(int(i) for i in dist.ids)
    message.weights.extend(int(w) for w in dist.weights)


def from_proto(message) -> SparseDist:
    return SparseDist(ids=np.asarray(message.ids, dtype=np.int64),
                      weights=np.asarray(message.weights, dtype=np.int64))
