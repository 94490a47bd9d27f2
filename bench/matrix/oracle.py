"""What the bench knows in advance: the target's own greedy output for each prompt (the reference
that agreement is measured against), and from it the oracle's draft lengths.

The oracle is an upper bound on any draft-length rule: before each round it knows how many of
the draft's next greedy tokens the target will accept, and drafts exactly that many (0 when the
first would be rejected), so no round wastes a draft token and none stops short of the first
mismatch. Greedy verification is lossless, so the context at every round is prompt + a prefix of
the reference; the draft's greedy token at each position of that text, fed the reference itself
(teacher forcing, one batched pass), tells whether it matches the reference there, and the
oracle's k at position i is the run of matches starting at i.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from cloud.runtime.target import TargetRuntime
from edge.control.policy import DraftPolicy, Plan, RoundView
from edge.record import RoundRecord
from edge.runtime.base import DraftRuntime


@torch.inference_mode()
def target_greedy(target: TargetRuntime, prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
    """The target alone, greedy, max_tokens new tokens (eos not special): plain decoding."""
    state = target.new_state()
    logits = target.score(state, list(prompt_ids))[-1]
    out: list[int] = []
    while True:
        token = int(logits.argmax())
        out.append(token)
        if len(out) == max_tokens:
            return out
        logits = target.score(state, [token])[-1]


def match_runs(draft: DraftRuntime, prompt_ids: Sequence[int], reference: Sequence[int],
               vocab_size: int | None = None) -> list[int]:
    """runs[i] = how many draft greedy tokens in a row match the reference from position i, given
    the context prompt + reference[:i] (len(reference) entries; the last can only be 0 or 1)."""
    text = list(prompt_ids) + list(reference)
    draft.rollback(0)
    logits = draft.extend(text[:-1])                       # [len(text) - 1, vocab]
    draft.rollback(0)
    vocab = vocab_size or logits.shape[-1]
    start = len(prompt_ids) - 1                            # row predicting reference[0]
    guesses = logits[start:, :vocab].argmax(dim=-1).tolist()
    matches = [int(g == r) for g, r in zip(guesses, reference)]
    runs = [0] * len(matches)
    run = 0
    for i in range(len(matches) - 1, -1, -1):
        run = run + 1 if matches[i] else 0
        runs[i] = run
    return runs


class OraclePolicy(DraftPolicy):
    """Draft exactly the accepted length known in advance (`runs`, set per prompt)."""

    def __init__(self) -> None:
        self.runs: list[int] = []

    def plan(self, view: RoundView) -> Plan:
        known = self.runs[view.generated] if view.generated < len(self.runs) else 0
        return Plan(k=min(known, view.max_k))

    def update(self, record: RoundRecord) -> None:
        pass


class CloudOnly(DraftPolicy):
    """The verifier generates every token itself and streams them (no drafting). With
    `cloud_generate` unsupported by the loop it degrades to k = 0 rounds: one target token per
    round trip."""

    def __init__(self, cloud_generate: bool = True) -> None:
        self.cloud_generate = cloud_generate

    def plan(self, view: RoundView) -> Plan:
        return Plan(k=0, cloud_generate=view.remaining if self.cloud_generate else 0)

    def update(self, record: RoundRecord) -> None:
        pass
