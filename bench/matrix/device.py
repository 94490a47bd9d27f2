"""Emulated edge devices: a draft runtime slowed to a device's speed, and the energy a
generation costs on it.

ThrottledDraft is for the bench only: it makes this machine's draft as slow as a phone-class
one by waiting on a clock after each extend (a decode step of one token takes at least
1 / draft_tokens_per_s seconds, a prefill of n tokens n / prefill_tokens_per_s). It sleeps rather
than spins, so a draft-ahead thread waiting on it leaves the CPU to the verifier, as a phone's
NPU would. Its `speed` counts the throttled times, which is what a policy measuring draft
seconds per token should see.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from edge.config import DeviceProfile
from edge.runtime.base import DraftRuntime


class ThrottledDraft(DraftRuntime):
    """`inner`, but no faster than the given decode and prefill rates (0 = not capped)."""

    def __init__(self, inner: DraftRuntime, draft_tokens_per_s: float,
                 prefill_tokens_per_s: float = 0.0) -> None:
        super().__init__()
        if draft_tokens_per_s < 0 or prefill_tokens_per_s < 0:
            raise ValueError("rates must be >= 0")
        self.inner = inner
        self.name = inner.name
        self.vocab_size = inner.vocab_size
        self.n_ctx = inner.n_ctx
        self.draft_tokens_per_s = draft_tokens_per_s
        self.prefill_tokens_per_s = prefill_tokens_per_s

    @property
    def position(self) -> int:
        return self.inner.position

    def extend(self, token_ids: Sequence[int]) -> torch.Tensor:
        started = time.monotonic()
        logits = self.inner.extend(token_ids)
        rate = self.prefill_tokens_per_s if len(token_ids) > 1 else self.draft_tokens_per_s
        if rate > 0:
            wait = started + len(token_ids) / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        self.speed.record(len(token_ids), time.monotonic() - started)
        return logits

    def rollback(self, position: int) -> None:
        self.inner.rollback(position)

    def fingerprint(self) -> str:
        return self.inner.fingerprint()

    def close(self) -> None:
        self.inner.close()


def joules(profile: DeviceProfile, draft_tokens: int, bytes_up: int, bytes_down: int) -> float:
    """Energy the device spends: every token the draft computed (drafted blocks, discarded ones
    and locally generated tokens alike) plus the radio's cost of every byte sent and received.
    Prefill and idle power are not modelled."""
    return (draft_tokens * profile.joules_per_draft_token + bytes_up * profile.joules_per_byte_up
            + bytes_down * profile.joules_per_byte_down)
