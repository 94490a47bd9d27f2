"""`client.max_passes_per_token`, an operator's cap on the verifier's cost, as the adaptive
controller prices it: the Lagrangian of "most tokens per second with passes <= cap x tokens",

    score = (N + price * (CAP_MARGIN * cap * N - P)) / T,

whose price integrates the excess of each round's passes over CAP_MARGIN x cap x its tokens (it
rises while the client runs over the cap and falls to 0 while under; an unreachable cap drives
it to CAP_PRICE_MAX, where the fewest passes per token win). A cloud run (a pass per token) is
cut to what the running surplus pays for, CAP_RESERVE_PASSES kept.
"""
from __future__ import annotations

from edge.record import RoundRecord

CAP_MARGIN = 0.95                 # plan to this share of max_passes_per_token (noisy estimates)
CAP_RESERVE_PASSES = 1.0          # a cloud run leaves this much of the surplus unspent
CAP_DECAY = 0.998                 # per round: the cap's running totals forget (~500 rounds)
CAP_PRICE_STEP = 1.0              # the cap's multiplier moves by this x (passes - cap x tokens)
CAP_PRICE_START = 1.0             # ... from here (a cap usually binds) ...
CAP_PRICE_MAX = 100.0             # ... up to here (an unreachable cap: the fewest passes)


class PassCap:
    """The cap's running totals and price; cap None: no cap, the score is the rate."""

    def __init__(self, cap: float | None) -> None:
        self.cap = cap
        self.passes = 0.0             # decayed running totals
        self.tokens = 0.0
        self.price = CAP_PRICE_START  # the Lagrange multiplier

    def score(self, tokens: float, seconds: float, passes: float) -> float:
        if self.cap is None:
            return tokens / max(seconds, 1e-9)
        return (tokens + self.price * (self.cap * CAP_MARGIN * tokens - passes)) \
            / max(seconds, 1e-9)

    def token_worth(self) -> float:
        """A committed token's worth in the score: under a cap it also lowers the passes per
        token."""
        return 1.0 if self.cap is None else 1.0 + self.price * self.cap * CAP_MARGIN

    def cloud_tokens(self, n: int) -> int:
        """The longest cloud run (up to n) the surplus pays for, keeping the pass of the round
        after it in reserve: every generated token is a target pass."""
        if self.cap is None:
            return n
        limit = self.cap * CAP_MARGIN
        surplus = limit * self.tokens - self.passes - CAP_RESERVE_PASSES
        return min(n, int(surplus / (1.0 - limit)) if limit < 1.0 else n)

    def observe(self, record: RoundRecord) -> None:
        self.passes = self.passes * CAP_DECAY + record.target_passes
        self.tokens = self.tokens * CAP_DECAY + record.committed
        if self.cap is not None:
            excess = record.target_passes - self.cap * CAP_MARGIN * record.committed
            self.price = min(max(self.price + CAP_PRICE_STEP * excess, 0.0), CAP_PRICE_MAX)
