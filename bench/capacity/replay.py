"""A draft runtime that replays the shipped draft's logits instead of computing them, so that one
core can host a hundred emulated devices.

Under greedy verification every round starts from prompt + a prefix of the target's greedy
output (the reference), and the draft then extends its own greedy chain from there (drafting a
block, and drafting ahead while one is in flight). `ReplayTable.precompute` runs the real draft
along exactly those contexts once per prompt and keeps the logits row after every one of them;
`ReplayDraft` answers `extend` from that table. A context the table lacks (a deeper chain, a
sampled token) is computed by the real draft under a lock and added, so the replayed logits are
the live draft's for every context, not an approximation; `misses` counts those.

Rows are keyed by a rolling hash of the whole context (key_i = hash((key_{i-1}, token_i)), ints
and tuples hash deterministically in CPython), so a lookup costs O(1) per token.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import torch

from edge.runtime.base import DraftRuntime

ROOT_KEY = 0


def chain_key(key: int, token: int) -> int:
    """The key of context + [token], given the key of context."""
    return hash((key, token))


def context_keys(tokens: Iterable[int]) -> list[int]:
    """keys[i] = the key of tokens[: i + 1]."""
    keys, key = [], ROOT_KEY
    for token in tokens:
        key = chain_key(key, token)
        keys.append(key)
    return keys


class ReplayTable:
    """Context key -> the draft's logits row [vocab] after that context, shared by every
    emulated device (thread-safe). `source` is the real draft that fills it."""

    def __init__(self, source: DraftRuntime) -> None:
        self.source = source
        self.vocab_size = source.vocab_size
        self.n_ctx = source.n_ctx
        self.rows: dict[int, torch.Tensor] = {}
        self.misses = 0            # rows computed after precompute (contexts it did not foresee)
        self._lock = threading.Lock()
        self._source_tokens: list[int] = []   # what the source's KV cache holds

    def precompute(self, prompt: Sequence[int], reference: Sequence[int], depth: int) -> None:
        """Rows for every prefix of the prompt, and for prompt + reference[:i] + the draft's own
        greedy chain of up to `depth` tokens from there, for every i in [0, len(reference)]."""
        with self._lock:
            for i in range(len(reference) + 1):
                context = list(prompt) + list(reference[:i])
                row = self._feed(context)[-1]
                for _ in range(depth):
                    token = int(row[:self.vocab_size].argmax())
                    context.append(token)
                    row = self._feed(context)[-1]

    def rows_for(self, context: Sequence[int], keys: Sequence[int], start: int) -> torch.Tensor:
        """Logits [len(context) - start, vocab]: row j follows context[: start + j + 1]."""
        rows = [self.rows.get(key) for key in keys[start:]]
        if any(row is None for row in rows):
            with self._lock:
                rows = [self.rows.get(key) for key in keys[start:]]
                if any(row is None for row in rows):
                    self.misses += 1
                    self._feed(list(context))
                    rows = [self.rows[key] for key in keys[start:]]
        return torch.stack(rows)

    def _feed(self, context: list[int]) -> torch.Tensor:
        """Make the source's cache hold `context`, storing the row after every position it
        computed; return those fresh rows (the last follows the whole context). Caller holds
        the lock."""
        keep = 0
        limit = min(len(self._source_tokens), len(context) - 1)
        while keep < limit and self._source_tokens[keep] == context[keep]:
            keep += 1
        self.source.rollback(keep)
        fresh = self.source.extend(context[keep:])          # [len(context) - keep, vocab]
        self._source_tokens = list(context)
        keys = context_keys(context)
        for j, row in enumerate(fresh):
            self.rows.setdefault(keys[keep + j], row.clone())
        return fresh


class ReplayDraft(DraftRuntime):
    """One emulated device's draft: the shipped draft's logits for whatever context it holds,
    read from a shared ReplayTable (computed by the real draft on a miss). As fast as a lookup;
    wrap it in bench.matrix.device.ThrottledDraft to pace it at a device's speed."""

    def __init__(self, table: ReplayTable, name: str = "replay") -> None:
        super().__init__()
        self.table = table
        self.name = f"{name}:{table.source.name}"
        self.vocab_size = table.vocab_size
        self.n_ctx = table.n_ctx
        self._tokens: list[int] = []
        self._keys: list[int] = []

    @property
    def position(self) -> int:
        return len(self._tokens)

    def extend(self, token_ids: Sequence[int]) -> torch.Tensor:
        self._check_extend(token_ids)
        start = len(self._tokens)
        key = self._keys[-1] if self._keys else ROOT_KEY
        for token in token_ids:
            key = chain_key(key, int(token))
            self._keys.append(key)
        self._tokens.extend(int(t) for t in token_ids)
        return self.table.rows_for(self._tokens, self._keys, start)

    def rollback(self, position: int) -> None:
        self._check_rollback(position)
        del self._tokens[position:]
        del self._keys[position:]

    def fingerprint(self) -> str:
        return self.table.source.fingerprint()
