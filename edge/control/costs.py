"""What a round costs, as the adaptive controller (edge/control/adaptive.py) models it: expected
tokens E(k) from the acceptance estimates, a round's seconds from the draft's speed, the link
(edge/control/link_estimate.py), the verifier's time and the round's overhead, and a cloud run's
seconds from the pace of its stream; each measured from the rounds' records (the formulas are
in adaptive.py's docstring). Plain measurement and arithmetic: no choice is made here.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from edge.control.acceptance import AcceptanceEstimator
from edge.control.link_estimate import LinkEstimator, Ewma
from edge.control.policy import Plan
from edge.record import RoundRecord

if TYPE_CHECKING:
    from edge.config import ClientConfig

log = logging.getLogger(__name__)

PRIOR_DRAFT_S_PER_TOKEN = 0.002   # before the first measured block
PRIOR_PREFILL_S_PER_TOKEN = 0.0005  # before the first measured multi-token sync
DRAFT_SPEEDUP_ALPHA = 0.7         # EWMA weight of a draft-time sample below the estimate
PREFILL_SPIKE_CAP = 2.0           # a prefill sample counts at most this times the estimate
PRIOR_BYTES_PER_TOKEN = 3.0       # greedy: a varint id and its tag share
DRAFT_OVERHEAD_BYTES = 8.0        # round, start, tags of an empty Draft
STALL_FACTOR = 10.0               # a cloud run's gap between tokens this many times its median
STALL_MIN_S = 0.05                # (and at least this long) is the link standing still, not
                                  # the stream's pace: an outage inside one run made the cloud
                                  # look 5x slower, and speculation, never measuring it again,
                                  # ran on (flaky/laptop: 0.11x cloud-only)


def decode_steps(record: RoundRecord) -> tuple[int, float]:
    """(decode steps, their seconds) of one round's drafting. Drafting k tokens feeds k - 1 of
    them (the last needs no logits) after the sync; a sync that fed one token (the verdict's
    bonus or correction: the usual case) is one more decode step, so k steps in all, which is
    what round_seconds charges. A longer sync is a prefill, at another speed: left out."""
    if record.drafted == 0:
        return 0, 0.0
    if record.sync_tokens == 1:
        return record.drafted, record.draft_s
    return record.drafted - 1, max(record.draft_s - record.sync_s, 0.0)


def stalled_seconds(gaps_s: list[float]) -> float:
    """The part of a cloud run's stream spent standing still: its gaps between tokens over
    STALL_FACTOR times their median (and over STALL_MIN_S)."""
    if not gaps_s:
        return 0.0
    ordered = sorted(gaps_s)
    floor = max(STALL_FACTOR * ordered[len(ordered) // 2], STALL_MIN_S)
    return sum(g for g in gaps_s if g > floor)


def load_acceptance(config: "ClientConfig") -> AcceptanceEstimator:
    """The acceptance estimator, from the prior file kept between sessions when there is one."""
    cfg = config.adaptive
    settings = dict(max_positions=cfg.max_draft_length, alpha=cfg.acceptance_alpha,
                    prior=cfg.prior_acceptance, prior_weight=cfg.prior_weight)
    if cfg.prior_path is not None and Path(cfg.prior_path).is_file():
        try:
            data = json.loads(Path(cfg.prior_path).read_text())
            return AcceptanceEstimator.from_dict(data, **settings)
        except (OSError, ValueError) as error:
            log.warning("ignoring the acceptance prior at %s: %s", cfg.prior_path, error)
    return AcceptanceEstimator(**settings)


def save_acceptance(acceptance: AcceptanceEstimator, path: Path) -> None:
    """The acceptance estimates, for load_acceptance in a later session."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(acceptance.to_dict()))
    except OSError as error:
        log.warning("cannot save the acceptance prior to %s: %s", path, error)


def add_device_time(estimate: Ewma, seconds: float, alpha: float,
                    spike_cap: float = math.inf) -> None:
    """A sample of the device's seconds per token, faster down than up: its speed is what it
    can do, and a slow sample is most often a moment of contention (while k = 0 only probes
    measure the draft). A slow sample counts at most spike_cap times the estimate: only
    speculation measures the prefill, and a spike (6.5x measured on wifi/laptop) priced into
    every generation's first block could keep speculation from being tried, so measured,
    again."""
    known = estimate.value
    if known is not None:
        seconds = min(seconds, spike_cap * known)
    estimate.add(seconds, DRAFT_SPEEDUP_ALPHA if known is not None and seconds < known else alpha)


class RoundCosts:
    def __init__(self, config: "ClientConfig") -> None:
        self.alpha = config.adaptive.rtt_alpha
        self.device = config.device
        self.link = LinkEstimator(self.alpha)
        self.acceptance = load_acceptance(config)
        self.draft_s = Ewma()          # seconds per decode step of the draft
        self.prefill_s = Ewma()        # seconds per token of a multi-token sync
        self.bytes_per_token = Ewma()  # a Draft's bytes per drafted token
        self.overhead = Ewma()         # a sequential round's seconds outside drafting and its RTT
        self.gen_s = Ewma()            # seconds between a cloud run's streamed tokens
        self.cloud_overhead = Ewma()   # a cloud run's seconds outside its first token and stream
        self.unsynced = 0              # committed tokens the draft has not seen (cloud runs)
        self._expected: list[float] | None = None  # expected_tokens' table

    # ---- the model ------------------------------------------------------------------------

    def t_draft(self) -> float:
        t = self.draft_s.value or PRIOR_DRAFT_S_PER_TOKEN
        cap = self.device.max_draft_tokens_per_s
        return max(t, 1.0 / cap) if cap > 0 else t

    def token_bytes(self) -> float:
        return self.bytes_per_token.value or PRIOR_BYTES_PER_TOKEN

    def block_bytes(self, k: int) -> float:
        return DRAFT_OVERHEAD_BYTES + k * self.token_bytes()

    def expected_tokens(self, k: int) -> float:
        table = self._expected
        if table is None or k >= len(table):  # E(0..k), kept until the next update
            alphas = self.acceptance.per_position()
            table, total, reach = [1.0], 1.0, 1.0
            for j in range(max(k, len(alphas))):
                reach *= alphas[min(j, len(alphas) - 1)]
                total += reach
                table.append(total)
            self._expected = table
        return table[k]

    def full_accept(self, k: int) -> float:
        """P(all k drafted tokens are accepted)."""
        return self.expected_tokens(k) - self.expected_tokens(k - 1)

    def wait_s(self, k: int) -> float:
        """A block of k's round trip: the link and the verifier."""
        return self.link.net_rtt(self.block_bytes(k)) + self.link.server_s()

    def round_seconds(self, k: int) -> float:
        return (self.t_draft() * k + self.link.net_rtt(self.block_bytes(k))
                + self.link.server_s() + (self.overhead.value or 0.0))

    def sync_seconds(self) -> float:
        """Prefilling what the draft has not seen (tokens a cloud run committed)."""
        if self.unsynced <= 1:
            return 0.0
        return self.unsynced * (self.prefill_s.value or PRIOR_PREFILL_S_PER_TOKEN)

    def ahead_gain(self, k: int) -> float:
        """Expected seconds draft-ahead saves on a round of k (negative: it costs)."""
        if k == 0:
            return 0.0
        p_full = self.full_accept(k)
        ahead = self.t_draft() * (k + 1)
        wait = self.wait_s(k)
        return p_full * min(ahead, wait) - (1.0 - p_full) * max(ahead - wait, 0.0)

    def ahead_pays(self, k: int) -> bool:
        """Draft-ahead drafts the next k + 1 tokens while this block is verified, and is not
        interrupted by the verdict: on a full accept it saves up to the wait, on a rejection it
        costs whatever of it outlasts the wait (a slow device on a short link loses)."""
        return self.ahead_gain(k) > 0.0

    def send_ahead_depth(self, k: int, limit: int) -> int:
        """Blocks in flight at once. Worth it when a full accept is likely and the network, not
        the draft, is the wait: blocks in flight hide the link's latency, not the verifier's
        compute (it verifies them one after the other)."""
        if limit <= 1 or k == 0:
            return 1
        wait = self.link.net_rtt(self.block_bytes(k))
        drafting = self.t_draft() * k
        if self.full_accept(k) >= 0.5 and wait > drafting:
            return min(limit, 1 + int(wait / max(drafting, 1e-6)))
        return 1

    def gen_seconds(self) -> float:
        return max(self.gen_s.value or self.link.server_s(), 1e-4)

    def cloud_latency_s(self) -> float:
        """What a cloud run pays once, beyond its tokens' pace."""
        return self.link.latency_s + (self.cloud_overhead.value or 0.0)

    def cloud_seconds(self, n: int) -> float:
        first = self.link.latency_s + self.gen_seconds()
        return first + (n - 1) * self.gen_seconds() + (self.cloud_overhead.value or 0.0)

    # ---- measuring ------------------------------------------------------------------------

    def observe(self, record: RoundRecord, planned: Plan | None, wall: float | None) -> None:
        """Everything a round's record measures; wall: seconds since its plan (less any
        re-open within the round: an outage's length, not what such a round costs)."""
        a = self.alpha
        if wall is not None:
            wall = max(wall - record.open_s, 0.0)
        self.link.update(record)
        self.acceptance.update(record)
        self._expected = None
        steps, busy_s = decode_steps(record)
        if steps > 0 and busy_s > 0:
            add_device_time(self.draft_s, busy_s / steps, a)
        if record.sync_tokens > 1 and record.sync_s > 0:
            add_device_time(self.prefill_s, record.sync_s / record.sync_tokens, a,
                            PREFILL_SPIKE_CAP)
        if record.drafted > 0 or record.mode == "local":
            self.unsynced = 0
        if record.mode == "verify" and record.accepted is not None:
            if record.drafted > 0 and record.bytes_up > 0:
                sent = record.bytes_up / max(record.attempts, 1) - DRAFT_OVERHEAD_BYTES
                self.bytes_per_token.add(max(sent, 1.0) / record.drafted, a)
            if wall is not None and record.attempts == 1 and record.in_flight == 1 and \
                    not planned.draft_ahead and planned.send_ahead == 1:
                self.overhead.add(max(wall - record.draft_s - record.rtt_s, 0.0), a)
        if record.mode == "cloud" and record.committed > 0:
            self.observe_cloud(record, wall)

    def observe_cloud(self, record: RoundRecord, wall: float | None) -> None:
        """A cloud run: the pace of its stream, the link's latency (send -> first token, less
        the verifier's time for it) and what the run cost beyond both; of a cut run only the
        latency, and no time its stream stood still (STALL_FACTOR says why)."""
        a = self.alpha
        self.unsynced += record.committed
        server_per_token = (record.server_forward_s + record.server_queue_s) / record.committed
        if record.rtt_s > 0:
            self.link.observe_latency(max(record.rtt_s - server_per_token, 0.0),
                                         float(record.bytes_up))
        if wall is None or record.rtt_s <= 0 or record.cut:
            return
        wall -= stalled_seconds(record.gaps_s)
        if record.committed > 1:
            self.gen_s.add(max(wall - record.send_s - record.rtt_s, 0.0)
                           / (record.committed - 1), a)
        expected = record.rtt_s + (record.committed - 1) * self.gen_seconds()
        self.cloud_overhead.add(max(wall - expected, 0.0), a)
