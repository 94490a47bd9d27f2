"""The adaptive controller (`client.policy: adaptive`): each round, every way to produce the
next tokens, by expected verified tokens per second.

Options, each with expected committed tokens N, wall seconds T and target passes P:

- speculate k (0 allowed: the target's next token alone), optionally drafting ahead:
      N = E(k) = 1 + sum_{j=1..k} prod_{i<j} alpha_i     (accepted prefix + the bonus token)
      T = t_draft * k + L + c * bytes(k) + t_server + t_over + t_sync,    P = 1
  with alpha_i the per-position acceptance (edge/control/acceptance.py), t_draft the measured
  draft seconds per decode step, L and c the link's latency and seconds per uplink byte
  (edge/control/channel.py), bytes(k) the measured Draft size model, t_server the verifier's
  reported time, t_over the round's measured time outside drafting and the round trip (Python,
  framing, committing) and t_sync the prefill of tokens the draft has not seen (after a cloud
  run). Draft-ahead (when `client.draft_ahead` allows it) takes
      p_full * min(ahead, wait) - (1 - p_full) * max(ahead - wait, 0)
  off T (p_full = P(the whole block is accepted), ahead = t_draft * (k + 1), wait = the round
  trip): the verdict does not interrupt it, so on a rejection its excess over the wait is lost.
- let the cloud generate n tokens (Plan.cloud_generate; `adaptive.cloud_generate` allows it):
      N = n,   T = L + t_gen + (n - 1) * t_gen + t_over_cloud,   P = n
  with t_gen the measured seconds between streamed tokens (before any cloud run: the verifier's
  reported time per pass, and then the cloud must be CLOUD_UNMEASURED_MARGIN faster, since
  streaming adds to it). n is the smallest run in which the link's latency is at most
  CLOUD_LATENCY_SHARE of the time, at least `cloud_generate_tokens`, at most what is left.
  The plan keeps speculation's k, which the loop drafts if the verifier does not serve
  Generate (the controller then asks again only CLOUD_RETRY_ROUNDS rounds later). When the
  last plan was a cloud run the next generation's draft is not prefilled (prefill_first).

The plan is the option of the highest N / T (among speculations, the smallest k within
FLAT_TOLERANCE of the best). With `client.max_passes_per_token` = cap (an operator's cap on
the verifier's cost) the score is the Lagrangian of "fastest with passes <= cap x tokens",
    (N + price * (CAP_MARGIN * cap * N - P)) / T,
whose price integrates the excess of each round's passes over CAP_MARGIN x cap x its tokens
(it rises while the client runs over the cap and falls to 0 while under; an unreachable cap
drives it to CAP_PRICE_MAX, where the fewest passes per token win), and a cloud run is cut to
what the running surplus pays for, CAP_RESERVE_PASSES kept. Losslessness does not depend on
the choice: every option commits only tokens the target chose or accepted. Generating locally without the verifier is
the loop's offline path (edge/link/offline.py), never chosen here: a lossless request has
no unverified option.

Re-deciding as the link changes: a cloud run measures the link too (send -> first token, less
the verifier's time, feeds L), so speculation's estimate follows the link while the cloud
generates; its other inputs (acceptance, draft speed) describe the draft and the text, and a
speculative round is tried every CLOUD_EXPLORE_ROUNDS cloud runs in a row when it is within
CLOUD_EXPLORE_RATIO of the cloud's rate.

Confidence stop, from the same model: one more draft token at confidence p adds beta(p)
expected tokens (beta = acceptance vs the draft's top probability, at best — when every earlier
token is accepted) and costs dt = t_draft + c * bytes_per_token seconds. At the chosen
operating point of R = E(k*) / T(k*) tokens/s it pays iff beta(p) > R * dt, so the block stops
below the confidence where beta reaches R * dt (Plan.min_confidence; under a cap R is the
option's score and a token is worth 1 + price x cap).

q entries (sampling): fewer entries per position when the uplink's share of a round grows
(lossless either way: the draft samples from exactly the q it sends).

Reaction (stated and tested in tests/test_control.py): RTT and timing estimates are EWMAs of
weight `rtt_alpha` per round that measured them, acceptance decays at `acceptance_alpha` per
verified round.
"""
from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
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
PRIOR_PREFILL_S_PER_TOKEN = 0.0005  # before the first measured multi-token sync
DRAFT_SPEEDUP_ALPHA = 0.7         # EWMA weight of a draft-time sample below the estimate
PROBE_AFTER_ZERO_ROUNDS = 4       # after this many k = 0 rounds in a row, draft one token to
                                  # re-measure the draft (its time is only seen when it drafts)
PRIOR_BYTES_PER_TOKEN = 3.0       # greedy: a varint id and its tag share
DRAFT_OVERHEAD_BYTES = 8.0        # round, start, tags of an empty Draft
UPLINK_SHARE_HIGH = 0.10          # q entries halve when the uplink takes more of a round
UPLINK_SHARE_LOW = 0.02           # ... and double again below this
CLOUD_LATENCY_SHARE = 0.10        # a cloud run is long enough that the link's latency is at
                                  # most this share of its time
CLOUD_EXPLORE_ROUNDS = 2          # after this many cloud runs in a row, one speculative round ...
CLOUD_EXPLORE_RATIO = 0.8         # ... if speculation is expected within this of the cloud
CLOUD_UNMEASURED_MARGIN = 1.3     # before any cloud run is measured its pace is the verifier's
                                  # time per pass (streaming adds to it): clearly faster only
CLOUD_RETRY_ROUNDS = 32           # a cloud plan run as another round (the verifier does not serve
                                  # Generate, or the link was being re-opened): ask again after this
CAP_MARGIN = 0.95                 # plan to this share of max_passes_per_token (noisy estimates)
CAP_RESERVE_PASSES = 1.0          # a cloud run leaves this much of the surplus unspent
CAP_DECAY = 0.998                 # per round: the cap's running totals forget (~500 rounds)
CAP_PRICE_STEP = 1.0              # the cap's multiplier moves by this x (passes - cap x tokens)
CAP_PRICE_START = 1.0             # ... from here (a cap usually binds) ...
CAP_PRICE_MAX = 100.0             # ... up to here (an unreachable cap: the fewest passes)
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


@dataclass(frozen=True)
class Option:
    """One way to produce the next tokens, as the model expects it to go."""
    kind: str                 # "speculate" | "cloud"
    tokens: float             # expected committed tokens
    seconds: float            # expected wall time
    passes: float             # target forward passes
    k: int = 0                # speculate: draft length
    draft_ahead: bool = False
    n: int = 0                # cloud: tokens asked

    @property
    def rate(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


class _Ewma:
    def __init__(self) -> None:
        self.value: float | None = None

    def add(self, x: float, alpha: float) -> float:
        self.value = x if self.value is None else self.value + alpha * (x - self.value)
        return self.value


class AdaptivePolicy:
    def __init__(self, config: "ClientConfig",
                 clock: Callable[[], float] = time.monotonic) -> None:
        cfg = config.adaptive
        self.cfg = cfg
        self.device = config.device
        self.max_q_entries = config.max_q_entries
        self.draft_ahead = config.draft_ahead
        self.max_send_ahead = config.send_ahead
        self.cap = config.max_passes_per_token
        self.clock = clock
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
        self.prefill_s_per_token: float | None = None
        self.bytes_per_token: float | None = None
        self.overhead = _Ewma()       # a sequential round's seconds outside drafting and its RTT
        self.gen_s = _Ewma()          # seconds between a cloud run's streamed tokens
        self.cloud_overhead = _Ewma()  # a cloud run's seconds outside its first token and stream
        self.rounds_seen = 0
        self.cloud_retry_at = 0       # rounds_seen before which no cloud plan is made
        self.q_entries = config.max_q_entries
        self.drafted = 0            # this generation
        self.generated = 0
        self.verified_rounds = 0
        self.zero_rounds = 0          # k = 0 rounds in a row
        self.cloud_rounds = 0         # cloud runs in a row
        self.unsynced = 0             # committed tokens the draft has not seen (cloud runs)
        self.cap_passes = 0.0         # decayed running totals for max_passes_per_token
        self.cap_tokens = 0.0
        self.cap_price = CAP_PRICE_START  # the cap's Lagrange multiplier (see score)
        self._planned: Plan | None = None   # the last plan, until its first record arrives
        self._t_plan = 0.0
        self.last_choice: dict = {}  # what the last plan was based on (reports, tests)
        self._expected: list[float] | None = None  # expected_tokens' table
        self.prefers_cloud = False    # the last choice that could have been a cloud run was

    # ---- the model ------------------------------------------------------------------------

    def t_draft(self) -> float:
        t = self.draft_s_per_token or PRIOR_DRAFT_S_PER_TOKEN
        cap = self.device.max_draft_tokens_per_s
        return max(t, 1.0 / cap) if cap > 0 else t

    def block_bytes(self, k: int) -> float:
        return DRAFT_OVERHEAD_BYTES + k * (self.bytes_per_token or PRIOR_BYTES_PER_TOKEN)

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

    def round_seconds(self, k: int) -> float:
        return (self.t_draft() * k + self.channel.net_rtt(self.block_bytes(k))
                + self.channel.server_s() + (self.overhead.value or 0.0))

    def sync_seconds(self) -> float:
        """Prefilling what the draft has not seen (tokens a cloud run committed)."""
        if self.unsynced <= 1:
            return 0.0
        return self.unsynced * (self.prefill_s_per_token or PRIOR_PREFILL_S_PER_TOKEN)

    def ahead_gain(self, k: int) -> float:
        """Expected seconds draft-ahead saves on a round of k (negative: it costs)."""
        if k == 0:
            return 0.0
        p_full = self.expected_tokens(k) - self.expected_tokens(k - 1)
        ahead = self.t_draft() * (k + 1)
        wait = self.channel.net_rtt(self.block_bytes(k)) + self.channel.server_s()
        return p_full * min(ahead, wait) - (1.0 - p_full) * max(ahead - wait, 0.0)

    def ahead_pays(self, k: int) -> bool:
        """Draft-ahead drafts the next k + 1 tokens while this block is verified, and is not
        interrupted by the verdict: on a full accept it saves up to the wait, on a rejection it
        costs whatever of it outlasts the wait (a slow device on a short link loses)."""
        return self.ahead_gain(k) > 0.0

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

    def speculations(self, view: RoundView) -> list[Option]:
        top = min(self.cfg.max_draft_length, view.max_k)
        # The prefill is paid once, for every token speculation goes on to commit: its share
        # per round is spread over what is left of the generation.
        sync = self.sync_seconds() / max(view.remaining, 1)
        out = []
        for k in range(0, top + 1):
            if not self.fits_budget(k, view):
                continue
            tokens = self.expected_tokens(k)
            seconds = self.round_seconds(k) + sync * min(tokens, view.remaining)
            ahead = self.draft_ahead and k > 0 and self.ahead_pays(k)
            if ahead:
                seconds -= self.ahead_gain(k)
            out.append(Option("speculate", tokens, seconds, 1.0, k=k, draft_ahead=ahead))
        return out

    def cloud_seconds(self, n: int) -> float:
        first = self.channel.latency_s + self.gen_seconds()
        return first + (n - 1) * self.gen_seconds() + (self.cloud_overhead.value or 0.0)

    def gen_seconds(self) -> float:
        return max(self.gen_s.value or self.channel.server_s(), 1e-4)

    def cloud_option(self, view: RoundView) -> Option | None:
        if not (self.cfg.cloud_generate and self.rounds_seen >= self.cloud_retry_at
                and self.channel.measured
                and view.remaining > 1 and not view.fast):
            return None
        latency = self.channel.latency_s + (self.cloud_overhead.value or 0.0)
        share = CLOUD_LATENCY_SHARE
        n = 1 + math.ceil((1.0 - share) / share * latency / self.gen_seconds())
        n = min(max(n, self.cfg.cloud_generate_tokens), view.remaining)
        if self.cap is not None:
            # every generated token is a target pass: as many as the surplus pays for, keeping
            # the pass of the round after it in reserve
            limit = self.cap * CAP_MARGIN
            surplus = limit * self.cap_tokens - self.cap_passes - CAP_RESERVE_PASSES
            n = min(n, int(surplus / (1.0 - limit)) if limit < 1.0 else n)
            if n < 2:
                return None
        return Option("cloud", float(n), self.cloud_seconds(n), float(n), n=n)

    def score(self, option: Option) -> float:
        """Tokens per second, less the cap's price: the Lagrangian of "most tokens per second
        with passes <= cap x tokens", (N + lam * (cap * N - P)) / T, whose multiplier lam
        rises while the running passes per token are over the cap and falls while under."""
        if self.cap is None:
            return option.rate
        lam = self.cap_price
        return (option.tokens + lam * (self.cap * CAP_MARGIN * option.tokens - option.passes)) \
            / max(option.seconds, 1e-9)

    def choose(self, view: RoundView) -> tuple[Option, Option | None]:
        """(the best speculation, the cloud run if it is better), by expected tokens per
        second (under a cap: its Lagrangian score)."""
        specs = self.speculations(view)
        scores = {o.k: self.score(o) for o in specs}
        peak = max(scores.values())
        slack = FLAT_TOLERANCE * abs(peak)
        spec = min((o for o in specs if scores[o.k] >= peak - slack), key=lambda o: o.k)
        cloud = self.cloud_option(view)
        self.last_choice["cloud_rate"] = cloud.rate if cloud is not None else None
        margin = 1.0 if self.gen_s.value is not None else CLOUD_UNMEASURED_MARGIN
        if cloud is None or self.score(cloud) <= margin * scores[spec.k]:
            return spec, None
        if self.cloud_rounds >= CLOUD_EXPLORE_ROUNDS and \
                spec.rate >= CLOUD_EXPLORE_RATIO * cloud.rate:
            return spec, None  # re-measure speculation now and then
        return spec, cloud

    def best_k(self, view: RoundView) -> tuple[int, float]:
        spec, _ = self.choose(view)
        return spec.k, spec.rate

    def min_confidence(self, spec: Option) -> float:
        """The confidence below which one more draft token does not pay (see the module's
        docstring). Under a cap a token is worth more than its time, since it also lowers the
        passes per token: 1 + price x cap, against the option's score."""
        if not self.cfg.confidence_stop or self.verified_rounds < 4:
            return 0.0
        dt = self.t_draft() + self.channel.seconds_per_byte * (
            self.bytes_per_token or PRIOR_BYTES_PER_TOKEN)
        worth = 1.0 if self.cap is None else 1.0 + self.cap_price * self.cap * CAP_MARGIN
        return self.acceptance.confidence_threshold(max(self.score(spec), 0.0) * dt / worth)

    def choose_q_entries(self, k: int) -> int:
        if not self.cfg.adapt_q_entries or k == 0:
            return self.q_entries
        share = (self.channel.seconds_per_byte * self.block_bytes(k)) / self.round_seconds(k)
        if share > UPLINK_SHARE_HIGH:
            self.q_entries = max(self.q_entries // 2, self.cfg.min_q_entries)
        elif share < UPLINK_SHARE_LOW:
            self.q_entries = min(self.q_entries * 2, self.max_q_entries)
        return self.q_entries

    # ---- the policy interface -------------------------------------------------------------

    @property
    def prefill_first(self) -> bool:
        """Whether the loop prefills the draft on the prompt before the first round (edge/
        loop.py). Not when the last real choice (one with a cloud run possible: more than one
        token left) let the cloud generate: the next generation most likely starts the same way
        and may never draft; its first block then pays the prefill, which the model charges to
        speculation (sync_seconds)."""
        return not self.prefers_cloud

    def plan(self, view: RoundView) -> Plan:
        if view.round == 0:
            self.drafted = 0
            # the loop prefilled the draft on the prompt unless prefill_first said not to
            self.unsynced = 0 if self.prefill_first else view.context_length
        mode = self.last_choice.get("mode")
        spec, cloud = self.choose(view)
        if self.last_choice.get("cloud_rate") is not None:
            self.prefers_cloud = cloud is not None
        k, rate = spec.k, spec.rate
        self.last_choice.update(mode="cloud" if cloud else "speculate", previous=mode, k=k,
                                rate=rate, rtt_s=self.channel.net_rtt(self.block_bytes(k)),
                                t_draft=self.t_draft())
        self._t_plan = self.clock()
        if cloud is not None:
            # k: what the loop drafts instead if this verifier does not serve Generate
            self._planned = Plan(k=k, cloud_generate=cloud.n)
            return self._planned
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
        # Dither: every other round a slightly longer block, so the link's cost per byte can
        # be told from its latency (edge/control/channel.py fits a line) and the acceptance of
        # positions past k is seen (short blocks alone never reach them, and an unseen
        # position is estimated at the pooled rate, which keeps k short); the rate is flat
        # near its optimum, so this costs little (under a cap it also spends fewer passes).
        chosen = k
        if self.cfg.dither and k >= 2 and self.verified_rounds % 2:
            longer = min(k + max(1, k // 4), self.cfg.max_draft_length, view.max_k)
            chosen = longer if self.fits_budget(longer, view) else k
        probe = k == 0 and view.max_k > 0 and self.zero_rounds >= PROBE_AFTER_ZERO_ROUNDS
        if probe:
            chosen = 1
        self._planned = Plan(k=chosen, min_confidence=self.min_confidence(spec),
                             q_entries=q_entries, send_ahead=send_ahead,
                             draft_ahead=self.draft_ahead and chosen > 0 and not probe
                             and self.ahead_pays(chosen))
        return self._planned

    def update(self, record: RoundRecord) -> None:
        planned, self._planned = self._planned, None
        wall = self.clock() - self._t_plan if planned is not None else None
        if planned is not None and planned.cloud_generate and record.mode != "cloud" and \
                record.mode != "local":
            self.cloud_retry_at = self.rounds_seen + CLOUD_RETRY_ROUNDS  # ran another round
        self.rounds_seen += 1
        self.channel.update(record)
        self.acceptance.update(record)
        self._expected = None
        a = self.cfg.rtt_alpha
        if record.mode == "verify":
            self.zero_rounds = self.zero_rounds + 1 if record.drafted == 0 else 0
        if record.mode != "cloud":
            self.cloud_rounds = 0
        steps, busy_s = decode_steps(record)
        if steps > 0 and busy_s > 0:
            per_token = busy_s / steps
            # Faster down than up: the device's speed is what it can do; a slow block is most
            # often a moment of contention, and while k = 0 only probes measure it.
            rate = DRAFT_SPEEDUP_ALPHA if self.draft_s_per_token is not None and \
                per_token < self.draft_s_per_token else a
            self.draft_s_per_token = per_token if self.draft_s_per_token is None else \
                self.draft_s_per_token + rate * (per_token - self.draft_s_per_token)
        if record.sync_tokens > 1 and record.sync_s > 0:
            per_token = record.sync_s / record.sync_tokens
            self.prefill_s_per_token = per_token if self.prefill_s_per_token is None else \
                self.prefill_s_per_token + a * (per_token - self.prefill_s_per_token)
        if record.drafted > 0 or record.mode == "local":
            self.unsynced = 0
        if record.mode == "verify" and record.accepted is not None:
            self.verified_rounds += 1
            if record.drafted > 0 and record.bytes_up > 0:
                per_token = max(record.bytes_up / max(record.attempts, 1) - DRAFT_OVERHEAD_BYTES,
                                1.0) / record.drafted
                self.bytes_per_token = per_token if self.bytes_per_token is None else \
                    self.bytes_per_token + a * (per_token - self.bytes_per_token)
            if wall is not None and record.attempts == 1 and record.in_flight == 1 and \
                    not planned.draft_ahead and planned.send_ahead == 1:
                self.overhead.add(max(wall - record.draft_s - record.rtt_s, 0.0), a)
            if self.cfg.prior_path is not None and self.verified_rounds % SAVE_EVERY_ROUNDS == 0:
                self.save_prior()
        if record.mode == "cloud" and record.committed > 0:
            self.observe_cloud(record, wall)
        self.cap_passes = self.cap_passes * CAP_DECAY + record.target_passes
        self.cap_tokens = self.cap_tokens * CAP_DECAY + record.committed
        if self.cap is not None:
            excess = record.target_passes - self.cap * CAP_MARGIN * record.committed
            self.cap_price = min(max(self.cap_price + CAP_PRICE_STEP * excess, 0.0),
                                 CAP_PRICE_MAX)
        self.drafted += record.drafted
        self.generated += record.committed

    def observe_cloud(self, record: RoundRecord, wall: float | None) -> None:
        """A cloud run: the pace of its stream, the link's latency (send -> first token, less
        the verifier's time for it) and what the run cost beyond both."""
        a = self.cfg.rtt_alpha
        self.cloud_rounds += 1
        self.unsynced += record.committed
        server_per_token = (record.server_forward_s + record.server_queue_s) / record.committed
        if record.rtt_s > 0:
            self.channel.observe_latency(max(record.rtt_s - server_per_token, 0.0),
                                         float(record.bytes_up))
        if wall is None or record.rtt_s <= 0:
            return
        if record.committed > 1:
            self.gen_s.add(max(wall - record.send_s - record.rtt_s, 0.0)
                           / (record.committed - 1), a)
        expected = record.rtt_s + (record.committed - 1) * self.gen_seconds()
        self.cloud_overhead.add(max(wall - expected, 0.0), a)

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
