"""What a drafted position costs the verifier (cloud/pass_cost.py): c measured once on the
runtime, over a 1-token session's share of the live passes. Synthetic passes here (the rule's
own logic); tests/cloud/test_price.py measures it on the real verifier and reads it at the edge."""
from __future__ import annotations

import random

import pytest

from cloud.batcher import ForwardResult
from cloud.pass_cost import MIN_PASSES, PassCosts

pytestmark = pytest.mark.unit


def _passes(costs: PassCosts, a: float, b: float, c: float, n: int, *, sessions: int,
            k_max: int = 8, seed: int = 0) -> None:
    """n passes of `sessions` sessions, each feeding 1..k_max + 1 positions, timed as
    a + b * sessions + c * positions ms."""
    rng = random.Random(seed)
    for _ in range(n):
        positions = sum(rng.randint(1, k_max + 1) for _ in range(sessions))
        costs.observe(sessions, positions, a + b * sessions + c * positions)


def test_a_position_costs_c_over_a_sessions_share_of_the_pass():
    """Passes of 32 sessions (a 5 ms fixed part, 0.35 ms a session, 0.17 ms a position): a
    1-token session's share of such a pass is 5 / 32 + 0.35 + 0.17 ms, of which a drafted
    position adds 0.17."""
    costs = PassCosts(position_ms=0.17)
    _passes(costs, 5.0, 0.35, 0.17, 200, sessions=32)
    assert costs.step_ms() == pytest.approx(5.0 / 32 + 0.52, rel=1e-6)
    assert costs.position_cost() == pytest.approx(0.17 / (5.0 / 32 + 0.52), rel=1e-6)


def test_a_position_is_dearer_when_the_passes_fill_up():
    """The same hardware: with 4 sessions a pass the fixed part dominates each one's share and a
    position is cheap; with 64 it is shared thin and a position weighs more."""
    idle, loaded = PassCosts(position_ms=0.17), PassCosts(position_ms=0.17)
    _passes(idle, 5.0, 0.35, 0.17, 200, sessions=4)
    _passes(loaded, 5.0, 0.35, 0.17, 200, sessions=64)
    assert idle.position_cost() < 0.15 < loaded.position_cost() < 0.35


def test_free_positions_read_as_zero():
    """A GPU far from its limits measured c = 0: a drafted position costs nothing."""
    costs = PassCosts(position_ms=0.0)
    _passes(costs, 8.0, 0.05, 0.0, 50, sessions=16)
    assert costs.position_cost() == 0.0


def test_unknown_until_measured():
    """No c (a backend that does not measure it) or too few passes: None, so the edge keeps its
    own estimate; passes without a position count (vLLM's results) add nothing."""
    assert PassCosts(position_ms=None).position_cost() is None
    unmeasured = PassCosts(position_ms=None)
    _passes(unmeasured, 5.0, 0.35, 0.17, 100, sessions=8)
    assert unmeasured.position_cost() is None
    few = PassCosts(position_ms=0.17)
    _passes(few, 5.0, 0.35, 0.17, int(MIN_PASSES) - 1, sessions=8)
    assert few.position_cost() is None
    vllm = PassCosts(position_ms=0.17)
    for _ in range(50):
        vllm.observe_job(ForwardResult(logits=None, queue_ms=0.0, forward_ms=3.0, batch_size=4))
    assert vllm.position_cost() is None


def test_it_follows_the_load():
    """Forgetting: from passes of 4 sessions to passes of 64, the figure moves to the loaded
    one's within a few half-lives."""
    costs = PassCosts(position_ms=0.17, half_life_passes=50)
    loaded = PassCosts(position_ms=0.17)
    _passes(costs, 5.0, 0.35, 0.17, 300, sessions=4)
    _passes(costs, 5.0, 0.35, 0.17, 500, sessions=64, seed=1)
    _passes(loaded, 5.0, 0.35, 0.17, 500, sessions=64, seed=1)
    assert costs.position_cost() == pytest.approx(loaded.position_cost(), rel=0.02)


def test_a_pass_seen_by_each_of_its_jobs_counts_once():
    """observe_job weighs each job's view of its pass by 1 / batch_size: passes seen through
    their jobs give what the passes themselves give."""
    by_pass, by_job = PassCosts(position_ms=0.17), PassCosts(position_ms=0.17)
    rng = random.Random(3)
    for _ in range(300):
        sessions = rng.randint(2, 32)
        positions = sum(rng.randint(1, 6) for _ in range(sessions))
        ms = 5.0 + 0.35 * sessions + 0.17 * positions
        by_pass.observe(sessions, positions, ms)
        for _ in range(sessions):
            by_job.observe_job(ForwardResult(logits=None, queue_ms=0.0, forward_ms=ms - 1.0,
                                             batch_size=sessions, verify_ms=1.0,
                                             positions=positions))
    assert by_job.position_cost() == pytest.approx(by_pass.position_cost(), rel=0.02)
