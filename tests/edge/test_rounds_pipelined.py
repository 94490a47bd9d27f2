"""The pipelined round (edge/rounds/pipelined.py) over a scripted verifier link: draft-ahead,
send-ahead, discarded blocks after a partial accept, the sequential fallback on a broken
link. No model, no gRPC."""
from __future__ import annotations

import pytest

from edge.control.policy import FixedK, Plan
from edge.link.errors import LinkDown
from fake_link import Accept, Discard, Fail, Opened, generation

pytestmark = pytest.mark.unit

SEND_AHEAD = Plan(k=3, draft_ahead=True, send_ahead=2)


def opened_round(script, **kwargs):
    run, link = generation([Opened(), *script], FixedK(3, draft_ahead=True, send_ahead=2),
                           **kwargs)
    assert run.ctx.reconnect.ensure_open(run.state.context)
    return run, link


def test_a_full_accept_with_the_guessed_token_keeps_the_block_sent_ahead():
    # 4 5 6 sent; guessed bonus 7, then 8 9 10 sent ahead assuming it
    run, link = opened_round([Accept(3, 7), Accept(1, 20)])
    run.pipelined.run(run.ctx.draft(3, SEND_AHEAD), 3, SEND_AHEAD, 0.0)
    assert [(d.start, d.tokens, d.ahead, d.assumed_token, d.in_flight) for d in link.sent] == \
        [(3, [4, 5, 6], False, 0, 1), (7, [8, 9, 10], True, 7, 2)]
    result = run.state.result
    assert result.token_ids == [4, 5, 6, 7, 8, 20] and all(result.verified)
    assert [r.accepted for r in result.rounds_log] == [3, 1] and result.target_passes == 2


def test_a_partial_accept_discards_the_block_sent_ahead():
    run, link = opened_round([Accept(1, 30), Discard()])
    run.pipelined.run(run.ctx.draft(3, SEND_AHEAD), 3, SEND_AHEAD, 0.0)
    result = run.state.result
    assert result.token_ids == [4, 30]
    assert [r.mode for r in result.rounds_log] == ["verify", "discarded"]
    assert result.target_passes == 1 and run.pipelined.ahead is None


def test_a_wrong_guess_discards_the_next_block_and_a_verified_discard_is_an_error():
    from edge.link.errors import ProtocolError
    run, _ = opened_round([Accept(3, 99), Discard()])
    run.pipelined.run(run.ctx.draft(3, SEND_AHEAD), 3, SEND_AHEAD, 0.0)
    assert run.state.result.token_ids == [4, 5, 6, 99]
    run, _ = opened_round([Discard()])  # the first block sits on the verified context
    with pytest.raises(ProtocolError):
        run.pipelined.run(run.ctx.draft(3, SEND_AHEAD), 3, SEND_AHEAD, 0.0)


def test_the_block_drafted_ahead_is_taken_by_the_next_round():
    # one block in flight (send_ahead 1): the next block is drafted ahead, not sent
    plan = Plan(k=3, draft_ahead=True)
    run, link = opened_round([Accept(3, 7)])
    run.pipelined.run(run.ctx.draft(3, plan), 3, plan, 0.0)
    assert len(link.sent) == 1 and run.pipelined.ahead is not None
    assert run.pipelined.take_ahead(3, plan).tokens == [8, 9, 10]


def test_a_broken_link_with_blocks_in_flight_redoes_the_first_the_sequential_way():
    run, link = opened_round([Fail(LinkDown("reset")), Opened(), Accept(2, 40)])
    run.pipelined.run(run.ctx.draft(3, SEND_AHEAD), 3, SEND_AHEAD, 0.0)
    result = run.state.result
    # both blocks in flight dropped; the first re-sent alone on a re-opened stream
    assert link.opens == [3, 3] and [(d.tokens, d.ahead) for d in link.sent] == \
        [([4, 5, 6], False), ([8, 9, 10], True), ([4, 5, 6], False)]
    assert result.token_ids == [4, 5, 40] and all(result.verified)
    assert run.pipelined.ahead is None and result.rounds_log[0].attempts == 1
