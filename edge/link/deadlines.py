"""The deadline every online wait on the verifier uses, from the measured link: `RttEstimator`
keeps a smoothed round-trip time and its variation from measured rounds (Jacobson/Karels, as
TCP's RTO: srtt + 4 * rttvar), and the verifier's own reported time per round. `late_s(k)` =
that RTO plus the server's time for a k-token block, times a margin, clamped to [floor,
ceiling]: when a reply counts as late. Late is not down (edge/link/wait.py WaitRule): a late
reply is waited for while the verifier answers probes; the link is down only on transport
evidence or after stall_timeout_s without any sign of life.

`LinkTimings` holds these knobs and the circuit breaker's (edge/link/breaker.py), read from
edge.config.ClientConfig, where their defaults are. Plain state, no threads, no gRPC.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]


@dataclass(frozen=True)
class LinkTimings:
    """Deadlines and probe pacing (no defaults here: they are edge.config.ClientConfig's)."""
    deadline_floor_s: float      # a reply is never late sooner (GC pauses, batching)
    deadline_ceiling_s: float    # ... and always late after this
    deadline_margin: float       # times (RTO + server time)
    open_deadline_s: float       # an Open (with its prefill) before any RTT is known
    probe_interval_s: float      # first probe after the breaker opens
    max_probe_interval_s: float  # probes back off to at most this
    probe_tokens: int            # ... or after this many local tokens, whichever first

    @classmethod
    def from_config(cls, config) -> LinkTimings:
        """config: edge.config.ClientConfig."""
        return cls(deadline_floor_s=config.deadline_floor_s,
                   deadline_ceiling_s=config.round_timeout_s,
                   deadline_margin=config.deadline_margin,
                   open_deadline_s=min(config.open_deadline_s, config.open_timeout_s),
                   probe_interval_s=config.probe_interval_s,
                   max_probe_interval_s=max(config.max_probe_interval_s, config.probe_interval_s),
                   probe_tokens=config.offline_probe_tokens)


class RttEstimator:
    """Smoothed RTT and server time per round (seconds)."""

    ALPHA, BETA = 0.125, 0.25  # RFC 6298

    def __init__(self, settings: LinkTimings) -> None:
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
