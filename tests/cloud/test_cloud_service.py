"""The verifier service on a real loopback socket: verdict semantics, every kind of bad input
(each refused with the right status and a clear message while another session keeps being
served), auth, TLS, eviction, 8 concurrent batched sessions equal to each run alone, health,
Info, and the tandem-cloud command.

The edge here is a small test-only loop that drafts with the draft model in plain transformers
(or sends hand-made blocks); the real edge client lives in edge/ and is tested on its own.
"""
from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from transformers import AutoModelForCausalLM, AutoTokenizer

from cloud.config import CloudConfig
from cloud.runtime.target import TargetRuntime
from cloud.server import create_server
from tandem.codec import quantize, to_proto
from tandem.config import ConfigError
from tandem.sampling import SamplingParams, warp
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60  # seconds any one call may take before the test fails instead of hanging


# --- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runtime(target_dir) -> TargetRuntime:
    torch.set_num_threads(1)
    return TargetRuntime(target_dir, device="cpu")


@pytest.fixture(scope="module")
def draft_model(draft_dir):
    return AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(target_dir, heldout_prompts) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    tokens = tokenizer("".join(heldout_prompts[:40]))["input_ids"]
    return [tokens[i * 40: i * 40 + 12 + 3 * i] for i in range(10)]


def _config(**sections) -> CloudConfig:
    raw = {"server": {"host": "127.0.0.1", "port": 0, "shutdown_grace_s": 0.5}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return CloudConfig.model_validate(raw)


@contextlib.contextmanager
def serving(runtime: TargetRuntime, **sections):
    server, port = create_server(_config(**sections), runtime=runtime)
    server.start()
    try:
        yield server, port
    finally:
        server.stop(0.5).wait(10)


@pytest.fixture(scope="module")
def server(runtime):
    with serving(runtime, limits={"max_draft_length": 8, "max_context": 200, "max_q_entries": 16},
                 batch={"window_ms": 20}) as (server, port):
        yield server, port


def _stub(port: int, channel_list: list) -> pb_grpc.DecodingStub:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    channel_list.append(channel)
    return pb_grpc.DecodingStub(channel)


@pytest.fixture
def stub(server):
    channels: list = []
    yield _stub(server[1], channels)
    for channel in channels:
        channel.close()


# --- a test-only edge ----------------------------------------------------------------------------
class Stream:
    """One Session stream driven message by message."""

    def __init__(self, stub: pb_grpc.DecodingStub, metadata=None) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._responses = stub.Session(iter(self._requests.get, None), metadata=metadata,
                                       timeout=TIMEOUT)

    def send(self, **kind) -> pb.ServerMessage:
        self._requests.put(pb.ClientMessage(**kind))
        return next(self._responses)

    def open(self, context: list[int], fingerprint: str, params: SamplingParams = SamplingParams(),
             session_id: str = "test", **fields) -> pb.ServerMessage:
        return self.send(open=pb.Open(
            session_id=session_id, tokenizer_fingerprint=fingerprint, context_ids=context,
            sampling=pb.SamplingParams(temperature=params.temperature, top_k=params.top_k,
                                       top_p=params.top_p, seed=params.seed), **fields))

    def draft(self, round_: int, start: int, tokens: list[int], q=()) -> pb.ServerMessage:
        return self.send(draft=pb.Draft(round=round_, start=start, tokens=tokens, q=list(q)))

    def close(self) -> None:
        self._requests.put(pb.ClientMessage(close=pb.Close(reason="done")))
        self._requests.put(None)
        with contextlib.suppress(StopIteration):
            next(self._responses)

    def refused(self, **kind) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            self.send(**kind)
        return info.value


@dataclass
class Run:
    verdicts: list[tuple[int, int]] = field(default_factory=list)  # (accepted, token) per round
    context: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    evictions: int = 0


def draft_block(draft_model, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator) -> tuple[list[int], list]:
    """k draft tokens (argmax, or sampled from the quantized q they then carry)."""
    tokens, dists = [], []
    with torch.inference_mode():
        for _ in range(k):
            logits = draft_model(torch.tensor([context + tokens])).logits[0, -1]
            if params.greedy:
                tokens.append(int(logits.argmax()))
                continue
            dist = quantize(warp(logits, params), max_entries=16)
            tokens.append(dist.sample(generator))
            message = pb.SparseDistribution()
            to_proto(dist, message)
            dists.append(message)
    return tokens, dists


def run_session(stub, draft_model, fingerprint: str, prompt: list[int], *, new_tokens: int,
                k: int, params: SamplingParams = SamplingParams(), session_id: str = "s",
                barrier: threading.Barrier | None = None, metadata=None,
                between_rounds=None) -> Run:
    """Generate new_tokens with draft + verify, re-opening with the full context on Evicted."""
    stream, run = Stream(stub, metadata), Run(context=list(prompt))
    generator = torch.Generator().manual_seed(params.seed + 1)
    if barrier is not None:
        barrier.wait()
    assert stream.open(run.context, fingerprint, params, session_id).WhichOneof("kind") == "opened"
    round_ = 0
    while len(run.context) - len(prompt) < new_tokens:
        tokens, q = draft_block(draft_model, run.context, k, params, generator)
        reply = stream.draft(round_, len(run.context), tokens, q)
        if reply.WhichOneof("kind") == "evicted":
            assert reply.evicted.round == round_ and reply.evicted.session_id == session_id
            run.evictions += 1
            assert stream.open(run.context, fingerprint, params, session_id).HasField("opened")
            continue
        verdict = reply.verdict
        assert verdict.round == round_ and verdict.accepted <= k
        run.context += tokens[: verdict.accepted] + [verdict.token]
        assert verdict.context_length == len(run.context)
        run.verdicts.append((verdict.accepted, verdict.token))
        run.batch_sizes.append(verdict.timings.batch_size)
        round_ += 1
        if between_rounds is not None:
            between_rounds()
    stream.close()
    return run


def _target_greedy(runtime: TargetRuntime, context: list[int], n: int) -> list[int]:
    out = list(context)
    with torch.inference_mode():
        for _ in range(n):
            out.append(int(runtime.model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(context):]


# --- verdict semantics ---------------------------------------------------------------------------
def test_verdicts_follow_the_proto_conventions(stub, server, runtime, prompts):
    """Hand-made blocks: the target's own continuation is accepted in full with the next target
    token as bonus; a block with a wrong token is cut there with the target's correction."""
    prompt = prompts[0]
    reference = _target_greedy(runtime, prompt, 9)
    stream = Stream(stub)
    opened = stream.open(prompt, runtime.fingerprint, session_id="semantics").opened
    assert opened.session_id == "semantics"
    assert (opened.limits.max_draft_length, opened.limits.max_context,
            opened.limits.vocab_size, opened.limits.max_q_entries) == \
        (8, 200, runtime.vocab_size, 16)
    assert 0 <= opened.load <= 1

    verdict = stream.draft(0, len(prompt), reference[:4]).verdict
    assert (verdict.round, verdict.accepted, verdict.token) == (0, 4, reference[4])
    assert verdict.context_length == len(prompt) + 5
    assert verdict.timings.batch_size >= 1 and verdict.timings.forward_ms > 0

    start = len(prompt) + 5
    wrong = reference[5:8]
    wrong[2] = (wrong[2] + 1) % runtime.vocab_size
    verdict = stream.draft(1, start, wrong).verdict
    assert (verdict.accepted, verdict.token, verdict.context_length) == (2, reference[7], start + 3)

    verdict = stream.draft(2, start + 3, []).verdict  # k = 0: plain target decoding
    assert (verdict.accepted, verdict.token) == (0, reference[8])
    stream.close()


def test_an_open_without_a_session_id_is_given_one(stub, runtime, prompts):
    stream = Stream(stub)
    opened = stream.open(prompts[0], runtime.fingerprint, session_id="").opened
    assert re.fullmatch(r"s-[0-9a-f]{12}", opened.session_id)
    stream.close()


def test_single_token_context_and_sampling_sessions_work(stub, runtime, draft_model, prompts):
    run = run_session(stub, draft_model, runtime.fingerprint, prompts[1][:1], new_tokens=6, k=3)
    assert len(run.context) >= 7
    params = SamplingParams(temperature=0.9, top_k=50, seed=9)
    first = run_session(stub, draft_model, runtime.fingerprint, prompts[1], new_tokens=10, k=3,
                        params=params)
    again = run_session(stub, draft_model, runtime.fingerprint, prompts[1], new_tokens=10, k=3,
                        params=params)
    assert first.verdicts == again.verdicts  # seeded: the same session gives the same output


# --- bad input -----------------------------------------------------------------------------------
def _status(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return error.code(), error.details()


def test_bad_input_gets_a_clear_status_and_others_keep_being_served(stub, server, runtime, prompts):
    fp = runtime.fingerprint
    vocab = runtime.vocab_size
    bystander = Stream(stub)
    bystander_context = list(prompts[2])
    bystander.open(bystander_context, fp, session_id="bystander")
    rounds = iter(range(1000))

    def bystander_still_served():
        verdict = bystander.draft(next(rounds), len(bystander_context), []).verdict
        bystander_context.append(verdict.token)
        assert verdict.context_length == len(bystander_context)

    sampling = SamplingParams(temperature=1.0, seed=1)

    def q_message(ids, weights):
        return pb.SparseDistribution(ids=ids, weights=weights)

    def opened_stream(params=SamplingParams()):
        stream = Stream(stub)
        assert stream.open(prompts[3], fp, params, session_id="bad").HasField("opened")
        return stream, len(prompts[3])

    cases = []
    # Open-time refusals.
    cases.append(("context id out of range", Stream(stub).refused(open=pb.Open(
        tokenizer_fingerprint=fp, context_ids=[1, vocab + 5])),
        grpc.StatusCode.INVALID_ARGUMENT, r"context_ids\[1\] = \d+ is out of range"))
    cases.append(("empty context", Stream(stub).refused(open=pb.Open(tokenizer_fingerprint=fp)),
                  grpc.StatusCode.INVALID_ARGUMENT, "empty"))
    cases.append(("context above the limit", Stream(stub).refused(open=pb.Open(
        tokenizer_fingerprint=fp, context_ids=[1] * 201)),
        grpc.StatusCode.OUT_OF_RANGE, "201 tokens exceeds max_context 200"))
    cases.append(("unknown model", Stream(stub).refused(open=pb.Open(
        model="gpt-9", tokenizer_fingerprint=fp, context_ids=[1])),
        grpc.StatusCode.NOT_FOUND, "'gpt-9' is not served"))
    cases.append(("negative temperature", Stream(stub).refused(open=pb.Open(
        tokenizer_fingerprint=fp, context_ids=[1], sampling=pb.SamplingParams(temperature=-1))),
        grpc.StatusCode.INVALID_ARGUMENT, "temperature"))
    # Unknown and closed sessions.
    cases.append(("draft before open", Stream(stub).refused(draft=pb.Draft(start=1, tokens=[1])),
                  grpc.StatusCode.NOT_FOUND, "no session is open"))
    stream, _ = opened_stream()
    stream._requests.put(pb.ClientMessage(close=pb.Close()))
    cases.append(("draft after close", stream.refused(draft=pb.Draft(start=1, tokens=[1])),
                  grpc.StatusCode.NOT_FOUND, "is closed"))
    # Draft-time refusals.
    stream, start = opened_stream()
    cases.append(("draft id out of range", stream.refused(draft=pb.Draft(
        start=start, tokens=[1, vocab])), grpc.StatusCode.INVALID_ARGUMENT, r"tokens\[1\]"))
    stream, start = opened_stream()
    cases.append(("k above the limit", stream.refused(draft=pb.Draft(start=start, tokens=[1] * 9)),
                  grpc.StatusCode.INVALID_ARGUMENT, "9 tokens exceeds max_draft_length 8"))
    stream, start = opened_stream()
    cases.append(("wrong start", stream.refused(draft=pb.Draft(start=start + 2, tokens=[1])),
                  grpc.StatusCode.FAILED_PRECONDITION, f"start is {start + 2}"))
    stream, start = opened_stream()
    stream.draft(0, start, [])
    cases.append(("second open", stream.refused(open=pb.Open(
        tokenizer_fingerprint=fp, context_ids=[1])),
        grpc.StatusCode.FAILED_PRECONDITION, "already open"))
    stream = Stream(stub)
    stream.open(list(prompts[4][:1]) * 195, fp, session_id="long")
    cases.append(("round past the context limit", stream.refused(draft=pb.Draft(
        start=195, tokens=[1] * 5)), grpc.StatusCode.OUT_OF_RANGE, "above max_context 200"))
    for name, q, pattern in [
        ("q missing", [], "one q per draft token"),
        ("q repeated id", [q_message([5, 5], [1, 2])], "repeated"),
        ("q zero weight (not normalisable)", [q_message([5, 6], [0, 0])], "positive"),
        ("q weights and ids disagree", [q_message([5, 6], [3])], "weights"),
        ("q too many entries", [q_message(list(range(17)), [1] * 17)], "limit is 16"),
        ("q id out of range", [q_message([5, vocab], [1, 1])], "out of range"),
        ("q zero at the drafted token", [q_message([6, 7], [1, 1])], "has q = 0"),
    ]:
        stream, start = opened_stream(sampling)
        cases.append((name, stream.refused(draft=pb.Draft(start=start, tokens=[5], q=q)),
                      grpc.StatusCode.INVALID_ARGUMENT, pattern))

    for name, error, code, pattern in cases:
        got_code, details = _status(error)
        assert got_code == code, f"{name}: {got_code} {details}"
        assert re.search(pattern, details), f"{name}: {details!r}"
        bystander_still_served()
    bystander.close()
    assert server[0].engine.table.active == 0  # every refused stream let go of its session


def test_coded_q_is_negotiated_and_bad_coded_bytes_are_refused(stub, server, runtime,
                                                              draft_model, prompts):
    """Opened.q_codec names the coded format only when the Open offered this verifier's own
    (older edges offer none); a coded block is verified; coded bytes that are cut, not whole
    words, oversized, beside plain q, or on a session without the format get INVALID_ARGUMENT."""
    fp, codec = runtime.fingerprint, server[0].engine.q_codec
    params = SamplingParams(temperature=0.8, seed=3)
    assert codec is not None
    for offered, expected in (([], ""), (["ans1:0:other"], ""), (["x", codec.name], codec.name)):
        stream = Stream(stub)
        assert stream.open(prompts[5], fp, params, q_codecs=offered).opened.q_codec == expected
        stream.close()

    context, generator = list(prompts[5]), torch.Generator().manual_seed(0)
    q, tokens = [], []
    with torch.inference_mode():
        for _ in range(3):
            logits = draft_model(torch.tensor([context + tokens])).logits[0, -1]
            q.append(codec.quantize(warp(logits, params)))
            tokens.append(q[-1].sample(generator))
    data = codec.encode(tokens, q)
    stream = Stream(stub)
    stream.open(context, fp, params, q_codecs=[codec.name])
    verdict = stream.send(draft=pb.Draft(round=1, start=len(context), tokens=tokens,
                                         q_coded=data)).verdict
    assert verdict.context_length == len(context) + verdict.accepted + 1
    stream.close()

    plain = pb.SparseDistribution(ids=[tokens[0]], weights=[1])
    for name, draft, pattern, negotiated in [
        ("cut", pb.Draft(tokens=tokens, q_coded=data[:-4]), "q_coded|one q per draft", True),
        ("not whole words", pb.Draft(tokens=tokens, q_coded=data + b"\x07"), "32-bit words", True),
        ("padded", pb.Draft(tokens=tokens, q_coded=data + bytes(4)), "q_coded", True),
        ("oversized", pb.Draft(tokens=tokens, q_coded=bytes(4000)), "more than any", True),
        ("q and q_coded", pb.Draft(tokens=tokens[:1], q=[plain], q_coded=data), "not both", True),
        ("not negotiated", pb.Draft(tokens=tokens, q_coded=data), "negotiated no", False),
    ]:
        stream = Stream(stub)
        stream.open(context, fp, params, q_codecs=[codec.name] if negotiated else [])
        draft.start = len(context)
        code, details = _status(stream.refused(draft=draft))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and re.search(pattern, details), \
            f"{name}: {code} {details}"
    with serving(runtime, limits={"coded_q": False}) as (_, port):
        channels: list = []
        stream = Stream(_stub(port, channels))
        assert stream.open(context, fp, params, q_codecs=[codec.name]).opened.q_codec == ""
        stream.close()
        channels[0].close()


def test_fingerprint_mismatch_is_refused_at_open_before_any_compute(stub, server, runtime, prompts):
    passes = runtime.forward_passes
    error = Stream(stub).refused(open=pb.Open(tokenizer_fingerprint="sha256:0000",
                                              context_ids=prompts[0]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "tokenizer fingerprint 'sha256:0000' does not match" in error.details()
    assert runtime.forward_passes == passes
    assert server[0].engine.table.active == 0


# --- access --------------------------------------------------------------------------------------
def _info(port: int, metadata=None, channel=None):
    channel = channel or grpc.insecure_channel(f"127.0.0.1:{port}")
    with channel:
        return pb_grpc.DecodingStub(channel).Info(pb.InfoRequest(), metadata=metadata,
                                                  timeout=TIMEOUT)


def test_api_key_is_required_when_configured(runtime, prompts, monkeypatch):
    monkeypatch.setenv("TANDEM_TEST_CLOUD_KEYS", "env-key-1, env-key-2")
    with serving(runtime, server={"api_keys": ["s3cret"],
                                  "api_keys_env": "TANDEM_TEST_CLOUD_KEYS"}) as (_, port):
        with pytest.raises(grpc.RpcError) as missing:
            _info(port)
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "x-api-key" in missing.value.details()
        with pytest.raises(grpc.RpcError) as wrong:
            _info(port, [("x-api-key", "guess")])
        assert wrong.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert _info(port, [("x-api-key", "s3cret")]).model == runtime.name
        assert _info(port, [("authorization", "Bearer env-key-2")]).model == runtime.name

        channels: list = []
        stub = _stub(port, channels)
        error = Stream(stub).refused(open=pb.Open(tokenizer_fingerprint=runtime.fingerprint,
                                                  context_ids=prompts[0]))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        stream = Stream(stub, metadata=[("x-api-key", "s3cret")])
        assert stream.open(prompts[0], runtime.fingerprint).HasField("opened")
        stream.close()
        # Probes need no key.
        health = health_pb2_grpc.HealthStub(channels[0]).Check(
            health_pb2.HealthCheckRequest(service="tandem.v1.Decoding"), timeout=TIMEOUT)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        for channel in channels:
            channel.close()


def test_public_address_without_a_key_refuses_to_start(runtime):
    with pytest.raises(ConfigError, match="without an API key"):
        create_server(_config(server={"host": "0.0.0.0"}), runtime=runtime)
    for allowed in ({"host": "0.0.0.0", "allow_insecure_public": True},
                    {"host": "0.0.0.0", "api_keys": ["k"]}):
        server, port = create_server(_config(server=allowed), runtime=runtime)
        assert port > 0
        server.stop(0).wait(10)


def _self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_with_a_self_signed_certificate(runtime, tmp_path):
    cert, key = _self_signed_certificate(tmp_path)
    with serving(runtime, server={"tls_cert": str(cert), "tls_key": str(key),
                                  "api_keys": ["k"]}) as (server, port):
        assert server.secure
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        reply = _info(port, [("x-api-key", "k")],
                      grpc.secure_channel(f"localhost:{port}", credentials))
        assert reply.tokenizer_fingerprint == runtime.fingerprint
        with pytest.raises(grpc.RpcError) as plaintext:
            _info(port, [("x-api-key", "k")])
        assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE


# --- memory budget -------------------------------------------------------------------------------
def test_eviction_under_a_tiny_budget_loses_nothing(runtime, draft_model, prompts):
    """Two sessions that cannot both fit: each evicts the other, is told so, re-opens with its
    full context, and ends with exactly the tokens it generates with room to spare."""
    a, b = prompts[5], prompts[6]
    budget = (len(a) + len(b) - 4) * runtime.bytes_per_token
    with serving(runtime, limits={"kv_budget_bytes": 10**8}) as (_, port):
        channels: list = []
        stub = _stub(port, channels)
        roomy = [run_session(stub, draft_model, runtime.fingerprint, p, new_tokens=8, k=2,
                             session_id=name) for p, name in ((a, "a"), (b, "b"))]
    with serving(runtime, limits={"kv_budget_bytes": budget}) as (server, port):
        stub = _stub(port, channels)
        # Lockstep: a round of a, then a round of b, ...; each Open or round makes room by
        # evicting the other, which hears so at its next Draft and re-opens.
        lockstep = threading.Condition()
        state = {"turn": 0, "done": [False, False]}
        runs: list[Run | None] = [None, None]

        def worker(i: int, prompt: list[int], name: str) -> None:
            def my_turn() -> bool:
                return state["turn"] == i or state["done"][1 - i]

            def hand_over() -> None:
                with lockstep:
                    state["turn"] = 1 - i
                    lockstep.notify_all()
                    assert lockstep.wait_for(my_turn, TIMEOUT)
            with lockstep:
                assert lockstep.wait_for(my_turn, TIMEOUT)
            try:
                runs[i] = run_session(stub, draft_model, runtime.fingerprint, prompt,
                                      new_tokens=8, k=2, session_id=name, between_rounds=hand_over)
            finally:
                with lockstep:
                    state["done"][i] = True
                    lockstep.notify_all()

        threads = [threading.Thread(target=worker, args=(0, a, "a")),
                   threading.Thread(target=worker, args=(1, b, "b"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT * 2)
        assert server.engine.table.evictions >= 2
        # Lossless: the same tokens as with room to spare (the run may go a few tokens past).
        for tight, ample in zip(runs, roomy):
            assert tight.evictions >= 1
            n = min(len(tight.context), len(ample.context))
            assert tight.context[:n] == ample.context[:n]

        # A context that alone exceeds the budget is refused outright.
        error = Stream(stub).refused(open=pb.Open(tokenizer_fingerprint=runtime.fingerprint,
                                                  context_ids=[1] * (len(a) + len(b))))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for channel in channels:
        channel.close()


# --- many sessions at once -----------------------------------------------------------------------
def test_eight_concurrent_sessions_are_batched_and_equal_each_alone(stub, runtime, draft_model,
                                                                    prompts):
    specs = [dict(prompt=prompts[i], k=2 + i % 3, session_id=f"c{i}",
                  params=SamplingParams(temperature=0.8, top_k=40, seed=i) if i % 4 == 3
                  else SamplingParams()) for i in range(8)]
    alone = [run_session(stub, draft_model, runtime.fingerprint, spec["prompt"], new_tokens=12,
                         k=spec["k"], params=spec["params"], session_id=spec["session_id"])
             for spec in specs]

    barrier = threading.Barrier(8)
    together: list[Run | None] = [None] * 8
    errors: list[BaseException] = []

    def session(i: int) -> None:
        spec = specs[i]
        try:
            together[i] = run_session(stub, draft_model, runtime.fingerprint, spec["prompt"],
                                      new_tokens=12, k=spec["k"], params=spec["params"],
                                      session_id=spec["session_id"], barrier=barrier)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * 3)
    assert not errors, errors
    assert max(max(run.batch_sizes) for run in together) > 1
    for spec, one, many in zip(specs, alone, together):
        assert many.verdicts == one.verdicts, spec["session_id"]
        assert many.context == one.context


# --- health, Info, command line ------------------------------------------------------------------
def test_health_and_info(server, runtime):
    port = server[1]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tandem.v1.Decoding"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    info = _info(port)
    assert (info.model, info.tokenizer_fingerprint, info.device, info.dtype) == \
        (runtime.name, runtime.fingerprint, "cpu", "float32")
    assert (info.limits.max_draft_length, info.limits.max_context, info.limits.vocab_size,
            info.limits.max_q_entries) == (8, 200, runtime.vocab_size, 16)
    assert info.active_sessions == 0


def test_command_serves_logs_each_session_and_stops_on_sigterm(tmp_path, target_dir, runtime,
                                                                 prompts):
    config = tmp_path / "cloud.yaml"
    config.write_text(f"server: {{host: 127.0.0.1, port: 0, shutdown_grace_s: 1}}\n"
                      f"model: {{path: {target_dir}, device: cpu, threads: 1}}\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "cloud.cli", "serve", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        port = None
        while port is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(r"serving .* on 127\.0\.0\.1:(\d+)", line)
            port = int(match.group(1)) if match else None
        assert port, "".join(lines)
        assert any("without an API key" in line for line in lines)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = Stream(pb_grpc.DecodingStub(channel))
            stream.open(prompts[0], runtime.fingerprint, session_id="cli-session")
            stream.draft(0, len(prompts[0]), [])
            stream.close()
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
        lines.append(out)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log = "".join(lines)
    assert process.returncode == 0, log
    assert re.search(r"session cli-session closed by client.*1 tokens, 1 rounds", log), log
    assert "stopped" in log


def test_command_refuses_a_public_address_without_a_key(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cloud.cli", "serve", "--config", str(ROOT / "configs/cloud.yaml"),
         "--host", "0.0.0.0", "--model", str(tmp_path / "never-loaded")],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "TANDEM_CLOUD_API_KEYS"})
    assert result.returncode == 2
    assert "refusing to serve 0.0.0.0 without an API key" in result.stderr
