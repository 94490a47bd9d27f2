"""The cloud-generates round (edge/rounds/cloud.py) over a scripted verifier link: the
verifier's tokens committed as they stream, an eviction cutting the run, a stop. No model, no
gRPC."""
from __future__ import annotations

import threading

import pytest

from edge.control.policy import FixedK
from fake_link import Evict, Generate, Hang, Opened, generation

pytestmark = pytest.mark.unit


def opened_round(script, **kwargs):
    run, link = generation([Opened(), *script], FixedK(3), **kwargs)
    assert run.cloud.ready()
    return run, link


def test_the_verifiers_tokens_are_committed_verified_one_pass_each():
    run, link = opened_round([Generate((20, 21, 22, 23))])
    n = run.cloud.served(4)
    run.cloud.run(n, 0.0)
    result = run.state.result
    assert n == 4 and link.generates == [(3, 4)]
    assert result.token_ids == [20, 21, 22, 23] and all(result.verified)
    record, = result.rounds_log
    assert (record.mode, record.committed, record.target_passes, record.cut) == \
        ("cloud", 4, 4, False)
    assert link.is_open  # the run finished: the stream stays


def test_served_is_held_to_the_verifiers_generate_limit_and_the_tokens_left():
    run, _ = opened_round([], max_tokens=5)
    assert run.cloud.served(100) == 5  # max_tokens
    assert run.cloud.served(0) == 0


def test_an_eviction_cuts_the_run_and_drops_the_stream():
    run, link = opened_round([Generate((20, 21), done=False), Evict()])
    run.cloud.run(4, 0.0)
    record, = run.state.result.rounds_log
    assert run.state.result.token_ids == [20, 21] and record.cut and not link.is_open


def test_a_stop_ends_the_wait_for_the_next_token():
    stop = threading.Event()
    run, link = opened_round([Generate((20,), done=False), Hang()], stop_event=stop)
    errors = []

    def cloud_run():
        try:
            run.cloud.run(4, 0.0)
        except Exception as error:  # the Stopped the loop turns into "cancelled"
            errors.append(error)

    worker = threading.Thread(target=cloud_run)
    worker.start()
    assert link.waiting.wait(10)
    stop.set()
    worker.join(10)
    assert [type(e).__name__ for e in errors] == ["Stopped"]
    assert run.state.result.token_ids == [20]
