"""The circuit breaker that declares the verifier away and paces the probes for its return.

Closed / open / half-open. Closed: rounds go to the verifier. A failure (outage or overload)
opens it: the generation goes on locally. Open -> half-open when a probe is due, by time
(probe_interval_s, doubling to max_probe_interval_s while probes keep failing) or by tokens
generated locally (probe_tokens), or at once when the background link monitor sees the
verifier answer again (`link_up`). Half-open lets one Open through: success closes the
breaker, failure opens it again. An overloaded verifier's retry hint is honoured as the
earliest next probe. Plain state with an injectable clock.
"""
from __future__ import annotations

import enum
import time

from edge.link.deadlines import Clock, LinkTimings


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, settings: LinkTimings, clock: Clock = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.reason = ""               # the last failure, for the stream and /healthz
        self.opened_at: float | None = None
        self.failures = 0              # consecutive
        self._interval = settings.probe_interval_s
        self._next_probe_at = 0.0
        self._local_tokens = 0         # generated locally since the last probe

    # --- outcomes -----------------------------------------------------------------------------
    def success(self) -> None:
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.reason = ""
        self.opened_at = None
        self._interval = self.settings.probe_interval_s

    def failure(self, reason: str, retry_after_s: float | None = None) -> None:
        """A round or an Open failed (outage or overload): open, next probe after the current
        interval (doubled for every failed probe) or the server's retry hint if later."""
        now = self.clock()
        if self.state is not BreakerState.CLOSED:
            self._interval = min(self._interval * 2, self.settings.max_probe_interval_s)
        else:
            self.opened_at = now
        self.state = BreakerState.OPEN
        self.failures += 1
        self.reason = reason
        self._local_tokens = 0
        self._next_probe_at = now + max(self._interval, retry_after_s or 0.0)

    def local_tokens(self, n: int) -> None:
        self._local_tokens += n

    def link_up(self) -> None:
        """The background monitor saw the verifier answer: probe at the next chance."""
        if self.state is BreakerState.OPEN:
            self._next_probe_at = min(self._next_probe_at, self.clock())

    # --- decisions ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.state is BreakerState.CLOSED

    def probe_due(self) -> bool:
        """Open and a probe is due (by time or by local tokens): go half-open and return True;
        the caller then tries one Open and reports success() or failure()."""
        if self.state is BreakerState.CLOSED:
            return False
        if self.state is BreakerState.HALF_OPEN:
            return True
        due = (self.clock() >= self._next_probe_at
               or self._local_tokens >= self.settings.probe_tokens)
        if due:
            self.state = BreakerState.HALF_OPEN
        return due

    def seconds_to_probe(self) -> float:
        if self.state is BreakerState.CLOSED:
            return 0.0
        return max(self._next_probe_at - self.clock(), 0.0)
