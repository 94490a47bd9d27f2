"""The adaptive controller (`client.policy: adaptive`): each round, every way to produce the
next tokens, by expected verified tokens per second.

Options, each with expected committed tokens N, wall seconds T and target passes P:

- speculate k (0 allowed: the target's next token alone), optionally drafting ahead:
      N = E(k) = 1 + sum_{j=1..k} prod_{i<j} alpha_i     (accepted prefix + the bonus token)
      T = t_draft * k + L + c * bytes(k) + t_server + t_over + t_sync,    P = 1
  with alpha_i the per-position acceptance (edge/control/acceptance.py), t_draft the measured
  draft seconds per decode step, L and c the link's latency and seconds per uplink byte
  (edge/control/link_estimate.py), bytes(k) the measured Draft size model, t_server the verifier's
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
  CLOUD_LATENCY_SHARE of the time, at least `cloud_generate_tokens`, at most what is left;
  when speculation is not worth measuring again (below), at least CLOUD_SETTLED_RUN_S of the
  stream, since nothing would be re-decided at the shorter run's end; from LOADED_PRICE,
  and at any price where the verifier measures speculation dearer, the rest of the response,
  so that a saturated verifier's cloud runs stay in its lockstep batch as cloud-only's do (at
  32 lte/phone users, price 0.65-0.74, speculating nothing, runs cut where the price dipped
  below LOADED_PRICE cost 1.06x cloud-only's CPU a token).
  The plan keeps speculation's k, which the loop drafts if the verifier does not serve
  Generate (the controller then asks again only CLOUD_RETRY_ROUNDS rounds later). When the
  last plan was a cloud run the next generation's draft is not prefilled (prefill_first).

The plan is the option of the highest N / T (among speculations, the smallest k within
FLAT_TOLERANCE of the best). With `client.max_passes_per_token` = cap (an operator's cap on
the verifier's cost) the score is the Lagrangian of "fastest with passes <= cap x tokens",
    (N + price * (CAP_MARGIN * cap * N - P)) / T,
and a cloud run is cut to what the running surplus of passes pays for (edge/control/
pass_cap.py). Losslessness does not depend on the choice: every option commits only tokens
the target chose or accepted. Generating locally without the verifier is the loop's offline
path (edge/link/offline.py), never chosen here: a lossless request has no unverified option.

The verifier's price (RoundView.price, cloud/price.py): at 0 all of the above; above 0 the
choice among the same options weighs each one's passes per token against its speed, never below
the user's speed floor (edge/control/pricing.py has the rule). From LOADED_PRICE (saturated) no
block is longer than LOADED_MAX_K: the pass is every session's wait (edge/control/options.py).

Where each part lives: the cost model and what measures it (N, T, draft-ahead's gain,
send-ahead's depth) in edge/control/costs.py, the options in edge/control/options.py, the cap
in edge/control/pass_cap.py; this module chooses, plans the round and feeds the record back.

Re-deciding as the link changes: a cloud run measures the link too (send -> first token, less
the verifier's time, feeds L), so speculation's estimate follows the link while the cloud
generates; its other inputs (acceptance, draft speed) describe the draft and the text, and a
speculative round is tried every CLOUD_EXPLORE_ROUNDS cloud runs in a row when it is worth
measuring again (edge/control/options.py worth_measuring): expected within CLOUD_EXPLORE_RATIO
of the cloud's rate, or, while the acceptance rests on a few verified rounds, is old or is
about another prompt's text, within THIN_EVIDENCE_RATIO (NEW_TEXT_RATIO) of it at the prior
acceptance. A new prompt is measured at once, with NEW_TEXT_BLOCKS blocks, and keeps only
NEW_TEXT_KEEP of the acceptance evidence of the prompts before it: prompts differ more than
rounds of one prompt do. One rejected first block (0.7 -> 0.45 at position 0) must not make
speculation look too slow ever to be measured again where the prior says it may win (measured
on wifi/laptop before: stuck on cloud runs at 0.78x fixed k = 16). Under a price with speculation
measured dearer than cloud runs by the verifier, or from LOADED_PRICE (edge/control/pricing.py)
neither is done but
for a new prompt once the verifier's speculate figure has stood still for STALE_FIGURE_S: enough
rounds to keep the measured figures current (measured on lte/phone at 32-64 users with every new
prompt measured: 17-19% of the verifier's tokens speculated, at 1.3-1.5x a cloud-run token's
cost; with one prompt in four 4% at 32 users, 1.11-1.14x cloud-only's CPU a token), and its
cloud runs take the rest of the response.

Confidence stop, from the same model: one more draft token at confidence p adds beta(p)
expected tokens (beta = acceptance vs the draft's top probability, at best — when every earlier
token is accepted) and costs dt = t_draft + c * bytes_per_token seconds. At the chosen
operating point of R = E(k*) / T(k*) tokens/s it pays iff beta(p) > R * dt, so the block stops
below the confidence where beta reaches R * dt (Plan.min_confidence; under a cap R is the
option's score and a token is worth 1 + price x cap).

q entries (sampling): fewer entries per position when the uplink's share of a round grows
(lossless either way: the draft samples from exactly the q it sends).

Reaction (stated and tested in tests/edge/test_control.py): RTT and timing estimates are EWMAs of
weight `rtt_alpha` per round that measured them, acceptance decays at `acceptance_alpha` per
verified round.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from edge.control.costs import RoundCosts, save_acceptance
from edge.control.options import (LOADED_MAX_K, LOADED_PRICE, Option, adapt_q_entries,
                                  best_speculation, cloud_run, confidence_floor, drafting_block,
                                  first_cloud_run, shortest_run_s, speculations, within_budget,
                                  worth_measuring)
from edge.control.pass_cap import PassCap
from edge.control.policy import DraftPolicy, Plan, RoundView, register_policy
from edge.control.pricing import PriceResponse, measured_dearer
from edge.record import RoundRecord

if TYPE_CHECKING:
    from edge.config import ClientConfig, DeviceProfile

PROBE_AFTER_ZERO_ROUNDS = 4       # after this many k = 0 rounds in a row, draft one token to
                                  # re-measure the draft (its time is only seen when it drafts)
CLOUD_EXPLORE_ROUNDS = 2          # after this many cloud runs in a row, one speculative round
                                  # ... if it is worth measuring again (options.worth_measuring)
CLOUD_UNMEASURED_MARGIN = 1.3     # before any cloud run is measured its pace is the verifier's
                                  # time per pass (streaming adds to it): clearly faster only
CLOUD_RETRY_ROUNDS = 32           # a cloud plan run as another round (the verifier does not serve
                                  # Generate): ask again after this many rounds
CLOUD_FAILED_RETRY_ROUNDS = 4     # a cloud run that committed nothing (evicted, or the link went
                                  # before its first token): speculative rounds, whose re-opens
                                  # back off on evictions, before the next cloud run
SAVE_EVERY_ROUNDS = 32
NEW_TEXT_BLOCKS = 2               # a new prompt's text is measured with this many blocks
                                  # before the cloud takes it (options.worth_measuring): one
                                  # block is a coin toss (wifi/laptop: an easy prompt's first
                                  # block rejected, the rest a cloud run at 0.32x fixed k = 16)
NEW_TEXT_KEEP = 0.6               # the acceptance evidence kept into a new generation: prompts
                                  # differ (wifi/laptop, fixed k = 16: 32-229 tok/s by prompt),
                                  # and forgetting 10% a round took ~9 rejected blocks to see a
                                  # hard prompt after easy ones; keeping 0.3, one or two rejected
                                  # new-text blocks sent easy prompts to the cloud (lan/laptop
                                  # 0.95x, wifi/laptop 0.99x the best other; 0.6: 1.00x, 1.05x)


class AdaptivePolicy(DraftPolicy):
    def __init__(self, config: "ClientConfig",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = config.adaptive
        self.clock = clock
        self.pricing = PriceResponse(config.min_tokens_per_s, clock=clock)  # floor, jitter
        self.device = config.device
        self.max_q_entries = config.max_q_entries
        self.draft_ahead = config.draft_ahead
        self.max_send_ahead = config.send_ahead
        self.costs = RoundCosts(config)
        self.cap = PassCap(config.max_passes_per_token)
        self.rounds_seen = 0
        self.cloud_retry_at = 0       # rounds_seen before which no cloud plan is made
        self.q_entries = config.max_q_entries
        self.drafted = 0              # this generation
        self.verified_rounds = 0
        self.zero_rounds = 0          # k = 0 rounds in a row
        self.cloud_rounds = 0         # cloud runs in a row
        self.generation_blocks = 0    # speculative rounds since round 0
        self._planned: Plan | None = None   # the last plan, until its first record arrives
        self._t_plan = 0.0
        self.last_choice: dict = {}  # what the last plan was based on (reports, tests)
        self.prefers_cloud = self.cfg.cloud_generate and self.cap.cap is None  # prefill_first

    # ---- the options ----------------------------------------------------------------------

    def speculations(self, view: RoundView) -> list[Option]:
        top = longest_block(self.cfg.max_draft_length, view)
        ks = [k for k in range(top + 1)
              if within_budget(self.device, self.costs, k, self.drafted, view.generated)]
        return speculations(self.costs, view, ks, self.draft_ahead)

    def cloud_option(self, view: RoundView, settled: bool = False) -> Option | None:
        """The cloud run to weigh (None: not allowed now), the first one (unmeasured) apart."""
        if not (self.cfg.cloud_generate and self.rounds_seen >= self.cloud_retry_at
                and view.remaining > 1 and not view.fast):
            return None
        fewest, shortest_s = self.cfg.cloud_generate_tokens, shortest_run_s(view.price, settled)
        if measured_dearer(view) or view.price >= LOADED_PRICE:  # stay in the lockstep batch
            fewest = view.remaining
        if not self.costs.link.measured:
            return first_cloud_run(self.cap, view.remaining, fewest)
        return cloud_run(self.costs, self.cap, view.remaining, fewest, shortest_s)

    def score(self, option: Option) -> float:
        """Tokens per second, less the cap's price (edge/control/pass_cap.py)."""
        return self.cap.score(option.tokens, option.seconds, option.passes)

    def choose(self, view: RoundView) -> tuple[Option, Option | None]:
        """(the best speculation, the cloud run if better) by tokens/s, a cap's or a price's."""
        specs = self.speculations(view)
        cloud, measured = self.cloud_option(view), self.costs.link.measured
        self.last_choice["cloud_rate"] = cloud.rate if cloud is not None and measured else None
        if view.price > 0:  # passes are not free
            spec, cloud, score = self.pricing.choose(self.costs, view, specs, cloud, self.score,
                                                     self.last_choice.get("mode"))
        else:
            spec, score = best_speculation(specs, self.score), self.score
            if not measured:
                return spec, cloud
            margin = 1.0 if self.costs.gen_s.value is not None else CLOUD_UNMEASURED_MARGIN
            cloud = None if cloud is None or score(cloud) <= margin * score(spec) else cloud
        if cloud is None:
            return spec, None
        new_text = self.generation_blocks < NEW_TEXT_BLOCKS
        if not worth_measuring(self.costs, spec, specs, cloud.rate, new_text):
            return spec, self.cloud_option(view, settled=True)  # options.py says why
        # measure speculation: at once on a new prompt's text, else now and then (see the top)
        if new_text or self.cloud_rounds >= CLOUD_EXPLORE_ROUNDS and not measured_dearer(view):
            return drafting_block(spec, specs, score), None
        return spec, cloud

    # ---- the policy interface -------------------------------------------------------------

    @property
    def prefill_first(self) -> bool:
        """Whether the loop prefills the draft before the first round: not when the last real
        choice (a cloud run possible) let the cloud generate, as the next one likely will (its
        first block pays the prefill, which the model charges to speculation: sync_seconds)."""
        return not self.prefers_cloud

    def plan(self, view: RoundView) -> Plan:
        costs = self.costs
        if view.round == 0:
            self.drafted = 0
            self.generation_blocks = 0 if self.pricing.measures_new_text(view) else NEW_TEXT_BLOCKS
            costs.acceptance.forget(NEW_TEXT_KEEP)
            # the loop prefilled the draft on the prompt unless prefill_first said not to
            costs.unsynced = 0 if self.prefill_first else view.context_length
        self.pricing.watch(view)
        mode = self.last_choice.get("mode")
        spec, cloud = self.choose(view)
        if self.last_choice.get("cloud_rate") is not None:
            self.prefers_cloud = cloud is not None
        k, rate = spec.k, spec.rate
        self.last_choice.update(mode="cloud" if cloud else "speculate", previous=mode, k=k,
                                rate=rate, rtt_s=costs.link.net_rtt(costs.block_bytes(k)),
                                t_draft=costs.t_draft())
        self._t_plan = self.clock()
        if cloud is not None:
            # k: what the loop drafts instead if this verifier does not serve Generate
            self._planned = Plan(k=k, cloud_generate=cloud.n)
            return self._planned
        if view.sampling and self.cfg.adapt_q_entries and k > 0:
            self.q_entries = adapt_q_entries(costs, k, self.q_entries, self.cfg.min_q_entries,
                                             self.max_q_entries)
        send_ahead = costs.send_ahead_depth(k, min(self.max_send_ahead,
                                                   max(view.max_send_ahead, 1)))
        chosen = k
        if self.cfg.dither and k >= 2 and self.verified_rounds % 2:
            top = longest_block(self.cfg.max_draft_length, view)
            chosen = dithered(top, self.device, costs, k, self.drafted, view)
        probe = k == 0 and view.max_k > 0 and self.zero_rounds >= PROBE_AFTER_ZERO_ROUNDS
        chosen = 1 if probe else chosen
        stop = self.cfg.confidence_stop and self.verified_rounds >= 4  # the confidence stop
        self._planned = Plan(k=chosen, min_confidence=confidence_floor(
                                 costs, self.cap, self.score(spec)) if stop else 0.0,
                             q_entries=self.q_entries if view.sampling else None,
                             send_ahead=send_ahead,
                             draft_ahead=self.draft_ahead and chosen > 0 and not probe
                             and costs.ahead_pays(chosen))
        return self._planned

    def update(self, record: RoundRecord) -> None:
        planned, self._planned = self._planned, None
        wall = self.clock() - self._t_plan if planned is not None else None
        if planned is not None and planned.cloud_generate and record.mode != "cloud" and \
                record.mode != "local":
            self.cloud_retry_at = self.rounds_seen + CLOUD_RETRY_ROUNDS  # ran another round
        elif record.mode == "cloud" and record.committed == 0:
            self.cloud_retry_at = self.rounds_seen + CLOUD_FAILED_RETRY_ROUNDS
        self.rounds_seen += 1
        self.costs.observe(record, planned, wall)
        self.cap.observe(record)
        if record.mode == "verify":
            self.zero_rounds = self.zero_rounds + 1 if record.drafted == 0 else 0
            self.generation_blocks += 1
        if record.mode != "cloud":
            self.cloud_rounds = 0
        elif record.committed > 0:
            self.cloud_rounds += 1
        if record.mode == "verify" and record.accepted is not None:
            self.verified_rounds += 1
            if self.cfg.prior_path is not None and self.verified_rounds % SAVE_EVERY_ROUNDS == 0:
                save_acceptance(self.costs.acceptance, Path(self.cfg.prior_path))
        self.drafted += record.drafted


def longest_block(max_draft_length: int, view: RoundView) -> int:
    """The longest block allowed now: LOADED_MAX_K on a saturated verifier."""
    top = min(max_draft_length, view.max_k)
    return min(top, LOADED_MAX_K) if view.price >= LOADED_PRICE else top


def dithered(top: int, device: "DeviceProfile", costs: RoundCosts, k: int, drafted: int,
             view: RoundView) -> int:
    """Every other round a slightly longer block, so the link's cost per byte can be told from
    its latency (edge/control/link_estimate.py fits a line) and the acceptance of positions
    past k is seen (short blocks alone never reach them, and an unseen position is estimated
    at the pooled rate, which keeps k short); the rate is flat near its optimum, so this costs
    little (under a cap it also spends fewer passes)."""
    longer = min(k + max(1, k // 4), top)
    return longer if within_budget(device, costs, longer, drafted, view.generated) else k


@register_policy("adaptive")
def _adaptive(config: "ClientConfig") -> DraftPolicy:
    return AdaptivePolicy(config)
