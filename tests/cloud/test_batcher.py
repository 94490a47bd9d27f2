"""The batcher, driven directly with the real target runtime: concurrent jobs share one forward
pass and get what they would alone, prompts share passes with each other but never with rounds,
failures reach every waiting job, and
a closed batcher refuses new work."""
from __future__ import annotations

import threading

import pytest
import torch

from cloud.batcher import ROUND_GAP_CAP, Batcher
from cloud.errors import Unavailable
from cloud.runtime.target import TargetRuntime
from verifier_harness import TEST_DEVICE

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)


@pytest.fixture(scope="module")
def runtime(target_dir) -> TargetRuntime:
    torch.set_num_threads(1)
    return TargetRuntime(target_dir, device=TEST_DEVICE)


def _prefilled(runtime: TargetRuntime, tokens: list[int]):
    state = runtime.new_state()
    runtime.score(state, tokens)
    return state


def test_concurrent_jobs_share_a_pass_and_equal_each_alone(runtime):
    contexts = [list(range(10 + i, 10 + i + 3 * (i + 1))) for i in range(6)]
    blocks = [[100 + i] * (1 + i % 3) for i in range(6)]
    alone = [runtime.score(_prefilled(runtime, c), b) for c, b in zip(contexts, blocks)]

    states = [_prefilled(runtime, c) for c in contexts]
    batcher = Batcher(runtime.forward, max_batch=8, window_ms=200, active_sessions=lambda: 6)
    results, start = [None] * 6, threading.Barrier(6)

    def session(i: int) -> None:
        start.wait()
        results[i] = batcher.submit(states[i], blocks[i]).result(timeout=30)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    batcher.close()

    assert max(r.batch_size for r in results) > 1
    assert batcher.batches_run < 6
    for one, result, block in zip(alone, results, blocks):
        assert result.logits.shape == (len(block), runtime.vocab_size)
        logits = result.logits.float().cpu()  # a pass's rows stay on the model's device
        assert torch.equal(one.argmax(-1), logits.argmax(-1))
        assert (one - logits).abs().max() < 1e-4
        assert result.queue_ms >= 0 and result.forward_ms > 0


def test_a_lone_session_does_not_wait_for_the_window(runtime):
    batcher = Batcher(runtime.forward, max_batch=8, window_ms=5000, active_sessions=lambda: 1)
    result = batcher.submit(_prefilled(runtime, [1, 2, 3]), [4]).result(timeout=4)
    batcher.close()
    assert result.batch_size == 1 and result.queue_ms < 4000


def test_prompts_share_passes_with_prompts_never_with_rounds(runtime):
    """Three prompts and two rounds queue while a pass runs: the prompts share one pass (packed,
    no padding to each other), run first, and the rounds another; every job gets what it would
    alone. A pass of prompts stops at PROMPT_PASS_TOKENS."""
    from cloud.batcher import PROMPT_PASS_TOKENS
    release, first_pass = threading.Event(), threading.Event()
    passes: list[int] = []  # jobs per pass, in the order the passes ran

    def held_forward(batch):
        passes.append(len(batch))
        if not first_pass.is_set():  # hold the first pass so the others queue behind it
            first_pass.set()
            release.wait(30)
        return runtime.forward(batch)

    prompts = [list(range(1, 30)), list(range(40, 52)), list(range(60, 101))]
    rounds = [([1, 2], [3]), ([5, 6], [7, 8])]
    batcher = Batcher(held_forward, max_batch=8, window_ms=0, active_sessions=lambda: 6)
    blocker = batcher.submit(_prefilled(runtime, [9, 9]), [9])
    assert first_pass.wait(30)
    futures = [batcher.submit(runtime.new_state(), p, alone=True) for p in prompts]
    futures += [batcher.submit(_prefilled(runtime, c), b) for c, b in rounds]
    release.set()
    results = [future.result(timeout=30) for future in futures]
    blocker.result(timeout=30)
    batcher.close()
    assert [r.batch_size for r in results] == [3, 3, 3, 2, 2]
    assert passes == [1, 3, 2]  # the held pass, the prompts, the rounds
    assert results[0].positions == sum(len(p) for p in prompts)
    expected = [runtime.score(runtime.new_state(), p) for p in prompts]
    expected += [runtime.score(_prefilled(runtime, c), b) for c, b in rounds]
    for one, result in zip(expected, results):
        assert (one - result.logits.float().cpu()).abs().max() < 1e-4
    from cloud.batcher import _prompt_passes, _Job
    jobs = [_Job(None, [0] * n, True) for n in (PROMPT_PASS_TOKENS - 10, 20, 5, PROMPT_PASS_TOKENS)]
    assert [len(g) for g in _prompt_passes(jobs)] == [1, 2, 1]


def test_a_failed_pass_reaches_every_job_in_it(runtime):
    batcher = Batcher(runtime.forward, max_batch=8, window_ms=0)
    bad = batcher.submit(runtime.new_state(), [])  # no new tokens: the runtime refuses
    with pytest.raises(AssertionError, match="at least one new token"):
        bad.result(timeout=30)
    ok = batcher.submit(_prefilled(runtime, [1]), [2]).result(timeout=30)  # the worker lives on
    assert ok.logits.shape == (1, runtime.vocab_size)
    batcher.close()
    with pytest.raises(Unavailable):
        batcher.submit(runtime.new_state(), [1])


def test_a_jobs_weight_counts_the_round_passes_since_its_sessions_last(runtime):
    """ForwardResult.weight (cloud/token_cost.py: a job's part of a pass's fixed cost): 1 for a
    session in every pass and for a session's first job; a session back after n round passes
    weighs n, at most ROUND_GAP_CAP; a prompt's pass counts none, and a session's first round
    counts from its prompt. One session at a time, so each job is a pass of its own."""
    batcher = Batcher(runtime.forward, max_batch=8, window_ms=0, active_sessions=lambda: 1)
    a, b, c = (_prefilled(runtime, [1, 2]) for _ in range(3))

    def weight(state, tokens=(5,), alone=False) -> float:
        result = batcher.submit(state, list(tokens), alone=alone).result(timeout=30)
        state.rollback(state.length - len(tokens))
        assert result.weights == result.weight  # alone in its pass
        return result.weight

    assert [weight(a), weight(a), weight(b, (5, 6, 7))] == [1, 1, 1]
    assert [weight(a) for _ in range(3)] + [weight(b)] == [2, 1, 1, 4]  # a: b's pass between
    weight(c, (8, 9), alone=True)  # c's prompt: no round pass
    assert [weight(a), weight(a), weight(c)] == [2, 1, 3]  # c: the passes since its prompt
    for _ in range(ROUND_GAP_CAP + 4):
        weight(a)
    assert weight(b) == ROUND_GAP_CAP
    batcher.close()
