"""Local rounds (edge/rounds/local.py) over a scripted verifier link: a fast-mode skip, and a
stretch while the verifier is away that probes and resumes. No model, no gRPC."""
from __future__ import annotations

import pytest

from edge.control.policy import FixedK, Plan
from edge.link.errors import LinkDown
from fake_link import Fail, Opened, generation

pytestmark = pytest.mark.unit


def test_a_skip_commits_the_block_unverified_as_fast_mode():
    run, link = generation([], FixedK(3), fast=True)
    plan = Plan(k=3, verify=False)
    run.local.skip(run.ctx.draft(3, plan), 3, plan, 0.0)
    result = run.state.result
    assert result.token_ids == [4, 5, 6] and result.verified == [False] * 3
    assert result.rounds_log[0].cause == "fast_mode" and run.state.gate.unverified_run == 3
    assert link.sent == [] and link.opens == []


def test_a_stretch_generates_up_to_the_probe_then_reopens_with_the_full_context():
    run, link = generation([Opened()], FixedK(3))
    run.ctx.offline.failure(LinkDown("down"))  # the verifier went away
    run.ctx.go_local()
    run.local.stretch()
    state = run.state
    assert state.result.token_ids == [4, 5, 6, 7]  # offline_probe_tokens = 4
    assert state.result.rounds_log[0].cause == "outage"
    assert link.opens == [7] and not state.local  # verification resumes


def test_a_failed_probe_stays_local_and_tries_again_later():
    run, link = generation([Fail(LinkDown("still down"))], FixedK(3))
    run.ctx.offline.failure(LinkDown("down"))
    run.ctx.go_local()
    run.local.stretch()
    assert run.state.local and link.opens == [7] and run.state.next_probe_at == 8


def test_a_stretch_ends_the_generation_at_max_tokens():
    run, link = generation([], FixedK(3), max_tokens=3)
    run.ctx.go_local()
    run.local.stretch()
    assert run.state.result.token_ids == [4, 5, 6]
    assert run.state.result.finish_reason == "length" and link.opens == []
