"""The verifier's price (cloud/price.py; the proto's header): 0 on an idle or lightly loaded
verifier, rising when rounds wait for their pass; negotiated in Open/Opened (an older edge sees
no new field), carried in every Verdict and Generated, in Info and in Prometheus. Real parts:
the shipped target in an in-process engine driven by many session threads, a real gRPC server
on loopback, the edge's own link reading it."""
from __future__ import annotations


import queue
import random
import threading

import pytest
import torch
from verifier_harness import TEST_DEVICE, channel_to, client_for, open_draft
from verifier_harness import edge_tokenizer, prompt_ids, target_runtime  # noqa: F401 (fixtures)

from cloud.config import BatchSettings, CloudConfig, LimitSettings, ModelSettings, ServerSettings
from cloud.engine import DraftRequest, Verifier, OpenRequest, RoundResult
from cloud.price import INTERVAL_S, SMOOTHING_S, PassPrice
from cloud.server import create_server
from edge.request import GenerationRequest
from edge.control.policy import DraftPolicy, FixedK, Plan, RoundView
from edge.link import VerifierLink
from edge.link.wait import WaitRule
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_price_follows_the_smoothed_queue_delay():
    """0 while jobs wait at most the target, rising past it, 1 from twice it; idle intervals
    count as no wait, so an idle verifier's price falls back to 0; a target of 0 is always 1."""
    clock = FakeClock()
    price = PassPrice(10.0, clock)

    def load(delay_ms: float, seconds: float) -> None:
        for _ in range(int(seconds / INTERVAL_S)):
            for _ in range(5):
                price.observe(delay_ms)
            clock.t += INTERVAL_S

    load(9.0, 10 * SMOOTHING_S)
    assert price.value() == 0.0 and price.queue_delay_ms() == pytest.approx(9.0, rel=0.01)
    load(15.0, 10 * SMOOTHING_S)
    assert price.value() == pytest.approx(0.5, abs=0.01)
    load(40.0, 10 * SMOOTHING_S)
    assert price.value() == 1.0
    clock.t += 0.3 * SMOOTHING_S  # a moment without jobs: still dear (smoothed) ...
    assert price.value() == 1.0
    clock.t += 10 * SMOOTHING_S  # ... and free once the verifier has idled for a while
    assert price.value() == 0.0
    assert PassPrice(0.0, clock).value() == 1.0


@pytest.fixture(scope="module")
def tokens(prompt_ids):
    return [list(ids[:40]) for ids in prompt_ids[:12]]


def _open(engine: Verifier, context: list[int]):
    return engine.open(OpenRequest(session_id="", model="",
                                   tokenizer_fingerprint=engine.runtime.fingerprint,
                                   context_ids=context, sampling=SamplingParams())).session


def _rounds(engine: Verifier, context: list[int], rounds: int,
            until: threading.Event | None = None) -> None:
    """A greedy session's rounds of 4-token blocks (the context's own tokens as the draft)."""
    session = _open(engine, context[:8])
    try:
        for r in range(1, rounds + 1):
            if until is not None and until.is_set():
                return
            start = session.context_length
            block = (context * 8)[start:start + 4]
            result = engine.draft(session, DraftRequest(round=r, start=start, tokens=block,
                                                        q=[]))
            assert isinstance(result, RoundResult)
    finally:
        engine.close(session, "done")


def test_a_lone_session_pays_nothing(target_runtime, tokens):
    """One session, round after round: its passes run at once on its own thread, nothing waits,
    the price stays exactly 0 (the single-user figures cannot change)."""
    engine = Verifier(target_runtime, LimitSettings(), BatchSettings())
    try:
        for context in tokens[:3]:
            _rounds(engine, context, 20)
        assert engine.price.value() == 0.0
        assert engine.price.queue_delay_ms() < BatchSettings().target_queue_ms
    finally:
        engine.shutdown()


def test_the_price_rises_when_many_sessions_wait_for_their_passes(target_runtime, tokens):
    """Twelve sessions at once, a small target: rounds wait for the passes of the others, the
    smoothed delay passes the target and the price rises above 0 (in the engine, and in the
    Prometheus gauge)."""
    engine = Verifier(target_runtime, LimitSettings(),
                    BatchSettings(window_ms=2.0, target_queue_ms=0.2))
    risen = threading.Event()
    errors: list[BaseException] = []

    def user(context: list[int]) -> None:
        try:
            _rounds(engine, context, 400, until=risen)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            risen.set()

    try:
        threads = [threading.Thread(target=user, args=(context,)) for context in tokens]
        for thread in threads:
            thread.start()
        watcher_done = threading.Event()

        def watch() -> None:  # the price read as an edge would, while the load runs
            while not watcher_done.is_set() and not risen.is_set():
                if engine.price.value() > 0:
                    risen.set()
                watcher_done.wait(INTERVAL_S / 4)

        watcher = threading.Thread(target=watch)
        watcher.start()
        for thread in threads:
            thread.join()
        watcher_done.set()
        watcher.join()
        assert not errors, errors
        assert risen.is_set() and engine.price.value() > 0
        assert engine.price.queue_delay_ms() > 0.2
        gauge = next(line for line in engine.metrics.render().decode().splitlines()
                     if line.startswith("tandem_verifier_price{"))
        assert float(gauge.rsplit(" ", 1)[1]) > 0
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def dear_verifier(target_runtime):
    """A verifier whose price is 1 whatever its load (batch.target_queue_ms = 0)."""
    config = CloudConfig(
        server=ServerSettings(host="127.0.0.1", port=0, shutdown_grace_s=0),
        model=ModelSettings(path=target_runtime.model_dir, device=TEST_DEVICE),
        limits=LimitSettings(), batch=BatchSettings(window_ms=0, target_queue_ms=0))
    server, port = create_server(config, target_runtime)
    server.start()
    yield port
    server.stop(0).wait()


def _session(port: int, open_: pb.Open, then: list[pb.ClientMessage]) -> list[pb.ServerMessage]:
    stub = pb_grpc.DecodingStub(channel_to(port))
    replies = list(stub.Session(iter([pb.ClientMessage(open=open_), *then,
                                      pb.ClientMessage(close=pb.Close())]), timeout=30))
    return replies


def _varied_rounds(port: int, target_runtime, context: list[int], rounds: int,
                   seed: int) -> None:
    """One priced session of `rounds` rounds, blocks of 0, 1, 3 or 6 tokens (drawn from the
    context), each sent at the context length the previous verdict said."""
    rng = random.Random(seed)
    outbox: queue.Queue = queue.Queue()
    outbox.put(pb.ClientMessage(open=_open_message(target_runtime, context, priced=True)))
    replies = pb_grpc.DecodingStub(channel_to(port)).Session(iter(outbox.get, None), timeout=60)
    start = len(context)
    for r in range(1, rounds + 1):
        reply = next(replies)
        start = reply.verdict.context_length if reply.HasField("verdict") else start
        block = rng.choices(context, k=rng.choice([0, 1, 3, 6]))
        outbox.put(pb.ClientMessage(draft=pb.Draft(round=r, start=start, tokens=block)))
    next(replies)
    outbox.put(pb.ClientMessage(close=pb.Close()))
    outbox.put(None)
    for _ in replies:
        pass


def _open_message(target_runtime, context: list[int], priced: bool) -> pb.Open:
    return pb.Open(tokenizer_fingerprint=target_runtime.fingerprint, context_ids=context,
                   mode=pb.MODE_LOSSLESS, priced=priced)


def test_an_edge_that_offers_gets_the_price_in_every_reply(dear_verifier, target_runtime,
                                                           tokens):
    context = tokens[0][:10]
    replies = _session(dear_verifier, _open_message(target_runtime, context, priced=True), [
        pb.ClientMessage(draft=pb.Draft(round=1, start=10, tokens=tokens[0][10:13]))])
    opened, verdict = replies[0].opened, replies[1].verdict
    assert opened.priced and opened.price == 1.0
    assert verdict.price == 1.0
    replies = _session(dear_verifier, _open_message(target_runtime, context, priced=True), [
        pb.ClientMessage(generate=pb.Generate(round=1, start=10, max_tokens=3))])
    generated = [r.generated for r in replies[1:]]
    assert len(generated) == 3 and all(g.price == 1.0 for g in generated)
    info = pb_grpc.DecodingStub(channel_to(dear_verifier)).Info(pb.InfoRequest(), timeout=10)
    assert info.price == 1.0


def test_an_older_edge_sees_no_new_field(dear_verifier, target_runtime, tokens):
    """An Open without `priced` (an older edge): Opened, Verdict and Generated are the messages
    it knew, byte for byte (no price, however dear the verifier)."""
    context = tokens[1][:10]
    replies = _session(dear_verifier, _open_message(target_runtime, context, priced=False), [
        pb.ClientMessage(draft=pb.Draft(round=1, start=10, tokens=tokens[1][10:13]))])
    opened, verdict = replies[0].opened, replies[1].verdict
    for message in (opened, verdict):
        names = {field.name for field, _ in message.ListFields()}
        assert not names & {"priced", "price"}, names
    replies = _session(dear_verifier, _open_message(target_runtime, context, priced=False), [
        pb.ClientMessage(generate=pb.Generate(round=1, start=10, max_tokens=2))])
    for reply in replies[1:]:
        assert "price" not in {field.name for field, _ in reply.generated.ListFields()}


class PriceSeen(DraftPolicy):
    """A fixed-k policy that keeps the price each round's view carried."""

    def __init__(self) -> None:
        self.inner = FixedK(3)
        self.prices: list[float] = []
        self.position_costs: list[float | None] = []

    def plan(self, view: RoundView) -> Plan:
        self.prices.append(view.price)
        self.position_costs.append(view.position_cost)
        return self.inner.plan(view)

    def update(self, record) -> None:
        pass


def test_the_edge_reads_the_price_into_its_policys_view(dear_verifier, target_runtime,
                                                        prompt_ids, draft_dir, gguf_path,
                                                        onnx_path):
    """The edge offers the price on every Open and hands what the verifier last said to the
    policy: 1 from the dear verifier in every view."""
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        policy = PriceSeen()
        client = client_for(channel_to(dear_verifier), draft)
        client.policy = policy
        result = client.generate(GenerationRequest(prompt_ids[2], 12))
        assert all(result.verified) and len(result.token_ids) == 12
        assert policy.prices and all(p == 1.0 for p in policy.prices)
    finally:
        draft.close()


def test_a_free_verifier_reads_as_free(target_runtime, tokens):
    """A verifier that is not loaded says price 0 and the link reads 0 (as it reads an Opened
    without `priced`, an older verifier's); a nonsense price is held to 0..1."""
    from edge.link.verifier_link import read_price
    assert read_price(float("nan")) == 0.0 and read_price(7.0) == 1.0 and read_price(-1) == 0.0
    config = CloudConfig(
        server=ServerSettings(host="127.0.0.1", port=0, shutdown_grace_s=0),
        model=ModelSettings(path=target_runtime.model_dir, device=TEST_DEVICE),
        batch=BatchSettings(window_ms=0, target_queue_ms=60_000))  # never priced above 0
    server, port = create_server(config, target_runtime)
    server.start()
    try:
        link = VerifierLink(pb_grpc.DecodingStub(channel_to(port)), (), session_id="s",
                            target_model="", fingerprint=target_runtime.fingerprint,
                            sampling=SamplingParams())
        link.bind(WaitRule(), should_stop=lambda: False)  # as a generation binds its link
        link.open(tokens[3][:10], late_s=10.0)
        assert link.price == 0.0
        link.close()
    finally:
        server.stop(0).wait()


def test_the_verifier_measures_what_a_drafted_position_costs(dear_verifier, target_runtime,
                                                            tokens, prompt_ids, draft_dir,
                                                            gguf_path, onnx_path):
    """Sessions at once over gRPC, blocks of 0-6 tokens: the verifier, which measured what a
    fed position adds to a pass when it started, weighs it against a session's share of its
    live passes (cloud/pass_cost.py) and says what a drafted position costs in Info and in
    every priced Opened; the edge's link hands it to the policy's view."""
    info = pb_grpc.DecodingStub(channel_to(dear_verifier)).Info(pb.InfoRequest(), timeout=10)
    errors: list[BaseException] = []

    def user(i: int) -> None:
        try:
            _varied_rounds(dear_verifier, target_runtime, tokens[i % len(tokens)][:10], 15, i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    measured = pb_grpc.DecodingStub(channel_to(dear_verifier)).Info(pb.InfoRequest(), timeout=10)
    assert 0.0 < measured.position_cost < 1.0, (info.position_cost, measured.position_cost)
    replies = _session(dear_verifier, _open_message(target_runtime, tokens[0][:10], priced=True),
                       [])
    assert replies[0].opened.position_cost == pytest.approx(measured.position_cost, rel=0.2)
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        policy = PriceSeen()
        client = client_for(channel_to(dear_verifier), draft)
        client.policy = policy
        client.generate(GenerationRequest(prompt_ids[4], 8))
        assert policy.position_costs and all(0.0 < c < 1.0 for c in policy.position_costs)
    finally:
        draft.close()
