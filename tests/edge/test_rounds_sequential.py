"""The sequential round (edge/rounds/sequential.py) over a scripted verifier link: one block,
its verdict, re-opens with the full context, the offline fallback. No model, no gRPC."""
from __future__ import annotations

import pytest

from edge.control.policy import FixedK, Plan
from edge.link.errors import LinkDown
from fake_link import Accept, Evict, Fail, Opened, generation

pytestmark = pytest.mark.unit


def opened_round(script, **kwargs):
    """A generation whose link is open on the prompt (1 2 3), and the sequential executor."""
    run, link = generation([Opened(), *script], FixedK(3), **kwargs)
    assert run.ctx.reconnect.ensure_open(run.state.context)
    return run, link


def test_a_verdict_commits_the_accepted_prefix_and_the_verifiers_token():
    run, link = opened_round([Accept(2, 40)])
    block = run.ctx.draft(3, Plan(k=3))
    run.sequential.run(block, 3, Plan(k=3), 0.0)
    result = run.state.result
    assert block.tokens == [4, 5, 6] and result.token_ids == [4, 5, 40]
    record, = result.rounds_log
    assert (record.accepted, record.committed, record.verified, record.attempts) == \
        (2, 3, True, 1)
    assert record.target_passes == 1 and link.server_context == 6


def test_an_eviction_reopens_with_the_full_context_and_sends_the_block_again():
    run, link = opened_round([Evict(), Opened(), Accept(3, 7)])
    run.sequential.run(run.ctx.draft(3, Plan(k=3)), 3, Plan(k=3), 0.0)
    assert link.opens == [3, 3] and [d.tokens for d in link.sent] == [[4, 5, 6]] * 2
    record, = run.state.result.rounds_log
    assert record.attempts == 2 and run.state.result.token_ids == [4, 5, 6, 7]


def test_a_broken_link_retried_once_then_the_block_goes_local_unverified():
    # max_retries 0: the re-open is not tried; offline "continue" commits the block unverified
    run, link = opened_round([Fail(LinkDown("reset"))])
    run.sequential.run(run.ctx.draft(3, Plan(k=3)), 3, Plan(k=3), 0.0)
    state = run.state
    assert state.result.token_ids == [4, 5, 6] and state.result.verified == [False] * 3
    assert state.local and not link.is_open
    record, = state.result.rounds_log
    assert (record.mode, record.cause, record.accepted) == ("local", "outage", None)


def test_a_broken_link_with_retries_left_reopens_and_is_verified():
    from edge.config import ClientConfig
    config = ClientConfig(offline="continue", max_retries=2, retry_initial_backoff_s=0.0,
                          retry_max_backoff_s=0.0)
    run, link = opened_round([Fail(LinkDown("reset")), Opened(), Accept(1, 9)], config=config)
    run.sequential.run(run.ctx.draft(3, Plan(k=3)), 3, Plan(k=3), 0.0)
    assert run.state.result.token_ids == [4, 9] and run.state.result.verified == [True] * 2
    assert link.opens == [3, 3] and not run.state.local
