"""The adaptive controller's answer to the verifier's price (cloud/price.py; the proto's header
says what it means): pay for speed only while passes are free.

At price 0 nothing here runs: the controller maximises the user's tokens per second, cloud runs
allowed (edge/control/adaptive.py). At a price p > 0, among the options expected to keep to the
user's speed floor F (client.min_tokens_per_s, or the request's own), it maximises

    score = rate / cost ** (PRICE_WEIGHT * p * jitter)

where rate is the option's expected tokens per second (under client.max_passes_per_token, the
cap's score: the cap stays a hard cap) and cost the verifier's work per committed token, in
1-token steps:

    speculate k:   (1 + position_cost * k) / E(k)     one pass of k + 1 positions per E(k) tokens
    cloud run:     1                                  one 1-token step per token

position_cost is what the verifier measured of its own passes (Opened.position_cost,
cloud/pass_cost.py: 0.15-0.35 for a small target on one CPU core, about 0 on a GPU), or
POSITION_COST while it has not said.

so as the price rises the controller moves to fewer passes per token (speculation instead of
cloud runs, longer blocks), and at price 1 it takes about the cheapest option that meets the
floor. When no option is expected to meet it, the fastest is taken (the floor is the user's, the
price the verifier's: a user is never made slower than F to save passes, and below F speed
decides). The speed a cloud run is expected at is also held to the verifier's measured time per
pass: a pace measured while the verifier idled would flatter the cloud once it is loaded.

Speculate or cloud run, measured: the position cost prices a round by what its extra
positions add to a pass, which is right for choosing k but blind to how many sessions share
the pass: a phone's rounds, drafted at 40 tok/s behind a 60-70 ms round trip, arrive spread
out and pay a larger share of each pass's fixed cost than cloud-run steps that arrive together
(lte/phone at 64 users: 1.45 ms a token speculating against 1.15 for cloud runs; wifi/laptop
0.88 against 1.04). So once the verifier has measured what a committed token costs it in each
mode (RoundView.token_ms: Verdict.speculate_token_ms and cloud_token_ms, the session's own
where it has them, the verifier's where not; cloud/token_cost.py), the choice between the two
weighs a cloud run (and a k = 0 round, a 1-token step too) at cost 1 and a drafted block at
their ratio r = speculate / cloud, and speculation is taken only where r < 1 - MEASURED_SAVING
(clearly cheaper) or where no cloud run keeps to the floor and speculation is expected
FLOOR_GAIN faster (a session speculating already, its own rounds measured: faster at all);
measured clearly cheaper with no option at the floor, a cloud run is taken only where it is
expected FLOOR_GAIN faster than speculating (the fastest is what the floor rule would take,
but on a saturated verifier each cloud-run token is a pass the others wait for, and laptops
leaving for the cloud one by one slowed everyone). The block length is still chosen by the
position cost (the measured figures are of the blocks drafted so far, not of each k), up to
LOADED_MAX_K on a saturated verifier (edge/control/adaptive.py longest_block). Until both
figures are said the position cost decides both.

Many users read the same price; so that they do not all flip at once, each controller scales the
exponent of its speculate-or-cloud decision by its own jitter drawn once in [1 - PRICE_JITTER,
1 + PRICE_JITTER] (identical users then switch at different prices, and the load moves
smoothly), and the kind of round it runs now (speculate or cloud) keeps a STAY_BONUS edge (no
flapping on a price near a user's switch point). The block length is chosen without the jitter:
identical speculating users draft alike (measured at 64 users before: jittered users drafted
k 4.5-10 and ran at 7-20 tok/s, p10/p50 0.61).
The server smooths the price over about a second (cloud/price.py), so one slow pass moves no one.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable

from edge.control.costs import RoundCosts
from edge.control.options import LOADED_PRICE, Option, best_speculation
from edge.control.policy import RoundView, TokenMs

PRICE_WEIGHT = 8.0    # the exponent at price 1: a 10% cheaper option wins unless the other is
                      # more than 1.1^8 = 2.1x faster, speculation at half a cloud run's cost
                      # unless the cloud is 2^8 = 256x faster: about "the cheapest that meets
                      # the floor"; at price 0.25 the cloud must be 4x faster than speculating
                      # at half its cost (phone on lte: cloud runs 70-80 tok/s, speculation 15-23)
POSITION_COST = 0.15  # a pass's cost grows by this share of a 1-token step per drafted position
                      # (the fallback for a verifier that does not measure it): measured on this
                      # CPU with the shipped target, 300-token contexts, one core: [64, 5] 1.59x
                      # and [64, 9] 2.17x a [64, 1] step (0.15 a position; [32, 5] 1.39x); a GPU
                      # ~0 (memory-bound). Too low a cost makes the priced controller draft long
                      # blocks whose passes cost more than they save
PRICE_JITTER = 0.3    # each controller's exponent is scaled by a draw in 1 -/+ this
STAY_BONUS = 1.1      # the kind of round running now wins ties within this factor
MEASURED_SAVING = 0.05  # under a price, speculation is taken where the verifier measures it at
                        # least this much cheaper per token than cloud runs: its figures move
                        # +-5% between runs and sessions (docs/capacity.md), and at a tie cloud
                        # runs keep the user's speed and the verifier's lockstep batch (held-out
                        # verizon/phone at 96 users: speculating 16% at a 0.975 ratio cost 1.08x
                        # cloud-only's CPU per token)
STALE_FIGURE_S = 10.0  # speculation measured dearer under a price: a new prompt is measured
                      # with speculative blocks only once the speculate figure the controller
                      # reads has not moved for this long (nobody speculates: the verifier's
                      # figure froze), which the first new prompt after it renews for everyone.
                      # Measuring one prompt in four kept 4% of the tokens speculating at 32
                      # lte/phone users and cost 1.11-1.14x cloud-only's verifier CPU a token
FLOOR_GAIN = 2.0      # measured dearer, speculation is taken for the speed floor only where it
                      # is expected this much faster than the cloud run: under load the model
                      # flatters a phone's rounds (64 lte/phone users: speculating 10-15% "for
                      # the floor", users' p10 11.3 tok/s against cloud-only's 13.0; 96
                      # verizon/phone users: expected at 13-14 tok/s, run at 8). Measured
                      # cheaper and below every floor, likewise a cloud run: a saturated
                      # verifier's pace flatters the cloud, and each cloud-run token is a pass
                      # the others wait for (wifi/laptop at 32-64 users, price 1: laptops
                      # below the floor took the cloud as the fastest, 25-80% speculated, and
                      # adaptive cost 1.09-1.86x cloud-only's CPU a token, capacity 0-32).
                      # Asked of a switch to speculation, not of a session speculating
                      # already (a laptop whose hard prompt read its own rounds dearer took a
                      # whole cloud run at 7-8 tok/s: 64 wifi/laptop users, good share 0.85)

Score = Callable[[Option], float]
Cost = Callable[[Option], float]  # the verifier's work per committed token, in cloud tokens


class PriceResponse:
    """One controller's answer to the price: its floor, its own jitter and how long the
    verifier's speculate figure has stood still."""

    def __init__(self, min_tokens_per_s: float, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_tokens_per_s = min_tokens_per_s  # client.min_tokens_per_s
        self.jitter = 1.0 + PRICE_JITTER * (2.0 * (rng or random.Random()).random() - 1.0)
        self.clock = clock
        self._figure: tuple[float | None, float] = (None, clock())  # (value, when it moved)
        self.speculating = False  # the last choice between the modes (a cloud run offered, the
                                  # link measured) was speculation

    def watch(self, view: RoundView) -> None:
        """Note the speculate figure the verifier said (each round)."""
        value = view.token_ms[0]
        if value != self._figure[0]:
            self._figure = (value, self.clock())

    def figure_stale(self) -> bool:
        """The speculate figure has not moved for STALE_FIGURE_S."""
        return self.clock() - self._figure[1] >= STALE_FIGURE_S

    def measures_new_text(self, view: RoundView) -> bool:
        """At a new prompt (view.round 0): whether to measure its text with speculative blocks.
        Always, but while the verifier measures speculation dearer under a price, or is
        saturated (from LOADED_PRICE), only once its figure is stale: the text's acceptance
        would not change the choice (dearer: the cloud; saturated: the choice by the figures
        and FLOOR_GAIN, which a speculating controller makes without these blocks), and those
        rounds renew the figure for every session. At 96 phone users, below every floor and
        speculation reading cheaper, three prompts in four began with two blocks, out of the
        verifier's lockstep batch while the phone prefilled its draft."""
        self.watch(view)
        if not measured_dearer(view) and view.price < LOADED_PRICE:
            return True
        if not self.figure_stale():
            return False
        self._figure = (self._figure[0], self.clock())  # measured now: at most once a period
        return True

    def choose(self, costs: RoundCosts, view: RoundView, specs: list[Option],
               cloud: Option | None, base: Score, running: str | None
               ) -> tuple[Option, Option | None, Score]:
        """(the speculation to draft, the cloud run when it wins, the score that chose) at
        view.price > 0: among the options that keep to the floor (the request's, else the
        client's) the best base score discounted by their cost; the fastest when none does.
        Before the link is measured: speculation, which measures it at no pass per token.
        running: the kind of round the controller runs now (it keeps the STAY_BONUS)."""
        if not costs.link.measured:
            score = priced(base, view.price, 1.0, modelled(position_cost_of(view)))
            return best_speculation(specs, score), None, score
        chosen = self.by_measure(costs, view, specs, cloud, base, running)
        if cloud is not None:  # a choice between the two modes
            self.speculating = chosen[1] is None
        return chosen

    def by_measure(self, costs: RoundCosts, view: RoundView, specs: list[Option],
                   cloud: Option | None, base: Score, running: str | None
                   ) -> tuple[Option, Option | None, Score]:
        """choose, once the link is measured."""
        position_cost = position_cost_of(view)
        score = priced(base, view.price, 1.0, modelled(position_cost))
        cloud = paced_by_verifier(costs, cloud) if cloud is not None else None
        floor = self.min_tokens_per_s if view.min_tokens_per_s is None \
            else view.min_tokens_per_s
        options = specs + ([cloud] if cloud is not None else [])
        pool = meeting_floor(options, floor)
        ratio = measured_ratio(view.token_ms)
        switch = priced(base, view.price, self.jitter,
                        modelled(position_cost) if ratio is None else measured(ratio))
        # speculation measured dearer per token, and the cloud keeps to the floor or is not
        # clearly slower than speculating. (Where speculation reads cheaper no gain is asked
        # of it: asked there too, it sent laptops that speculate at the floor's edge to cloud
        # runs, 64 wifi/laptop users at a good share of 0.78; there the cloud needs the gain.)
        # The gain is asked of a switch to speculation; a session speculating already (its
        # figure grew dearer: a laptop on a hard prompt) leaves it only for a cloud that keeps
        # the floor or is faster
        fastest_spec = best_speculation(specs, base)
        gain = 1.0 if self.speculating else FLOOR_GAIN
        dearer = not_cheaper(ratio) and cloud is not None and (
            cloud in pool or fastest_spec.rate < gain * cloud.rate)
        if not pool:  # below the floor speed decides (the fastest, as at price 0) ...
            if cheaper(ratio) and (cloud is None or cloud.rate < FLOOR_GAIN * fastest_spec.rate):
                return fastest_spec, None, base  # ... but a cheaper speculation yields only
            pool, score, switch = options, base, base  # to a clearly faster cloud (above)
        spec = best_speculation([o for o in pool if o.kind == "speculate"] or specs, score)
        if dearer:
            return spec, cloud, score
        ranked = staying(switch, running)
        if cloud is None or cloud not in pool or (spec in pool and ranked(cloud) <= ranked(spec)):
            return spec, None, score
        return spec, cloud, score


def pass_cost(option: Option, position_cost: float = POSITION_COST) -> float:
    """The verifier's work per committed token, in 1-token steps."""
    if option.kind == "cloud":
        return 1.0
    return option.passes * (1.0 + position_cost * option.k) / max(option.tokens, 1e-9)


def position_cost_of(view: RoundView) -> float:
    """What the verifier measured one more fed position adds to a pass, else POSITION_COST."""
    return POSITION_COST if view.position_cost is None else view.position_cost


def measured_dearer(view: RoundView) -> bool:
    """Under a price, the verifier does not measure a speculated token clearly cheaper than a
    cloud-run one."""
    return view.price > 0 and not_cheaper(measured_ratio(view.token_ms))


def cheaper(ratio: float | None) -> bool:
    """A measured ratio (speculate / cloud) that saves at least MEASURED_SAVING."""
    return ratio is not None and ratio <= 1.0 - MEASURED_SAVING


def not_cheaper(ratio: float | None) -> bool:
    """A measured ratio (speculate / cloud) that is no saving of MEASURED_SAVING."""
    return ratio is not None and not cheaper(ratio)


def modelled(position_cost: float = POSITION_COST) -> Cost:
    """An option's cost by the position-cost model (pass_cost)."""
    return lambda option: pass_cost(option, position_cost)


def measured_ratio(token_ms: TokenMs) -> float | None:
    """What a speculated token costs the verifier over a cloud-run token, as measured; None
    until both are."""
    speculate, cloud = token_ms
    return None if speculate is None or cloud is None else speculate / cloud


def measured(ratio: float) -> Cost:
    """An option's cost, in cloud-run tokens, by the verifier's measured figures: a drafted
    block the ratio, a k = 0 round (the target's next token alone, a 1-token step like a cloud
    run's) 1."""
    return lambda option: ratio if option.kind == "speculate" and option.k > 0 else 1.0


def priced(base: Score, price: float, jitter: float = 1.0,
           cost: Cost | None = None) -> Score:
    """base (tokens/s, or the cap's score) discounted by the option's cost (default: the
    position-cost model at POSITION_COST) at the price."""
    exponent = PRICE_WEIGHT * price * jitter
    cost = cost or modelled()

    def score(option: Option) -> float:
        value, discount = base(option), cost(option) ** exponent
        return value / discount if value > 0 else value * discount

    return score


def staying(score: Score, incumbent: str | None) -> Score:
    """score with the STAY_BONUS edge for options of the kind running now."""
    def stay(option: Option) -> float:
        value = score(option)
        if option.kind != incumbent:
            return value
        return value * STAY_BONUS if value > 0 else value / STAY_BONUS

    return stay


def meeting_floor(options: list[Option], floor: float) -> list[Option]:
    """The options expected at least `floor` tokens per second (none: an empty list)."""
    return [o for o in options if o.rate >= floor]


def paced_by_verifier(costs: RoundCosts, cloud: Option) -> Option:
    """A cloud run no faster than the verifier's measured time per pass allows (each of its
    tokens is a pass; the pace a cloud run last measured may be from an idle verifier)."""
    floor_s = costs.link.latency_s + cloud.n * costs.link.server_s()
    if cloud.seconds >= floor_s:
        return cloud
    return Option("cloud", cloud.tokens, floor_s, cloud.passes, n=cloud.n)
