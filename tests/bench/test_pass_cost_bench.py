"""tandem pass-cost's parts (bench/passcost/): the named shapes are the published architectures,
and the timer runs real passes of the shipped target through TargetRuntime.forward, every
session back where it started after each point."""
from __future__ import annotations

import pytest

from bench.passcost.measure import Grid, PassTimer, pool_bytes
from bench.passcost.shapes import parameter_count, shape_config
from tandem.config import REPO_ROOT

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name, billions", [("llama-1b", 1.24), ("llama-8b", 8.03),
                                             ("qwen-7b", 7.62)])
def test_the_shapes_have_their_published_sizes(name, billions):
    assert parameter_count(shape_config(name)) / 1e9 == pytest.approx(billions, abs=0.01)


def test_the_pool_rounds_sessions_and_positions_up_to_powers_of_two():
    assert pool_bytes(3, 100, 10) == 4 * 256 * 10
    assert pool_bytes(65, 1024, 10) == 128 * 1024 * 10


def test_the_timer_times_every_point_through_the_real_path():
    from cloud.runtime.target import TargetRuntime

    runtime = TargetRuntime(REPO_ROOT / "models/tandem-target", device="cpu")
    timer = PassTimer(runtime, kv_room=pool_bytes(4, 32, runtime.bytes_per_token))
    points = timer.surface(Grid(batches=[1, 2, 8], tokens=[1, 3], contexts=[24, 4096], reps=2))
    assert sorted((p.batch, p.tokens) for p in points) == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert all(p.context == 24 and p.reps == 2 and 0 < p.ms_min <= p.ms <= p.ms_max
               for p in points)
    # B = 8 would not fit the memory given; 4096 positions exceed the target's 1024
    assert any("B=8" in s for s in timer.skipped) and any("4096" in s for s in timer.skipped)
    state = runtime.new_state()  # the sessions went back to the pool
    runtime.forward([(state, [1, 2, 3])])
    assert state.length == 3
