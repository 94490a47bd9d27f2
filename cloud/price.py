"""The verifier's price: how dear its forward passes are now, 0..1 (the proto's header says
what edges do with it).

Its input is the queue delay of every job the target runs (a round, a cloud-run step, a
prefill): the time from its submission until the pass that serves it begins
(cloud.batcher.ForwardResult.queue_ms; the vLLM backend reports the same). Jobs wait when the
verifier is busy: a lone session never does (its pass runs on its own thread), a few sessions
wait at most the batcher's gather window, and a verifier past its capacity makes every job wait
for whole passes of the others.

    delay = the mean queue delay of each INTERVAL_S (an interval without a job counts as 0:
            nothing waited), smoothed by an EWMA of time constant SMOOTHING_S
    price = clamp((delay - target) / target, 0, 1)          target = batch.target_queue_ms

so the price is exactly 0 while jobs wait at most the target, rises as the delay grows past it
and is 1 from twice the target on. A target of 0 makes it 1 whatever the load (an operator who
wants the fewest passes per token always; tests force the priced path with it). The smoothing
keeps the price a slow, shared signal: every edge reads about the same value and one slow pass
moves no one.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

INTERVAL_S = 0.1     # the queue delay is averaged over intervals this long ...
SMOOTHING_S = 1.0    # ... and the intervals' means smoothed with this time constant: the price
                     # follows a change in load within a second or two, not pass by pass


class PassPrice:
    """Queue delays in, the price out; observe() and value() are thread-safe."""

    def __init__(self, target_queue_ms: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if target_queue_ms < 0:
            raise ValueError(f"target_queue_ms must be >= 0, got {target_queue_ms}")
        self.target_ms = target_queue_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._interval_start = clock()
        self._sum_ms = 0.0           # queue delays of the open interval's jobs
        self._jobs = 0
        self._smoothed_ms = 0.0

    def observe(self, queue_ms: float) -> None:
        """One job's wait for its pass."""
        with self._lock:
            self._roll(self._clock())
            self._sum_ms += max(queue_ms, 0.0)
            self._jobs += 1

    def queue_delay_ms(self) -> float:
        """The smoothed queue delay (closed intervals only)."""
        with self._lock:
            self._roll(self._clock())
            return self._smoothed_ms

    def value(self) -> float:
        """The price now, 0..1."""
        if self.target_ms <= 0:
            return 1.0
        excess = (self.queue_delay_ms() - self.target_ms) / self.target_ms
        return min(max(excess, 0.0), 1.0)

    def _roll(self, now: float) -> None:
        """Close the intervals that have ended: the first with its jobs' mean delay, any after
        it (no job came) as 0."""
        ended = int((now - self._interval_start) // INTERVAL_S)
        if ended < 1:
            return
        keep = math.exp(-INTERVAL_S / SMOOTHING_S)
        mean = self._sum_ms / self._jobs if self._jobs else 0.0
        self._smoothed_ms = (keep * self._smoothed_ms + (1.0 - keep) * mean) * keep ** (ended - 1)
        self._interval_start += ended * INTERVAL_S
        self._sum_ms, self._jobs = 0.0, 0
