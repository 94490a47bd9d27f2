"""What one more drafted position costs the verifier, in one-token steps (the proto's
Opened.position_cost; edges weigh speculation against cloud runs with it under a price).

Two measurements, each of what it can measure well:

- c, the time one more fed position adds to a pass, measured once at start on the runtime
  itself (TargetRuntime.position_ms: [B, 1] and [B, 9] passes of B synthetic sessions). It
  is the layers' compute per position and hardly moves with the load. The live passes cannot
  tell it: at load every pass holds about the same sessions and positions, and a shared CPU's
  noise (+-13 ms a pass measured under contention) buries the few ms their spread would show.
- step, a 1-token session's share of the passes as they run now: with S, P and T the live
  passes' sessions, positions and time (forward pass and acceptance test), averaged with
  exponential forgetting,  step = (T - c * (P - S)) / S  (the typical pass less what its extra
  positions cost, shared by its sessions; their share of its fixed part counted). It falls as
  passes fill up, which is what makes a position dear at load and cheap when idle.

A speculative round of k drafted tokens then costs (1 + position_cost * k) one-token steps,

    position_cost = c / step

about 0.1-0.25 for the shipped target on one CPU core at load (positions are compute there;
measured at 64 users on wifi/laptop: 0.09 under fixed k = 4, 0.14 adaptive, 0.24 cloud-only,
whose passes hold the most sessions) and near 0 on a GPU (decoding is memory-bound: a 5-token
pass costs about a 1-token step). None until both are known (a backend that does not measure
c, e.g. vLLM, or no pass yet): the edge then uses its own estimate (edge/control/pricing.py).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cloud.batcher import ForwardResult

HALF_LIFE_PASSES = 500.0  # a pass's weight in the means halves this many passes later
MIN_PASSES = 10.0         # passes seen before the step is believed


class PassCosts:
    """Passes in, position_cost out; observe() and position_cost() are thread-safe."""

    def __init__(self, position_ms: float | None,
                 half_life_passes: float = HALF_LIFE_PASSES) -> None:
        self.position_ms = position_ms  # c, measured at start (None: the backend does not)
        self._keep = 0.5 ** (1.0 / half_life_passes)
        self._lock = threading.Lock()
        self._weight = 0.0    # passes seen, forgotten
        self._sessions = 0.0  # weighted sums of S, P, T
        self._positions = 0.0
        self._ms = 0.0

    def observe(self, sessions: int, positions: int, ms: float, weight: float = 1.0) -> None:
        """One pass, or a share of one (a pass seen through each of its jobs gives each job
        weight 1 / sessions)."""
        if sessions < 1 or positions < sessions or not ms >= 0.0 or weight <= 0.0:
            return
        keep = self._keep ** weight
        with self._lock:
            self._weight = keep * self._weight + weight
            self._sessions = keep * self._sessions + weight * sessions
            self._positions = keep * self._positions + weight * positions
            self._ms = keep * self._ms + weight * ms

    def observe_job(self, result: ForwardResult) -> None:
        """A job's share of its pass (forward pass and acceptance test). A backend that does
        not count positions (vLLM) adds nothing."""
        self.observe(result.batch_size, result.positions, result.forward_ms + result.verify_ms,
                     weight=1.0 / max(result.batch_size, 1))

    def step_ms(self) -> float | None:
        """A 1-token session's share of the typical live pass; None before MIN_PASSES."""
        with self._lock:
            weight, sessions, positions, ms = (self._weight, self._sessions, self._positions,
                                               self._ms)
        if self.position_ms is None or weight < MIN_PASSES:
            return None
        step = (ms - self.position_ms * (positions - sessions)) / sessions
        return step if step > 0.0 else None

    def position_cost(self) -> float | None:
        """c / step, 0..1; None until both are known."""
        step = self.step_ms()
        return None if step is None else min(self.position_ms / step, 1.0)
