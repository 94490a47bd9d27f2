"""`VerifierLink`, one generation's session with the verifier (open, send a block without
waiting, await its verdict, byte counting, error classes), and the WaitRule of every wait.

Error classes the round loop tells apart:
  LinkDown (edge.link.stream)     outage: the stream broke or timed out -> reconnect / offline
  Evicted                         overload: the server dropped our state -> re-open
  VerifierRefused                 configuration / identity (bad key, fingerprint, request):
                                  retrying cannot help -> raised to the caller
  Stopped                         the caller stopped the generation while the link waited
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from edge.caps import verifier_vocab
from edge.link.errors import IdentityMismatch, check_identity
from edge.link.stream import (LinkDown, LinkSilent, ProtocolError, RecvTimeout, SessionStream,
                              VerifierMisconfigured)
from tandem.codec import InvalidDistribution, to_proto
from tandem.qcodec import QCodec
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from edge.drafting import Block


# A stop event is checked this often while waiting on the verifier: the wait ends within this
# much of a stop (a threading.Event cannot wake a queue wait by itself).
STOP_POLL_S = 0.01


@dataclass(frozen=True)
class WaitRule:
    """The one deadline rule of every wait on the verifier: for Opened, a verdict (sequential or
    pipelined round) or a generated token (cloud-generates round).

    - Late is not down. Past `late_s` (the caller's, from the measured RTT and the verifier's
      reported time: edge/link/offline.py) the reply is late: the link starts asking the
      verifier for Info on the same channel every `probe_every_s`, and keeps waiting. A late
      reply is used like any other; slowness alone never makes a generation go local.
    - Down only on transport evidence: the call fails (connect failure, reset, an HTTP/2
      keepalive ping unanswered: gRPC ends the call with UNAVAILABLE), or nothing came from the
      verifier, neither on the stream nor as an answer to a probe, for `stall_s` (a stalled
      process or a dead path that TCP has not noticed yet) — or for late_s, when the link's
      own measured pace makes that longer (probing then starts at half of it).
    - `cap_s`: a reply still missing this long although the verifier answers its probes fails
      the round (alive, but not answering this stream); the loop re-opens.
    """
    stall_s: float = 3.0
    cap_s: float = 30.0
    probe_every_s: float = 0.25

    def recv(self, stream: SessionStream, late_s: float, cap_s: float | None = None, *,
             should_stop: Callable[[], bool],
             probe: Callable[[float], grpc.Future]) -> pb.ServerMessage:
        """The next message on `stream`, waited for under this rule: late after late_s, then
        `probe(stall_s)` (an Info call) every probe_every_s; down after stall_s without a sign
        of life, failed after cap_s (default: this rule's). Raises LinkDown (the stream
        abandoned), Stopped when should_stop() turns true."""
        cap_s = self.cap_s if cap_s is None else cap_s
        # A link whose measured RTT makes replies late only after stall_s (a slow, far link)
        # gets as long as late_s without a sign of life, and is probed from half of it.
        stall_s = max(self.stall_s, late_s)
        started = time.monotonic()
        heard = started              # the last sign of life: the send, or a probe answered
        next_probe = started + min(late_s, stall_s / 2)
        asked: grpc.Future | None = None
        try:
            while True:
                if should_stop():
                    raise Stopped()
                try:
                    return stream.recv(STOP_POLL_S, cancel_on_timeout=False)
                except RecvTimeout:
                    pass
                now = time.monotonic()
                if asked is not None and asked.done():
                    if _answered(asked):
                        heard = now
                    asked, next_probe = None, now + self.probe_every_s
                if asked is None and now >= next_probe:
                    asked = probe(stall_s)
                if now - heard >= stall_s:
                    stream.abandon()
                    raise LinkSilent(f"no answer from the verifier, on the stream or to a "
                                     f"probe, for {stall_s:.3g} s")
                if now - started >= cap_s:
                    stream.abandon()
                    raise LinkDown(f"no reply on the stream within {cap_s:.3g} s although the "
                                   "verifier answers probes")
        finally:
            if asked is not None:
                asked.cancel()


# Probe answers that mean "nobody answered": anything else (even a refusal) came from the verifier.
_SILENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                           grpc.StatusCode.CANCELLED})


def _answered(probe: grpc.Future) -> bool:
    """A finished Info probe: did the verifier answer it (successfully or not)?"""
    error = probe.exception()
    return error is None or getattr(error, "code", lambda: None)() not in _SILENT_CODES


class Evicted(Exception):
    """The verifier dropped this session's state during the round (overload)."""


class Stopped(Exception):
    """The caller stopped the generation (stop event) while the link was waiting."""


@dataclass
class Sent:
    """A block on its way: what the verdict must match, and when it left."""
    round: int
    start: int
    k: int
    bytes_up: int
    t_sent: float
    send_s: float


class VerifierLink:
    """Open / send a block without waiting / await its verdict, with byte counting.

    One link per generation; it may hold several streams in turn (re-opens). Not thread-safe.
    """

    def __init__(self, stub: pb_grpc.DecodingStub, metadata: Sequence[tuple[str, str]], *,
                 session_id: str, target_model: str, fingerprint: str, sampling: SamplingParams,
                 should_stop: Callable[[], bool] = lambda: False, fast: bool = False,
                 pinned_digest: str = "", offered_codec: QCodec | None = None) -> None:
        self.stub = stub
        self.metadata = tuple(metadata)
        self.session_id = session_id
        self.target_model = target_model
        self.fingerprint = fingerprint
        self.sampling = sampling
        self.should_stop = should_stop
        self.fast = fast             # open in MODE_FAST: blocks may carry unverified tokens
        # The coded q format this edge offers (Open.q_codecs), and the one the open stream
        # negotiated (Opened.q_codec; None: plain SparseDistribution messages).
        self.offered_codec = offered_codec
        self.q_codec: QCodec | None = None
        self.q_encode_s = 0.0        # time spent coding q (Draft.q_coded)
        # Target identity (edge/link/errors.check_identity): every open and re-open must meet
        # the pinned digest (if any) and the one the generation's first open saw.
        self.pinned_digest = pinned_digest
        self.seen_digest: str | None = None
        self.open_rtt_s: float | None = None
        # How long a wait may go on (set by the loop from the client config: WaitRule).
        self.wait_rule = WaitRule()
        self.prefill_s = 0.0
        # Context length the verifier holds (set by Opened and each verdict): in fast mode the
        # edge's context runs ahead of it by the tokens it emitted unverified since.
        self.server_context = 0
        self.stream: SessionStream | None = None
        self.limits: pb.Limits | None = None
        self.load = 0.0
        self.opens = 0
        self.wire_round = 0          # Draft.round of the last block sent
        self.bytes_up = 0            # every message, every stream
        self.bytes_down = 0
        self.draft_bytes_up = 0      # Draft messages only
        self.drafted_tokens = 0      # tokens in Draft messages (re-sends included)

    @property
    def is_open(self) -> bool:
        return self.stream is not None

    def open(self, context: Sequence[int], late_s: float, cap_s: float | None = None) -> None:
        """A new stream, Open with the full context, wait for Opened (late after late_s, at most
        cap_s: WaitRule). Raises LinkDown (also when evicted while opening: no room even to
        open), VerifierRefused, Stopped."""
        self.drop()
        stream = SessionStream(self.stub, self.metadata)
        params = self.sampling
        message = pb.ClientMessage(open=pb.Open(
            session_id=self.session_id, model=self.target_model,
            tokenizer_fingerprint=self.fingerprint, context_ids=list(context),
            sampling=pb.SamplingParams(temperature=params.temperature, top_k=params.top_k,
                                       top_p=params.top_p, seed=params.seed),
            mode=pb.MODE_FAST if self.fast else pb.MODE_LOSSLESS,
            q_codecs=[self.offered_codec.name]  # greedy sends no q: nothing to offer
            if self.offered_codec is not None and not params.greedy else []))
        t_open = time.monotonic()
        self.bytes_up += stream.send(message)
        try:
            reply = self._recv(stream, late_s, cap_s)
        except BaseException:
            stream.abandon()
            raise
        kind = reply.WhichOneof("kind")
        if kind == "evicted":
            stream.abandon()
            raise LinkDown("evicted while opening")
        if kind != "opened":
            stream.abandon()
            raise ProtocolError(f"expected Opened, got {kind}")
        target = reply.opened.target if reply.opened.HasField("target") else None
        try:
            check_identity(target, self.pinned_digest, self.seen_digest)
        except IdentityMismatch as mismatch:
            stream.abandon()
            raise VerifierMisconfigured(str(mismatch)) from None
        if target is not None and target.digest:
            self.seen_digest = target.digest
        self.limits = reply.opened.limits if reply.opened.HasField("limits") else None
        # An older verifier says nothing (plain q); one naming a format not offered is ignored.
        offered = self.offered_codec
        self.q_codec = offered if offered is not None and reply.opened.q_codec == offered.name \
            else None
        self.load = reply.opened.load
        # The Open's round trip and the server's share of it (the offline policy's first RTT).
        self.open_rtt_s = time.monotonic() - t_open
        self.prefill_s = reply.opened.prefill_ms / 1000.0
        self.stream = stream
        self.server_context = len(context)
        self.opens += 1

    def send(self, start: int, block: "Block", unverified: Sequence[int] = (), *,
             ahead: bool = False, assumed_token: int = 0, in_flight: int = 1) -> Sent:
        """Queue Draft(round, start, block) on the open stream; returns at once. `unverified`
        (fast mode): tokens emitted since the verifier's context, sent ahead of the block; the
        block then starts at start + len(unverified). `ahead` (send-ahead, edge/rounds/pipelined.py):
        the block assumes the one before it is accepted whole with bonus `assumed_token`;
        `in_flight` counts the blocks in flight with this one."""
        assert self.stream is not None, "send on a closed link"
        assert not unverified or self.fast, "unverified tokens on a lossless session"
        t0 = time.monotonic()
        self.wire_round += 1
        draft = pb.Draft(round=self.wire_round, start=start, tokens=block.tokens,
                         unverified=unverified)
        if ahead or in_flight > 1:  # unset on plain rounds: an older verifier reads them the same
            draft.ahead, draft.assumed_token, draft.in_flight = ahead, assumed_token, in_flight
        start += len(unverified)
        self._add_q(draft, block)
        size = self.stream.send(pb.ClientMessage(draft=draft))
        self.bytes_up += size
        self.draft_bytes_up += size
        self.drafted_tokens += len(block)
        t1 = time.monotonic()
        return Sent(round=self.wire_round, start=start, k=len(block), bytes_up=size,
                    t_sent=t1, send_s=t1 - t0)

    def _add_q(self, draft: pb.Draft, block: Block) -> None:
        """The block's q: coded in one byte string when the session negotiated a format and
        every q is on its grid (a block drafted before a re-open may not be), else plain."""
        if self.q_codec is not None and block.q:
            t0 = time.perf_counter()
            try:
                draft.q_coded = self.q_codec.encode(block.tokens, block.q)
            except InvalidDistribution:
                pass  # drafted for another format (before a re-open): sent plain below
            finally:
                self.q_encode_s += time.perf_counter() - t0
            if draft.q_coded:
                return
        for q in block.q:
            to_proto(q, draft.q.add())

    def await_verdict(self, sent: Sent, late_s: float,
                      allow_discarded: bool = False) -> tuple[pb.Verdict, int]:
        """The verdict of `sent` (late after late_s: WaitRule) and its serialized size. Raises
        Evicted, LinkDown, Stopped, VerifierRefused, ProtocolError. A discarded verdict
        (send-ahead) only when allowed."""
        assert self.stream is not None, "await on a closed link"
        reply = self._recv(self.stream, late_s)
        kind = reply.WhichOneof("kind")
        if kind == "evicted":
            raise Evicted()
        if kind != "verdict":
            raise ProtocolError(f"expected Verdict for round {sent.round}, got {kind}")
        if reply.verdict.discarded:
            if not allow_discarded or reply.verdict.round != sent.round:
                raise ProtocolError(f"unexpected discarded verdict for round "
                                    f"{reply.verdict.round} (awaiting {sent.round})")
            return reply.verdict, reply.ByteSize()
        check_verdict(reply.verdict, sent.round, sent.start, sent.k, self.limits)
        self.server_context = sent.start + reply.verdict.accepted + 1
        return reply.verdict, reply.ByteSize()

    def send_generate(self, start: int, max_tokens: int, stop_ids: Sequence[int]) -> Sent:
        """Queue Generate (cloud-generates) on the open stream; returns at once."""
        assert self.stream is not None, "send on a closed link"
        t0 = time.monotonic()
        self.wire_round += 1
        size = self.stream.send(pb.ClientMessage(generate=pb.Generate(
            round=self.wire_round, start=start, max_tokens=max_tokens, stop_ids=stop_ids)))
        self.bytes_up += size
        t1 = time.monotonic()
        return Sent(round=self.wire_round, start=start, k=0, bytes_up=size, t_sent=t1,
                    send_s=t1 - t0)

    def await_generated(self, sent: Sent, late_s: float) -> tuple[pb.Generated, int]:
        """The next token of a Generate (late after late_s: WaitRule) and its serialized size.
        Raises Evicted, LinkDown, Stopped, VerifierRefused, ProtocolError."""
        assert self.stream is not None, "await on a closed link"
        reply = self._recv(self.stream, late_s)
        kind = reply.WhichOneof("kind")
        if kind == "evicted":
            raise Evicted()
        if kind != "generated" or reply.generated.round != sent.round:
            raise ProtocolError(f"expected Generated for round {sent.round}, got {kind}")
        generated = reply.generated
        vocab = verifier_vocab(self.limits)
        if vocab and generated.token >= vocab:
            raise ProtocolError(f"generated token {generated.token} outside the vocabulary")
        self.server_context = generated.context_length
        return generated, reply.ByteSize()

    def _recv(self, stream: SessionStream, late_s: float,
              cap_s: float | None = None) -> pb.ServerMessage:
        """The next message on `stream`, waited for under the WaitRule."""
        reply = self.wait_rule.recv(stream, late_s, cap_s, should_stop=self.should_stop,
                                    probe=self._probe)
        self.bytes_down += reply.ByteSize()
        return reply

    def _probe(self, timeout_s: float) -> grpc.Future:
        """Ask the verifier for Info on the link's channel (is it there?)."""
        return self.stub.Info.future(pb.InfoRequest(), metadata=self.metadata, timeout=timeout_s)

    def drop(self) -> None:
        """Abandon the stream (broken, evicted, or stopped) without waiting for the server."""
        if self.stream is not None:
            self.stream.abandon()
            self.stream = None

    def close(self, reason: str = "done") -> None:
        if self.stream is not None:
            self.bytes_up += self.stream.close(reason)
            self.stream = None


def check_verdict(verdict: pb.Verdict, round_: int, start: int, k: int,
                  limits: pb.Limits | None) -> None:
    """A verdict must answer this round, accept at most the block, and name a real token."""
    if verdict.round != round_:
        raise ProtocolError(f"verdict for round {verdict.round}, expected {round_}")
    if verdict.accepted > k:
        raise ProtocolError(f"accepted {verdict.accepted} of a {k}-token block")
    if verdict.context_length and verdict.context_length != start + verdict.accepted + 1:
        raise ProtocolError(f"verdict context length {verdict.context_length}, expected "
                            f"{start + verdict.accepted + 1}")
    vocab = verifier_vocab(limits)
    if vocab and verdict.token >= vocab:
        raise ProtocolError(f"bonus token {verdict.token} outside the vocabulary")
