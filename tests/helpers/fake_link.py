"""A scripted verifier link and a counting draft, for the round loop's unit tests.

`ScriptedLink` has the surface of edge.link.VerifierLink that the executors (edge/rounds/), the
reconnect logic and the dispatcher (edge/generation.py) use; it answers every Open and every
wait from a script, in order, and records what the loop sent. Verdicts go through the real
link's parsing and checks (edge.link.verifier_link.read_verdict / read_generated), so a script that
answers what no verifier may (a discarded verdict where none is allowed, more accepted than
drafted) fails as it would on the wire.

`CountingRuntime` is a draft runtime whose next token is always the last one plus one (mod its
vocabulary): after a context ending in t a block of k drafts t+1 .. t+k, so a test knows every
block before the loop drafts it. These tests check the loop's bookkeeping, not the models (the
lossless claim is tested with the real models elsewhere).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from edge.drafting import Block, DraftCursor
from edge.link import STOP_POLL_S, Sent, WaitRule
from edge.link.errors import Stopped
from edge.link.verifier_link import LinkTotals, read_generated, read_verdict
from edge.runtime.base import DraftRuntime
from tandem.v1 import decoding_pb2 as pb

# The limits a plain fake verifier sends: drafts up to 16, two blocks in flight, Generate served.
LIMITS = pb.Limits(max_draft_length=16, max_context=4096, max_in_flight=2,
                   max_generate_tokens=16)
# A Hang step fails the test when no stop comes within this long (a test bug, not a timing).
HANG_LIMIT_S = 10.0


# ---- the script: one step per Open or per wait, in order -----------------------------------

@dataclass(frozen=True)
class Opened:
    """An Open succeeds, with these limits (None: an Opened without limits)."""
    limits: pb.Limits | None = field(default_factory=lambda: LIMITS)
    price: float = 0.0


@dataclass(frozen=True)
class Accept:
    """A verdict: the first n drafted tokens accepted, then the verifier's `token`."""
    n: int
    token: int
    price: float = 0.0


@dataclass(frozen=True)
class Discard:
    """A send-ahead block built on a prefix the verifier rejected, answered unscored."""


@dataclass(frozen=True)
class Evict:
    """The verifier dropped the session's state (Evicted)."""


@dataclass(frozen=True)
class Generate:
    """The answer to a Generate: these tokens, one per wait; `done` on the last one."""
    tokens: tuple[int, ...]
    done: bool = True


@dataclass(frozen=True)
class Hang:
    """The verifier never answers: the wait ends only when the loop's stop signal is set
    (ScriptedLink.waiting is set while it hangs)."""


@dataclass(frozen=True)
class Fail:
    """The Open or the wait raises this error (LinkDown: an outage; VerifierRefused...)."""
    error: Exception


@dataclass
class SentDraft:
    """One Draft the loop queued, as the verifier would read it."""
    start: int                    # Draft.start (before the unverified tokens)
    tokens: list[int]
    unverified: list[int]
    ahead: bool
    assumed_token: int
    in_flight: int


@dataclass
class ScriptedLink:
    """edge.link.VerifierLink's surface, answering from `script` (a list of the steps above)."""
    script: list
    fast: bool = False
    sent: list[SentDraft] = field(default_factory=list)
    opens: list[int] = field(default_factory=list)          # the context length of every Open
    generates: list[tuple[int, int]] = field(default_factory=list)  # (start, max_tokens)
    closed: str = ""                                         # the reason of close(), once closed
    drops: int = 0

    def __post_init__(self) -> None:
        self.totals = LinkTotals()
        self.limits: pb.Limits | None = None
        self.q_codec = None
        self.load = 0.0
        self.price = 0.0
        self.position_cost: float | None = None  # a drafted position's cost: not said
        self.token_ms = (None, None)  # a committed token's cost per mode: not said
        self.server_context = 0
        self.open_rtt_s: float | None = None
        self.prefill_s = 0.0
        self.wait_rule = WaitRule()
        self.should_stop: Callable[[], bool] = lambda: False
        self.wire_round = 0
        self._open = False
        self._generating: list[int] = []   # tokens of the Generate answer not yet read
        self._generate_done = True
        self.waiting = threading.Event()   # set while a Hang step waits for the stop signal

    # ---- the script ------------------------------------------------------------------------
    def _next(self, *kinds: type):
        if self.should_stop():
            raise Stopped()  # as the WaitRule does: a stop is seen before any reply
        assert self.script, f"the script ran out (the loop waited for {kinds[0].__name__})"
        step = self.script.pop(0)
        if isinstance(step, Hang):
            self.waiting.set()
            for _ in range(int(HANG_LIMIT_S / STOP_POLL_S)):  # polled, as the WaitRule does
                if self.should_stop():
                    raise Stopped()
                threading.Event().wait(STOP_POLL_S)
            raise AssertionError(f"a Hang step saw no stop within {HANG_LIMIT_S} s")
        if isinstance(step, Fail):
            raise step.error
        assert isinstance(step, kinds), f"script step {step} where the loop waits for " \
            f"{' / '.join(kind.__name__ for kind in kinds)}"
        return step

    @property
    def exhausted(self) -> bool:
        return not self.script

    # ---- VerifierLink's surface -------------------------------------------------------------
    def bind(self, wait_rule: WaitRule, should_stop: Callable[[], bool]) -> None:
        self.wait_rule, self.should_stop = wait_rule, should_stop

    @property
    def is_open(self) -> bool:
        return self._open

    def open(self, context: Sequence[int], late_s: float, cap_s: float | None = None) -> None:
        self.drop()
        self.opens.append(len(context))
        step = self._next(Opened)
        self.limits, self.price = step.limits, step.price
        self.server_context = len(context)
        self.open_rtt_s = 0.001
        self.totals.opens += 1
        self._open = True

    def send(self, start: int, block: Block, unverified: Sequence[int] = (), *,
             ahead: bool = False, assumed_token: int = 0, in_flight: int = 1) -> Sent:
        assert self._open, "send on a closed link"
        assert not unverified or self.fast, "unverified tokens on a lossless session"
        self.wire_round += 1
        self.sent.append(SentDraft(start, list(block.tokens), list(unverified), ahead,
                                   assumed_token, in_flight))
        size = pb.ClientMessage(draft=pb.Draft(round=self.wire_round, start=start,
                                               tokens=block.tokens,
                                               unverified=unverified)).ByteSize()
        self.totals.bytes_up += size
        self.totals.draft_bytes_up += size
        self.totals.drafted_tokens += len(block)
        return Sent(round=self.wire_round, start=start + len(unverified), k=len(block),
                    bytes_up=size, t_sent=0.0, send_s=0.0)

    def await_verdict(self, sent: Sent, late_s: float,
                      allow_discarded: bool = False) -> tuple[pb.Verdict, int]:
        assert self._open, "await on a closed link"
        step = self._next(Accept, Discard, Evict)
        if isinstance(step, Evict):
            reply = pb.ServerMessage(evicted=pb.Evicted(round=sent.round))
        elif isinstance(step, Discard):
            reply = pb.ServerMessage(verdict=pb.Verdict(round=sent.round, discarded=True))
        else:
            reply = pb.ServerMessage(verdict=pb.Verdict(
                round=sent.round, accepted=step.n, token=step.token,
                context_length=sent.start + step.n + 1, price=step.price))
        self.totals.bytes_down += reply.ByteSize()
        verdict = read_verdict(reply, sent, self.limits, allow_discarded)
        self.price = verdict.price
        if not verdict.discarded:
            self.server_context = sent.start + verdict.accepted + 1
        return verdict, reply.ByteSize()

    def send_generate(self, start: int, max_tokens: int, stop_ids: Sequence[int]) -> Sent:
        assert self._open, "send on a closed link"
        self.wire_round += 1
        self.generates.append((start, max_tokens))
        return Sent(round=self.wire_round, start=start, k=0, bytes_up=8, t_sent=0.0, send_s=0.0)

    def await_generated(self, sent: Sent, late_s: float) -> tuple[pb.Generated, int]:
        assert self._open, "await on a closed link"
        if not self._generating:
            step = self._next(Generate, Evict)
            if isinstance(step, Evict):
                read_generated(pb.ServerMessage(evicted=pb.Evicted(round=sent.round)), sent,
                               self.limits)  # raises Evicted
            self._generating, self._generate_done = list(step.tokens), step.done
        elif self.should_stop():
            raise Stopped()
        token = self._generating.pop(0)
        self.server_context += 1
        reply = pb.ServerMessage(generated=pb.Generated(
            round=sent.round, token=token, context_length=self.server_context,
            done=self._generate_done and not self._generating))
        self.totals.bytes_down += reply.ByteSize()
        return read_generated(reply, sent, self.limits), reply.ByteSize()

    def drop(self) -> None:
        if self._open:
            self.drops += 1
        self._open = False
        self._generating = []

    def close(self, reason: str = "done") -> None:
        self._open = False
        self.closed = reason


class CountingRuntime(DraftRuntime):
    """A draft whose next token is the last one plus one, with top probability about 0.83."""
    name = "counting"

    def __init__(self, vocab_size: int = 64, n_ctx: int = 512) -> None:
        super().__init__()
        self.vocab_size, self.n_ctx = vocab_size, n_ctx
        self.cache: list[int] = []

    @property
    def position(self) -> int:
        return len(self.cache)

    def extend(self, token_ids: Sequence[int]) -> torch.Tensor:
        self._check_extend(token_ids)
        self.cache.extend(int(t) for t in token_ids)
        logits = torch.zeros(len(token_ids), self.vocab_size)  # [len(token_ids), vocab]
        for row, token in enumerate(token_ids):
            logits[row, (int(token) + 1) % self.vocab_size] = 5.0
        return logits

    def rollback(self, position: int) -> None:
        assert 0 <= position <= len(self.cache)
        del self.cache[position:]

    def fingerprint(self) -> str:
        return "counting"


def counting_cursor(vocab_size: int = 64, n_ctx: int = 512) -> DraftCursor:
    return DraftCursor(CountingRuntime(vocab_size, n_ctx))


def generation(script: list, policy, *, prompt: Sequence[int] = (1, 2, 3), max_tokens: int = 12,
               fast: bool = False, max_unverified_run: int = 8, config=None,
               stop_ids: frozenset[int] = frozenset(), stop_event=None, on_tokens=None):
    """A Generation (edge/generation.py) over a ScriptedLink and a counting draft; returns it
    and its link. The default config gives the verifier up at the first failed Open and goes on
    locally (offline: continue), probing again after 4 local tokens: no sleep anywhere."""
    from edge.request import GenerationRequest
    from edge.config import ClientConfig
    from edge.generation import Generation
    config = config or ClientConfig(offline="continue", max_retries=0, offline_probe_tokens=4,
                                    retry_initial_backoff_s=0.0)
    link = ScriptedLink(list(script), fast=fast)
    request = GenerationRequest(prompt_ids=list(prompt), max_tokens=max_tokens,
                                stop_ids=stop_ids, mode="fast" if fast else None)
    run = Generation(request=request, cursor=counting_cursor(), config=config, policy=policy,
                     link=link, stop_event=stop_event, on_tokens=on_tokens, fast=fast,
                     max_unverified_run=max_unverified_run)
    return run, link
