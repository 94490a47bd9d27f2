"""The dispatcher (edge/generation.py Generation.run) over a scripted verifier link: which
executor each round takes, what the generation commits, how it ends. Milliseconds each, no model
and no gRPC (tests/helpers/fake_link.py); the lossless claim is tested with the real models elsewhere."""
from __future__ import annotations

import threading

import grpc
import pytest

from edge.control.policy import DraftPolicy, FixedK, Plan
from edge.link.errors import LinkDown, VerifierRefused
from fake_link import LIMITS, Accept, Fail, Generate, Hang, Opened, generation
from tandem.v1 import decoding_pb2 as pb

pytestmark = pytest.mark.unit


class CloudThenDraft(DraftPolicy):
    """The first round asks the verifier to generate 3 tokens, then fixed k = 2 rounds."""

    def plan(self, view):
        return Plan(k=2, cloud_generate=3 if view.round == 0 else 0)

    def update(self, record):
        pass


def test_a_lossless_generation_commits_exactly_the_verdicts():
    # Prompt 1 2 3: the counting draft proposes 4 5 6 7, then after 30 it proposes 31 ...
    run, link = generation([Opened(), Accept(2, 30), Accept(4, 35), Accept(1, 37)],
                           FixedK(4), max_tokens=10)
    result = run.run()
    assert result.token_ids == [4, 5, 30, 31, 32, 33, 34, 35, 36, 37]
    assert result.verified == [True] * 10 and result.finish_reason == "length"
    assert [d.start for d in link.sent] == [3, 6, 11]          # the context each block follows
    assert [len(d.tokens) for d in link.sent] == [4, 4, 1]     # k = 1: max_tokens leaves 2
    assert result.target_passes == 3 and result.accepted_lengths == [2, 4, 1]
    assert link.exhausted and link.closed == "done" and link.opens == [3]


def test_a_stop_id_in_the_verdict_ends_the_generation():
    run, link = generation([Opened(), Accept(1, 50), Accept(9, 0)], FixedK(3),
                           stop_ids=frozenset({50}))
    result = run.run()
    assert result.token_ids == [4, 50] and result.finish_reason == "stop"
    assert len(link.script) == 1  # no round after the stop


def test_the_generation_goes_local_while_the_verifier_is_away_and_resumes_verified():
    # The first Open fails: 4 local tokens (offline_probe_tokens), then a probe re-opens with
    # the full context and verification resumes.
    run, link = generation([Fail(LinkDown("refused")), Opened(), Accept(3, 11), Accept(0, 40),
                            Accept(2, 43)], FixedK(3))
    result = run.run()
    assert result.token_ids == [4, 5, 6, 7, 8, 9, 10, 11, 40, 41, 42, 43]
    assert result.verified == [False] * 4 + [True] * 8
    assert link.opens == [3, 7]  # the re-open carries the prompt and the local tokens
    first = result.rounds_log[0]
    assert (first.mode, first.cause, first.verified) == ("local", "outage", False)
    assert result.unverified_by_cause() == {"outage": 4}
    assert result.target_passes == 3 and result.finish_reason == "length"


def test_a_refused_open_fails_the_generation_instead_of_going_local():
    refused = VerifierRefused(grpc.StatusCode.FAILED_PRECONDITION, "tokenizer mismatch")
    run, _ = generation([Fail(refused)], FixedK(3))
    with pytest.raises(VerifierRefused):
        run.run()


def test_on_tokens_returning_false_cancels_after_that_round():
    run, link = generation([Opened(), Accept(1, 9), Accept(3, 0)], FixedK(3),
                           on_tokens=lambda ids, verified: False)
    result = run.run()
    assert result.token_ids == [4, 9] and result.finish_reason == "cancelled"
    assert len(link.script) == 1 and result.rounds == 1


def test_a_stop_event_ends_a_verdict_wait_and_cancels():
    stop = threading.Event()
    run, link = generation([Opened(), Accept(1, 9), Hang()], FixedK(3), stop_event=stop)
    results = []
    worker = threading.Thread(target=lambda: results.append(run.run()))
    worker.start()
    assert link.waiting.wait(10)  # the second round waits for a verdict that never comes
    stop.set()
    worker.join(10)
    result, = results
    assert result.token_ids == [4, 9] and result.finish_reason == "cancelled"
    assert link.drops == 1 and link.closed == "done"
    # the unanswered round is recorded, sent but never accepted
    assert [r.accepted for r in result.rounds_log] == [1, None]


def test_a_cloud_plan_streams_the_verifiers_tokens_then_drafts_again():
    run, link = generation([Opened(), Generate((20, 21, 22)), Accept(2, 30), Accept(2, 33)],
                           CloudThenDraft(), max_tokens=9)
    result = run.run()
    assert result.token_ids == [20, 21, 22, 23, 24, 30, 31, 32, 33]
    assert [r.mode for r in result.rounds_log] == ["cloud", "verify", "verify"]
    assert link.generates == [(3, 3)] and [d.start for d in link.sent] == [6, 9]
    assert result.target_passes == 3 + 2  # one pass per generated token, one per verdict


def test_a_cloud_plan_drafts_when_the_verifier_serves_no_generate():
    no_generate = pb.Limits()
    no_generate.CopyFrom(LIMITS)
    no_generate.max_generate_tokens = 0
    run, link = generation([Opened(no_generate), Accept(2, 30)], CloudThenDraft(), max_tokens=3)
    result = run.run()
    assert link.generates == [] and result.token_ids == [4, 5, 30]
    assert [r.mode for r in result.rounds_log] == ["verify"]


def test_a_pipelined_plan_takes_the_pipelined_round():
    run, link = generation([Opened(), Accept(3, 7), Accept(3, 11), Accept(1, 13)],
                           FixedK(3, draft_ahead=True, send_ahead=2), max_tokens=10)
    result = run.run()
    assert result.token_ids == list(range(4, 14))
    assert [(d.start, d.ahead) for d in link.sent][:2] == [(3, False), (7, True)]


def test_a_fast_skippable_plan_commits_unverified_and_the_next_block_carries_it():
    class Skippable(DraftPolicy):
        def plan(self, view):
            return Plan(k=3, verify=view.round % 2 == 1)

        def update(self, record):
            pass

    # the third round has one token left: nothing to skip, a k = 0 round verifies it
    run, link = generation([Opened(), Accept(3, 10), Accept(0, 11)], Skippable(), fast=True,
                           max_tokens=8)
    result = run.run()
    assert result.token_ids == [4, 5, 6, 7, 8, 9, 10, 11]
    assert result.verified == [False] * 3 + [True] * 5
    assert result.rounds_log[0].cause == "fast_mode"
    assert (link.sent[0].start, link.sent[0].unverified) == (3, [4, 5, 6])
