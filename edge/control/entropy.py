"""The entropy switch: which local model drafts, how far, and (in fast mode) whether the cloud
verifies, chosen from the rolling entropy of the draft's own distributions.

Most code is easy to predict and some of it is not. The rolling mean of the draft's per-position
entropy (nats) over the last `window` drafted positions tells the two apart. Two thresholds with
hysteresis and a minimum dwell keep the state from flapping:

    easy --(rolling >= enter_hard and dwell >= min_dwell_rounds)--> hard
    hard --(rolling <= exit_hard  and dwell >= min_dwell_rounds)--> easy

(dwell = rounds since the last switch; a fast request uses the pair fast_enter_hard /
fast_exit_hard). In the easy state the cheapest rung of the ladder
drafts k = client.draft_length tokens; in the hard state the strongest rung drafts and k is capped at
`hard_max_k`, because long blocks are mostly rejected there. In `lossless` mode every block is
still verified, so the switch changes only speed and cost. In `fast` mode the easy state's
blocks are emitted unverified (Plan.verify = False) up to the first position whose draft top
probability is below fast_min_confidence; that position goes to the verifier in a round of
fast_unsure_k draft tokens (0: the target supplies that one token), so in easy text the cloud
is spent only where the draft is unsure (U-HLM's rule). The round loop bounds how many tokens in
a row go unverified (max_unverified_run), whatever a policy asks for.

Which rung drafts a state's text (lossless requests, no rung named in the config): the one
measured fastest in that state — committed tokens per second of drafting plus round trip,
an EWMA per (state, rung) kept across the client's generations, since it describes the device
and the link more than the text — with each other rung tried every `explore_every` rounds in
the state. A slow device on a short link then keeps the cheap rung even in hard text, a fast
one on a long link the strong rung even in easy text. Until a rung was measured the fixed rule
holds (cheapest in easy text, strongest in hard).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from edge.config import EntropySwitchConfig, SwitchState
from edge.control.policy import DraftPolicy, Plan, RoundView, register_policy
from edge.record import RoundRecord

State = SwitchState
SPEED_ALPHA = 0.2  # EWMA weight of a round's measured speed (tokens per second)


class EntropySwitch(DraftPolicy):
    """Two-state switch over the rolling draft entropy; a DraftPolicy (plan / update).

    `ladder`: the local model names, cheapest first; None = the view's `drafters` at each plan.
    One object serves every generation of its client: the state restarts at each generation's
    first round (view.round == 0), since the entropy describes that generation's text.

    Plan.verify is False in the easy state: the round loop honours that only for a `fast`
    request (a lossless request verifies every block whatever the policy says), and bounds
    the unverified run.
    """

    serves_fast_mode = True  # its plans mark skippable blocks (DraftPolicy)

    def __init__(self, config: EntropySwitchConfig, k: int,
                 ladder: Sequence[str] | None = None) -> None:
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.config = config
        self.k = k                                       # draft length in the easy state
        self.ladder = tuple(ladder) if ladder else None
        if self.ladder is not None:
            self._check_ladder(self.ladder)
        self.reset()
        # Measured speed per (state, rung), across generations (see the module docstring).
        self.speed: dict[tuple[State, str], float] = {}
        self.state_rounds: dict[State, int] = {"easy": 0, "hard": 0}

    def reset(self, fast: bool = False) -> None:
        self.fast = fast                                 # a fast request: its own thresholds
        self.state: State = self.config.start_state
        self.dwell = 0                                   # rounds since the last switch
        self.window: deque[float] = deque(maxlen=self.config.window)
        self.switches = 0

    def _check_ladder(self, ladder: Sequence[str]) -> None:
        for name in (self.config.easy_drafter, self.config.hard_drafter, self.config.fast_drafter):
            if name is not None and name not in ladder:
                raise ValueError(f"drafter {name!r} is not in the ladder {list(ladder)}")

    def drafter(self, state: State, ladder: Sequence[str], fast: bool = False) -> str | None:
        """The model for `state`: the configured one; else, for easy text of a fast request
        (emitted as drafted), the strongest rung; else the rung measured fastest in this state
        (see the module docstring), the cheapest (easy) or the strongest (hard) until one is
        measured. None when there is no ladder (the loop's default drafter)."""
        named = self.config.hard_drafter if state == "hard" else (
            self.config.fast_drafter if fast else self.config.easy_drafter)
        if named is not None or not ladder:
            return named
        fixed = ladder[0] if state == "easy" and not fast else ladder[-1]
        if (fast and state == "easy") or self.config.explore_every == 0 or len(ladder) < 2:
            return fixed
        return self._measured_choice(state, ladder, fixed)

    def _measured_choice(self, state: State, ladder: Sequence[str], fixed: str) -> str:
        self.state_rounds[state] += 1
        if self.state_rounds[state] % self.config.explore_every == 0:
            # Try the rung this state has measured least recently: one not measured yet first.
            tries = self.state_rounds[state] // self.config.explore_every
            others = [r for r in ladder if (state, r) not in self.speed] or list(ladder)
            return others[tries % len(others)]
        measured = {r: self.speed[(state, r)] for r in ladder if (state, r) in self.speed}
        return max(measured, key=measured.get) if measured else fixed

    @property
    def rolling(self) -> float | None:
        """Mean entropy over the window, None before any drafted position."""
        return sum(self.window) / len(self.window) if self.window else None

    @property
    def thresholds(self) -> tuple[float, float]:
        """(enter hard, leave hard) in nats for this generation's mode."""
        c = self.config
        return (c.fast_enter_hard, c.fast_exit_hard) if self.fast else (c.enter_hard, c.exit_hard)

    def observe(self, entropies: Sequence[float]) -> State:
        """One round's per-position draft entropies in; the state for the next round out."""
        self.window.extend(e for e in entropies if math.isfinite(e))
        self.dwell += 1
        rolling = self.rolling
        if rolling is None or self.dwell < self.config.min_dwell_rounds:
            return self.state
        enter, leave = self.thresholds
        if self.state == "easy" and rolling >= enter:
            self._switch("hard")
        elif self.state == "hard" and rolling <= leave:
            self._switch("easy")
        return self.state

    def _switch(self, state: State) -> None:
        self.state = state
        self.dwell = 0
        self.switches += 1

    # ---- DraftPolicy ------------------------------------------------------------------------

    def plan(self, view: RoundView) -> Plan:
        if view.round == 0:
            self.reset(fast=view.fast)
        ladder = self.ladder or tuple(d for d in view.drafters if d)
        if self.ladder is None and ladder:
            self._check_ladder(ladder)
        hard = self.state == "hard"
        k = min(self.k, self.config.hard_max_k) if hard else self.k
        # min_confidence only matters for a skippable block: the loop cuts the unverified span
        # before the first unsure position (see edge/fast_mode.py).
        return Plan(k=min(k, view.max_k), drafter=self.drafter(self.state, ladder, view.fast),
                    verify=hard,
                    min_confidence=0.0 if hard else self.config.fast_min_confidence,
                    unsure_k=None if hard else self.config.fast_unsure_k)

    def update(self, record: RoundRecord) -> None:
        """Feed one finished round to the rung speeds and the state machine. The state is still
        the one the round was planned in: only observe() below moves it."""
        seconds = record.draft_s + record.send_s + record.rtt_s
        if record.drafter and record.mode == "verify" and record.verified \
                and record.drafted > 0 and seconds > 0:
            key = (self.state, record.drafter)
            rate = record.committed / seconds
            old = self.speed.get(key)
            self.speed[key] = rate if old is None else old + SPEED_ALPHA * (rate - old)
        self.observe(record.entropies)


@register_policy("entropy")
def _entropy(config) -> EntropySwitch:
    return EntropySwitch(config.entropy, k=config.draft_length)
