"""The session table: byte budget, LRU eviction of idle sessions only, session-count limit,
removal of a session whose round is in flight."""
from __future__ import annotations

import pytest
import torch

from cloud.errors import ResourceExhausted
from cloud.runtime.kv import KVPool, KVState
from cloud.sessions import Session, SessionTable
from tandem.sampling import SamplingParams

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

POOL = KVPool(torch.device("cpu"), max_capacity=64)  # never used by a pass here


def _session(name: str) -> Session:
    return Session(session_id=name, params=SamplingParams(), generator=torch.Generator(),
                   state=KVState(POOL), context_length=1, pending_token=0, mode=0,
                   prompt_tokens=1)


def _admit(table: SessionTable, session: Session, need: int) -> list[str]:
    evicted = table.admit(session, need)
    table.settle(session, need)
    return [victim.session_id for victim in evicted]


def test_least_recently_used_idle_session_is_evicted_first():
    table = SessionTable(kv_budget_bytes=100, max_sessions=10)
    a, b, c = _session("a"), _session("b"), _session("c")
    assert _admit(table, a, 40) == []
    assert _admit(table, b, 40) == []
    table.reserve(a, 40)  # a round of a: a becomes most recently used
    table.settle(a, 40)
    assert _admit(table, c, 40) == ["b"]
    assert b.evicted and not a.evicted
    assert table.used_bytes == 80 and table.active == 2
    assert table.reserve(b, 40) is None  # b's next round hears it was evicted


def test_busy_sessions_are_never_victims():
    table = SessionTable(kv_budget_bytes=100, max_sessions=10)
    a, b = _session("a"), _session("b")
    _admit(table, a, 60)
    table.reserve(a, 70)  # a round in flight
    assert _admit(table, b, 50) == []  # over budget for a moment rather than evicting a
    assert not a.evicted
    table.settle(a, 60)
    assert table.reserve(b, 60) is not None and a.evicted  # the next round makes room


def test_a_session_that_alone_exceeds_the_budget_is_refused():
    table = SessionTable(kv_budget_bytes=100, max_sessions=10)
    with pytest.raises(ResourceExhausted, match="budget"):
        table.admit(_session("big"), 101)


def test_session_count_limit_evicts_or_refuses():
    table = SessionTable(kv_budget_bytes=10**6, max_sessions=2)
    a, b = _session("a"), _session("b")
    _admit(table, a, 1)
    _admit(table, b, 1)
    c = _session("c")
    assert _admit(table, c, 1) == ["a"]
    table.reserve(b, 1)  # b busy: c is the only possible victim
    d = _session("d")
    assert _admit(table, d, 1) == ["c"]
    assert table.load == 1.0
    table.reserve(d, 1)  # both busy now: a new session is refused
    with pytest.raises(ResourceExhausted, match="all busy"):
        table.admit(_session("e"), 1)


def test_a_session_removed_mid_round_stays_charged_until_the_round_settles():
    # Its stream was cancelled while the round ran: the cache is still in use until it settles.
    table = SessionTable(kv_budget_bytes=100, max_sessions=10)
    a, b = _session("a"), _session("b")
    _admit(table, a, 40)
    table.reserve(a, 50)
    assert table.remove(a) and not table.remove(a)  # True for exactly one caller
    assert table.used_bytes == 50 and table.active == 1
    assert table.reserve(a, 50) is None             # no further round on a removed session
    assert _admit(table, b, 60) == []               # over budget for a moment, a not evicted
    assert not a.evicted and table.evictions == 0
    table.settle(a, 45)
    assert table.used_bytes == 60 and table.active == 1
    assert not table.remove(a)
