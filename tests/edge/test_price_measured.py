"""The priced controller choosing between speculation and cloud runs by what the verifier
measured a committed token costs it in each mode (RoundView.token_ms: Verdict's
speculate_token_ms and cloud_token_ms, cloud/token_cost.py; edge/control/pricing.py), on the
synthetic links and drafts of tests/edge/test_price_control.py.

The figures are the docs' (docs/capacity.md, 64 users): on lte/phone a speculated token cost
the verifier 1.45 ms against 1.15 for a cloud-run token, on wifi/laptop 0.88 against 1.04."""
from __future__ import annotations

import random

import pytest
from test_control import Draft, Link, adaptive
from test_price_control import LTE, PHONE, cloudy, run, totals

from edge.control.options import LOADED_MAX_K, LOADED_PRICE, Option
from edge.control.pricing import MEASURED_SAVING, measured, measured_ratio

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

PHONE_DEARER = (1.45, 1.15)     # lte/phone: speculation measured dearer per committed token
LAPTOP_CHEAPER = (0.88, 1.04)   # wifi/laptop: cheaper
WIFI, LAPTOP = Link(latency_s=0.012, server_s=0.015), Draft(alpha=0.85, s_per_token=0.004)


def plans(link, draft, price, token_ms, seed=3, rounds=80, floor=None):
    log = run(adaptive(cloud_generate=True), link, draft, rounds, random.Random(seed),
              price=price, floor=floor, token_ms=token_ms)
    return [plan for plan, _ in log], log


@pytest.mark.parametrize("token_ms", [PHONE_DEARER, LAPTOP_CHEAPER, (None, 1.0)])
def test_at_price_zero_the_measured_costs_change_nothing(token_ms):
    """Free passes: plan for plan what the controller does without the figures, on either
    link (the phone lets the cloud generate, the laptop speculates)."""
    for link, draft in ((LTE, PHONE), (WIFI, LAPTOP)):
        assert plans(link, draft, 0.0, token_ms)[0] == plans(link, draft, 0.0, (None, None))[0]


def test_speculation_measured_dearer_leaves_it_to_the_cloud():
    """Price 1, a floor of 10 tok/s that cloud runs keep: by the position-cost model the phone
    speculates (tests/edge/test_price_control.py), but the verifier measures its speculated tokens
    dearer than cloud-run ones, so the cloud generates (speculation only as the controller
    measures it again now and then)."""
    _, modelled = plans(LTE, PHONE, 1.0, (None, None), floor=10.0)
    _, by_measure = plans(LTE, PHONE, 1.0, PHONE_DEARER, floor=10.0)
    assert cloudy(modelled[20:]) == 0
    assert cloudy(by_measure[20:]) >= 0.6 * 60, cloudy(by_measure[20:])
    assert totals(by_measure[20:])[0] > totals(modelled[20:])[0]  # and the user is faster


def test_a_saturated_verifier_gets_whole_cloud_runs():
    """From LOADED_PRICE on, a cloud run takes the rest of the response (the session stays in
    the verifier's lockstep batch: 2 s runs, three a response at 96 phone users, cost
    1.06-1.12x cloud-only's CPU a token); below it, as long as the link's latency asks.
    Speculation measured a little cheaper (not the dearer rule), but the cloud runs several
    times faster."""
    def run_lengths(price):
        _, log = plans(LTE, PHONE, price, (0.94, 1.0), floor=10.0)
        return [plan.cloud_generate for plan, _ in log[20:] if plan.cloud_generate]

    loaded, light = run_lengths(LOADED_PRICE), run_lengths(LOADED_PRICE / 2)
    assert loaded and light
    assert set(loaded) == {10_000}                      # the rest (the loop's fixed remaining)
    assert max(light) < 10_000 / 10


def test_speculation_measured_cheaper_keeps_speculating():
    """The same phone where the verifier measures speculation cheaper: at price 1 it
    speculates, as by the model."""
    _, log = plans(LTE, PHONE, 1.0, (0.8, 1.15), floor=10.0)
    assert cloudy(log[20:]) == 0


def test_a_saving_within_the_figures_noise_leaves_it_to_the_cloud():
    """A laptop, whose speculation is faster than cloud runs: measured cheaper by less than
    MEASURED_SAVING (a 0.975 ratio, within the figures' run-to-run noise) speculation is a tie,
    and at a tie the cloud generates; measured clearly cheaper (0.9) it speculates."""
    tie = (0.78, 0.80)
    assert measured_ratio(tie) > 1.0 - MEASURED_SAVING
    _, log = plans(WIFI, LAPTOP, 1.0, tie, floor=10.0)
    assert cloudy(log[20:]) >= 0.6 * 60, cloudy(log[20:])
    _, log = plans(WIFI, LAPTOP, 1.0, (0.9 * 0.80, 0.80), floor=10.0)
    assert cloudy(log[20:]) == 0, cloudy(log[20:])


def test_the_floor_keeps_speculation_the_cloud_cannot_meet():
    """A loaded verifier (150 ms a pass: cloud runs ~6 tok/s) and a laptop whose speculation
    keeps a floor of 10: even measured dearer, speculation, since the cloud would make the user
    slower than the floor."""
    slow = Link(latency_s=0.012, server_s=0.15)
    _, log = plans(slow, LAPTOP, 1.0, (2.0, 1.0), floor=10.0)
    assert cloudy(log[20:]) == 0
    assert totals(log[20:])[0] >= 10.0


def test_dearer_only_a_clear_gain_leaves_a_cloud_below_the_floor():
    """A saturated verifier (120 ms a pass, cloud runs ~8 tok/s) and a floor of 10 tok/s that
    nothing keeps: measured dearer, a phone whose speculation the model expects about as fast
    lets the cloud generate (FLOOR_GAIN: under load the model flatters its rounds); a laptop
    whose speculation reads cheaper and keeps the floor speculates."""
    saturated = Link(latency_s=0.07, server_s=0.12)
    _, phone = plans(saturated, PHONE, 1.0, PHONE_DEARER, floor=10.0)
    assert cloudy(phone[20:]) >= 0.6 * 60, cloudy(phone[20:])
    _, laptop = plans(saturated, LAPTOP, 1.0, (0.8, 1.0), floor=10.0)
    assert cloudy(laptop[20:]) == 0, cloudy(laptop[20:])
    assert totals(laptop[20:])[0] >= 10.0


def test_one_mode_unmeasured_leaves_the_position_cost_model():
    """Until the verifier has measured both modes the position-cost model decides: plan for
    plan the same as with no figure."""
    for token_ms in ((1.45, None), (None, 1.15)):
        assert plans(LTE, PHONE, 1.0, token_ms, floor=10.0)[0] == \
            plans(LTE, PHONE, 1.0, (None, None), floor=10.0)[0]


def test_the_measured_cost_of_each_option():
    """A cloud run costs 1 cloud-run token a token, a drafted block the measured ratio, a k = 0
    round (no draft) 1."""
    assert measured_ratio((1.45, 1.16)) == pytest.approx(1.25)
    assert measured_ratio((None, 1.0)) is None and measured_ratio((1.0, None)) is None
    cost = measured(1.25)
    assert cost(Option("cloud", 16.0, 0.3, 16.0, n=16)) == 1.0
    assert cost(Option("speculate", 3.0, 0.2, 1.0, k=4)) == 1.25
    assert cost(Option("speculate", 1.0, 0.02, 1.0, k=0)) == 1.0  # a 1-token step, as a cloud's


def test_new_prompts_are_measured_again_only_once_the_figure_is_stale():
    """A new prompt's text is measured with speculative blocks every time, but while the
    verifier measures speculation dearer under a price, or is saturated (LOADED_PRICE), only
    once the speculate figure has stood still for STALE_FIGURE_S (a prompt every second here,
    the figure frozen: at 10, 20 and 30 s, each controller at most once a period); a figure
    that keeps moving (someone speculates) is never stale."""
    from edge.control.policy import RoundView
    from edge.control.pricing import STALE_FIGURE_S, PriceResponse

    def measured_prompts(price, token_ms, prompts=40, moving=False):
        clock = FakeClock()
        pricing = PriceResponse(10.0, random.Random(0), clock=clock)
        count = 0
        for i in range(prompts):
            figures = (token_ms[0] + 0.001 * i, token_ms[1]) if moving else token_ms
            view = RoundView(round=0, generated=0, remaining=48, max_k=16, link_state="up",
                             sampling=False, history=[], price=price, token_ms=figures)
            count += pricing.measures_new_text(view)
            clock.t += 1.0
        return count

    assert STALE_FIGURE_S == 10.0
    assert measured_prompts(1.0, PHONE_DEARER) == 3
    assert measured_prompts(1.0, PHONE_DEARER, moving=True) == 0
    assert measured_prompts(0.0, PHONE_DEARER) == 40
    assert measured_prompts(1.0, LAPTOP_CHEAPER) == 3  # saturated: as stale as dearer
    assert measured_prompts(LOADED_PRICE / 2, LAPTOP_CHEAPER) == 40
    assert measured_prompts(LOADED_PRICE / 2, (None, None)) == 40


def test_measured_dearer_under_load_the_cloud_takes_the_rest_of_the_response():
    """Under a price (any: also below LOADED_PRICE) with speculation measured dearer, a cloud
    run is the whole rest of the response (no gap between runs to leave the verifier's
    lockstep batch); measured cheaper below LOADED_PRICE, as long as the link asks."""
    from edge.control.policy import RoundView

    policy = adaptive(cloud_generate=True)
    run(policy, LTE, PHONE, 30, random.Random(1), price=1.0, floor=10.0,
        token_ms=PHONE_DEARER)  # the link and the cloud's pace measured
    view = RoundView(round=5, generated=100, remaining=700, max_k=32, link_state="up",
                     sampling=False, history=[], price=1.0, min_tokens_per_s=10.0,
                     token_ms=PHONE_DEARER)
    assert policy.plan(view).cloud_generate == 700
    light = RoundView(**{**view.__dict__, "price": LOADED_PRICE / 4})
    assert policy.cloud_option(light).n == 700
    cheaper = RoundView(**{**light.__dict__, "token_ms": (0.5, 1.15)})
    assert policy.cloud_option(cheaper).n < 700


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_below_every_floor_a_cheaper_speculation_yields_only_to_a_clearly_faster_cloud():
    """A saturated verifier far away (100 ms, 50 ms a pass: cloud runs ~20 tok/s) and a floor
    of 40 tok/s that nothing keeps, speculation measured cheaper: a laptop whose blocks run at
    ~15 tok/s keeps speculating (the cloud's pace on a saturated verifier flatters it, and each
    of its tokens is a pass the others wait for: FLOOR_GAIN), one whose blocks run at ~6 tok/s
    lets the cloud generate."""
    far = Link(latency_s=0.1, server_s=0.05)
    _, good = plans(far, Draft(alpha=0.8, s_per_token=0.004), 1.0, LAPTOP_CHEAPER, floor=40.0)
    assert cloudy(good[20:]) == 0, cloudy(good[20:])
    _, poor = plans(far, Draft(alpha=0.3, s_per_token=0.004), 1.0, LAPTOP_CHEAPER, floor=40.0)
    assert cloudy(poor[20:]) >= 0.6 * 60, cloudy(poor[20:])


def test_dearer_the_gain_is_asked_of_a_switch_to_speculation_not_of_staying():
    """A saturated verifier (120 ms a pass: cloud runs ~8 tok/s), a floor of 20 tok/s that
    nothing keeps, speculation measured dearer, and a hard prompt whose blocks run at ~12
    tok/s (faster than the cloud, not FLOOR_GAIN faster). A laptop that was speculating (its
    figure read cheaper) keeps speculating: its own rounds on this text. The same laptop that
    went to cloud runs (dearer, at a floor of 5 that the cloud kept) stays in the cloud: the
    gain is asked of a switch to speculation (under load the model flatters a phone's
    rounds)."""
    saturated, hard = Link(latency_s=0.012, server_s=0.12), Draft(alpha=0.5, s_per_token=0.004)

    def then_dearer_below_the_floor(token_ms, floor):
        policy = adaptive(cloud_generate=True)
        run(policy, saturated, hard, 10, random.Random(4), price=1.0, floor=20.0,
            token_ms=(0.8, 1.0))  # the draft and the link measured, speculating
        before = run(policy, saturated, hard, 20, random.Random(5), price=1.0, floor=floor,
                     token_ms=token_ms)
        after = run(policy, saturated, hard, 40, random.Random(6), price=1.0, floor=20.0,
                    token_ms=PHONE_DEARER)
        return cloudy(before[1:]), cloudy(after), after

    spec_before, spec_after, log = then_dearer_below_the_floor((0.8, 1.0), 20.0)
    assert (spec_before, spec_after) == (0, 0)
    assert 8.4 < totals(log)[0] < 20.0  # faster than the cloud, below the floor
    cloud_before, cloud_after, _ = then_dearer_below_the_floor(PHONE_DEARER, 5.0)
    assert cloud_before >= 0.9 * 19 and cloud_after >= 0.9 * 40, (cloud_before, cloud_after)


def test_a_saturated_verifier_gets_no_block_over_loaded_max_k():
    """From LOADED_PRICE no block (dithered ones included) is longer than LOADED_MAX_K: a
    saturated verifier's pass is every session's wait. Below it the laptop on an easy text
    drafts longer blocks, as the position cost asks."""
    easy = Draft(alpha=0.95, s_per_token=0.004)
    loaded, _ = plans(WIFI, easy, LOADED_PRICE, LAPTOP_CHEAPER, floor=10.0)
    light, _ = plans(WIFI, easy, LOADED_PRICE / 2, LAPTOP_CHEAPER, floor=10.0)
    assert max(plan.k for plan in loaded) == LOADED_MAX_K
    assert max(plan.k for plan in light[20:]) > LOADED_MAX_K
