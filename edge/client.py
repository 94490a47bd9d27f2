"""The edge session client: draft a block, send it, apply the verdict, roll the draft back.

One generation is one session with the verifier (protos/tandem/v1/decoding.proto, whose header
defines draft, block, round, verdict, accepted length, bonus token and verified). Per round:

1. the draft runtime's cache is synced to the context (prompt + every committed token) and the
   draft proposes a block of k tokens (greedy: argmax; sampling: a sample from the sparse,
   quantized q that travels with the block, so the verifier's acceptance uses the true q);
2. Draft(round, start = context length, tokens, q) goes up, a Verdict (accepted length n,
   bonus token) comes down;
3. draft[:n] + [bonus] is committed, and the next sync rolls the draft back to that prefix.

Server state is soft. On Evicted, or a broken link, the client re-opens with its full context
and redoes the round, losing nothing. If the verifier stays unreachable past a deadline, the
draft generates alone (those tokens have verified=False) and the client tries to re-open every
few tokens; verification resumes from the full context, unverified tokens included.
"""
from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import grpc

from edge.config import ClientConfig
from edge.drafting import Block, DraftCursor, TokenChooser
from edge.runtime.base import DraftRuntime
from edge.session_stream import (ClientError, CloudUnavailable, LinkDown, ProtocolError,
                                 SessionStream, VerifierRefused)
from tandem.codec import to_proto
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

__all__ = ["EdgeClient", "GenerationRequest", "GenerationResult", "block_length",
           "ClientError", "CloudUnavailable", "ProtocolError", "VerifierRefused"]

OnTokens = Callable[[list[int], list[bool]], None]


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    draft_length: int | None = None  # None = ClientConfig.draft_length
    # Generation stops right after emitting one of these (the stop id is part of the output).
    # Callers pass their tokenizer's eos (edge.tokenizer.EdgeTokenizer.stop_ids); empty = none.
    stop_ids: frozenset[int] = frozenset()


@dataclass
class GenerationResult:
    """What one generation produced and what it cost.

    bytes_up / bytes_down are the serialized sizes (protobuf ByteSize()) of every message sent /
    received, summed over all streams of the session (re-opens included); gRPC and HTTP/2
    framing are not counted. draft_bytes_up counts the Draft messages alone, drafted_tokens the
    tokens they carried, so draft_bytes_up / drafted_tokens is the uplink cost per drafted token.
    """
    token_ids: list[int] = field(default_factory=list)   # new tokens only
    verified: list[bool] = field(default_factory=list)   # per token: checked by the target
    rounds: int = 0                                       # Draft -> Verdict exchanges completed
    accepted_lengths: list[int] = field(default_factory=list)  # per round
    target_passes: int = 0                                # verdicts received
    drafted_tokens: int = 0                               # tokens sent in Draft blocks
    bytes_up: int = 0
    bytes_down: int = 0
    draft_bytes_up: int = 0
    wall_s: float = 0.0
    ttft_s: float = 0.0          # until the first token was committed
    finish_reason: str = ""      # "length" | "stop"
    reopens: int = 0             # Opens after the first (evictions, reconnects, back online)

    @property
    def mean_accepted_length(self) -> float:
        """τ = 1 + accepted / rounds (counts the bonus token; plain decoding has τ = 1)."""
        return 1.0 + sum(self.accepted_lengths) / self.rounds if self.rounds else 0.0

    @property
    def passes_per_token(self) -> float:
        return self.target_passes / len(self.token_ids) if self.token_ids else 0.0

    @property
    def uplink_bytes_per_drafted_token(self) -> float:
        return self.draft_bytes_up / self.drafted_tokens if self.drafted_tokens else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(mean_accepted_length=self.mean_accepted_length,
                   passes_per_token=self.passes_per_token,
                   uplink_bytes_per_drafted_token=self.uplink_bytes_per_drafted_token)
        return out


def block_length(draft_length: int, remaining: int, context_length: int, *,
                 max_draft_length: int | None = None, max_context: int | None = None) -> int | None:
    """How many tokens to draft this round, or None when no round fits (context full).

    A round emits up to k + 1 tokens (the bonus token), so k <= remaining - 1 never drafts past
    max_tokens; k = 0 makes the verdict's token the target's plain next token. The round takes
    the context to start + n + 1 <= start + k + 1, which must fit max_context. None = no limit.
    """
    assert remaining >= 1, "no tokens left to generate"
    k = min(draft_length, remaining - 1)
    if max_draft_length is not None:
        k = min(k, max_draft_length)
    if max_context is not None:
        room = max_context - context_length
        if room < 1:
            return None
        k = min(k, room - 1)
    return max(k, 0)


class EdgeClient:
    """Runs generations against one verifier over `channel` with one draft runtime.

    Not thread-safe: one generation at a time per client (the draft has one KV cache).
    """

    def __init__(self, channel: grpc.Channel, draft: DraftRuntime, config: ClientConfig,
                 metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.stub = pb_grpc.DecodingStub(channel)
        self.draft = draft
        self.config = config
        self.metadata = tuple(metadata)
        self.cursor = DraftCursor(draft)
        self.jitter_rng = random.Random()  # unseeded: edges must not retry in lockstep

    def generate(self, request: GenerationRequest,
                 on_tokens: OnTokens | None = None) -> GenerationResult:
        """Generate up to request.max_tokens new tokens; on_tokens(ids, verified) is called with
        every committed chunk as it is committed."""
        if not request.prompt_ids:
            raise ValueError("the prompt must hold at least one token")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")
        if request.draft_length is not None and request.draft_length < 0:
            raise ValueError(f"draft_length must be >= 0, got {request.draft_length}")
        return _Generation(self, request, on_tokens).run()


class _Generation:
    """The state of one generation and the round logic, in plain methods."""

    def __init__(self, client: EdgeClient, request: GenerationRequest,
                 on_tokens: OnTokens | None) -> None:
        self.client = client
        self.config = client.config
        self.request = request
        self.on_tokens = on_tokens
        self.draft_length = (self.config.draft_length if request.draft_length is None
                             else request.draft_length)
        self.chooser = TokenChooser(request.sampling, self.config.q_scale)
        self.session_id = uuid.uuid4().hex
        self.context = [int(t) for t in request.prompt_ids]
        self.result = GenerationResult()
        self.stream: SessionStream | None = None
        self.limits: pb.Limits | None = None
        self.opens = 0
        self.round = 0
        self.offline = False
        self.next_probe_at = 0  # while offline: re-open once this many tokens are committed
        self.t0 = 0.0

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> GenerationResult:
        self.t0 = time.monotonic()
        try:
            self.client.cursor.sync(self.context)  # prefill the draft while nothing else runs
            if not self._open_with_retries():
                self._go_offline()
            while not self.result.finish_reason:
                if self.offline:
                    self._offline_stretch()
                    continue
                remaining = self.request.max_tokens - len(self.result.token_ids)
                k = block_length(self.draft_length, remaining, len(self.context),
                                 max_draft_length=self.limits.max_draft_length
                                 if self.limits is not None else None,
                                 max_context=self.max_context)
                if k is None:
                    self.result.finish_reason = "length"  # no round fits the context
                    break
                block = self._draft(k)
                self._verify_round(block)
        finally:
            if self.stream is not None:
                self.result.bytes_up += self.stream.close("done")
                self.stream = None
            self.result.wall_s = time.monotonic() - self.t0
        self.result.reopens = max(self.opens - 1, 0)
        return self.result

    @property
    def max_context(self) -> int:
        """The longest context both sides can hold: the server's limit and the draft's cache."""
        n_ctx = self.client.draft.n_ctx
        if self.limits is not None and self.limits.max_context:
            return min(self.limits.max_context, n_ctx)
        return n_ctx

    def _draft(self, k: int) -> Block:
        vocab = self.client.draft.vocab_size
        max_entries = self.config.max_q_entries
        if self.limits is not None:
            vocab = min(vocab, self.limits.vocab_size or vocab)
            max_entries = min(max_entries, self.limits.max_q_entries or max_entries)
        return self.client.cursor.draft(self.context, k, self.chooser, vocab_size=vocab,
                                        max_entries=max_entries, stop_ids=self.request.stop_ids)

    def _verify_round(self, block: Block) -> None:
        """Get this block verified, re-opening as often as needed; commit it unverified when
        the verifier stays unreachable (or keeps evicting us, or keeps dropping the stream)."""
        evictions = broken = 0
        while True:
            if self.stream is None:
                # A second eviction in one round means the server is short of memory right
                # now: back off before asking again.
                given_up = (evictions > self.config.max_evictions_per_round
                            or broken > self.config.max_retries
                            or not self._open_with_retries(backoff_first=evictions > 1 or
                                                           broken > 0))
                if given_up:
                    self._commit(block.tokens, verified=False)
                    self._go_offline()
                    return
            try:
                verdict = self._exchange(block)
            except _Evicted:
                # Our state on the server is gone; the re-open carries the full context.
                evictions += 1
                self._drop_stream()
                continue
            except LinkDown:
                broken += 1
                self._drop_stream()
                continue
            self._apply(block, verdict)
            return

    def _offline_stretch(self) -> None:
        """Generate locally up to the next probe point, then try to re-open once."""
        remaining = self.request.max_tokens - len(self.result.token_ids)
        # The draft's cache must hold the context plus what it generates (the last one is fed
        # by the next sync).
        room = self.client.draft.n_ctx - len(self.context)
        if room < 1:
            self.result.finish_reason = "length"
            return
        n = min(max(self.next_probe_at - len(self.result.token_ids), 1), remaining, room)
        block = self._draft(n)
        self._commit(block.tokens, verified=False)
        if self.result.finish_reason:
            return
        self.next_probe_at = len(self.result.token_ids) + self.config.offline_probe_tokens
        if len(self.context) >= self.max_context:
            return  # no verifier round would fit this context: stay local
        try:
            self._open(self.config.open_timeout_s)
        except LinkDown:
            return
        except VerifierRefused as refused:
            if refused.code != grpc.StatusCode.OUT_OF_RANGE:
                raise
            self.next_probe_at = self.request.max_tokens  # the context outgrew the server
            return
        self.offline = False

    # ---- the wire -------------------------------------------------------------------------

    def _open_with_retries(self, backoff_first: bool = False) -> bool:
        """Open a stream with bounded retries, exponential backoff and jitter; False when the
        verifier stayed unreachable past the deadline (or the retries ran out)."""
        cfg = self.config
        deadline = time.monotonic() + cfg.offline_after_s
        delay = cfg.retry_initial_backoff_s
        if backoff_first:
            self._sleep(delay)
            delay = min(delay * cfg.retry_multiplier, cfg.retry_max_backoff_s)
        failures = 0
        while True:
            try:
                self._open(cfg.open_timeout_s)
                return True
            except LinkDown as error:
                failures += 1
                if failures > cfg.max_retries or time.monotonic() + delay > deadline:
                    if not cfg.offline_enabled:
                        raise CloudUnavailable(f"verifier unreachable after {failures} "
                                               f"attempts: {error}") from error
                    return False
            self._sleep(delay)
            delay = min(delay * cfg.retry_multiplier, cfg.retry_max_backoff_s)

    def _sleep(self, delay: float) -> None:
        jitter = self.config.retry_jitter
        time.sleep(max(delay * (1.0 + self.client.jitter_rng.uniform(-jitter, jitter)), 0.0))

    def _open(self, timeout_s: float) -> None:
        """A new stream, Open with the full context, wait for Opened. Raises LinkDown."""
        stream = SessionStream(self.client.stub, self.client.metadata)
        params = self.request.sampling
        message = pb.ClientMessage(open=pb.Open(
            session_id=self.session_id, model=self.config.target_model,
            tokenizer_fingerprint=self.client.draft.fingerprint(), context_ids=self.context,
            sampling=pb.SamplingParams(temperature=params.temperature, top_k=params.top_k,
                                       top_p=params.top_p, seed=params.seed),
            mode=pb.MODE_LOSSLESS))
        self.result.bytes_up += stream.send(message)
        try:
            reply = self._recv(stream, timeout_s)
        except (LinkDown, VerifierRefused):
            stream.abandon()
            raise
        kind = reply.WhichOneof("kind")
        if kind == "evicted":  # no room even to open: same as an unreachable verifier
            stream.abandon()
            raise LinkDown("evicted while opening")
        if kind != "opened":
            stream.abandon()
            raise ProtocolError(f"expected Opened, got {kind}")
        self.limits = reply.opened.limits if reply.opened.HasField("limits") else None
        self.stream = stream
        self.opens += 1

    def _exchange(self, block: Block) -> pb.Verdict:
        """Send the block, return its verdict. Raises _Evicted or LinkDown."""
        assert self.stream is not None
        self.round += 1
        start = len(self.context)
        draft = pb.Draft(round=self.round, start=start, tokens=block.tokens)
        for q in block.q:
            to_proto(q, draft.q.add())
        size = self.stream.send(pb.ClientMessage(draft=draft))
        self.result.bytes_up += size
        self.result.draft_bytes_up += size
        self.result.drafted_tokens += len(block)
        reply = self._recv(self.stream, self.config.round_timeout_s)
        kind = reply.WhichOneof("kind")
        if kind == "evicted":
            raise _Evicted()
        if kind != "verdict":
            raise ProtocolError(f"expected Verdict for round {self.round}, got {kind}")
        verdict = reply.verdict
        check_verdict(verdict, self.round, start, len(block), self.limits)
        return verdict

    def _recv(self, stream: SessionStream, timeout_s: float) -> pb.ServerMessage:
        reply = stream.recv(timeout_s)
        self.result.bytes_down += reply.ByteSize()
        return reply

    def _drop_stream(self) -> None:
        if self.stream is not None:
            self.stream.abandon()
            self.stream = None

    def _go_offline(self) -> None:
        self._drop_stream()
        self.offline = True
        self.next_probe_at = len(self.result.token_ids) + self.config.offline_probe_tokens

    # ---- committing -----------------------------------------------------------------------

    def _apply(self, block: Block, verdict: pb.Verdict) -> None:
        n = verdict.accepted
        self.result.rounds += 1
        self.result.target_passes += 1
        self.result.accepted_lengths.append(n)
        self._commit(block.tokens[:n] + [int(verdict.token)], verified=True)

    def _commit(self, tokens: list[int], verified: bool) -> None:
        """Append tokens to the output, cut at max_tokens and right after a stop id."""
        tokens, reason = truncate(tokens, self.request.max_tokens - len(self.result.token_ids),
                                  self.request.stop_ids)
        if not tokens:
            return
        if not self.result.token_ids:
            self.result.ttft_s = time.monotonic() - self.t0
        self.result.token_ids.extend(tokens)
        self.result.verified.extend([verified] * len(tokens))
        self.context.extend(tokens)
        self.result.finish_reason = reason
        if self.on_tokens is not None:
            self.on_tokens(list(tokens), [verified] * len(tokens))


class _Evicted(Exception):
    """The verifier dropped this session's state during the round."""


def truncate(tokens: list[int], room: int, stop_ids: frozenset[int]) -> tuple[list[int], str]:
    """Cut tokens to at most `room` and right after the first stop id; return them and the
    finish reason they cause ("stop", "length", or "" to go on)."""
    for i, token in enumerate(tokens[:room]):
        if token in stop_ids:
            return tokens[: i + 1], "stop"
    tokens = tokens[:room]
    return tokens, ("length" if len(tokens) >= room else "")


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
    if limits is not None and limits.vocab_size and verdict.token >= limits.vocab_size:
        raise ProtocolError(f"bonus token {verdict.token} outside the vocabulary")
