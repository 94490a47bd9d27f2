"""What a committed token costs the verifier per mode (cloud/token_cost.py): each pass's time
shared among its jobs, summed per mode over the tokens they committed, verifier-wide and per
session. Synthetic passes here (the rule's own logic); tests/cloud/test_token_cost_verifier.py reads
the figures off a real verifier, over gRPC and at the edge."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bench.capacity.servers import TokenTotals
from bench.capacity.stats import TokenCostReading
from cloud.batcher import ForwardResult
from cloud.token_cost import (CLOUD, MIN_TOKENS, SESSION_WINDOW_TOKENS, SPECULATE,
                              VERIFIER_WINDOW_TOKENS, WINDOW_BINS, PassFit, PassModel,
                              TokenCosts, job_share_ms, pass_parts, said)

pytestmark = pytest.mark.unit


def _result(sessions: int, positions: int, forward_ms: float, verify_ms: float = 0.0,
            ones: int = 0, weights: list[float] | None = None, weight: float = 1.0):
    return ForwardResult(logits=None, queue_ms=0.0, forward_ms=forward_ms,
                         batch_size=sessions, verify_ms=verify_ms, positions=positions,
                         ones=ones, weight=weight, weights=sum(weights or []))


def _shares(result: ForwardResult, jobs: list[tuple[int, float]], model: PassModel) -> list[float]:
    """Each job's share: jobs = (positions fed, weight)."""
    return [job_share_ms(replace(result, weight=w), p, model) for p, w in jobs]


C = PassModel(position_ms=0.25, step_ms=1.0)


def test_a_pass_is_shared_by_each_jobs_part_as_the_probe_priced_it():
    """A pass of 4 drafted blocks (positions 2, 2, 5, 9) of 10 ms, priced at a step of 1 ms
    and 0.25 ms a position beyond a job's first: parts 1.25, 1.25, 2, 3 (7.5 ms); the pass
    is shared in those proportions, and the shares add up to it."""
    result = _result(4, 18, 9.0, verify_ms=1.0)
    shares = _shares(result, [(2, 1), (2, 1), (5, 1), (9, 1)], C)
    assert shares == pytest.approx([10 * 1.25 / 7.5, 10 * 1.25 / 7.5, 10 * 2 / 7.5, 10 * 3 / 7.5])
    assert sum(shares) == pytest.approx(10.0)


def test_the_passs_fixed_part_is_carried_by_the_passes_a_session_was_open_through():
    """The same pass with a fixed part F = 4 ms, whose jobs come 1, 1, 6 and 2 passes after
    their sessions' previous ones (weights 10 in all): F is carried 0.4 ms a pass of each and
    the rest, 6 ms, by the parts. The round back after 6 passes (drafting, the round trip)
    pays F's part of each: its session kept its place among the passes' fixed costs."""
    jobs = [(2, 1.0), (2, 1.0), (5, 6.0), (9, 2.0)]
    result = _result(4, 18, 9.0, verify_ms=1.0, weights=[w for _, w in jobs])
    model = replace(C, fixed_ms=4.0)
    shares = _shares(result, jobs, model)
    parts = [1.25, 1.25, 2.0, 3.0]
    assert shares == pytest.approx([0.4 * w + 6 * p / 7.5 for (_, w), p in zip(jobs, parts)])
    assert sum(shares) == pytest.approx(10.0)
    unweighed = _result(4, 18, 9.0, verify_ms=1.0)  # weights not counted: F equally
    assert job_share_ms(unweighed, 2, model) == pytest.approx(1.0 + 6 * 1.25 / 7.5)


def test_blocks_beside_one_token_rows_pay_their_own_layouts_cost():
    """20 one-token rows and 2 blocks of 5 positions in a 30 ms pass, F = 6 ms, a step 1 ms,
    the blocks' layout Fb = 2 ms and cb = 0.2 ms a position beyond a job's first: a row's part
    is 1, a block's 2 / 2 + 1 + 4 x 0.2 = 2.8 (25.6 in all), and the 24 ms beyond F are shared
    so. Priced as if every job were a row with extra positions, the rows would pay the
    blocks' layout."""
    jobs = [(1, 1.0)] * 20 + [(5, 5.0), (5, 5.0)]
    result = _result(22, 30, 30.0, ones=20, weights=[w for _, w in jobs])
    model = PassModel(position_ms=0.2, fixed_ms=6.0, block_fixed_ms=2.0, block_position_ms=0.2,
                      step_ms=1.0)
    shares = _shares(result, jobs, model)
    assert shares[0] == pytest.approx(6.0 / 30 + 24 * 1 / 25.6)
    assert shares[-1] == pytest.approx(6.0 * 5 / 30 + 24 * 2.8 / 25.6)
    assert sum(shares) == pytest.approx(30.0)
    flat = _shares(result, jobs, replace(model, block_fixed_ms=None))
    assert flat[0] > shares[0] and flat[-1] < shares[-1]
    assert sum(flat) == pytest.approx(30.0)


def test_the_live_passes_fit_what_the_probe_could_not_see():
    """Passes whose blocks cost 3x what the probe's parts say (a context the probe did not
    run at) and rows as it says, F 5 ms: PassFit finds (F, a, b) = (5, 1, 3), and with it
    each block pays three times its probe part while a row pays its own."""
    model = PassModel(position_ms=0.2, fixed_ms=4.0, block_fixed_ms=1.0, block_position_ms=0.1,
                      step_ms=0.5)
    fit = PassFit(model)
    rng = random.Random(7)
    for _ in range(3000):
        ones, blocks = rng.randint(10, 60), rng.randint(0, 6)
        positions = ones + 6 * blocks
        result = _result(ones + blocks, positions, 0.0, ones=ones)
        rows, drafted = pass_parts(result, model)
        total = 5.0 + rows + 3.0 * drafted
        for _ in range(ones + blocks):
            fit.observe_job(replace(result, forward_ms=total), total)
    fixed, a, b = fit.coefficients()
    assert (fixed, a, b) == (pytest.approx(5.0, abs=0.3), pytest.approx(1.0, abs=0.05),
                             pytest.approx(3.0, abs=0.1))
    result = _result(42, 40 + 12, 0.0, ones=40, weights=[1.0] * 42)
    total = 5.0 + pass_parts(result, model)[0] + 3.0 * pass_parts(result, model)[1]
    result = replace(result, forward_ms=total)
    row = job_share_ms(result, 1, model, fit=fit.coefficients())
    block = job_share_ms(result, 6, model, fit=fit.coefficients())
    assert row == pytest.approx(5.0 / 42 + 0.5, rel=0.05)
    assert block == pytest.approx(5.0 / 42 + 3 * (1.0 / 2 + 0.5 + 5 * 0.1), rel=0.05)


def test_without_a_step_the_pass_is_split_equally():
    """vLLM and the exact path (no step measured, or positions not counted): each job pays
    T / S."""
    assert job_share_ms(_result(4, 0, 8.0), 5, PassModel()) == pytest.approx(2.0)
    assert job_share_ms(_result(4, 16, 8.0), 5, PassModel(position_ms=0.3)) == pytest.approx(2.0)
    assert job_share_ms(_result(4, 0, 8.0), 5, C) == pytest.approx(2.0)


def test_on_one_cpu_thread_a_pass_costs_its_cpu_time():
    """Where the target runs on the pass's own thread its CPU time is the pass's cost (a core
    shared with other work stretches the wall time, not that); elsewhere the wall time."""
    result = ForwardResult(logits=None, queue_ms=0.0, forward_ms=18.0, batch_size=4,
                           verify_ms=2.0, positions=4, cpu_ms=8.0, ones=4)
    assert job_share_ms(result, 1, C, cpu_clock=True) == pytest.approx(2.0)
    assert job_share_ms(result, 1, C) == pytest.approx(5.0)
    unmeasured = replace(result, cpu_ms=None)
    assert job_share_ms(unmeasured, 1, C, cpu_clock=True) == pytest.approx(5.0)


def test_a_modes_cost_per_committed_token():
    """Rounds that commit 4 tokens for a 2 ms share and cloud-run steps that commit 1 for a
    0.9 ms share: 0.5 and 0.9 ms a token; no figure before MIN_TOKENS of a mode; the totals
    keep everything (a benchmark's window reads their differences)."""
    costs = TokenCosts()
    costs.observe(SPECULATE, 2.0, 4)
    assert costs.per_token_ms(SPECULATE) is None and costs.per_token_ms(CLOUD) is None
    for _ in range(int(MIN_TOKENS) + 1):
        costs.observe(SPECULATE, 2.0, 4)
        costs.observe(CLOUD, 0.9, 1)
    assert costs.per_token_ms(SPECULATE) == pytest.approx(0.5)
    assert costs.per_token_ms(CLOUD) == pytest.approx(0.9)
    assert costs.totals(SPECULATE) == pytest.approx((2.0 * (MIN_TOKENS + 2), 4 * (MIN_TOKENS + 2)))


def test_the_figures_follow_a_change_and_keep_a_mode_not_run():
    """Speculation's cost rises from 0.5 to 1.5 ms a token: a window of tokens later the figure
    reads the new cost; the cloud's figure, not run meanwhile, keeps its last value."""
    costs = TokenCosts(window_tokens=200)
    rng = random.Random(0)
    for _ in range(200):
        costs.observe(SPECULATE, 0.5 * (n := rng.randint(1, 5)), n)
        costs.observe(CLOUD, 1.0, 1)
    for _ in range(100):  # ~300 tokens: the window and its open bin
        costs.observe(SPECULATE, 1.5 * (n := rng.randint(1, 5)), n)
    assert costs.per_token_ms(SPECULATE) == pytest.approx(1.5)
    assert costs.per_token_ms(CLOUD) == pytest.approx(1.0)


def test_a_quiet_hours_figure_is_gone_a_window_after_the_load_came():
    """One lone session's cloud-run tokens cost a whole pass each (8 ms); then 32 sessions
    share each pass (1 ms a token). A window of the verifier's tokens later the cloud figure
    reads 1 ms: with a half-life of as many tokens it still read 4.2 ms, and speculation at
    1.2 ms a token looked cheaper than the cloud (measured: 19 s of a 32-user point)."""
    costs = TokenCosts()
    for _ in range(20_000):
        costs.observe(CLOUD, 8.0, 1)
    for _ in range(VERIFIER_WINDOW_TOKENS + VERIFIER_WINDOW_TOKENS // WINDOW_BINS):
        costs.observe(CLOUD, 1.0, 1)
    assert costs.per_token_ms(CLOUD) == pytest.approx(1.0)


def test_a_session_says_its_own_figure_where_it_has_one():
    """A reply carries the session's figure of a mode once it has one, the verifier's where it
    has not, and leaves out a mode nobody measured."""
    verifier, session = TokenCosts(), TokenCosts(SESSION_WINDOW_TOKENS)
    assert said(session, verifier) == {}
    for _ in range(2 * int(MIN_TOKENS)):
        verifier.observe(SPECULATE, 1.0, 1)
        verifier.observe(CLOUD, 2.0, 1)
        session.observe(SPECULATE, 3.0, 1)
    assert said(session, verifier) == pytest.approx({"speculate_token_ms": 3.0,
                                                     "cloud_token_ms": 2.0})
    assert said(verifier) == pytest.approx({"speculate_token_ms": 1.0, "cloud_token_ms": 2.0})


def test_a_benchmark_window_reads_the_totals_differences():
    """tandem capacity: two readings of Info.batches' totals give each mode's cost per token in
    the window, both modes together, and the share of the tokens speculated."""
    a = TokenTotals(speculate_ms=100.0, speculate_tokens=100, cloud_ms=50.0, cloud_tokens=40)
    b = TokenTotals(speculate_ms=160.0, speculate_tokens=200, cloud_ms=150.0, cloud_tokens=140)
    reading = TokenCostReading.between(a, b)
    assert reading.speculate == pytest.approx(0.6) and reading.cloud == pytest.approx(1.0)
    assert reading.both == pytest.approx(0.8) and reading.speculate_share == pytest.approx(0.5)
    assert TokenCostReading.between(None, b) == TokenCostReading()
    only_cloud = TokenCostReading.between(a, TokenTotals(100.0, 100, 90.0, 80))
    assert only_cloud.speculate is None and only_cloud.speculate_share == 0.0
