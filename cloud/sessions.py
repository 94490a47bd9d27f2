"""The session table: every open session, its KV-cache charge, and LRU eviction under a byte
budget.

Server state is soft. When a session needs room (a new Open, or a round that grows a cache)
the table drops the least recently used *idle* sessions until the budget holds; a dropped
session is marked evicted, and its next Draft is answered with `Evicted` so the edge re-opens
with its full context and loses nothing. A session with a forward pass in flight is never a
victim. If only busy sessions are left the budget is briefly exceeded rather than failing a
round; a single session that alone exceeds the budget is refused.

A session removed while its pass is in flight (its stream was cancelled mid-round) leaves the
table only when that pass settles: until then its cache is in use, so it stays charged and is
still nobody's victim.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from cloud.errors import ResourceExhausted
from cloud.runtime.kv import KVState
from cloud.token_cost import SESSION_WINDOW_TOKENS, TokenCosts
from tandem.qcodec import QCodec
from tandem.sampling import SamplingParams


@dataclass
class Session:
    session_id: str
    params: SamplingParams
    generator: torch.Generator   # the server's randomness for rejection sampling
    state: KVState               # the context minus its last ("pending") token
    context_length: int          # prompt + committed tokens, including the pending one
    pending_token: int
    mode: int
    prompt_tokens: int
    key: int = field(default_factory=itertools.count().__next__)  # unique within the process
    opened_at: float = field(default_factory=time.monotonic)
    rounds: int = 0
    last_round: int = -1         # Draft.round of the last verdict: rounds must increase
    accepted_total: int = 0      # draft tokens accepted over all rounds
    generated: int = 0           # tokens committed by verdicts (accepted + bonus)
    charged_bytes: int = 0       # what the table counts against the budget
    busy: bool = False           # a forward pass is in flight
    leaving: bool = False        # removed while busy: dropped from the table when its pass settles
    evicted: bool = False
    closed: bool = False
    q_codec: QCodec | None = None  # the coded q format negotiated at Open; None = plain q only
    # what its committed tokens cost the passes, per mode (cloud/token_cost.py)
    token_costs: TokenCosts = field(
        default_factory=lambda: TokenCosts(SESSION_WINDOW_TOKENS))

    @property
    def mean_accepted(self) -> float:
        return self.accepted_total / self.rounds if self.rounds else 0.0


class SessionTable:
    """Thread-safe; every method takes the table lock."""

    def __init__(self, kv_budget_bytes: int, max_sessions: int) -> None:
        self.kv_budget_bytes = kv_budget_bytes
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: OrderedDict[int, Session] = OrderedDict()  # LRU first
        self._used_bytes = 0
        self.evictions = 0

    def admit(self, session: Session, need_bytes: int) -> list[Session]:
        """Add a session that will hold need_bytes, busy (its prefill is next). Returns the
        sessions evicted to make room."""
        with self._lock:
            if need_bytes > self.kv_budget_bytes:
                raise ResourceExhausted(
                    f"the context needs {need_bytes} bytes of KV cache, the server's budget is "
                    f"{self.kv_budget_bytes}")
            evicted = []
            while len(self._sessions) >= self.max_sessions:
                victim = self._lru_idle(exclude=None)
                if victim is None:
                    raise ResourceExhausted(
                        f"the server is at its limit of {self.max_sessions} sessions, all busy")
                evicted.append(self._evict(victim))
            session.busy = True
            session.charged_bytes = need_bytes
            self._sessions[session.key] = session
            self._used_bytes += need_bytes
            evicted += self._make_room(session)
            return evicted

    def reserve(self, session: Session, need_bytes: int) -> list[Session] | None:
        """Mark a session busy for a round that takes its cache to need_bytes. Returns the
        sessions evicted for it, or None when the session itself was evicted (or is gone)."""
        with self._lock:
            if session.evicted or session.leaving or session.key not in self._sessions:
                return None
            if need_bytes > self.kv_budget_bytes:
                raise ResourceExhausted(
                    f"this round needs {need_bytes} bytes of KV cache, the server's budget is "
                    f"{self.kv_budget_bytes}")
            session.busy = True
            self._recharge(session, need_bytes)
            return self._make_room(session)

    def settle(self, session: Session, held_bytes: int) -> None:
        """The pass is done: charge what the session holds now, mark it most recently used (or
        drop it, if it was removed while the pass ran)."""
        with self._lock:
            session.busy = False
            if session.key not in self._sessions:
                return
            if session.leaving:
                self._drop(session)
                return
            self._recharge(session, held_bytes)
            self._sessions.move_to_end(session.key)

    def remove(self, session: Session) -> bool:
        """Drop a session (closed or ended); one with a pass in flight is dropped when that pass
        settles. Returns True for exactly one caller, False if it was not (or no longer) in the
        table."""
        with self._lock:
            if session.key not in self._sessions or session.leaving:
                return False
            if session.busy:
                session.leaving = True
            else:
                self._drop(session)
            return True

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._sessions)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used_bytes

    @property
    def load(self) -> float:
        """Share of the budget in use (bytes or session slots, whichever is fuller), 0..1."""
        with self._lock:
            return min(1.0, max(self._used_bytes / self.kv_budget_bytes,
                                len(self._sessions) / self.max_sessions))

    # --- under the lock -------------------------------------------------------------------
    def _recharge(self, session: Session, held_bytes: int) -> None:
        self._used_bytes += held_bytes - session.charged_bytes
        session.charged_bytes = held_bytes

    def _make_room(self, keep: Session) -> list[Session]:
        evicted = []
        while self._used_bytes > self.kv_budget_bytes:
            victim = self._lru_idle(exclude=keep)
            if victim is None:
                break  # only busy sessions left: they shrink back when their rounds settle
            evicted.append(self._evict(victim))
        return evicted

    def _lru_idle(self, exclude: Session | None) -> Session | None:
        for session in self._sessions.values():
            if not session.busy and session is not exclude:
                return session
        return None

    def _drop(self, session: Session) -> None:
        del self._sessions[session.key]
        self._used_bytes -= session.charged_bytes
        session.charged_bytes = 0

    def _evict(self, victim: Session) -> Session:
        assert not victim.busy, "a session with a pass in flight is never a victim"
        self._drop(victim)
        victim.evicted = True
        victim.state.release()
        self.evictions += 1
        return victim
