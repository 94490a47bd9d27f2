"""Acceptance estimator: per-position acceptance and acceptance as a function of the draft's
own confidence (its top probability), from this session's verdicts, seeded from a prior.

Both are decayed counts (a Beta posterior with forgetting): after each verified round every
count is multiplied by 1 - alpha and the round's outcomes are added, and an estimate is
(accepted + w * prior) / (reached + w). So it forgets at rate alpha per round (a step change
in acceptance is ~90% absorbed after log(0.1) / log(1 - alpha) rounds once the counts are in
steady state; alpha 0.1: 22 rounds, fewer while counts are small) and starts from the prior.

- position i is "reached" when the block had position i and every earlier one was accepted
  (tandem.metrics.conditional_acceptance): alpha_i = P(accept i | accepted < i);
- confidence bins (BINS equal bins of the top probability) count the same events by the
  confidence the draft had at that position, for the confidence stop.

`to_dict` / `from_dict` let a device persist the prior between sessions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from edge.record import RoundRecord

BINS = 10


@dataclass
class AcceptanceEstimator:
    max_positions: int = 16
    alpha: float = 0.1              # forgetting per verified round
    prior: float = 0.7              # acceptance assumed before any verdict
    prior_weight: float = 4.0       # observations the prior is worth
    pos_accepted: list[float] = field(default_factory=list)
    pos_reached: list[float] = field(default_factory=list)
    conf_accepted: list[float] = field(default_factory=lambda: [0.0] * BINS)
    conf_reached: list[float] = field(default_factory=lambda: [0.0] * BINS)
    unchecked: int = 0              # tokens committed since the last verified draft token
    verified: float = 0.0           # verified blocks, decayed per round but not by forget():
                                    # how much evidence there is, not how much is about this text

    def __post_init__(self) -> None:
        n = self.max_positions
        self.pos_accepted = (self.pos_accepted + [0.0] * n)[:n]
        self.pos_reached = (self.pos_reached + [0.0] * n)[:n]

    def update(self, record: RoundRecord) -> None:
        checked = record.mode == "verify" and record.accepted is not None
        self.unchecked = 0 if checked and record.drafted else self.unchecked + record.committed
        if not checked:
            return
        self.forget(1.0 - self.alpha)
        self.verified = self.verified * (1.0 - self.alpha) + (1.0 if record.drafted else 0.0)
        n = record.accepted
        for i in range(min(n + 1, record.drafted)):
            hit = 1.0 if i < n else 0.0
            if i < self.max_positions:
                self.pos_reached[i] += 1.0
                self.pos_accepted[i] += hit
            if i < len(record.confidences):
                b = conf_bin(record.confidences[i])
                self.conf_reached[b] += 1.0
                self.conf_accepted[b] += hit

    def forget(self, keep: float) -> None:
        """Keep this share of the evidence: a new prompt's text is only partly like the last."""
        for counts in (self.pos_accepted, self.pos_reached, self.conf_accepted,
                       self.conf_reached):
            counts[:] = [c * keep for c in counts]

    def _rate(self, accepted: float, reached: float, prior: float) -> float:
        return (accepted + self.prior_weight * prior) / (reached + self.prior_weight)

    def per_position(self) -> list[float]:
        """alpha_i for i < max_positions. Each position is shrunk toward the pooled rate of all
        positions (itself drawn toward the prior), so a deep position seen a few times does not
        swing the choice of k on chance."""
        pooled = self._rate(sum(self.pos_accepted), sum(self.pos_reached), self.prior)
        return [self._rate(a, r, pooled) for a, r in zip(self.pos_accepted, self.pos_reached)]

    def by_confidence(self) -> list[float]:
        """Acceptance per confidence bin, made non-decreasing in confidence (a more confident
        draft token is not less likely accepted; pooling keeps sparse bins sane)."""
        overall = self._rate(sum(self.conf_accepted), sum(self.conf_reached), self.prior)
        rates = [self._rate(a, r, overall) for a, r in zip(self.conf_accepted, self.conf_reached)]
        for b in range(BINS - 2, -1, -1):  # monotone from the top down
            rates[b] = min(rates[b], rates[b + 1])
        return rates

    def confidence_threshold(self, min_acceptance: float) -> float:
        """The lowest confidence whose estimated acceptance reaches min_acceptance (0.0 = never
        stop; 1.0 when no bin does)."""
        if min_acceptance <= 0.0:
            return 0.0
        rates = self.by_confidence()
        for b, rate in enumerate(rates):
            if rate >= min_acceptance:
                return b / BINS
        return 1.0

    def observations(self) -> float:
        return self.verified

    def to_dict(self) -> dict:
        return {"pos_accepted": self.pos_accepted, "pos_reached": self.pos_reached,
                "conf_accepted": self.conf_accepted, "conf_reached": self.conf_reached,
                "verified": self.verified}

    @classmethod
    def from_dict(cls, data: dict, **settings) -> "AcceptanceEstimator":
        est = cls(**settings)
        n = est.max_positions
        est.pos_accepted = (list(data.get("pos_accepted", [])) + [0.0] * n)[:n]
        est.pos_reached = (list(data.get("pos_reached", [])) + [0.0] * n)[:n]
        est.verified = float(data.get("verified", est.pos_reached[0]))
        for name in ("conf_accepted", "conf_reached"):
            values = list(data.get(name, []))
            if len(values) == BINS:
                setattr(est, name, [float(v) for v in values])
        return est


def conf_bin(confidence: float) -> int:
    return min(max(int(confidence * BINS), 0), BINS - 1)
