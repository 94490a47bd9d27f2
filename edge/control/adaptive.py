"""The adaptive draft-length controller (`client.policy: adaptive`).

Each round it picks k (0 allowed) to maximise expected committed tokens per second of wall time:

    E(k) = 1 + sum_{j=1..k} prod_{i<j} alpha_i          (accepted prefix + the bonus token)
    T(k) = t_draft * k + L + c * bytes(k) + t_server     (draft, uplink, latency, verifier)

with alpha_i the per-position acceptance (edge/control/acceptance.py), t_draft the measured
draft seconds per token, L and c the link's latency and seconds per uplink byte
(edge/control/channel.py), bytes(k) the measured Draft size model and t_server the verifier's
reported time. Only k that fit the device budget (config `client.device`) are candidates.

Confidence stop, from the same model: one more draft token at confidence p adds beta(p)
expected tokens (beta = acceptance vs the draft's top probability, at best — when every earlier
token is accepted) and costs dt = t_draft + c * bytes_per_token seconds. At the chosen
operating point of R = E(k*) / T(k*) tokens/s it pays iff beta(p) > R * dt, so the block stops
below the confidence where beta reaches R * dt (Plan.min_confidence).

q entries (sampling): fewer entries per position when the uplink's share of a round grows
(lossless either way: the draft samples from exactly the q it sends). Cloud-generates: when
speculation does not pay — the best k is expected to commit fewer than CLOUD_MAX_TAU tokens
per target pass (acceptance collapsed, or a device too slow to draft) — and asking the verifier
to generate n tokens itself is expected to be faster, and the config allows it. (A verifier
that generates spends one target pass per token; speculation exists to save those, so being
merely faster is not enough.)

Reaction (stated and tested in tests/test_control.py): RTT and timing estimates are EWMAs of
weight `rtt_alpha` per verified round, acceptance decays at `acceptance_alpha` per round.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from edge.control.acceptance import AcceptanceEstimator
from edge.control.channel import ChannelEstimator
from edge.control.policy import DraftPolicy, Plan, RoundView, register_policy
from edge.rounds import RoundRecord

if TYPE_CHECKING:
    from edge.config import ClientConfig

log = logging.getLogger(__name__)

PRIOR_DRAFT_S_PER_TOKEN = 0.002   # before the first measured block
DRAFT_SPEEDUP_ALPHA = 0.7         # EWMA weight of a draft-time sample below the estimate
PROBE_AFTER_ZERO_ROUNDS = 4       # after this many k = 0 rounds in a row, draft one token to
                                  # re-measure the draft (its time is only seen when it drafts)
PRIOR_BYTES_PER_TOKEN = 3.0       # greedy: a varint id and its tag share
DRAFT_OVERHEAD_BYTES = 8.0        # round, start, tags of an empty Draft
UPLINK_SHARE_HIGH = 0.10          # q entries halve when the uplink takes more of a round
UPLINK_SHARE_LOW = 0.02           # ... and double again below this
CLOUD_MARGIN = 1.1                # cloud-generates only when clearly faster ...
CLOUD_MAX_TAU = 1.5               # ... and speculation saves few target passes (E(k) below)
SAVE_EVERY_ROUNDS = 32
FLAT_TOLERANCE = 0.02             # the smallest k within 2% of the best rate wins: the rate is
                                  # flat near its optimum at long RTTs, and a shorter block
                                  # drafts (and spends) less for the same speed


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


class AdaptivePolicy:
    def __init__(self, config: "ClientConfig") -> None:
        cfg = config.adaptive
        self.cfg = cfg
        self.device = config.device
        self.max_q_entries = config.max_q_entries
        self.draft_ahead = config.draft_ahead
        self.max_send_ahead = config.send_ahead
        self.channel = ChannelEstimator(cfg.rtt_alpha)
        settings = dict(max_positions=cfg.max_draft_length, alpha=cfg.acceptance_alpha,
                        prior=cfg.prior_acceptance, prior_weight=cfg.prior_weight)
        self.acceptance = AcceptanceEstimator(**settings)
        if cfg.prior_path is not None and Path(cfg.prior_path).is_file():
            try:
                data = json.loads(Path(cfg.prior_path).read_text())
                self.acceptance = AcceptanceEstimator.from_dict(data, **settings)
            except (OSError, ValueError) as error:
                log.warning("ignoring the acceptance prior at %s: %s", cfg.prior_path, error)
        self.draft_s_per_token: float | None = None
        self.bytes_per_token: float | None = None
        self.cloud_s_per_token: float | None = None
        self.q_entries = config.max_q_entries
        self.drafted = 0            # this generation
        self.generated = 0
        self.verified_rounds = 0
        self.zero_rounds = 0          # k = 0 rounds in a row
        self.last_choice: dict = {}  # what the last plan was based on (reports, tests)

    # ---- the model ------------------------------------------------------------------------

    def t_draft(self) -> float:
        t = self.draft_s_per_token or PRIOR_DRAFT_S_PER_TOKEN
        cap = self.device.max_draft_tokens_per_s
        return max(t, 1.0 / cap) if cap > 0 else t

    def block_bytes(self, k: int) -> float:
        return DRAFT_OVERHEAD_BYTES + k * (self.bytes_per_token or PRIOR_BYTES_PER_TOKEN)

    def expected_tokens(self, k: int) -> float:
        alphas = self.acceptance.per_position()
        total, reach = 1.0, 1.0
        for j in range(k):
            reach *= alphas[min(j, len(alphas) - 1)]
            total += reach
        return total

    def round_seconds(self, k: int) -> float:
        return (self.t_draft() * k + self.channel.net_rtt(self.block_bytes(k))
                + self.channel.server_s())

    def fits_budget(self, k: int, view: RoundView) -> bool:
        if k == 0:
            return True
        d = self.device
        e = self.expected_tokens(k)
        if d.max_draft_tokens_per_s > 0 and k / self.round_seconds(k) > d.max_draft_tokens_per_s:
            return False
        if d.max_draft_per_generated > 0 and \
                self.drafted + k > d.max_draft_per_generated * (view.generated + e):
            return False
        if d.joules_budget_per_token > 0:
            joules = (d.joules_per_draft_token * k + d.joules_per_byte_up * self.block_bytes(k)
                      + d.joules_per_byte_down * DRAFT_OVERHEAD_BYTES)
            if joules / e > d.joules_budget_per_token:
                return False
        return True

    def best_k(self, view: RoundView) -> tuple[int, float]:
        top = min(self.cfg.max_draft_length, view.max_k)
        rates = {0: self.expected_tokens(0) / self.round_seconds(0)}
        for k in range(1, top + 1):
            if self.fits_budget(k, view):
                rates[k] = self.expected_tokens(k) / self.round_seconds(k)
        peak = max(rates.values())
        best = min(k for k, rate in rates.items() if rate >= (1.0 - FLAT_TOLERANCE) * peak)
        return best, rates[best]

    def min_confidence(self, rate: float) -> float:
        if not self.cfg.confidence_stop or self.verified_rounds < 4:
            return 0.0
        dt = self.t_draft() + self.channel.seconds_per_byte * (
            self.bytes_per_token or PRIOR_BYTES_PER_TOKEN)
        return self.acceptance.confidence_threshold(rate * dt)

    def choose_q_entries(self, k: int) -> int:
        if not self.cfg.adapt_q_entries or k == 0:
            return self.q_entries
        share = (self.channel.seconds_per_byte * self.block_bytes(k)) / self.round_seconds(k)
        if share > UPLINK_SHARE_HIGH:
            self.q_entries = max(self.q_entries // 2, self.cfg.min_q_entries)
        elif share < UPLINK_SHARE_LOW:
            self.q_entries = min(self.q_entries * 2, self.max_q_entries)
        return self.q_entries

    def ahead_pays(self, k: int) -> bool:
        """Draft-ahead drafts the next k + 1 tokens while this block is verified, and is not
        interrupted by the verdict: on a full accept it saves up to the wait, on a rejection it
        costs whatever of it outlasts the wait (a slow device on a short link loses)."""
        p_full = self.expected_tokens(k) - self.expected_tokens(k - 1)
        ahead = self.t_draft() * (k + 1)
        wait = self.channel.net_rtt(self.block_bytes(k)) + self.channel.server_s()
        return p_full * min(ahead, wait) > (1.0 - p_full) * max(ahead - wait, 0.0)

    def cloud_rate(self, n: int) -> float:
        per_token = self.cloud_s_per_token or self.channel.server_s()
        return n / (self.channel.net_rtt(DRAFT_OVERHEAD_BYTES) + n * max(per_token, 1e-4))

    # ---- the policy interface -------------------------------------------------------------

    def plan(self, view: RoundView) -> Plan:
        if view.round == 0:
            self.drafted = 0
        k, rate = self.best_k(view)
        self.last_choice = {"k": k, "rate": rate, "rtt_s": self.channel.net_rtt(
            self.block_bytes(k)), "t_draft": self.t_draft()}
        if self.cfg.cloud_generate and self.channel.measured and view.remaining > 1:
            n = min(self.cfg.cloud_generate_tokens, view.remaining)
            if self.expected_tokens(k) < CLOUD_MAX_TAU and \
                    self.cloud_rate(n) > CLOUD_MARGIN * rate:
                return Plan(k=0, cloud_generate=n)
        q_entries = self.choose_q_entries(k) if view.sampling else None
        send_ahead = 1
        if self.max_send_ahead > 1 and k > 0:
            # Worth it when a full accept is likely and the network, not the draft, is the
            # wait: blocks in flight hide the link's latency, not the verifier's compute
            # (it verifies them one after the other).
            p_full = self.expected_tokens(k) - self.expected_tokens(k - 1)
            wait = self.channel.net_rtt(self.block_bytes(k))
            if p_full >= 0.5 and wait > self.t_draft() * k:
                send_ahead = min(self.max_send_ahead, max(view.max_send_ahead, 1),
                                 1 + int(wait / max(self.t_draft() * k, 1e-6)))
        # Dither: every other round a slightly shorter block, so the link's cost per byte can
        # be told from its latency (edge/control/channel.py fits a line); the rate is flat
        # near its optimum, so this costs little.
        chosen = k
        if self.cfg.dither and k >= 2 and self.verified_rounds % 2:
            chosen = k - max(1, k // 4)
        if k == 0 and view.max_k > 0 and self.zero_rounds >= PROBE_AFTER_ZERO_ROUNDS:
            chosen = 1
        return Plan(k=chosen, min_confidence=self.min_confidence(rate), q_entries=q_entries,
                    send_ahead=send_ahead,
                    draft_ahead=self.draft_ahead and chosen > 0 and self.ahead_pays(chosen))

    def update(self, record: RoundRecord) -> None:
        self.channel.update(record)
        self.acceptance.update(record)
        a = self.cfg.rtt_alpha
        self.zero_rounds = self.zero_rounds + 1 if record.drafted == 0 else 0
        steps, busy_s = decode_steps(record)
        if steps > 0 and busy_s > 0:
            per_token = busy_s / steps
            # Faster down than up: the device's speed is what it can do; a slow block is most
            # often a moment of contention, and while k = 0 only probes measure it.
            rate = DRAFT_SPEEDUP_ALPHA if self.draft_s_per_token is not None and \
                per_token < self.draft_s_per_token else a
            self.draft_s_per_token = per_token if self.draft_s_per_token is None else \
                self.draft_s_per_token + rate * (per_token - self.draft_s_per_token)
        if record.mode == "verify" and record.accepted is not None:
            self.verified_rounds += 1
            if record.drafted > 0 and record.bytes_up > 0:
                per_token = max(record.bytes_up / max(record.attempts, 1) - DRAFT_OVERHEAD_BYTES,
                                1.0) / record.drafted
                self.bytes_per_token = per_token if self.bytes_per_token is None else \
                    self.bytes_per_token + a * (per_token - self.bytes_per_token)
            if self.cfg.prior_path is not None and self.verified_rounds % SAVE_EVERY_ROUNDS == 0:
                self.save_prior()
        if record.mode == "cloud" and record.committed > 0:
            per_token = (record.server_forward_s + record.server_queue_s) / record.committed
            self.cloud_s_per_token = per_token if self.cloud_s_per_token is None else \
                self.cloud_s_per_token + a * (per_token - self.cloud_s_per_token)
        self.drafted += record.drafted
        self.generated += record.committed

    def save_prior(self) -> None:
        path = Path(self.cfg.prior_path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.acceptance.to_dict()))
        except OSError as error:
            log.warning("cannot save the acceptance prior to %s: %s", path, error)


@register_policy("adaptive")
def _adaptive(config: "ClientConfig") -> DraftPolicy:
    return AdaptivePolicy(config)
