"""The entropy switch's state machine (edge/control/entropy.py) on synthetic entropy sequences:
thresholds, hysteresis, minimum dwell, the drafter and k it plans, and fast mode's verify flag."""
from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from edge.config import ClientConfig, EntropySwitchConfig
from edge.control.entropy import EntropySwitch
from edge.control.policy import RoundView, make_policy
from edge.record import RoundRecord

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

LADDER = ("draft", "small")


def run(switch: EntropySwitch, rounds: list[list[float]]) -> list[str]:
    return [switch.observe(r) for r in rounds]


def config(**kw) -> EntropySwitchConfig:
    base = dict(window=2, enter_hard=2.0, exit_hard=1.0, min_dwell_rounds=0, start_state="easy")
    base.update(kw)
    return EntropySwitchConfig(**base)


def test_thresholds_switch_both_ways():
    s = EntropySwitch(config(), k=4, ladder=LADDER)
    states = run(s, [[0.5, 0.5], [2.5, 2.5], [2.5, 2.5], [0.2, 0.2]])
    assert states == ["easy", "hard", "hard", "easy"]
    assert s.switches == 2


def test_a_fast_generation_uses_its_own_thresholds():
    """The same entropies: hard for a lossless generation (enter 2.0), easy for a fast one
    (fast_enter_hard 4.0); each generation picks its pair at its first round."""
    s = EntropySwitch(config(fast_enter_hard=4.0, fast_exit_hard=3.0), k=4, ladder=LADDER)
    for fast, expected in ((False, "hard"), (True, "easy"), (False, "hard")):
        s.plan(RoundView(round=0, generated=0, remaining=64, max_k=8, link_state="up",
                         sampling=False, history=[], fast=fast))
        assert s.thresholds == ((4.0, 3.0) if fast else (2.0, 1.0))
        assert run(s, [[3.0, 3.0]]) == [expected]
    with pytest.raises(ValidationError, match="fast_exit_hard"):
        EntropySwitchConfig(fast_enter_hard=1.0, fast_exit_hard=2.0)


def test_hysteresis_band_holds_the_state():
    """Between exit_hard and enter_hard nothing changes, whichever state we are in."""
    s = EntropySwitch(config(), k=4, ladder=LADDER)
    assert run(s, [[1.5, 1.5]] * 3) == ["easy"] * 3          # in the band: stays easy
    assert run(s, [[3.0, 3.0]]) == ["hard"]
    assert run(s, [[1.5, 1.5]] * 3) == ["hard"] * 3          # in the band: stays hard
    assert run(s, [[0.9, 0.9]]) == ["easy"]


def test_oscillating_entropy_inside_the_band_never_flaps():
    s = EntropySwitch(config(window=1), k=4, ladder=LADDER)
    run(s, [[1.1], [1.9]] * 20)
    assert s.switches == 0


def test_minimum_dwell_delays_each_switch():
    s = EntropySwitch(config(window=1, min_dwell_rounds=3), k=4, ladder=LADDER)
    # Hard from the first round, but the switch waits until three rounds were spent easy.
    assert run(s, [[5.0]] * 3) == ["easy", "easy", "hard"]
    # Easy right after the switch, again held for the dwell.
    assert run(s, [[0.0]] * 4) == ["hard", "hard", "easy", "easy"]


def test_rolling_window_averages_recent_positions_only():
    s = EntropySwitch(config(window=4), k=4, ladder=LADDER)
    run(s, [[3.0, 3.0, 3.0, 3.0]])
    assert s.state == "hard" and s.rolling == pytest.approx(3.0)
    # Two low positions pull the mean of the last four to 1.5: inside the band, still hard.
    assert run(s, [[0.0, 0.0]]) == ["hard"] and s.rolling == pytest.approx(1.5)
    # Two more: the old high values left the window.
    assert run(s, [[0.0, 0.0]]) == ["easy"] and s.rolling == pytest.approx(0.0)


def test_no_entropy_seen_keeps_the_start_state():
    s = EntropySwitch(config(start_state="hard"), k=4, ladder=LADDER)
    assert run(s, [[], [], [math.nan]]) == ["hard"] * 3
    assert s.rolling is None


def test_config_rejects_inverted_thresholds():
    with pytest.raises(ValidationError):
        EntropySwitchConfig(enter_hard=1.0, exit_hard=2.0)


def test_unknown_drafter_is_refused():
    with pytest.raises(ValueError, match="not in the ladder"):
        EntropySwitch(config(hard_drafter="huge"), k=4, ladder=LADDER)


def view(round_: int = 1, max_k: int = 16, drafters: tuple[str, ...] = LADDER) -> RoundView:
    return RoundView(round=round_, generated=0, remaining=100, max_k=max_k, link_state="up",
                     sampling=False, history=(), drafters=drafters)


def test_plan_picks_drafter_caps_k_and_marks_easy_blocks_skippable():
    s = EntropySwitch(config(hard_max_k=2), k=6)
    easy = s.plan(view())
    assert (easy.drafter, easy.k, easy.verify) == ("draft", 6, False)
    s.observe([5.0, 5.0])
    hard = s.plan(view())
    assert (hard.drafter, hard.k, hard.verify) == ("small", 2, True)
    assert s.plan(view(max_k=1)).k == 1                       # the loop's caps still bind


def test_a_new_generation_restarts_the_state_machine():
    s = EntropySwitch(config(start_state="hard"), k=4)
    s.observe([0.0, 0.0])
    assert s.state == "easy"
    assert s.plan(view(round_=0)).drafter == "small" and s.state == "hard"


def test_registered_by_name_and_built_from_the_client_config():
    client = ClientConfig(policy="entropy", draft_length=5,
                          entropy=EntropySwitchConfig(hard_drafter="small"))
    policy = make_policy("entropy", client)
    assert isinstance(policy, EntropySwitch) and policy.k == 5
    assert policy.plan(view(round_=0)).drafter == "small"


def drive(switch: EntropySwitch, rounds: int, entropy: float, s_per_token: dict[str, float],
          committed: dict[str, int], rtt_s: float) -> list[str]:
    """Plan and feed `rounds` rounds whose speed depends on the rung: k draft tokens at the
    rung's seconds per token plus one round trip, committing the rung's tokens per round."""
    chosen = []
    for i in range(rounds):
        plan = switch.plan(RoundView(round=i, generated=0, remaining=10_000, max_k=8,
                                     link_state="up", sampling=False, history=[],
                                     drafters=LADDER))
        chosen.append(plan.drafter)
        switch.update(RoundRecord(index=i, k_asked=plan.k, drafted=plan.k, accepted=0,
                                  mode="verify", verified=True, drafter=plan.drafter,
                                  committed=committed[plan.drafter],
                                  draft_s=s_per_token[plan.drafter] * plan.k, rtt_s=rtt_s,
                                  entropies=[entropy] * plan.k))
    return chosen


def test_each_state_keeps_the_rung_measured_fastest_and_keeps_trying_the_others():
    """A phone-speed device on a short link: the strong rung commits more per round but drafts
    2.5x slower, so even hard text goes to the cheap rung after the first measurements; a fast
    device on a long link keeps the strong rung even in easy text. Every 8th round of a state
    tries another rung, so a change of conditions is noticed."""
    slow_short = EntropySwitch(config(explore_every=8, start_state="hard"), k=4, ladder=LADDER)
    hard = drive(slow_short, 64, 5.0, {"draft": 0.025, "small": 0.0625},
                 {"draft": 3, "small": 4}, rtt_s=0.02)
    assert hard[0] == "small"                       # the fixed rule until measured
    later = hard[16:]
    assert later.count("draft") >= 0.8 * len(later)
    assert "small" in later                          # still tried now and then
    fast_long = EntropySwitch(config(explore_every=8), k=4, ladder=LADDER)
    easy = drive(fast_long, 64, 0.1, {"draft": 0.001, "small": 0.0025},
                 {"draft": 3, "small": 4}, rtt_s=0.1)
    assert easy[0] == "draft"
    assert easy[16:].count("small") >= 0.8 * len(easy[16:])


def test_fixed_rungs_without_measuring():
    switch = EntropySwitch(config(explore_every=0, start_state="hard"), k=4, ladder=LADDER)
    assert set(drive(switch, 20, 5.0, {"draft": 0.025, "small": 0.0625},
                     {"draft": 3, "small": 4}, rtt_s=0.02)) == {"small"}
