"""Link estimator: RTT, uplink cost per byte, verifier time and link state, from the round log.

The network part of a round's RTT is modelled as rtt_net(b) = L + c * b: a fixed latency L plus
c seconds per byte sent (b = the Draft's serialized size; the Verdict is small and constant, so
its transfer is part of L). c is a least-squares slope with forgetting on the differences of
consecutive rounds (bytes vary because the controller dithers k), kept only as far as it is
significant, so a congested uplink shows as a steeper slope, not as a longer latency, and a
latency step or jitter does not show as a slow uplink; L = EWMA(rtt_net) - c * EWMA(b). When
the block sizes seen do not vary enough to fit a slope, c keeps its last fit (at first the
prior: a fast link). Server time (queue + forward + verify, reported in the verdict) is tracked
on its own: rtt_net = rtt - server time.

Reaction: every estimate is an EWMA with weight `alpha` per verified round, so a step change
reaches 1 - (1 - alpha)^n of its size after n rounds (alpha 0.3: 90% after 7 rounds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from edge.link_state import LinkState
from edge.record import RoundRecord

PRIOR_SECONDS_PER_BYTE = 1e-8   # 100 MB/s: bytes cost nothing until measured otherwise
MIN_BYTE_SPREAD = 1.0           # std of block bytes (B) below which no slope is fitted
SLOPE_SLOWDOWN = 0.25           # the slope's moments forget 4x slower than the RTT (less noise)
SLOPE_Z = 2.0                   # a slope counts only what is this many std errors above 0


@dataclass
class Ewma:
    value: float | None = None

    def add(self, x: float, alpha: float) -> float:
        self.value = x if self.value is None else self.value + alpha * (x - self.value)
        return self.value


class LinkEstimator:
    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.slope_alpha = alpha * SLOPE_SLOWDOWN
        self.rtt = Ewma()          # whole RTT, s
        self.rtt_var = Ewma()      # EWMA of squared deviation, s^2
        self.server = Ewma()       # verifier's own time per round, s
        self._bb = Ewma()          # E[db^2] over consecutive rounds (bytes up)
        self._bn = Ewma()          # E[db * dnet] (network RTT)
        self._nn = Ewma()          # E[dnet^2]
        self._pairs = 0
        self._prev: tuple[float, float] | None = None
        self.losses = 0             # rounds that needed a re-send (timeout, broken, evicted)
        self.consecutive_losses = 0
        self.offline = False
        self.rounds = 0
        self._slope = PRIOR_SECONDS_PER_BYTE
        self._net_fast = Ewma()    # network RTT, at the RTT's own pace
        self._b_fast = Ewma()

    def update(self, record: RoundRecord) -> None:
        if record.mode == "local":
            self.offline = True
            self.consecutive_losses += 1
            return
        if record.mode != "verify" or record.accepted is None:
            return
        self.offline = False
        if record.attempts > 1:
            self.losses += record.attempts - 1
            self.consecutive_losses += 1
        else:
            self.consecutive_losses = 0
        a = self.alpha
        self.rounds += 1
        rtt = record.rtt_s
        if self.rtt.value is not None:
            self.rtt_var.add((rtt - self.rtt.value) ** 2, a)
        else:
            self.rtt_var.add(0.0, a)
        self.rtt.add(rtt, a)
        server = record.server_queue_s + record.server_forward_s + record.server_verify_s
        self.server.add(server, a)
        net = max(rtt - server, 0.0)
        b = float(record.bytes_up) / max(record.attempts, 1)
        self._net_fast.add(net, a)
        self._b_fast.add(b, a)
        if self._prev is not None:
            self._fit_slope(b - self._prev[0], net - self._prev[1])
        self._prev = (b, net)

    def observe_latency(self, net_s: float, bytes_up: float) -> None:
        """A round that saw the link's latency without a verdict (a cloud-generates run: its
        send -> first token, less the verifier's time for it): moves L like a verified round,
        leaves the slope (one small message says nothing about the uplink's cost per byte)."""
        self.offline = False
        self.rounds += 1
        self._net_fast.add(net_s, self.alpha)
        self._b_fast.add(bytes_up, self.alpha)

    def _fit_slope(self, db: float, dn: float) -> None:
        """Least squares through the origin on consecutive differences: a change of latency
        touches one difference only, while bytes vary round to round (the controller dithers
        k), so the slope sees the uplink, not the RTT's drift."""
        sa = self.slope_alpha
        self._bb.add(db * db, sa)
        self._bn.add(db * dn, sa)
        self._nn.add(dn * dn, sa)
        self._pairs += 1
        var = self._bb.value
        if var < MIN_BYTE_SPREAD ** 2:
            return  # keep the last slope fitted (or the prior)
        slope = self._bn.value / var
        # Standard error from the residual variance and the effective number of samples an
        # EWMA holds, (2 - a) / a: jitter (or a latency step) must not look like a slow link.
        resid = max(self._nn.value - slope * self._bn.value, 0.0)
        n_eff = min(self._pairs, (2.0 - sa) / sa)
        stderr = (resid / (max(n_eff - 1.0, 1.0) * var)) ** 0.5
        self._slope = max(slope - SLOPE_Z * stderr, PRIOR_SECONDS_PER_BYTE)

    # ---- the model ------------------------------------------------------------------------

    @property
    def seconds_per_byte(self) -> float:
        return self._slope

    @property
    def latency_s(self) -> float:
        """L: the network RTT of an empty block."""
        if self._net_fast.value is None:
            return 0.0
        return max(self._net_fast.value - self.seconds_per_byte * self._b_fast.value, 0.0)

    def net_rtt(self, bytes_up: float) -> float:
        return self.latency_s + self.seconds_per_byte * bytes_up

    def server_s(self) -> float:
        return self.server.value or 0.0

    @property
    def rtt_std_s(self) -> float:
        return math.sqrt(self.rtt_var.value or 0.0)

    @property
    def state(self) -> LinkState:
        """UP | DEGRADED (re-sends lately, or RTT jitter above its mean) | DOWN (offline)."""
        if self.offline:
            return LinkState.DOWN
        if self.consecutive_losses or (self.rtt.value and self.rtt_std_s > self.rtt.value):
            return LinkState.DEGRADED
        return LinkState.UP

    @property
    def measured(self) -> bool:
        return self.rounds > 0
