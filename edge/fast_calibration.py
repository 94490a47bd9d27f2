"""Fast mode's calibration: how often the target agrees with a draft token, by the draft's
confidence, per local model, measured only on tokens the target checked (issue 30).

Vocabulary. A draft token *agrees* when the target would itself emit it after the same prefix
(greedy: the target's argmax; sampling: the verifier accepts it). A token is *checked* when a
verified round decides it: positions 0..n of a block with accepted length n (0..n-1 agree, n
does not); later positions are not checked. The *confidence* is the draft's top probability at
the position (edge/drafting.py), in CONFIDENCE_EDGES buckets. The draft's entropy is not a
second axis: on the shipped models it separated nothing below a top probability of 0.2 (0.72-0.84
agreement whatever the entropy); above 0.25, 1-3 nats agreed 2-5 points less than the rest, a
finer split than the few confident tokens the edge checks online could keep up to date.

Per local model (and greedy / sampled apart) the calibration keeps decayed counts per bucket:
`checked` and `agreed`. A shipped prior per model pair (models/fast-calibration.json, fitted by
models/train/fit_fast_prior.py on other prompts than fast mode is benchmarked on) starts them,
scaled to `prior_tokens` observations and decaying with every checked token exactly like the
edge's own evidence (half of it after `half_life_tokens` checked tokens), so the edge's measure
takes over. A bucket's agreement is its posterior mean, shrunk toward the model's pooled rate
and made non-decreasing in confidence (pool-adjacent-violators).

The *cut* for a stated agreement A: positions are verified below it and may go unverified above
it. It is the lowest confidence at which the expected agreement of a generation reaches A, over
the prior's mix of confidences (the share of positions per bucket; verified positions count as
agreeing): E(cut) = sum_b mix_b * (1 if b below the cut else agreement_b). The mix comes from
the prior because online the positions below the cut are never drafted in fast mode (the span
ends before them), so an online mix would see only the confident ones (a model without a prior
uses its checked tokens' mix, which over-counts them and keeps its cut high).
"""
from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tandem.config import resolve_path

if TYPE_CHECKING:
    from edge.config import FastModeConfig

log = logging.getLogger(__name__)

# Top-probability buckets: fine below 0.2, where a 4096-id draft's confidence mostly lies and the
# agreement climbs (0.6 -> 0.9 on the shipped models), coarse above.
CONFIDENCE_EDGES = (0.0, 0.04, 0.06, 0.08, 0.10, 0.12, 0.14, 0.16, 0.18, 0.20, 0.25, 0.30,
                    0.40, 0.50, 0.60, 0.80, 1.0)
BUCKETS = len(CONFIDENCE_EDGES) - 1
SHRINK = 2.0            # observations the model's pooled rate is worth in each bucket
FLAT_AGREEMENT = 0.5    # agreement assumed with neither prior nor evidence (shrinks thin
                        # buckets of a model without prior; its cut verifies all until measured)


def bucket(confidence: float) -> int:
    for b in range(BUCKETS - 1, -1, -1):
        if confidence >= CONFIDENCE_EDGES[b]:
            return b
    return 0


def monotone(rates: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit (pool adjacent violators): a more confident
    draft token is not less likely to agree, and a thin bucket must not say otherwise."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for r, w in zip(rates, weights):
        blocks.append([r, max(w, 1e-9), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(n)]


@dataclass
class ModelCalibration:
    """One local model's decayed counts per confidence bucket, and the prior's mix."""
    checked: list[float] = field(default_factory=lambda: [0.0] * BUCKETS)
    agreed: list[float] = field(default_factory=lambda: [0.0] * BUCKETS)
    mix: list[float] | None = None   # the prior's share of positions per bucket

    @classmethod
    def from_prior(cls, entry: Mapping[str, Sequence[float]], tokens: float) -> "ModelCalibration":
        seen, agreed = list(map(float, entry["seen"])), list(map(float, entry["agreed"]))
        if len(seen) != BUCKETS or len(agreed) != BUCKETS or sum(seen) <= 0:
            raise ValueError(f"a prior entry needs {BUCKETS} buckets of counts")
        scale = tokens / sum(seen)
        return cls(checked=[s * scale for s in seen], agreed=[a * scale for a in agreed],
                   mix=[s / sum(seen) for s in seen])

    def observe(self, confidence: float, agreed: bool, keep: float) -> None:
        self.checked[:] = [c * keep for c in self.checked]
        self.agreed[:] = [a * keep for a in self.agreed]
        b = bucket(confidence)
        self.checked[b] += 1.0
        self.agreed[b] += 1.0 if agreed else 0.0

    def rates(self) -> list[float]:
        total = sum(self.checked)
        pooled = (sum(self.agreed) + SHRINK * FLAT_AGREEMENT) / (total + SHRINK)
        raw = [(a + SHRINK * pooled) / (c + SHRINK) for a, c in zip(self.agreed, self.checked)]
        return monotone(raw, [c + SHRINK for c in self.checked])

    def shares(self) -> list[float] | None:
        """The mix: the prior's; without one, the checked tokens' (confident ones over-counted,
        which keeps the cut high); None before any."""
        if self.mix is not None:
            return self.mix
        total = sum(self.checked)
        return [c / total for c in self.checked] if total > 0 else None

    def mean(self) -> float:
        """The expected agreement of a position drawn from the mix."""
        mix = self.shares()
        return sum(m * r for m, r in zip(mix, self.rates())) if mix else FLAT_AGREEMENT

    def cut(self, min_agreement: float) -> float:
        """The lowest confidence at which E(cut) >= min_agreement (module docstring); 1.0 (verify
        everything) when even the top bucket alone falls short."""
        rates, mix = self.rates(), self.shares()
        if mix is None:
            return 1.0
        for b in range(BUCKETS):
            expected = sum(mix[:b]) + sum(m * r for m, r in zip(mix[b:], rates[b:]))
            if expected >= min_agreement - 1e-12:
                return CONFIDENCE_EDGES[b]
        return 1.0


class FastCalibration:
    """The edge's calibrations, one per (local model, greedy or sampled), shared by the clients
    of one process (thread-safe); `audit_share` of the confident tokens are still checked."""

    def __init__(self, prior: Mapping[str, Mapping] | None = None, *, prior_tokens: float = 1000.0,
                 half_life_tokens: float = 1000.0, audit_share: float = 0.05,
                 models: Mapping[str, str] | None = None) -> None:
        """prior: the prior file's `models` (entry name -> counts); models: ladder rung name ->
        entry name (a rung without an entry starts flat)."""
        self.prior = dict(prior or {})
        self.prior_tokens = prior_tokens
        self.keep = 0.5 ** (1.0 / half_life_tokens)
        self.audit_share = audit_share
        self.models = dict(models or {})
        self._by_key: dict[str, ModelCalibration] = {}
        self._lock = threading.Lock()
        self.audited = 0.0   # confident tokens sent to the target anyway (audits)
        self.skipped = 0.0   # confident tokens emitted unverified

    @classmethod
    def load(cls, path: Path | None, **settings) -> "FastCalibration":
        """From a prior file (models/fast-calibration.json); a missing or unreadable one gives
        flat calibrations (everything verified until measured), with a warning."""
        prior = None
        if path is not None:
            try:
                data = json.loads(Path(path).read_text())
                if [float(e) for e in data["edges"]] != list(CONFIDENCE_EDGES):
                    raise ValueError("its buckets are not this edge's CONFIDENCE_EDGES")
                prior = data["models"]
            except (OSError, ValueError, KeyError, TypeError) as error:
                log.warning("fast mode: no calibration prior from %s (%s); every local model "
                            "starts flat", path, error)
                prior = None
        return cls(prior, **settings)

    @classmethod
    def from_config(cls, config: "FastModeConfig") -> "FastCalibration":
        path = resolve_path(config.calibration_prior) if config.calibration_prior else None
        return cls.load(path, prior_tokens=config.prior_tokens,
                        half_life_tokens=config.half_life_tokens,
                        audit_share=config.audit_share, models=config.prior_models)

    def model(self, drafter: str, sampling: bool = False) -> ModelCalibration:
        key = f"{drafter}/{'sampled' if sampling else 'greedy'}"
        with self._lock:
            found = self._by_key.get(key)
            if found is None:
                entry = self.prior.get(self.models.get(drafter, drafter))
                found = (ModelCalibration.from_prior(entry, self.prior_tokens) if entry
                         else ModelCalibration())
                self._by_key[key] = found
            return found

    def agreement(self, drafter: str, confidences: Sequence[float],
                  sampling: bool = False) -> list[float]:
        """The expected agreement of each position drafted at these confidences."""
        rates = self.model(drafter, sampling).rates()
        return [rates[bucket(c)] for c in confidences]

    def cut(self, drafter: str, min_agreement: float, sampling: bool = False) -> float:
        return self.model(drafter, sampling).cut(min_agreement)

    def observe(self, drafter: str, confidences: Sequence[float], accepted: int,
                sampling: bool = False) -> None:
        """One verified round: positions 0..accepted are checked (the last one, when drafted,
        disagreed)."""
        calibration = self.model(drafter, sampling)
        with self._lock:
            for i, confidence in enumerate(confidences[:accepted + 1]):
                calibration.observe(confidence, i < accepted, self.keep)

    def audit_due(self) -> bool:
        """Whether the next confident span goes to the target: until audit_share of the
        confident tokens were."""
        with self._lock:
            return self.audited < self.audit_share * (self.audited + self.skipped)

    def count(self, tokens: int, audited: bool) -> None:
        with self._lock:
            if audited:
                self.audited += tokens
            else:
                self.skipped += tokens


@dataclass
class AgreementTally:
    """One generation's agreement, for its final chunk: expected over every emitted token (a
    verified one counts as agreeing), and measured on the confident tokens the target checked."""
    min_agreement: float
    expected_sum: float = 0.0       # sum over emitted tokens of their expected agreement
    emitted: int = 0
    checked: int = 0                # confident draft tokens the target checked
    checked_agreed: int = 0
    checked_expected: float = 0.0   # what the calibration expected of those

    def expected_after(self, p: Sequence[float]) -> list[float]:
        """The generation's expected agreement after each of these unverified tokens."""
        out, s, n = [], self.expected_sum, self.emitted
        for value in p:
            s, n = s + value, n + 1
            out.append(s / n)
        return out

    def report(self) -> dict:
        return {"min_agreement": self.min_agreement,
                "expected_agreement": self.expected_sum / self.emitted if self.emitted else 1.0,
                "measured_agreement": (self.checked_agreed / self.checked if self.checked
                                       else None),
                "checked_tokens": self.checked,
                "checked_expected_agreement": (self.checked_expected / self.checked
                                               if self.checked else None)}
