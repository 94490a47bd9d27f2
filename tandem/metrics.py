"""The formulas of the metric conventions (../shared/ANCHORS.md), in one place.

Every τ, acceptance rate, per-position rate, passes-per-token and TPOT in the project is computed
here: the edge client's GenerationResult, the daemon's stats and metrics, the benches and the
model evaluation call these functions, so the numbers they print cannot drift apart.

Empty cases are defined, never a ZeroDivisionError or NaN:
- τ with no verification rounds is 1.0 (plain decoding: one token per target pass);
- an acceptance rate with nothing drafted is 0.0;
- passes per token with no tokens is 0.0;
- TPOT with fewer than two tokens is 0.0 (no inter-token interval exists).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class _RoundLike(Protocol):
    drafted: int
    accepted: int | None


@dataclass(frozen=True)
class Round:
    """The minimum of a verification round the formulas need (edge.rounds.RoundRecord has
    more); accepted None = not verified."""
    drafted: int
    accepted: int | None


def tau(accepted_total: int, rounds: int) -> float:
    """Mean accepted length τ = 1 + accepted / verification rounds (counts the bonus token)."""
    if rounds < 0 or accepted_total < 0:
        raise ValueError(f"negative counts: accepted {accepted_total}, rounds {rounds}")
    return 1.0 + accepted_total / rounds if rounds else 1.0


def tau_of(accepted_lengths: Sequence[int]) -> float:
    """τ of a list of per-round accepted lengths."""
    return tau(sum(accepted_lengths), len(accepted_lengths))


def acceptance_rate(accepted: int, drafted: int) -> float:
    """Accepted / drafted (prefix-accepted only); 0.0 when nothing was drafted."""
    if accepted > drafted:
        raise ValueError(f"accepted {accepted} > drafted {drafted}")
    return accepted / drafted if drafted else 0.0


def per_position_acceptance(records: Iterable[_RoundLike]) -> list[float]:
    """Rate at position i = rounds that accepted position i / verified rounds whose block reached
    position i. Unverified rounds (accepted is None) are skipped. [] when nothing was drafted."""
    reached: list[int] = []
    accepted: list[int] = []
    for record in records:
        if record.accepted is None:
            continue
        for i in range(record.drafted):
            if i == len(reached):
                reached.append(0)
                accepted.append(0)
            reached[i] += 1
            if i < record.accepted:
                accepted[i] += 1
    return [a / r for a, r in zip(accepted, reached)]


def conditional_acceptance(records: Iterable[_RoundLike]) -> list[float]:
    """Rate at position i given positions < i were accepted: rounds that accepted position i /
    verified rounds whose block had position i and accepted every position before it (the
    per-position alpha_i a draft-length model multiplies). [] when nothing was drafted."""
    reached: list[int] = []
    accepted: list[int] = []
    for record in records:
        if record.accepted is None:
            continue
        for i in range(min(record.accepted + 1, record.drafted)):
            if i == len(reached):
                reached.append(0)
                accepted.append(0)
            reached[i] += 1
            if i < record.accepted:
                accepted[i] += 1
    return [a / r for a, r in zip(accepted, reached)]


def passes_per_token(passes: int, tokens: int) -> float:
    """Target forward passes per output token; 0.0 with no tokens."""
    return passes / tokens if tokens else 0.0


def tpot(e2e_s: float, ttft_s: float, tokens: int) -> float:
    """Time per output token after the first: (e2e - TTFT) / (tokens - 1); 0.0 below 2 tokens."""
    return (e2e_s - ttft_s) / (tokens - 1) if tokens >= 2 else 0.0


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Tokens committed by one round with i.i.d. acceptance alpha and k drafts (bonus counted):
    (1 - alpha^(k+1)) / (1 - alpha), = k + 1 at alpha = 1."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
