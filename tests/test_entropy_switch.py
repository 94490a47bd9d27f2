"""The entropy switch's state machine (edge/control/entropy.py) on synthetic entropy sequences:
thresholds, hysteresis, minimum dwell, the drafter and k it plans, and fast mode's verify flag."""
from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from edge.config import ClientConfig, EntropySwitchConfig
from edge.control.entropy import EntropySwitch
from edge.control.policy import RoundView, make_policy

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
