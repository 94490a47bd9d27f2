"""The verifier engine's calls and replies (cloud/engine.py): plain dataclasses, no gRPC (the
servicer converts the proto's messages to and from these). Positions as in the proto."""
from __future__ import annotations

from dataclasses import dataclass

from cloud.sessions import Session
from cloud.verify import Verdict
from tandem.codec import SparseDist
from tandem.sampling import SamplingParams


@dataclass(frozen=True)
class Limits:
    max_draft_length: int
    max_context: int
    vocab_size: int
    max_q_entries: int
    max_in_flight: int = 1          # Draft blocks in flight (send-ahead)
    max_generate_tokens: int = 0    # tokens per Generate; 0 = not served


@dataclass(frozen=True)
class OpenRequest:
    session_id: str
    model: str
    tokenizer_fingerprint: str
    context_ids: list[int]
    sampling: SamplingParams
    mode: int = 0
    q_codecs: tuple[str, ...] = ()  # coded q formats the edge can send, preferred first


@dataclass(frozen=True)
class Opened:
    session: Session
    load: float
    prefill_ms: float
    q_codec: str = ""  # the coded q format the session's Drafts may use; "" = none


@dataclass(frozen=True)
class DraftRequest:
    round: int
    start: int
    tokens: list[int]
    q: list[SparseDist]  # one per token when sampling; ignored for greedy
    q_coded: bytes = b""  # instead of q: the block's q coded with the session's q codec
    # Fast mode: tokens the edge emitted unverified since the last verdict; appended to the
    # context before the block (they are context, not candidates: never tested).
    unverified: tuple[int, ...] = ()
    # Send-ahead: built on the previous block being fully accepted with bonus `assumed_token`;
    # answered Discarded (not scored) when the verified context turned out otherwise.
    ahead: bool = False
    assumed_token: int = 0
    in_flight: int = 1  # blocks the edge has in flight with this one


@dataclass(frozen=True)
class GenerateRequest:
    round: int
    start: int
    max_tokens: int
    stop_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Timings:
    queue_ms: float
    forward_ms: float
    verify_ms: float
    batch_size: int


@dataclass(frozen=True)
class RoundResult:
    round: int
    verdict: Verdict
    context_length: int  # start + accepted + 1
    timings: Timings


@dataclass(frozen=True)
class EvictedNotice:
    session_id: str
    round: int


@dataclass(frozen=True)
class Discarded:
    """An `ahead` block whose assumed prefix the target rejected: not scored."""
    round: int
    context_length: int


@dataclass(frozen=True)
class GeneratedToken:
    token: int
    context_length: int
    done: bool
    timings: Timings
