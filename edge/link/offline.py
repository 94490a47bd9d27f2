"""The offline policy: what a request gets while the verifier is away, and when to try it
again. `OfflineControl` holds one generation's deadlines (edge/link/deadlines.py), its circuit
breaker (edge/link/breaker.py), the shared link monitor and the request's `OfflineMode`:
"continue" (generate locally, tokens unverified), "wait" (pause up to offline_wait_s for the
verifier, then resume verified from the full context; continue locally after that),
"require_verified" (fail with a clear error instead of emitting an unverified token).

Recovery bound: with the monitor running, a verifier that answers health again is used by the
next round after the monitor's next probe, i.e. within monitor interval + one open (stated in
LinkMonitor and checked by the fault tests); without it, within max_probe_interval_s of local
generation.
"""
from __future__ import annotations

import enum
import threading
import time

from edge.link.breaker import CircuitBreaker
from edge.link.deadlines import Clock, LinkTimings, RttEstimator
from edge.link.errors import LinkSilent, VerifierOverloaded
from edge.link.wait import WaitRule
from edge.link_state import LinkState

# Why a token was emitted without the target's check (RoundRecord.cause, the daemon's
# unverified-token counter and its per-request warning).
UNVERIFIED_CAUSES = ("outage", "startup", "overload", "fast_mode")


class OfflineMode(str, enum.Enum):
    CONTINUE = "continue"
    WAIT = "wait"
    REQUIRE_VERIFIED = "require_verified"


class OfflineControl:
    """One generation's offline policy: deadlines from its RTT estimate, its circuit breaker,
    the shared link monitor (optional) and the request's offline mode. The round loop
    (edge/rounds/) asks it how long to wait, whether to retry or probe now, and reports every
    verdict and failure to it."""

    def __init__(self, config, monitor=None, mode: str | None = None,
                 wait_s: float | None = None, clock: Clock = time.monotonic) -> None:
        """config: edge.config.ClientConfig; monitor: edge.link.monitor.LinkMonitor or None."""
        self.settings = LinkTimings.from_config(config)
        self.open_ceiling_s = config.open_timeout_s
        self.stall_s = config.stall_timeout_s
        self.overloaded = False        # the last failure was the verifier saying it is full
        self.mode = OfflineMode(mode or config.offline)
        self.wait_s = config.offline_wait_s if wait_s is None else wait_s
        self.clock = clock
        self.rtt = RttEstimator(self.settings)
        self.breaker = CircuitBreaker(self.settings, clock)
        self.monitor = monitor
        self._up = threading.Event()
        self._remove = monitor.add_listener(self._on_status) if monitor is not None else None
        if monitor is not None and monitor.state is LinkState.UP:
            self._up.set()

    def close(self) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None

    def _on_status(self, status) -> None:
        if status.state is LinkState.UP:
            self._up.set()
            self.breaker.link_up()
        else:
            self._up.clear()

    # --- deadlines ----------------------------------------------------------------------------
    def wait_rule(self) -> WaitRule:
        """The link's WaitRule (edge/link/wait.py): down after stall_timeout_s without a
        sign of life, a reply still missing after round_timeout_s fails the round."""
        return WaitRule(stall_s=self.stall_s, cap_s=self.settings.deadline_ceiling_s,
                        probe_every_s=self.settings.probe_interval_s)

    def late_s(self, k: int) -> float:
        """When the verdict of a k-token block is late: the link starts probing the verifier."""
        return self.rtt.late_s(k)

    def open_late_s(self, context_tokens: int) -> float:
        return min(self.rtt.open_late_s(context_tokens), self.open_ceiling_s)

    # --- outcomes -----------------------------------------------------------------------------
    def verdict(self, rtt_s: float, k: int, server_s: float | None) -> None:
        self.rtt.observe(rtt_s, k, server_s)
        self.breaker.success()

    def opened(self, link=None) -> None:
        """An Open succeeded; link (edge.link.VerifierLink) gives its round trip and the
        server's prefill time, the first RTT measurement of the generation."""
        if link is not None and link.open_rtt_s is not None:
            # The network part only: the prefill is no per-round server time.
            self.rtt.observe(max(link.open_rtt_s - link.prefill_s, 0.0), 0, None)
        self.breaker.success()

    def failure(self, error: Exception) -> None:
        """A round or an Open failed: open the breaker (honouring an overloaded verifier's
        retry hint) and tell the monitor. A silent link (LinkSilent) was probed throughout the
        wait and never answered: the monitor takes it as down. Any other failure (a reset, a
        refused connection) is checked at once with one Info probe: a verifier that restarted
        answers it and the round is retried instead of going local."""
        overloaded = isinstance(error, VerifierOverloaded)
        retry_after = error.retry_after_s if overloaded else None
        self.overloaded = overloaded
        self.breaker.failure(str(error), retry_after)
        if self.monitor is None:
            return
        if overloaded:
            self.monitor.report(LinkState.OVERLOADED, str(error))
            self._up.clear()
        elif isinstance(error, LinkSilent):
            # Probing again would only block another stall bound on the same silence.
            self.monitor.report(LinkState.DOWN, str(error))
        elif time.monotonic() - self.monitor.status.checked_s > self.monitor.timeout_s + 0.2:
            self.monitor.probe()  # (not when a probe just ran)

    # --- decisions ----------------------------------------------------------------------------
    def local_cause(self) -> str:
        """Why tokens go local now (UNVERIFIED_CAUSES): the verifier said it is full
        (overload), this process has not reached it yet since it started (startup), or it is
        unreachable (outage)."""
        if self.overloaded:
            return "overload"
        if self.monitor is not None and not self.monitor.ever_up:
            return "startup"
        return "outage"

    def misconfiguration(self) -> str | None:
        """The monitor's named cause when the link is misconfigured (TLS, key, identity)."""
        if self.monitor is not None and self.monitor.state is LinkState.MISCONFIGURED:
            return self.monitor.status.detail
        return None

    def retry_now(self, failures: int) -> bool:
        """After a broken round: reconnect at once? Only while the monitor still sees the
        verifier up (a restart, a dropped connection), or, without a monitor, once."""
        if self.monitor is not None:
            return self.monitor.state is LinkState.UP
        return failures <= 1

    def probe_due(self) -> bool:
        """While offline: try an Open now? With a monitor, only once it sees the verifier
        answer (so a stalled verifier never pauses the generation); without, by the breaker's
        time and token schedule."""
        if self.monitor is not None and self.monitor.state is not LinkState.UP:
            return False
        return self.breaker.probe_due()

    def local_tokens(self, n: int) -> None:
        self.breaker.local_tokens(n)

    def wait_for_link(self, timeout_s: float, stopped: Callable[[], bool]) -> bool:
        """Block until the verifier looks reachable (monitor up, or the breaker's next probe
        time without a monitor) or timeout_s passes; False on timeout. Checks `stopped` every
        few ms and returns False at once when it is set."""
        deadline = self.clock() + timeout_s
        while not stopped():
            left = deadline - self.clock()
            if left <= 0:
                return False
            if self.monitor is not None:
                if self._up.wait(min(left, 0.02)):
                    return True
            elif self.breaker.seconds_to_probe() <= 0:
                return True
            else:
                time.sleep(min(left, self.breaker.seconds_to_probe(), 0.02))
        return False
