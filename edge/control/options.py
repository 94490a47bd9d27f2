"""The adaptive controller's options (edge/control/adaptive.py): every way to produce the next
tokens it may choose among, each priced by the cost model (edge/control/costs.py)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge.control.costs import DRAFT_OVERHEAD_BYTES, RoundCosts
from edge.control.pass_cap import PassCap
from edge.control.policy import RoundView

if TYPE_CHECKING:
    from edge.config import DeviceProfile

UPLINK_SHARE_HIGH = 0.10          # q entries halve when the uplink takes more of a round
UPLINK_SHARE_LOW = 0.02           # ... and double again below this
CLOUD_LATENCY_SHARE = 0.10        # a cloud run is long enough that the link's latency is at
                                  # most this share of its time
CLOUD_SETTLED_RUN_S = 1.0         # ... and when speculation is not worth measuring again, as
                                  # long as this much of the stream: nothing is re-decided
                                  # between runs then, and each run pays the link's latency once
                                  # more (wifi/phone: 0.91x cloud-only with 16-token runs); not
                                  # on a priced verifier, whose price may move meanwhile (a run
                                  # settled at a low price ran on at 5.8 tok/s after it rose) ...
LOADED_PRICE = 0.5                # ... until the price says the verifier is saturated (jobs
                                  # wait 1.5x its target delay): from there a cloud run takes
                                  # the rest of the response. Between runs a session leaves the
                                  # verifier's lockstep batch of cloud runs (the last token's
                                  # trip back, the decision, the next request's trip, its first
                                  # step's wait: 240 ms median at 64 lte/phone users), whose
                                  # fixed costs the others then share: whole-generation runs
                                  # took adaptive from 1.14x to 0.95x cloud-only's verifier CPU
                                  # per token, and 2 s runs (3 a response at 96 phone users)
                                  # still cost 1.06-1.12x there (issue 38)
LOADED_MAX_K = 4                  # ... and no block longer than this: a saturated verifier's
                                  # pass is every session's wait, and its length grows with the
                                  # positions fed (0.15-0.35 of a 1-token step each). Laptops
                                  # drafting k 5-9 by the position cost kept passes at 120-140
                                  # ms, and those on hard prompts (2-3 tokens a round) missed
                                  # TPOT 100 ms with either mode (64 wifi/laptop users: good
                                  # share 0.71-0.96 against cloud-only's; with this cap
                                  # 0.96-0.98, at 0.75-0.83x its CPU a token)
CLOUD_EXPLORE_RATIO = 0.8         # speculation is measured again when expected within this
                                  # of the cloud's rate ...
EXPLORE_EVIDENCE = 4.0            # ... or, before this many verified rounds (decayed) of
STALE_EVIDENCE_TOKENS = 64        # evidence, or this many tokens after the last (acceptance
                                  # depends on the text, which has moved on: measured on
                                  # wifi/laptop, one hard prompt kept the controller on cloud
                                  # runs for the next four, 0.81x fixed k = 16),
THIN_EVIDENCE_RATIO = 0.6         # within this at the prior acceptance: a prior
                                  # 0.1 higher is worth ~1.35x at k = 8. Measured (the model's
                                  # ratio once a cloud run is measured): wifi/laptop 0.8-0.9,
                                  # lan/phone 0.47-0.57, wifi/phone 0.32-0.39, lte/laptop 0.3.
                                  # A wasted try is bounded: the evidence ends the rule.
NEW_TEXT_RATIO = 0.75             # ... or within this on a new prompt, whose text the
                                  # evidence is not about: tried at every generation's start,
                                  # so only where speculation is near the cloud (wifi/laptop: fixed
                                  # k = 16 at 53-276 tok/s by prompt, the cloud ~85; one
                                  # rejected block kept whole generations on cloud runs), not
                                  # on lan/phone
FLAT_TOLERANCE = 0.02             # the smallest k within 2% of the best rate wins: the rate is
                                  # flat near its optimum at long RTTs, and a shorter block
                                  # drafts (and spends) less for the same speed


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


def best_speculation(specs: list[Option], score: Callable[[Option], float]) -> Option:
    """The speculation of the best score; the smallest k within FLAT_TOLERANCE of it."""
    peak = max(score(o) for o in specs)
    slack = FLAT_TOLERANCE * abs(peak)
    return min((o for o in specs if score(o) >= peak - slack), key=lambda o: o.k)


def drafting_block(spec: Option, specs: list[Option],
                   score: Callable[[Option], float]) -> Option:
    """What measures speculation: spec, or where that is k = 0 (one target token per round
    trip, nothing a cloud run does not measure) the best drafting block."""
    return spec if spec.k > 0 else max((o for o in specs if o.k > 0), key=score)


def worth_measuring(costs: RoundCosts, spec: Option, specs: list[Option], cloud_rate: float,
                    new_text: bool = False) -> bool:
    """Whether to try speculation again while the cloud generates: the chosen speculation's
    expected rate is within CLOUD_EXPLORE_RATIO of the cloud's, or while the acceptance rests on
    fewer than EXPLORE_EVIDENCE verified rounds, is STALE_EVIDENCE_TOKENS old or is about other
    text (new_text: this generation has run fewer than adaptive.NEW_TEXT_BLOCKS speculative
    rounds), its rate at the prior acceptance p (each option's estimated time, E(k) = 1 + p +
    ... + p^k) is within THIN_EVIDENCE_RATIO of it (NEW_TEXT_RATIO for new text alone).
    Drafting blocks only: a k = 0 round has nothing to measure that a cloud run does not (it is
    one target token per round trip)."""
    drafting = [o for o in specs if o.k > 0]
    if not drafting:
        return False
    if spec.k > 0 and spec.rate >= CLOUD_EXPLORE_RATIO * cloud_rate:
        return True
    acceptance = costs.acceptance
    if acceptance.observations() < EXPLORE_EVIDENCE or \
            acceptance.unchecked >= STALE_EVIDENCE_TOKENS:
        ratio = THIN_EVIDENCE_RATIO
    elif new_text:
        ratio = NEW_TEXT_RATIO
    else:
        return False
    p = acceptance.prior
    at_prior = max(sum(p ** j for j in range(o.k + 1)) / max(o.seconds, 1e-9) for o in drafting)
    return at_prior >= ratio * cloud_rate


def within_budget(device: "DeviceProfile", costs: RoundCosts, k: int, drafted: int,
                  generated: int) -> bool:
    """Whether a block of k keeps to the device's draft-speed, draft-share and energy budgets
    (drafted: tokens drafted so far in this generation, generated: tokens committed)."""
    if k == 0:
        return True
    d = device
    e = costs.expected_tokens(k)
    if d.max_draft_tokens_per_s > 0 and k / costs.round_seconds(k) > d.max_draft_tokens_per_s:
        return False
    if d.max_draft_per_generated > 0 and \
            drafted + k > d.max_draft_per_generated * (generated + e):
        return False
    if d.joules_budget_per_token > 0:
        joules = (d.joules_per_draft_token * k + d.joules_per_byte_up * costs.block_bytes(k)
                  + d.joules_per_byte_down * DRAFT_OVERHEAD_BYTES)
        if joules / e > d.joules_budget_per_token:
            return False
    return True


def speculations(costs: RoundCosts, view: RoundView, ks: list[int],
                 draft_ahead: bool) -> list[Option]:
    """A block of each k in ks, drafted ahead where that is allowed and pays."""
    # The prefill is paid once, for every token speculation goes on to commit: its share per
    # round is spread over what is left of the generation.
    sync = costs.sync_seconds() / max(view.remaining, 1)
    out = []
    for k in ks:
        tokens = costs.expected_tokens(k)
        seconds = costs.round_seconds(k) + sync * min(tokens, view.remaining)
        ahead = draft_ahead and k > 0 and costs.ahead_pays(k)
        if ahead:
            seconds -= costs.ahead_gain(k)
        out.append(Option("speculate", tokens, seconds, 1.0, k=k, draft_ahead=ahead))
    return out


def cloud_run(costs: RoundCosts, cap: PassCap, remaining: int, fewest: int,
              settled_s: float = 0.0) -> Option | None:
    """The cloud generating n tokens: the smallest run in which the link's latency is at most
    CLOUD_LATENCY_SHARE of its time, at least settled_s of its stream (CLOUD_SETTLED_RUN_S)
    and `fewest`, at most what is left and, under a cap, what its surplus pays for
    (none under 2 tokens)."""
    share = CLOUD_LATENCY_SHARE
    n = 1 + math.ceil((1.0 - share) / share * costs.cloud_latency_s() / costs.gen_seconds())
    n = max(n, math.ceil(settled_s / costs.gen_seconds()))
    n = cap.cloud_tokens(min(max(n, fewest), remaining))
    if cap.cap is not None and n < 2:
        return None
    return Option("cloud", float(n), costs.cloud_seconds(n), float(n), n=n)


def shortest_run_s(price: float, settled: bool) -> float:
    """The least stream a cloud run is chosen for: CLOUD_SETTLED_RUN_S when settled at price 0,
    else none (as the link's latency asks; from LOADED_PRICE the caller asks the whole rest)."""
    return CLOUD_SETTLED_RUN_S if settled and price == 0 else 0.0


def first_cloud_run(cap: PassCap, remaining: int, fewest: int) -> Option | None:
    """Before anything is measured: a short cloud run, which measures the link and the cloud's
    pace while it commits `fewest` tokens (a k = 0 round commits one), and is never far from the
    best choice, where speculating can be several times slower (a phone on a cellular link).
    None under a cap (no surplus of passes yet). Its time is unknown: only n is used."""
    if cap.cap is not None:
        return None
    n = min(fewest, remaining)
    return Option("cloud", float(n), 0.0, float(n), n=n)


def confidence_floor(costs: RoundCosts, cap: PassCap, score: float) -> float:
    """The confidence below which one more draft token does not pay at the chosen option's
    score (edge/control/adaptive.py's docstring). Under a cap a token is worth more than its
    time, since it also lowers the passes per token: 1 + price x cap, against the score."""
    dt = costs.t_draft() + costs.link.seconds_per_byte * costs.token_bytes()
    threshold = max(score, 0.0) * dt / cap.token_worth()
    return costs.acceptance.confidence_threshold(threshold)


def adapt_q_entries(costs: RoundCosts, k: int, entries: int, fewest: int, most: int) -> int:
    """Sparse-q entries per position for a block of k (sampling): halved when the uplink's
    share of a round grows, doubled again when it shrinks (lossless either way: the draft
    samples from exactly the q it sends)."""
    share = costs.link.seconds_per_byte * costs.block_bytes(k) / costs.round_seconds(k)
    if share > UPLINK_SHARE_HIGH:
        return max(entries // 2, fewest)
    if share < UPLINK_SHARE_LOW:
        return min(entries * 2, most)
    return entries
