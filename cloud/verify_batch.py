"""The acceptance test for every round of a batched pass at once: pure tensor functions, the
same test as cloud/verify.py (its vocabulary; verify.py's single-block functions are the
reference these must equal exactly), vectorised over the rows like vLLM's RejectionSampler.

A batch of B blocks of ragged lengths k_b <= K is padded: draft tokens [B, K] (entries past
k_b are ignored), target rows [B, K + 1] (row j = the distribution after x_1..x_j).

verify_rounds() takes the RoundChecks of one pass and its logits, runs one greedy step for all
greedy rows and one rejection step per group of sampled rows that warp alike, and returns one
Verdict (or the refusal) per round.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from cloud.errors import InvalidRequest, ZeroDraftProbability
from cloud.runtime.target import PassLogits
from cloud.verify import RoundCheck, Verdict
from tandem.sampling import warp


def verify_greedy_batch(draft_tokens: torch.Tensor,   # [B, K] int64
                        lengths: torch.Tensor,        # [B] int64, k_b
                        target_tokens: torch.Tensor,  # [B, K + 1] int64, argmax of each row
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """accepted [B] (n_b: the longest prefix equal to the target's argmax) and bonus [B]
    (the target's token after it)."""
    size, width = draft_tokens.shape
    assert target_tokens.shape == (size, width + 1), \
        f"target_tokens: expected {(size, width + 1)}, got {tuple(target_tokens.shape)}"
    valid = torch.arange(width, device=draft_tokens.device)[None, :] < lengths[:, None]
    match = (draft_tokens == target_tokens[:, :width]) & valid                   # [B, K]
    accepted = match.long().cumprod(dim=1).sum(dim=1)                            # [B]
    return accepted, target_tokens.gather(1, accepted[:, None])[:, 0]


def verify_sampled_batch(draft_tokens: torch.Tensor,  # [B, K] int64
                         lengths: torch.Tensor,       # [B] int64, k_b
                         q: torch.Tensor,             # [B, K, V] float64 draft probabilities
                         p: torch.Tensor,             # [B, K + 1, V] warped target probs
                         uniforms: torch.Tensor,      # [B, K + 1] float64; row b uses [: k_b + 1]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling for B blocks: accepted [B] and bonus [B], each row
    exactly what verify.verify_sampled_with_uniforms gives it (uniforms[b, k_b] draws its
    bonus token). Raises ZeroDraftProbability for a draft token with q = 0."""
    size, width = draft_tokens.shape
    vocab = p.shape[2]
    assert p.shape == (size, width + 1, vocab), f"p: got {tuple(p.shape)}"
    assert q.shape == (size, width, vocab), f"q: got {tuple(q.shape)}"
    assert uniforms.shape == (size, width + 1), f"uniforms: got {tuple(uniforms.shape)}"
    p, q = p.double(), q.double()
    rows = torch.arange(size, device=p.device)
    valid = torch.arange(width, device=p.device)[None, :] < lengths[:, None]     # [B, K]
    drafts = torch.where(valid, draft_tokens, 0)[..., None]                     # [B, K, 1]
    q_of_draft = q.gather(2, drafts)[..., 0]                                     # [B, K]
    p_of_draft = p[:, :width].gather(2, drafts)[..., 0]                          # [B, K]
    zero = (q_of_draft <= 0) & valid
    if zero.any():
        b, i = (int(x) for x in zero.nonzero()[0])
        raise ZeroDraftProbability(
            f"draft token {int(draft_tokens[b, i])} at block position {i} has q = 0: the draft "
            "could not have sampled it (q must be the distribution the token was drawn from)")

    ratio = p_of_draft / torch.where(valid, q_of_draft, 1.0)
    accept = (uniforms[:, :width] < ratio) & valid                               # [B, K]
    accepted = accept.long().cumprod(dim=1).sum(dim=1)                           # [B]

    p_n = p[rows, accepted]                                                      # [B, V]
    q_n = torch.cat([q, q.new_zeros((size, 1, vocab))], dim=1)[rows, accepted]   # [B, V]
    rejected = (accepted < lengths)[:, None]
    # A rejection needs p(x) < q(x), so max(0, p - q) has mass; falling back to p only guards
    # against float rounding (as in verify.py).
    residual = (p_n - q_n).clamp_min(0.0)
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_n)
    bonus_dist = torch.where(rejected, residual, p_n)
    return accepted, sample_inverse_cdf_batch(bonus_dist, uniforms[rows, lengths])


def sample_inverse_cdf_batch(weights: torch.Tensor,  # [B, V] non-negative
                             uniforms: torch.Tensor,  # [B] in [0, 1)
                             ) -> torch.Tensor:       # [B] int64
    """verify.sample_inverse_cdf for every row: the id whose CDF interval holds the uniform."""
    cdf = weights.double().cumsum(dim=1)                                         # [B, V]
    total = cdf[:, -1:]
    if not bool((total > 0).all()):
        raise InvalidRequest("cannot sample from a distribution with no mass")
    index = torch.searchsorted(cdf, uniforms.double()[:, None] * total, right=True)[:, 0]
    over = index >= weights.shape[1]
    if bool(over.any()):
        # uniform * total rounded up to the total: the last id that has mass, never a 0 one.
        ids = torch.arange(weights.shape[1], device=weights.device)
        last = torch.where(weights > 0, ids, -1).max(dim=1).values
        index = torch.where(over, last, index)
    return index


def verify_rounds(checks: Sequence[RoundCheck | None],
                  logits: Sequence[torch.Tensor],   # logits[i]: [n_i, V], the job's rows
                  ) -> list[Verdict | Exception | None]:
    """One verdict per check (None where a job has no check), rows m..m + k of each job's
    logits scoring its block. A round the test refuses gets its exception; the others their
    verdicts."""
    out: list[Verdict | Exception | None] = [None] * len(checks)
    greedy = [i for i, c in enumerate(checks) if c is not None and c.params.greedy]
    if greedy:
        _greedy(greedy, checks, logits, out)
    groups: dict[object, list[int]] = {}
    for i, check in enumerate(checks):
        if check is not None and not check.params.greedy:
            key = (check.params.temperature, check.params.top_k, check.params.top_p)  # warp
            groups.setdefault(key, []).append(i)
    for members in groups.values():
        try:
            _sampled(members, checks, logits, out)
        except (InvalidRequest, ZeroDraftProbability):
            for i in members:  # find the one that is refused; the others are still exact
                out[i] = _one_sampled(checks[i], logits[i])
    return out


def _rows(check: RoundCheck, scores: torch.Tensor) -> torch.Tensor:
    k = len(check.draft)
    return scores[check.offset: check.offset + k + 1]                            # [k + 1, V]


def _padded_drafts(members: list[int], checks, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    width = max(len(checks[i].draft) for i in members)
    drafts = torch.zeros((len(members), width), dtype=torch.long)
    for row, i in enumerate(members):
        drafts[row, : len(checks[i].draft)] = torch.as_tensor(checks[i].draft, dtype=torch.long)
    lengths = torch.tensor([len(checks[i].draft) for i in members])
    return drafts.to(device), lengths.to(device), width


def _stack_rows(members: list[int], checks, logits, width: int) -> torch.Tensor:
    """[len(members), width + 1, V]: each job's k + 1 rows, padded with copies of its last."""
    rows = []
    for i in members:
        block = _rows(checks[i], logits[i])
        if block.shape[0] < width + 1:
            block = torch.cat([block, block[-1:].expand(width + 1 - block.shape[0], -1)])
        rows.append(block)
    return torch.stack(rows)


def _greedy(members, checks, logits, out) -> None:
    device = logits[members[0]].device
    drafts, lengths, width = _padded_drafts(members, checks, device)
    if isinstance(logits, PassLogits):  # the torch runtime's whole pass; vLLM's: a list
        flat = logits.flat
        # One argmax over the whole pass, then each job's k + 1 rows.
        argmax = flat.argmax(dim=-1)                                             # [T]
        starts = torch.tensor([logits.starts[i] + checks[i].offset for i in members],
                              device=device)
        index = starts[:, None] + torch.arange(width + 1, device=device)[None, :]
        index = torch.minimum(index, starts[:, None] + lengths[:, None])        # pad: last row
        target = argmax[index]                                                   # [G, K + 1]
    else:
        target = _stack_rows(members, checks, logits, width).argmax(dim=-1)
    accepted, bonus = verify_greedy_batch(drafts, lengths, target)
    for i, n, token in zip(members, accepted.tolist(), bonus.tolist()):
        out[i] = Verdict(accepted=n, token=token)


def _sampled(members, checks, logits, out) -> None:
    device = logits[members[0]].device
    drafts, lengths, width = _padded_drafts(members, checks, device)
    params = checks[members[0]].params
    p = warp(_stack_rows(members, checks, logits, width), params)                # [G, K+1, V]
    vocab = p.shape[-1]
    q = torch.zeros((len(members), width, vocab), dtype=torch.float64)
    uniforms = torch.zeros((len(members), width + 1), dtype=torch.float64)
    for row, i in enumerate(members):
        k = len(checks[i].draft)
        if k:
            q[row, :k] = checks[i].q
        uniforms[row, : k + 1] = checks[i].uniforms
    accepted, bonus = verify_sampled_batch(drafts, lengths, q.to(device), p, uniforms.to(device))
    for i, n, token in zip(members, accepted.tolist(), bonus.tolist()):
        out[i] = Verdict(accepted=n, token=token)


def _one_sampled(check: RoundCheck, scores: torch.Tensor) -> Verdict | Exception:
    from cloud.verify import verify_round
    try:
        return verify_round(check, scores)
    except (InvalidRequest, ZeroDraftProbability) as exc:
        return exc
