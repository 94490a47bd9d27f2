"""The verifier's limits and hostile input, on a real gRPC server over loopback.

- a bounded fuzz (hypothesis over raw bytes, and over mutated valid messages) of the Session
  stream: every call ends with a clear status, never INTERNAL or a logged traceback, and a
  bystander session keeps being served throughout;
- a property test of the message handling itself (arbitrary field values in Open / Draft /
  Close): each message is answered or refused with a CloudError, nothing else escapes, and no
  session is left behind;
- the Open deadline and the idle timeout free the workers that silent streams hold, and Info
  answers while every stream slot is taken;
- streams per API key and draft tokens per second per key;
- a message larger than max_message_bytes and oversized fields are refused before any work;
- number ranges (top_p, top_k, round) and the target's identity in Info and Opened.
"""
from __future__ import annotations

import contextlib
import logging
import threading

import grpc
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_stream import Stream
from verifier_harness import _target_runtime

from cloud.admission import RETRY_AFTER_HEADER, Admission
from cloud.config import CloudConfig
from cloud.engine import Verifier
from cloud.errors import CloudError
from cloud.identity import identify
from cloud.runtime.target import TargetRuntime
from cloud.server import create_server
from cloud.service import _Stream
from tandem.codec import SparseDist
from tandem.qcodec import codec_for
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

TIMEOUT = 30
LIMITS = {"max_draft_length": 8, "max_context": 64, "max_q_entries": 16}
# Every status a refusal may carry; INTERNAL and UNKNOWN would mean the verifier broke.
CLEAR_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
               grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE,
               grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture(scope="module")
def runtime(target_dir) -> TargetRuntime:
    torch.set_num_threads(1)
    return _target_runtime(target_dir)


@contextlib.contextmanager
def serving(runtime: TargetRuntime, **sections):
    raw = {"server": {"host": "127.0.0.1", "port": 0, "shutdown_grace_s": 0.5},
           "limits": dict(LIMITS), "batch": {"window_ms": 0}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    server, port = create_server(CloudConfig.model_validate(raw), runtime=runtime)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield server, channel
    finally:
        channel.close()
        server.stop(0.5).wait(10)


def _open(runtime: TargetRuntime, context: list[int], **sampling) -> pb.ClientMessage:
    return pb.ClientMessage(open=pb.Open(
        session_id="t", tokenizer_fingerprint=runtime.fingerprint, context_ids=context,
        sampling=pb.SamplingParams(**sampling)))


def _draft(round_: int, start: int, tokens: list[int]) -> pb.ClientMessage:
    return pb.ClientMessage(draft=pb.Draft(round=round_, start=start, tokens=tokens))


class Bystander:
    """A greedy session that must keep being served while others misbehave."""

    def __init__(self, channel: grpc.Channel, runtime: TargetRuntime) -> None:
        self.stream = Stream(channel)
        self.context = [5, 6, 7]
        self.round = 0
        assert self.stream.send(_open(runtime, self.context)).HasField("opened")

    def step(self) -> None:
        self.round += 1
        if len(self.context) + 2 > LIMITS["max_context"]:
            return
        verdict = self.stream.send(_draft(self.round, len(self.context), [])).verdict
        self.context.append(verdict.token)
        assert verdict.context_length == len(self.context)


# --- fuzz: raw bytes and mutated messages ----------------------------------------------------
def _valid_messages(runtime: TargetRuntime) -> list[bytes]:
    sampling = pb.SamplingParams(temperature=0.8, top_k=20, seed=3)
    q = pb.SparseDistribution(ids=[1, 2, 3], weights=[5, 2, 1])
    codec = codec_for(runtime.fingerprint, runtime.vocab_size)
    coded = codec.encode([1, 2], [SparseDist(np.array([1, 3, 2]), np.array([1023, 525, 99])),
                                  SparseDist(np.array([2]), np.array([1023]))])
    return [m.SerializeToString() for m in (
        _open(runtime, [1, 2, 3, 4]),
        pb.ClientMessage(open=pb.Open(tokenizer_fingerprint=runtime.fingerprint,
                                      context_ids=[9, 8], sampling=sampling)),
        pb.ClientMessage(open=pb.Open(tokenizer_fingerprint=runtime.fingerprint,
                                      context_ids=[1, 2, 3, 4], sampling=sampling,
                                      q_codecs=[codec.name])),
        pb.ClientMessage(draft=pb.Draft(round=1, start=4, tokens=[1, 2], q=[q, q])),
        pb.ClientMessage(draft=pb.Draft(round=1, start=4, tokens=[1, 2], q_coded=coded)),
        pb.ClientMessage(close=pb.Close(reason="x")))]


@st.composite
def hostile_streams(draw, valid: list[bytes]) -> list[bytes]:
    """1-3 messages: random bytes, or a valid message with bytes flipped, cut or appended."""
    messages = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            messages.append(draw(st.binary(max_size=64)))
            continue
        data = bytearray(draw(st.sampled_from(valid)))
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, max(len(data) - 1, 0)))
            action = draw(st.sampled_from(["flip", "cut", "append"]))
            if action == "flip" and data:
                data[at] ^= draw(st.integers(1, 255))
            elif action == "cut":
                data = data[:at]
            else:
                data += draw(st.binary(min_size=1, max_size=8))
        messages.append(bytes(data))
    return messages


def test_fuzzed_bytes_get_clear_statuses_and_leave_other_sessions_alone(runtime, caplog):
    caplog.set_level(logging.ERROR, logger="cloud.service")
    codes: dict[grpc.StatusCode, int] = {}
    with serving(runtime) as (server, channel):
        bystander = Bystander(channel, runtime)
        valid = _valid_messages(runtime)

        @settings(max_examples=200, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(messages=hostile_streams(valid))
        def fuzz(messages):
            stream = Stream(channel)
            for data in messages:
                stream._requests.put(data)
            code = stream.end()
            codes[code] = codes.get(code, 0) + 1
            assert code in CLEAR_CODES, f"{code}: {stream.call.details()}"
            bystander.step()

        fuzz()
        assert server.engine.table.active == 1  # only the bystander is left
    print("fuzzed streams by final status:", {code.name: n for code, n in codes.items()})
    assert grpc.StatusCode.INVALID_ARGUMENT in codes
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


# --- property: the message handling itself -----------------------------------------------------
def _messages(vocab: int, fingerprint: str, opening: bool = False, q_codec: str = ""):
    """Mostly well-formed messages (so sessions open and rounds run), each field sometimes
    hostile: out-of-range ids, NaN/inf/negative numbers, 2^32 - 1, oversized lists, coded q
    bytes (Draft.q_coded) on sessions that did and did not negotiate the format."""
    big = st.integers(0, 2**32 - 1)
    codecs = st.lists(st.sampled_from([q_codec, q_codec, "ans1:0:0", "x" * 300]), max_size=2)
    good_token = st.integers(0, vocab - 1)
    ids = st.one_of(st.lists(good_token, max_size=80), st.lists(good_token, max_size=80),
                    st.lists(st.one_of(good_token, st.sampled_from([vocab, 2**32 - 1])),
                             max_size=80))
    number = st.one_of(st.just(0.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0),
                       st.floats(allow_nan=True, allow_infinity=True, width=32),
                       st.sampled_from([-1.0, 1.5]))
    sampling = st.builds(pb.SamplingParams, temperature=number, top_k=st.one_of(
        st.integers(0, 64), st.integers(0, 64), big), top_p=number,
        seed=st.integers(0, 2**64 - 1))
    hostile_open = st.builds(pb.Open, session_id=st.text(max_size=8),
                             model=st.sampled_from(["", "", "x"]),
                             tokenizer_fingerprint=st.sampled_from([fingerprint] * 4 + ["s:0"]),
                             context_ids=ids, sampling=sampling,
                             mode=st.sampled_from([0, 1, 1, 2, 3]), q_codecs=codecs)
    valid_sampling = st.builds(pb.SamplingParams, temperature=st.sampled_from([0.0, 0.0, 0.8]),
                               top_k=st.integers(0, 64), top_p=st.floats(0.0, 1.0),
                               seed=st.integers(0, 2**64 - 1))
    valid_open = st.builds(pb.Open, session_id=st.text(max_size=8), tokenizer_fingerprint=st.just(
        fingerprint), context_ids=st.lists(good_token, min_size=1, max_size=40),
        sampling=valid_sampling, mode=st.just(1), q_codecs=codecs)
    open_ = st.one_of(valid_open, valid_open, hostile_open)
    dist = st.builds(pb.SparseDistribution, ids=st.lists(good_token, max_size=20),
                     weights=st.lists(st.one_of(st.integers(1, 1000), big), max_size=20))
    # round / start 0 are replaced by the session's next round and context length (below),
    # so most blocks reach the verification; other values test the checks.
    draft = st.builds(pb.Draft, round=st.one_of(st.just(0), st.just(0), big),
                      start=st.one_of(st.just(0), st.just(0), st.integers(1, 70), big),
                      tokens=st.lists(good_token, max_size=10),
                      q=st.one_of(st.just([]), st.just([]), st.lists(dist, max_size=10)),
                      q_coded=st.one_of(st.just(b""), st.just(b""), st.binary(max_size=48)))
    close = st.builds(pb.Close, reason=st.text(max_size=8))
    if opening:
        # Sequences that start with a well-formed Open and go on with well-formed greedy blocks
        # (round / start filled in by the caller), so some examples always reach a verdict
        # however the derandomized examples fall.
        greedy_open = st.builds(pb.Open, session_id=st.text(max_size=8),
                                tokenizer_fingerprint=st.just(fingerprint),
                                context_ids=st.lists(good_token, min_size=1, max_size=40),
                                mode=st.just(1))
        block = st.builds(pb.Draft, round=st.just(0), start=st.just(0),
                          tokens=st.lists(good_token, max_size=8))
        return st.builds(lambda first, rest: [first, *rest],
                         st.builds(pb.ClientMessage, open=greedy_open),
                         st.lists(st.builds(pb.ClientMessage, draft=block), min_size=1,
                                  max_size=3))
    return st.one_of(st.builds(pb.ClientMessage, open=open_),
                     st.builds(pb.ClientMessage, draft=draft),
                     st.builds(pb.ClientMessage, draft=draft),
                     st.builds(pb.ClientMessage, close=close), st.just(pb.ClientMessage()))


def test_any_message_is_answered_or_refused_with_a_cloud_error(runtime):
    config = CloudConfig.model_validate({"limits": LIMITS, "batch": {"window_ms": 0}})
    engine = Verifier(runtime, config.limits, config.batch)
    admission = Admission(max_streams=4)
    outcomes: dict[str, int] = {}
    try:
        hostile = st.lists(_messages(runtime.vocab_size, runtime.fingerprint,
                                     q_codec=engine.q_codec.name), min_size=1, max_size=4)
        well_formed = _messages(runtime.vocab_size, runtime.fingerprint, opening=True)

        @settings(max_examples=150, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(messages=st.one_of(hostile, hostile, well_formed))
        def handle(messages):
            admission.enter("")
            stream = _Stream(engine, admission, "")
            try:
                for message in messages:
                    session = stream.session
                    if message.HasField("draft") and session is not None:
                        if message.draft.round == 0:
                            message.draft.round = session.last_round + 1
                        if message.draft.start == 0:
                            message.draft.start = session.context_length
                    try:
                        reply = stream.handle(message)
                    except CloudError as exc:
                        outcomes[exc.code] = outcomes.get(exc.code, 0) + 1
                        break
                    kind = reply.WhichOneof("kind") if reply is not None else "none"
                    outcomes[kind] = outcomes.get(kind, 0) + 1
            finally:
                stream.release()

        handle()
    finally:
        engine.shutdown()
    print("handled messages by outcome:", outcomes)
    assert engine.table.active == 0 and admission.streams == 0
    assert outcomes.get("opened") and outcomes.get("verdict") and outcomes.get("INVALID_ARGUMENT")


# --- deadlines, slots, keys ------------------------------------------------------------------
def test_silent_streams_are_closed_and_their_workers_freed(runtime):
    with serving(runtime, server={"max_workers": 2},
                 limits={"open_timeout_s": 2.0, "idle_timeout_s": 2.0}) as (server, channel):
        silent = [Stream(channel) for _ in range(2)]
        opened_then_idle = silent[1]
        assert opened_then_idle.send(_open(runtime, [1, 2, 3])).HasField("opened")
        # Both slots are held: a third stream is refused at once, with a retry hint ...
        third = Stream(channel)
        error = third.refused(_open(runtime, [1, 2, 3]))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "stream slots" in error.details()
        assert dict(error.trailing_metadata())[RETRY_AFTER_HEADER]
        # ... while Info still answers (reserved threads).
        info = pb_grpc.DecodingStub(channel).Info(pb.InfoRequest(), timeout=TIMEOUT)
        assert info.model == runtime.name
        # The deadlines close both silent streams with a status that says why.
        for stream, why in zip(silent, ("no Open within 2 s", "idle timeout")):
            assert stream.end(close=False) == grpc.StatusCode.DEADLINE_EXCEEDED
            assert why in stream.call.details()
        assert server.engine.table.active == 0
        fresh = Stream(channel)
        assert fresh.send(_open(runtime, [1, 2, 3])).HasField("opened")
        assert fresh.send(_draft(1, 3, [4])).HasField("verdict")
        assert fresh.end() == grpc.StatusCode.OK


def test_streams_per_key_and_draft_rate_per_key(runtime):
    with serving(runtime, server={"api_keys": ["a", "b"]},
                 limits={"max_streams_per_key": 1, "draft_tokens_per_s_per_key": 2.0,
                         "max_draft_length": 4}) as (_, channel):
        key_a, key_b = [("x-api-key", "a")], [("x-api-key", "b")]
        first = Stream(channel, key_a)
        assert first.send(_open(runtime, [1, 2, 3])).HasField("opened")
        error = Stream(channel, key_a).refused(_open(runtime, [1, 2, 3]))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "already holds 1 streams, its limit is 1" in error.details()
        other = Stream(channel, key_b)
        assert other.send(_open(runtime, [1, 2, 3])).HasField("opened")
        # Key a's bucket holds one full block (k = 4 plus the verdict's token): the second block
        # right after needs 2.5 s of refill at 2 tokens/s and is refused with that hint.
        assert first.send(_draft(1, 3, [1, 2, 3, 4])).HasField("verdict")
        error = first.refused(_draft(2, 8, [1, 2, 3, 4]))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "draft rate limit of 2 tokens/s" in error.details()
        assert 1000 <= int(dict(error.trailing_metadata())[RETRY_AFTER_HEADER]) <= 2500
        # Key b has its own bucket.
        assert other.send(_draft(1, 3, [1, 2, 3, 4])).HasField("verdict")
        assert other.end() == grpc.StatusCode.OK


def test_oversized_messages_and_fields_are_refused_before_any_work(runtime):
    with serving(runtime, limits={"max_message_bytes": 4096}) as (server, channel):
        passes = runtime.forward_passes
        error = Stream(channel).refused(_open(runtime, list(range(1, 3000))))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC's own size check
        stream = Stream(channel)
        assert stream.send(_open(runtime, [1, 2])).HasField("opened")
        passes = runtime.forward_passes
        many = pb.SparseDistribution(ids=list(range(300)), weights=[1] * 300)
        error = stream.refused(pb.ClientMessage(draft=pb.Draft(round=1, start=2, tokens=[1],
                                                               q=[many])))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "lists 300 ids" in error.details()
        assert runtime.forward_passes == passes
        assert server.engine.table.active == 0


def test_numbers_outside_their_ranges_are_refused(runtime):
    with serving(runtime) as (_, channel):
        vocab = runtime.vocab_size
        for sampling, pattern in [({"temperature": 1.0, "top_p": -1.0}, "top_p must be in"),
                                  ({"temperature": 1.0, "top_k": 2**32 - 1}, "top_k 4294967295"),
                                  ({"temperature": 1.0, "top_p": 1.5}, "top_p must be in")]:
            error = Stream(channel).refused(_open(runtime, [1, 2], **sampling))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
            assert pattern in error.details()
        assert Stream(channel).send(_open(runtime, [1, 2], temperature=1.0, top_k=vocab))
        stream = Stream(channel)
        stream.send(_open(runtime, [1, 2]))
        context_length = stream.send(_draft(5, 2, [])).verdict.context_length
        error = stream.refused(_draft(5, context_length, []))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not follow round 5" in error.details()


def test_identity_names_the_target_and_tells_same_tokenizer_targets_apart(runtime, draft_dir):
    expected = identify(runtime.model_dir, runtime.name, runtime.fingerprint)
    with serving(runtime) as (_, channel):
        info = pb_grpc.DecodingStub(channel).Info(pb.InfoRequest(), timeout=TIMEOUT)
        opened = Stream(channel).send(_open(runtime, [1, 2])).opened
    for target in (info.target, opened.target):
        assert (target.name, target.weights_digest, target.digest) == (
            runtime.name, expected.weights_digest, expected.digest)
        assert target.tokenizer_fingerprint == runtime.fingerprint
    other = identify(draft_dir, "tandem-draft", runtime.fingerprint)
    assert other.digest != expected.digest  # same tokenizer, different weights


def test_many_threads_hammering_admission_keep_counts_exact():
    admission = Admission(max_streams=8, max_streams_per_key=3)
    barrier = threading.Barrier(16)
    refused = []

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(200):
            try:
                admission.enter(str(i % 4))
            except CloudError:
                refused.append(1)
                continue
            admission.leave(str(i % 4))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert admission.streams == 0


def test_draft_token_bucket_refills_at_its_rate():
    now = [0.0]
    admission = Admission(max_streams=4, draft_tokens_per_s_per_key=10.0, burst_tokens=5,
                          clock=lambda: now[0])
    # The bucket holds max(rate x 1 s, one block) = 10 tokens; a round costs k + 1.
    admission.take_draft_tokens("a", 4)
    admission.take_draft_tokens("a", 4)
    with pytest.raises(CloudError, match="retry in 0.50 s"):
        admission.take_draft_tokens("a", 4)
    admission.take_draft_tokens("b", 4)      # another key has its own bucket
    now[0] += 0.5
    admission.take_draft_tokens("a", 4)      # refilled 5 tokens in 0.5 s
    with pytest.raises(CloudError):
        admission.take_draft_tokens("a", 0)
