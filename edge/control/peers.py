"""The peers' draft-length rules, re-implemented as draft policies (baselines for `tandem bench`).

Each keeps its project's defaults and update rule (../shared/ANCHORS.md):

- `hf-heuristic` — transformers' assisted generation, `num_assistant_tokens_schedule="heuristic"`
  (generation/candidate_generator.py, AssistedCandidateGenerator.update_candidate_strategy):
  k starts at num_assistant_tokens (20); +2 when every drafted token was accepted, else -1
  (never below 1). Drafting stops once the draft's probability of its token falls below
  assistant_confidence_threshold (0.4), and that threshold is re-fitted after every round on the
  (probability, accepted) pairs seen so far: the ROC threshold minimising FPR + 3 FNR.
- `llamacpp-pmin` — llama.cpp's speculative decoding (common/speculative.cpp, server): up to
  --draft-max (16) tokens, drafting stops after a token whose top probability is below
  --draft-p-min (0.75); when fewer than --draft-min tokens could be drafted, no draft at all.
  Stateless.
- `sglang-ema` — SGLang's --speculative-adaptive (AdaptiveSpeculativeParams): an EMA (alpha 0.2)
  of the accepted length, started at steps - 1; after 10 warm-up verifies and then every 5, the
  step count moves between the tiers [1, 3, 7]: down a tier while EMA <= lower - 0.5 +
  down_hysteresis (0), up while EMA > current - 0.5 + up_hysteresis (-0.25).

Like every policy, one object lives per EdgeClient and sees its generations in turn, so the
learned state carries over between requests as it does in those servers. The policy's k is
capped by view.max_k (remaining tokens, server limits), as their own caps do. One difference
from their code: the confidence stop is the loop's (edge/drafting.py), which ends the block
before a low-confidence token (never at the first position); llama.cpp and transformers append
that token and stop after it, one more draft token per stopped block.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from edge.control.policy import DraftPolicy, Plan, RoundView, register_policy
from edge.record import RoundRecord
from tandem.config import Settings

if TYPE_CHECKING:
    from edge.config import ClientConfig


class HFHeuristicConfig(Settings):
    """transformers' defaults (GenerationConfig)."""
    num_assistant_tokens: int = Field(20, ge=1, le=64, description="k of the first round")
    assistant_confidence_threshold: float = Field(
        0.4, ge=0, lt=1, description="stop drafting after a token whose draft probability is "
                                     "below this; 0 = never")
    dynamic_threshold: bool = Field(True, description="re-fit the threshold after each round "
                                    "(ROC, cost FPR + 3 FNR), as transformers does with sklearn")


class LlamaCppConfig(Settings):
    """llama.cpp's --draft-max / --draft-min / --draft-p-min defaults."""
    draft_max: int = Field(16, ge=1, le=64, description="most tokens drafted per round")
    draft_min: int = Field(0, ge=0, le=64, description="fewer tokens than this possible: no draft")
    p_min: float = Field(0.75, ge=0, lt=1, description="stop after a token whose top "
                                                       "probability is below this")


class SGLangEMAConfig(Settings):
    """SGLang's adaptive speculative defaults."""
    initial_steps: int = Field(3, ge=1, le=64, description="draft steps before any update")
    candidate_steps: tuple[int, ...] = Field((1, 3, 7), min_length=1, description="the tiers")
    ema_alpha: float = Field(0.2, gt=0, le=1, description="EMA weight of a new accepted length")
    warmup_batches: int = Field(10, ge=0, description="verifies before the first update")
    update_interval: int = Field(5, ge=1, description="verifies between updates")
    down_hysteresis: float = Field(0.0, description="shift of the step-down threshold")
    up_hysteresis: float = Field(-0.25, description="shift of the step-up threshold")

    @model_validator(mode="after")
    def _tiers_positive(self) -> "SGLangEMAConfig":
        if min(self.candidate_steps) < 1:
            raise ValueError("candidate_steps must be >= 1")
        return self


class PeersConfig(Settings):
    """Knobs of the peers' rules (edge/control/peers.py), each at its project's default."""
    hf: HFHeuristicConfig = Field(default_factory=HFHeuristicConfig)
    llamacpp: LlamaCppConfig = Field(default_factory=LlamaCppConfig)
    sglang: SGLangEMAConfig = Field(default_factory=SGLangEMAConfig)


def _verified(record: RoundRecord) -> bool:
    return record.mode == "verify" and record.accepted is not None


def roc_threshold(probs: Sequence[float], matches: Sequence[int], fn_cost: float = 3.0) -> float | None:
    """The threshold t (predict "accepted" when prob >= t) minimising FPR + fn_cost * FNR over
    the ROC points, highest t on ties (sklearn's roc_curve + argmin, as transformers uses it);
    None without at least one positive and one negative."""
    positives = sum(1 for m in matches if m)
    negatives = len(matches) - positives
    if not positives or not negatives:
        return None
    pairs = sorted(zip(probs, matches), key=lambda pm: -pm[0])
    best_t, best_cost = math.inf, fn_cost  # t = inf: nothing predicted positive, FNR = 1
    tp = fp = 0
    i = 0
    while i < len(pairs):
        t = pairs[i][0]
        while i < len(pairs) and pairs[i][0] == t:  # every prob >= t is predicted positive
            tp += 1 if pairs[i][1] else 0
            fp += 0 if pairs[i][1] else 1
            i += 1
        cost = fp / negatives + fn_cost * (1.0 - tp / positives)
        if cost < best_cost:
            best_t, best_cost = t, cost
    return best_t


class HFHeuristic(DraftPolicy):
    """transformers' heuristic schedule with its confidence cut-off (see the module docstring)."""

    def __init__(self, config: HFHeuristicConfig | None = None) -> None:
        self.config = config or HFHeuristicConfig()
        self.num_assistant_tokens = self.config.num_assistant_tokens
        self.threshold = self.config.assistant_confidence_threshold
        self.probs: list[float] = []
        self.matches: list[int] = []

    def plan(self, view: RoundView) -> Plan:
        return Plan(k=min(self.num_assistant_tokens, view.max_k), min_confidence=self.threshold)

    def update(self, record: RoundRecord) -> None:
        if not _verified(record):
            return
        n, drafted = int(record.accepted), record.drafted  # type: ignore[arg-type]
        if n == drafted:
            self.num_assistant_tokens += 2
        else:
            self.num_assistant_tokens = max(1, self.num_assistant_tokens - 1)
        if (self.config.dynamic_threshold and self.threshold > 0 and drafted
                and len(record.confidences) >= drafted):
            # As transformers: every accepted token is a positive, the first rejected one a
            # negative; the drafts after it say nothing and are dropped.
            self.probs.extend(record.confidences[: min(n + 1, drafted)])
            self.matches.extend([1] * n + ([0] if n < drafted else []))
            if len(self.probs) > 5:
                fitted = roc_threshold(self.probs, self.matches)
                if fitted is not None and math.isfinite(fitted):
                    self.threshold = fitted


class LlamaCppPMin(DraftPolicy):
    """llama.cpp's draft-max / draft-min / draft-p-min rule (stateless)."""

    def __init__(self, config: LlamaCppConfig | None = None) -> None:
        self.config = config or LlamaCppConfig()

    def plan(self, view: RoundView) -> Plan:
        k = min(self.config.draft_max, view.max_k)
        if k < self.config.draft_min:
            k = 0  # llama.cpp skips speculation when the draft could not reach draft-min
        return Plan(k=k, min_confidence=self.config.p_min)

    def update(self, record: RoundRecord) -> None:
        pass


class SGLangEMA(DraftPolicy):
    """SGLang's adaptive step count: EMA of the accepted length, tiers, warm-up, hysteresis."""

    def __init__(self, config: SGLangEMAConfig | None = None) -> None:
        self.config = config or SGLangEMAConfig()
        self.tiers = sorted(set(self.config.candidate_steps))
        wanted = min(max(self.config.initial_steps, self.tiers[0]), self.tiers[-1])
        self.steps = min(self.tiers, key=lambda s: (abs(s - wanted), -s))
        self.ema = float(self.steps - 1)
        self.batches = 0

    def plan(self, view: RoundView) -> Plan:
        return Plan(k=min(self.steps, view.max_k))

    def update(self, record: RoundRecord) -> None:
        if not _verified(record):
            return
        a = self.config.ema_alpha
        self.ema = (1 - a) * self.ema + a * float(record.accepted)  # type: ignore[arg-type]
        self.batches += 1
        past_warmup = self.batches - self.config.warmup_batches
        if past_warmup <= 0 or past_warmup % self.config.update_interval:
            return
        i = self.tiers.index(self.steps)
        while i > 0 and self.ema <= self.tiers[i - 1] - 0.5 + self.config.down_hysteresis:
            i -= 1
        while i < len(self.tiers) - 1 and self.ema > self.tiers[i] - 0.5 + self.config.up_hysteresis:
            i += 1
        self.steps = self.tiers[i]


@register_policy("hf-heuristic")
def _hf(config: "ClientConfig") -> DraftPolicy:
    return HFHeuristic(PeersConfig().hf)


@register_policy("llamacpp-pmin")
def _llamacpp(config: "ClientConfig") -> DraftPolicy:
    return LlamaCppPMin(PeersConfig().llamacpp)


@register_policy("sglang-ema")
def _sglang(config: "ClientConfig") -> DraftPolicy:
    return SGLangEMA(PeersConfig().sglang)
