"""The offline policy: how long to wait for the verifier, when to give up on it, and how soon
to try it again.

Three parts, each plain state with an injectable clock (no threads, no gRPC):

- `RttEstimator` keeps a smoothed round-trip time and its variation from measured rounds
  (Jacobson/Karels, as TCP's RTO: srtt + 4 * rttvar), and the verifier's own reported time per
  round. `late_s(k)` = that RTO plus the server's time for a k-token block, times a margin,
  clamped to [floor, ceiling]: when a reply counts as late. Late is not down
  (edge/link/wait.py WaitRule): a late reply is waited for while the verifier answers
  probes; the link is down only on transport evidence or after stall_timeout_s without any
  sign of life.
- `CircuitBreaker`, closed / open / half-open. Closed: rounds go to the verifier. A failure
  (outage or overload) opens it: the generation goes on locally. Open -> half-open when a probe
  is due, by time (probe_interval_s, doubling to max_probe_interval_s while probes keep
  failing) or by tokens generated locally (probe_tokens), or at once when the background link
  monitor sees the verifier answer again (`link_up`). Half-open lets one Open through: success
  closes the breaker, failure opens it again. An overloaded verifier's retry hint is honoured
  as the earliest next probe.
- `OfflineMode`: what a request wants while the verifier is away: "continue" (generate
  locally, tokens unverified), "wait" (pause up to offline_wait_s for the verifier, then resume
  verified from the full context; continue locally after that), "require_verified" (fail with
  a clear error instead of emitting an unverified token).

Recovery bound: with the monitor running, a verifier that answers health again is used by the
next round after the monitor's next probe, i.e. within monitor interval + one open (stated in
LinkMonitor and checked by the fault tests); without it, within max_probe_interval_s of local
generation.
"""
from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edge.link.errors import LinkSilent
from edge.link.wait import WaitRule
from edge.link_state import LinkState

Clock = Callable[[], float]


# Why a token was emitted without the target's check (RoundRecord.cause, the daemon's
# unverified-token counter and its per-request warning).
UNVERIFIED_CAUSES = ("outage", "startup", "overload", "fast_mode")


class OfflineMode(str, enum.Enum):
    CONTINUE = "continue"
    WAIT = "wait"
    REQUIRE_VERIFIED = "require_verified"


@dataclass(frozen=True)
class OfflineSettings:
    """The knobs, filled from edge.config.ClientConfig (defaults are defined there)."""
    deadline_floor_s: float = 0.5      # a reply is never late sooner (GC pauses, batching)
    deadline_ceiling_s: float = 10.0   # ... and always late after this
    deadline_margin: float = 2.0       # times (RTO + server time)
    open_deadline_s: float = 5.0       # an Open (with its prefill) before any RTT is known
    probe_interval_s: float = 0.25     # first probe after the breaker opens
    max_probe_interval_s: float = 1.0  # probes back off to at most this
    probe_tokens: int = 16             # ... or after this many local tokens, whichever first


class RttEstimator:
    """Smoothed RTT and server time per round (seconds)."""

    ALPHA, BETA = 0.125, 0.25  # RFC 6298

    def __init__(self, settings: OfflineSettings) -> None:
        self.settings = settings
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.server_s_per_token: float | None = None  # queue + forward + verify per position
        self.server_var_per_token = 0.0               # its mean deviation (batching, queueing)

    def observe(self, rtt_s: float, k: int, server_s: float | None = None) -> None:
        """A round of k drafted tokens took rtt_s end to end; the verifier said server_s of
        it was its own (queue + forward + verify)."""
        if rtt_s < 0:
            return
        # The network part: rtt minus what the server reported (its time varies with k and
        # batching, the link's does not).
        net = max(rtt_s - (server_s or 0.0), 0.0)
        if self.srtt is None:
            self.srtt, self.rttvar = net, net / 2
        else:
            self.rttvar = (1 - self.BETA) * self.rttvar + self.BETA * abs(self.srtt - net)
            self.srtt = (1 - self.ALPHA) * self.srtt + self.ALPHA * net
        if server_s is not None:
            per_token = server_s / (k + 1)
            if self.server_s_per_token is None:
                self.server_s_per_token, self.server_var_per_token = per_token, per_token / 2
            else:
                self.server_var_per_token = ((1 - self.BETA) * self.server_var_per_token
                                             + self.BETA * abs(self.server_s_per_token - per_token))
                self.server_s_per_token = ((1 - self.ALPHA) * self.server_s_per_token
                                           + self.ALPHA * per_token)

    @property
    def rto_s(self) -> float | None:
        return None if self.srtt is None else self.srtt + 4 * self.rttvar

    def late_s(self, k: int) -> float:
        """When the verdict of a k-token block counts as late (probing starts)."""
        s = self.settings
        if self.srtt is None:
            return s.deadline_ceiling_s
        # The server's time varies with batching and queueing: its variation counts like the
        # link's (RTO = mean + 4 deviations).
        server = ((self.server_s_per_token or 0.0) + 4 * self.server_var_per_token) * (k + 1)
        deadline = s.deadline_margin * (self.rto_s + server)
        return min(max(deadline, s.deadline_floor_s), s.deadline_ceiling_s)

    def open_late_s(self, context_tokens: int) -> float:
        """When Opened counts as late. An Open runs a prefill of the whole context: the
        server's time per token times the context, plus the link's RTO; the configured open
        deadline until anything is known."""
        s = self.settings
        if self.srtt is None or self.server_s_per_token is None:
            return s.open_deadline_s
        deadline = s.deadline_margin * (self.rto_s + self.server_s_per_token * context_tokens)
        return min(max(deadline, s.deadline_floor_s), max(s.open_deadline_s, s.deadline_floor_s))


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, settings: OfflineSettings, clock: Clock = time.monotonic) -> None:
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


class OfflineControl:
    """One generation's offline policy: deadlines from its RTT estimate, its circuit breaker,
    the shared link monitor (optional) and the request's offline mode. The round loop
    (edge/rounds/) asks it how long to wait, whether to retry or probe now, and reports every
    verdict and failure to it."""

    def __init__(self, config, monitor=None, mode: str | None = None,
                 wait_s: float | None = None, clock: Clock = time.monotonic) -> None:
        """config: edge.config.ClientConfig; monitor: edge.link.monitor.LinkMonitor or None."""
        self.settings = OfflineSettings(
            deadline_floor_s=config.deadline_floor_s, deadline_ceiling_s=config.round_timeout_s,
            deadline_margin=config.deadline_margin,
            open_deadline_s=min(config.open_deadline_s, config.open_timeout_s),
            probe_interval_s=config.probe_interval_s,
            max_probe_interval_s=max(config.max_probe_interval_s, config.probe_interval_s),
            probe_tokens=config.offline_probe_tokens)
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
        if link is not None and getattr(link, "open_rtt_s", None) is not None:
            # The network part only: the prefill is no per-round server time.
            self.rtt.observe(max(link.open_rtt_s - link.prefill_s, 0.0), 0, None)
        self.breaker.success()

    def failure(self, error: Exception) -> None:
        """A round or an Open failed: open the breaker (honouring an overloaded verifier's
        retry hint) and tell the monitor. A silent link (LinkSilent) was probed throughout the
        wait and never answered: the monitor takes it as down. Any other failure (a reset, a
        refused connection) is checked at once with one Info probe: a verifier that restarted
        answers it and the round is retried instead of going local."""
        retry_after = getattr(error, "retry_after_s", None)
        overloaded = type(error).__name__ == "VerifierOverloaded"
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
