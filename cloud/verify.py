"""Verification of one block: pure tensor functions, no gRPC, no model objects.

Vocabulary (the same as protos/tandem/v1/decoding.proto, used everywhere in cloud/):
  draft           tokens proposed by the edge's small model
  block           the k draft tokens x_1..x_k sent in one Draft message (k >= 0)
  round           one Draft -> Verdict exchange; the target scores [pending] + block in one
                  forward pass, giving k + 1 target distributions p_1..p_{k+1}
  q               the draft distribution each x_i was sampled from (dense here, [k, vocab])
  p               the target's distribution after the same warp (temperature, top-k, top-p)
  accepted length n <= k: the longest prefix of the block the target accepts
  bonus token     the target's token at position n + 1: a correction when n < k (vLLM calls it
                  the "recovered" token), a free extra token when n == k
  verdict         (n, bonus token); the round commits x_1..x_n and the bonus token
  verified        a token the target checked (an accepted draft token or a bonus token)

Greedy (temperature 0): accept while x_i equals the target's argmax; the bonus token is the
argmax at the first mismatch (or after the last draft token).

Sampling: speculative rejection sampling (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023). Accept x_i with
probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample the correction from
norm(max(0, p_i - q_i)); if all k are accepted sample the bonus token from p_{k+1}. The emitted
tokens are then distributed exactly as the target's own samples. A drafted token with
q_i(x_i) = 0 could not have been sampled by the draft: it is refused, never a silent NaN.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cloud.errors import InvalidRequest, ZeroDraftProbability
from tandem.sampling import SamplingParams, warp


@dataclass(frozen=True)
class Verdict:
    accepted: int  # n, 0 <= n <= k
    token: int     # bonus token: the target's token after the accepted prefix


@dataclass(frozen=True)
class RoundCheck:
    """What the acceptance test of one round needs besides the target's rows, made by the
    session's thread before the pass (so the pass's thread only runs tensors): the block, the
    rows before it, and for sampling the dense q and the round's uniforms."""
    draft: Sequence[int]               # x_1..x_k
    offset: int                        # rows before the block's k + 1 (fast-mode unverified)
    params: SamplingParams
    q: torch.Tensor | None = None      # [k, vocab] float64 (sampling)
    uniforms: torch.Tensor | None = None  # [k + 1] float64 from the session's generator

    @classmethod
    def make(cls, draft: Sequence[int], offset: int, params: SamplingParams,
             q: torch.Tensor | None, generator: torch.Generator | None) -> RoundCheck:
        """Draws the k + 1 uniforms verify_sampled would draw, in the same order."""
        if params.greedy:
            return cls(draft=tuple(draft), offset=offset, params=params)
        uniforms = torch.rand(len(draft) + 1, dtype=torch.float64, generator=generator)
        return cls(draft=tuple(draft), offset=offset, params=params, q=q, uniforms=uniforms)


def verify_round(check: RoundCheck, scores: torch.Tensor) -> Verdict:
    """The reference test of one round: scores [offset + k + 1, vocab] (or more rows), rows
    offset..offset + k scoring the block."""
    k = len(check.draft)
    logits = scores[check.offset: check.offset + k + 1]                      # [k + 1, vocab]
    draft_tokens = torch.tensor(list(check.draft), dtype=torch.long)         # [k]
    if check.params.greedy:
        return verify_greedy(draft_tokens, logits.cpu())
    p = warp(logits, check.params).cpu()                                     # [k + 1, vocab]
    return verify_sampled_with_uniforms(draft_tokens, check.q, p, check.uniforms)


def verify_greedy(draft_tokens: torch.Tensor,   # [k] int64
                  target_logits: torch.Tensor,  # [k + 1, vocab]
                  ) -> Verdict:
    """Accept the longest prefix matching the target's argmax, then the target's own token."""
    k = _check_block(draft_tokens, target_logits.shape, "target_logits")
    target_tokens = target_logits.argmax(dim=-1)                          # [k + 1]
    mismatch = (draft_tokens != target_tokens[:k]).nonzero()
    n = int(mismatch[0]) if len(mismatch) else k
    return Verdict(accepted=n, token=int(target_tokens[n]))


def verify_sampled(draft_tokens: torch.Tensor,  # [k] int64
                   q: torch.Tensor,             # [k, vocab] draft probabilities (dense)
                   p: torch.Tensor,             # [k + 1, vocab] warped target probabilities
                   generator: torch.Generator,
                   ) -> Verdict:
    """Speculative rejection sampling; draws k + 1 uniforms from `generator` every round, so a
    session's verdicts are a deterministic function of its seed and its inputs."""
    uniforms = torch.rand(draft_tokens.shape[0] + 1, dtype=torch.float64, generator=generator)
    return verify_sampled_with_uniforms(draft_tokens, q, p, uniforms)


def verify_sampled_with_uniforms(draft_tokens: torch.Tensor,  # [k] int64
                                 q: torch.Tensor,             # [k, vocab]
                                 p: torch.Tensor,             # [k + 1, vocab]
                                 uniforms: torch.Tensor,      # [k + 1] float in [0, 1)
                                 ) -> Verdict:
    """The same test with its randomness given: uniforms[i] decides x_i, uniforms[k] draws the
    bonus token by inverse CDF."""
    k = _check_block(draft_tokens, p.shape, "p")
    assert q.shape == (k, p.shape[1]), f"q: expected {(k, p.shape[1])}, got {tuple(q.shape)}"
    assert uniforms.shape == (k + 1,), f"uniforms: expected {(k + 1,)}, got {tuple(uniforms.shape)}"
    p, q = p.double(), q.double()

    positions = torch.arange(k)
    q_of_draft = q[positions, draft_tokens]                               # [k]
    p_of_draft = p[positions, draft_tokens]                               # [k]
    if k and (q_of_draft <= 0).any():
        i = int((q_of_draft <= 0).nonzero()[0])
        raise ZeroDraftProbability(
            f"draft token {int(draft_tokens[i])} at block position {i} has q = 0: the draft "
            "could not have sampled it (q must be the distribution the token was drawn from)")

    # u < p/q accepts with probability min(1, p/q), since u < 1.
    accepted_mask = uniforms[:k] < p_of_draft / q_of_draft                # [k]
    rejected = (~accepted_mask).nonzero()
    n = int(rejected[0]) if len(rejected) else k

    if n < k:
        # A rejection needs p(x) < q(x), so max(0, p - q) has positive mass; the fallback to p
        # only guards against float rounding when p and q are equal to within an ulp.
        residual = (p[n] - q[n]).clamp_min(0.0)                          # [vocab]
        bonus_dist = residual if residual.sum() > 0 else p[n]
    else:
        bonus_dist = p[k]
    return Verdict(accepted=n, token=sample_inverse_cdf(bonus_dist, float(uniforms[k])))


def sample_inverse_cdf(weights: torch.Tensor,  # [vocab] non-negative, not necessarily normalised
                       uniform: float) -> int:
    """The id whose CDF interval contains `uniform`; an id of weight 0 is never returned."""
    cdf = weights.double().cumsum(0)                                      # [vocab]
    total = cdf[-1]
    if not total > 0:
        raise InvalidRequest("cannot sample from a distribution with no mass")
    target = torch.tensor([uniform * float(total)], dtype=torch.float64)
    index = int(torch.searchsorted(cdf, target, right=True))
    if index >= len(cdf):
        # uniform * total rounded up to the total: the last id that has mass, never a 0 one.
        index = int((weights > 0).nonzero()[-1])
    return index


def _check_block(draft_tokens: torch.Tensor, scores_shape: torch.Size, name: str) -> int:
    assert draft_tokens.dim() == 1, f"draft_tokens: expected [k], got {tuple(draft_tokens.shape)}"
    k = draft_tokens.shape[0]
    assert len(scores_shape) == 2 and scores_shape[0] == k + 1, \
        f"{name}: expected [k + 1 = {k + 1}, vocab], got {tuple(scores_shape)}"
    if k and (draft_tokens.min() < 0 or draft_tokens.max() >= scores_shape[1]):
        raise InvalidRequest(f"draft token id out of range [0, {scores_shape[1]})")
    return k
