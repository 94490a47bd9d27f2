"""The adaptive controller under the verifier's price (edge/control/pricing.py), on the synthetic
links and drafts of tests/edge/test_control.py (no model, no network): the records a real loop would
produce, the price fed in each round's view as the verifier's replies would carry it.

A phone draft on an LTE-like link is the case the price is about: at price 0 the cloud generating
is several times faster for the user (cloud runs, one target pass per token); priced, the
controller speculates (about a third of the passes per token) while that keeps to the user's
speed floor, and lets the cloud generate again when it does not."""
from __future__ import annotations

import random

import pytest
from test_control import Draft, Link, adaptive

from edge.control.options import Option
from edge.control.policy import RoundView
from edge.control.pricing import (POSITION_COST, PRICE_JITTER, STAY_BONUS, PriceResponse, pass_cost, priced,
                                  staying)
from edge.record import RoundRecord

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

PHONE = Draft(alpha=0.75, s_per_token=0.025)     # a ~40 tok/s phone draft
LTE = Link(latency_s=0.070, server_s=0.015)      # 70 ms, one target pass 15 ms


def run(policy, link: Link, draft: Draft, rounds: int, rng: random.Random, *, price=0.0,
        floor: float | None = None, remaining: int = 10_000,
        position_cost: float | None = None, token_ms=(None, None)):
    """tests/edge/test_control.py's loop with the verifier's price (a number, or price(round)), the
    request's speed floor and what the verifier measured a token costs it per mode (token_ms)
    in each view; returns the log of (plan, record)."""
    log, history, generated = [], [], 0
    for i in range(rounds):
        view = RoundView(round=len(history), generated=generated, remaining=remaining,
                         max_k=32, link_state="up", sampling=False, history=history,
                         max_q_entries=16, price=price(i) if callable(price) else price,
                         min_tokens_per_s=floor, position_cost=position_cost,
                         token_ms=token_ms)
        plan = policy.plan(view)
        if plan.cloud_generate:
            n = plan.cloud_generate
            first = link.latency_s + 10 * link.seconds_per_byte + link.server_s
            record = RoundRecord(index=len(history), k_asked=0, drafted=0, accepted=None,
                                 mode="cloud", verified=True, committed=n, target_passes=n,
                                 rtt_s=first, server_forward_s=n * link.server_s, bytes_up=10,
                                 bytes_down=8 * n)
            wall = first + (n - 1) * link.server_s
        else:
            k, n = plan.k, 0
            while n < k and rng.random() < draft.alpha:
                n += 1
            bytes_up = int(8 + k * draft.bytes_per_token)
            rtt = link.latency_s + bytes_up * link.seconds_per_byte + link.server_s
            record = RoundRecord(index=len(history), k_asked=k, drafted=k, accepted=n,
                                 mode="verify", verified=True, committed=n + 1, target_passes=1,
                                 draft_s=draft.s_per_token * k, rtt_s=rtt,
                                 sync_s=draft.s_per_token if k else 0.0, sync_tokens=1,
                                 server_forward_s=link.server_s, bytes_up=bytes_up,
                                 bytes_down=12, confidences=[0.9] * k)
            wall = record.draft_s + rtt
        policy.clock.t += wall
        history.append(record)
        generated += record.committed
        policy.update(record)
        log.append((plan, record))
    return log


def totals(log) -> tuple[float, float]:
    """(tokens per second, target passes per token) of a log, as the simulated clock ran."""
    tokens = sum(r.committed for _, r in log)
    seconds = sum(r.rtt_s + (r.committed - 1) * LTE.server_s if r.mode == "cloud"
                  else r.draft_s + r.rtt_s for _, r in log)
    return tokens / seconds, sum(r.target_passes for _, r in log) / tokens


def cloudy(log) -> int:
    return sum(1 for plan, _ in log if plan.cloud_generate)


def test_at_price_zero_nothing_changes():
    """A price of 0 in every view is the controller without a price, plan for plan: the cloud
    generates for the phone on LTE (the fastest for its user)."""
    plain, zero = adaptive(cloud_generate=True), adaptive(cloud_generate=True)
    without = run(plain, LTE, PHONE, 60, random.Random(3))
    with_zero = run(zero, LTE, PHONE, 60, random.Random(3), price=0.0)
    assert [plan for plan, _ in without] == [plan for plan, _ in with_zero]
    assert cloudy(without[-20:]) == 20


def test_a_high_price_buys_speculation_within_the_floor():
    """Price 1: the phone speculates (~16 tok/s, above a request's floor of 10) instead of
    letting the cloud generate (~60 tok/s): fewer than half the passes per token. It never
    tries a cloud run first: speculation measures the link at no pass per token."""
    priced_policy = adaptive(cloud_generate=True)
    log = run(priced_policy, LTE, PHONE, 80, random.Random(3), price=1.0, floor=10.0)
    assert cloudy(log) == 0
    rate, passes = totals(log[20:])
    free_rate, free_passes = totals(run(adaptive(cloud_generate=True), LTE, PHONE, 80,
                                        random.Random(3))[20:])
    assert passes < 0.5 * free_passes and free_passes > 0.95
    assert rate >= 10.0                              # the request's floor, kept
    assert rate < free_rate                          # what the user gives up for the verifier


def test_the_price_moves_the_choice_and_back():
    """Free, then dear, then free again: cloud runs, speculation, cloud runs."""
    policy = adaptive(cloud_generate=True)
    log = run(policy, LTE, PHONE, 150, random.Random(5),
              price=lambda i: 1.0 if 50 <= i < 100 else 0.0, floor=10.0)
    assert cloudy(log[30:50]) == 20
    assert cloudy(log[60:100]) == 0
    assert cloudy(log[-20:]) >= 15  # speculation measured again now and then, then the cloud


def test_a_priced_verifier_gets_no_settled_cloud_runs():
    """Free, a cloud run that nothing would re-decide soon is long (a second of the stream); on
    a priced verifier it is only as long as the link's latency asks: the price may move, and a
    settled run would outlast it."""
    def run_lengths(price):
        log = run(adaptive(cloud_generate=True), LTE, PHONE, 60, random.Random(3), price=price)
        return {plan.cloud_generate for plan, _ in log[-10:]}

    free, priced_runs = run_lengths(0.0), run_lengths(0.02)
    assert all(n > 0 for n in free | priced_runs)  # the cloud generates either way ...
    assert max(priced_runs) < min(free)             # ... in shorter runs when priced


def test_a_floor_the_speculation_cannot_meet_keeps_the_cloud():
    """A floor of 30 tok/s (the request's own, over the client's 15): speculating (~16) would
    miss it, so even at price 1 the cloud generates; a floor no option meets (1000) leaves
    speed to decide, the same choice as at price 0."""
    for floor in (30.0, 1000.0):
        policy = adaptive(cloud_generate=True)
        run(policy, LTE, PHONE, 30, random.Random(7))  # measured at price 0: the cloud
        log = run(policy, LTE, PHONE, 40, random.Random(8), price=1.0, floor=floor)
        assert cloudy(log[-20:]) >= 19, floor
        assert totals(log[-20:])[0] >= 30.0


def test_the_pass_cap_stays_a_hard_cap_under_the_price():
    """client.max_passes_per_token = 0.5: priced or not, the passes per token keep under the
    cap (the price only ever asks for fewer)."""
    for price in (0.0, 0.5, 1.0):
        policy = adaptive(cap=0.5, cloud_generate=True)
        log = run(policy, LTE, PHONE, 120, random.Random(11), price=price, floor=10.0)
        assert totals(log[40:])[1] <= 0.5, price


def test_longer_blocks_cost_fewer_passes_per_token():
    """Speculation only (cloud runs off), a fast link, draft and verifier: free, short blocks
    of ~3 are about as fast as any; priced, the controller drafts longer ones: fewer passes
    per token for a little speed."""
    lan, laptop = Link(latency_s=0.002, server_s=0.002), Draft(alpha=0.8, s_per_token=0.001)
    free = run(adaptive(), lan, laptop, 80, random.Random(2))
    dear = run(adaptive(), lan, laptop, 80, random.Random(2), price=1.0)
    k_free = sum(plan.k for plan, _ in free[20:]) / 60
    k_dear = sum(plan.k for plan, _ in dear[20:]) / 60
    assert k_dear > k_free
    assert totals(dear[20:])[1] < 0.9 * totals(free[20:])[1]


def test_the_verifiers_position_cost_sets_how_long_priced_blocks_get():
    """The verifier says what a drafted position costs it (Opened.position_cost): priced, the
    controller drafts longer blocks on one whose positions are free (a GPU: 0) than on one
    whose positions are dear (a loaded CPU core: 0.4), and without a figure it uses its own
    (POSITION_COST), in between."""
    lan, laptop = Link(latency_s=0.002, server_s=0.002), Draft(alpha=0.85, s_per_token=0.001)

    def mean_k(position_cost):
        log = run(adaptive(), lan, laptop, 80, random.Random(2), price=1.0,
                  position_cost=position_cost)
        return sum(plan.k for plan, _ in log[20:]) / 60

    free, unsaid, dear = mean_k(0.0), mean_k(None), mean_k(0.4)
    assert free > unsaid > dear, (free, unsaid, dear)


def test_identical_users_switch_at_different_prices():
    """Twenty controllers measured alike (the same rounds) but each with its own jitter: the
    price at which each leaves cloud runs for speculation differs, so a rising price moves the
    load a few users at a time, not all at once."""
    switch_at = []
    for seed in range(20):
        policy = adaptive(cloud_generate=True)
        policy.pricing = PriceResponse(policy.pricing.min_tokens_per_s, random.Random(seed))
        run(policy, LTE, PHONE, 40, random.Random(1))  # the same rounds for every one
        view = RoundView(round=1, generated=1000, remaining=1000, max_k=32, link_state="up",
                         sampling=False, history=[], max_q_entries=16)
        prices = [i / 100 for i in range(1, 101)]
        first = next(p for p in prices
                     if policy.choose(RoundView(**{**view.__dict__, "price": p}))[1] is None)
        switch_at.append(first)
    assert len(set(switch_at)) >= 5, switch_at
    assert max(switch_at) / min(switch_at) >= (1 + PRICE_JITTER / 2) / (1 - PRICE_JITTER / 2)


def test_identical_speculating_users_draft_alike_whatever_their_jitter():
    """The jitter spreads when users switch between cloud runs and speculation; it does not
    spread how long they draft: controllers measured alike choose the same k at any price
    (different k under load left users at 7-20 tok/s side by side)."""
    # a loaded verifier (250 ms a round): jittered, these users drafted k = 7, 9 or 11 at 0.3
    wifi, laptop = Link(latency_s=0.012, server_s=0.25), Draft(alpha=0.85, s_per_token=0.004)
    view = RoundView(round=1, generated=1000, remaining=1000, max_k=32, link_state="up",
                     sampling=False, history=[], max_q_entries=16)
    for price in (0.3, 0.6, 1.0):
        ks = set()
        for seed in range(12):
            policy = adaptive()
            policy.pricing = PriceResponse(policy.pricing.min_tokens_per_s, random.Random(seed))
            run(policy, wifi, laptop, 40, random.Random(1), price=price)  # the same rounds
            ks.add(policy.choose(RoundView(**{**view.__dict__, "price": price}))[0].k)
        assert len(ks) == 1, (price, ks)


def test_priced_score_and_the_stay_bonus():
    """The score's parts: cost per token in 1-token steps (a cloud run 1, a block of k its
    (1 + POSITION_COST k) / E(k)), the discount at a price, and the running kind's edge."""
    cloud = Option("cloud", 16.0, 0.3, 16.0, n=16)
    spec = Option("speculate", 3.0, 0.2, 1.0, k=4)
    assert pass_cost(cloud) == 1.0 and pass_cost(spec) == pytest.approx((1 + POSITION_COST * 4) / 3)
    rate = lambda o: o.rate  # noqa: E731
    assert priced(rate, 0.0)(cloud) == cloud.rate
    assert priced(rate, 1.0)(spec) > priced(rate, 1.0)(cloud)
    assert priced(rate, 0.0)(spec) < priced(rate, 0.0)(cloud)
    assert staying(rate, "cloud")(cloud) == STAY_BONUS * cloud.rate
    assert staying(rate, "cloud")(spec) == spec.rate
