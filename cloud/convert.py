"""The verifier's wire messages and the engine's requests and results, converted both ways
(tandem.v1 protos <-> cloud.engine dataclasses). Sizes are bounded here, before anything of a
message is converted or looked at; what the values mean (contexts, limits, sampling the backend
can score) the engine checks."""
from __future__ import annotations

import math

from cloud.engine import Verifier
from cloud.engine_api import (Discarded, DraftRequest, EvictedNotice, GeneratedToken,
                              GenerateRequest, Limits, OpenRequest, RoundResult)
from cloud.errors import InvalidRequest
from cloud.identity import TargetIdentity
from cloud.token_cost import CLOUD, SPECULATE
from tandem.codec import from_proto
from tandem.qcodec import MAX_CODED_BYTES_PER_TOKEN
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb

MAX_NAME_CHARS = 256   # session_id, model, tokenizer_fingerprint, close reason
MAX_Q_CODECS = 16      # names in Open.q_codecs


# ---- edge -> engine ---------------------------------------------------------------------------

def open_request(message: pb.Open, vocab_size: int) -> OpenRequest:
    _check_open_sizes(message)
    return OpenRequest(
        session_id=message.session_id, model=message.model,
        tokenizer_fingerprint=message.tokenizer_fingerprint,
        context_ids=list(message.context_ids), sampling=sampling(message.sampling, vocab_size),
        mode=int(message.mode), q_codecs=tuple(message.q_codecs))


def _check_open_sizes(message: pb.Open) -> None:
    """Refuse oversized fields before any of them is converted or looked at (the context's
    length against max_context is the engine's check)."""
    for name in ("session_id", "model", "tokenizer_fingerprint"):
        if len(getattr(message, name)) > MAX_NAME_CHARS:
            raise InvalidRequest(f"Open.{name} is longer than {MAX_NAME_CHARS} characters")
    if len(message.q_codecs) > MAX_Q_CODECS or any(len(c) > MAX_NAME_CHARS
                                                   for c in message.q_codecs):
        raise InvalidRequest(f"Open.q_codecs: at most {MAX_Q_CODECS} names of at most "
                             f"{MAX_NAME_CHARS} characters")


def check_draft_sizes(message: pb.Draft, limits: Limits) -> None:
    """Refuse an oversized block before its tokens are counted against the key's rate or any
    of it is converted."""
    for name, n in (("tokens", len(message.tokens)), ("q", len(message.q))):
        if n > limits.max_draft_length:
            raise InvalidRequest(f"block of {n} {name} exceeds max_draft_length "
                                 f"{limits.max_draft_length}")
    if len(message.q_coded) > MAX_CODED_BYTES_PER_TOKEN * (len(message.tokens) + 1):
        raise InvalidRequest(f"Draft.q_coded of {len(message.q_coded)} bytes for "
                             f"{len(message.tokens)} tokens: more than any coded q needs")
    for i, dist in enumerate(message.q):
        if len(dist.ids) > limits.max_q_entries or len(dist.weights) > limits.max_q_entries:
            raise InvalidRequest(f"q at block position {i} lists {len(dist.ids)} ids and "
                                 f"{len(dist.weights)} weights, limit is {limits.max_q_entries}")


def draft_request(message: pb.Draft) -> DraftRequest:
    """A Draft whose sizes check_draft_sizes passed."""
    return DraftRequest(
        round=message.round, start=message.start, tokens=list(message.tokens),
        q=[from_proto(dist) for dist in message.q], q_coded=message.q_coded,
        unverified=tuple(message.unverified),
        ahead=message.ahead, assumed_token=message.assumed_token,
        in_flight=max(message.in_flight, 1))


def generate_request(message: pb.Generate) -> GenerateRequest:
    return GenerateRequest(round=message.round, start=message.start,
                           max_tokens=message.max_tokens, stop_ids=frozenset(message.stop_ids))


def sampling(message: pb.SamplingParams, vocab_size: int) -> SamplingParams:
    if not (math.isfinite(message.temperature) and math.isfinite(message.top_p)):
        raise InvalidRequest("sampling temperature and top_p must be finite")
    if not 0.0 <= message.top_p <= 1.0:
        raise InvalidRequest(f"sampling top_p must be in [0, 1] (0 = off), got {message.top_p:g}")
    if message.top_k > vocab_size:
        raise InvalidRequest(f"sampling top_k {message.top_k} exceeds the vocabulary "
                             f"({vocab_size}; 0 = off)")
    try:
        # The proto's top_p = 0 means "off", as does 1.
        return SamplingParams(temperature=message.temperature, top_k=message.top_k,
                              top_p=message.top_p if message.top_p > 0 else 1.0, seed=message.seed)
    except ValueError as exc:
        raise InvalidRequest(f"sampling: {exc}") from exc


# ---- engine -> edge ---------------------------------------------------------------------------

def verdict_message(result: RoundResult | Discarded, price: float) -> pb.ServerMessage:
    if isinstance(result, Discarded):
        return pb.ServerMessage(verdict=pb.Verdict(
            round=result.round, discarded=True, context_length=result.context_length,
            price=price))
    timings = result.timings
    return pb.ServerMessage(verdict=pb.Verdict(
        round=result.round, accepted=result.verdict.accepted, token=result.verdict.token,
        context_length=result.context_length,
        timings=pb.Timings(queue_ms=timings.queue_ms, forward_ms=timings.forward_ms,
                           verify_ms=timings.verify_ms, batch_size=timings.batch_size),
        price=price))


def generated_message(round_: int, item: GeneratedToken, price: float) -> pb.ServerMessage:
    t = item.timings
    return pb.ServerMessage(generated=pb.Generated(
        round=round_, token=item.token, context_length=item.context_length,
        done=item.done, timings=pb.Timings(queue_ms=t.queue_ms, forward_ms=t.forward_ms,
                                           batch_size=t.batch_size),
        price=price))


def evicted_message(notice: EvictedNotice) -> pb.ServerMessage:
    return pb.ServerMessage(evicted=pb.Evicted(session_id=notice.session_id, round=notice.round))


def limits_message(limits: Limits) -> pb.Limits:
    return pb.Limits(max_draft_length=limits.max_draft_length, max_context=limits.max_context,
                     vocab_size=limits.vocab_size, max_q_entries=limits.max_q_entries,
                     max_in_flight=limits.max_in_flight,
                     max_generate_tokens=limits.max_generate_tokens)


def identity_message(identity: TargetIdentity) -> pb.TargetIdentity:
    return pb.TargetIdentity(name=identity.name, weights_digest=identity.weights_digest,
                             tokenizer_fingerprint=identity.tokenizer_fingerprint,
                             digest=identity.digest)


def batch_stats_message(engine: Verifier) -> pb.BatchStats:
    # A copy: the batcher thread adds to it. The vLLM backend has no batcher (vLLM batches).
    counts = dict(engine.batcher.size_counts) if engine.batcher is not None else {}
    largest = max(counts, default=0)
    (speculate_ms, speculate_tokens), (cloud_ms, cloud_tokens) = (
        engine.token_costs.totals(SPECULATE), engine.token_costs.totals(CLOUD))
    return pb.BatchStats(passes=sum(counts.values()),
                         rounds=sum(size * n for size, n in counts.items()), largest=largest,
                         size_counts=[counts.get(size, 0) for size in range(1, largest + 1)],
                         speculate_ms=speculate_ms, speculate_tokens=speculate_tokens,
                         cloud_ms=cloud_ms, cloud_tokens=cloud_tokens)
