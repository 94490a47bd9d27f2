"""The verifier's operational surface on real sockets: Prometheus metrics whose spec-decode
counters (vLLM's names) give the same τ as the edge's own stats, refusals by status code, a
second server on a port in use refused, gRPC server reflection for grpcurl, and the edge's
keepalive pings accepted by the server."""
from __future__ import annotations

import re

import grpc
import httpx
import pytest
import torch
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import \
    ProtoReflectionDescriptorDatabase
from verifier_harness import channel_to, client_for, open_draft, start_verifier, target_runtime  # noqa: F401

from cloud.config import CloudConfig, ModelSettings, ServerSettings
from cloud.metrics import VerifierMetrics
from cloud.server import create_server
from edge.request import GenerationRequest
from edge.config import CloudLinkConfig
from edge.tokenizer import EdgeTokenizer
from tandem import metrics as formulas
from tandem.config import ConfigError
from tandem.sampling import SamplingParams

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def running(target_runtime):
    server, port = start_verifier(target_runtime)
    yield server, port
    server.stop(0).wait()


def _value(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    return sum(values)


def test_metrics_endpoint_agrees_with_the_edge(running, draft_dir, gguf_path, onnx_path):
    server, port = running
    metrics_port = server.engine.metrics.serve("127.0.0.1", 0)
    before = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    tokenizer = EdgeTokenizer(draft_dir)
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    channel = channel_to(port, CloudLinkConfig(keepalive_s=10))
    try:
        result = client_for(channel, draft, draft_length=4).generate(GenerationRequest(
            prompt_ids=tokenizer.encode("def fib(n):\n    "), max_tokens=24,
            sampling=SamplingParams(), stop_ids=frozenset()))
    finally:
        channel.close()
        draft.close()
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    assert "_created" not in text

    def delta(name: str) -> float:
        return _value(text, name) - _value(before, name)

    drafts = delta("tandem_spec_decode_num_drafts_total")
    accepted = delta("tandem_spec_decode_num_accepted_tokens_total")
    rounds = [r for r in result.verified_rounds if r.drafted > 0]
    assert drafts == len(rounds) > 0
    assert accepted == sum(r.accepted for r in rounds)
    assert delta("tandem_spec_decode_num_draft_tokens_total") == sum(r.drafted for r in rounds)
    assert formulas.tau(int(accepted), int(drafts)) == pytest.approx(
        formulas.tau_of([r.accepted for r in rounds]))
    assert delta('tandem_spec_decode_num_accepted_tokens_per_pos_total{model="tandem-target",'
                 'position="0"}') == sum(1 for r in rounds if r.accepted >= 1)
    assert delta("tandem_verifier_batch_size_count") == delta("tandem_verifier_rounds_total")
    assert delta("tandem_verifier_forward_seconds_count") >= drafts
    assert delta("tandem_verifier_sessions_opened_total") == 1
    assert _value(text, "tandem_verifier_kv_budget_bytes") > 0


def test_refusals_are_counted_by_status_code(running):
    server, port = running
    metrics: VerifierMetrics = server.engine.metrics
    before = _value(metrics.render().decode(), 'tandem_verifier_refusals_total{code="FAILED_PRECONDITION",'
                                                'model="tandem-target"}')
    from tandem.v1 import decoding_pb2 as pb
    from tandem.v1 import decoding_pb2_grpc as pb_grpc
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.DecodingStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Session(iter([pb.ClientMessage(open=pb.Open())]), timeout=10))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    after = _value(metrics.render().decode(), 'tandem_verifier_refusals_total{code="FAILED_PRECONDITION",'
                                               'model="tandem-target"}')
    assert after == before + 1


def test_a_port_in_use_is_refused(running, target_runtime):
    _, port = running
    config = CloudConfig(server=ServerSettings(host="127.0.0.1", port=port),
                         model=ModelSettings(path=target_runtime.model_dir, device="cpu"))
    with pytest.raises(ConfigError, match=f"cannot bind 127.0.0.1:{port}"):
        create_server(config, target_runtime)


def test_reflection_lists_the_services(running):
    _, port = running
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"tandem.v1.Decoding", "grpc.health.v1.Health"} <= services
        described = database.FindFileContainingSymbol("tandem.v1.Decoding")
        assert re.search(r"decoding\.proto$", described.name)


def test_edge_keepalive_channel_talks_to_the_server(running):
    """The edge's channel with keepalive at the server's minimum interval connects and calls
    (the server permits pings every 10 s, also without calls)."""
    from tandem.v1 import decoding_pb2 as pb
    from tandem.v1 import decoding_pb2_grpc as pb_grpc
    _, port = running
    channel = channel_to(port, CloudLinkConfig(keepalive_s=10, keepalive_timeout_s=5))
    try:
        reply = pb_grpc.DecodingStub(channel).Info(pb.InfoRequest(), timeout=10)
        assert reply.model == "tandem-target"
    finally:
        channel.close()
