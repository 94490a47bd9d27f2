"""What a committed token costs the verifier per mode (cloud/token_cost.py), on the real
verifier: measured from its passes, said in every priced Verdict and Generated (the session's
own figure once it has one), in Info (with the totals a benchmark reads) and in Prometheus,
absent for an older edge, and handed by the edge's link to its policy's view."""
from __future__ import annotations

import pytest
import torch
from test_price import _open_message, _session, dear_verifier, tokens  # noqa: F401 (fixtures)
from verifier_harness import TEST_DEVICE, channel_to, client_for, open_draft
from verifier_harness import edge_tokenizer, prompt_ids, target_runtime  # noqa: F401 (fixtures)

from cloud.config import BatchSettings, LimitSettings
from cloud.engine import DraftRequest, GenerateRequest, OpenRequest, Verifier
from cloud.token_cost import CLOUD, MIN_TOKENS, SPECULATE
from edge.request import GenerationRequest
from edge.control.policy import DraftPolicy, FixedK, Plan, RoundView
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)

FIELDS = {"speculate_token_ms", "cloud_token_ms"}


def _said(message) -> dict[str, float]:
    return {field.name: value for field, value in message.ListFields() if field.name in FIELDS}


def test_the_engine_charges_each_mode_its_share_of_the_passes(target_runtime, tokens):
    """A session's rounds and a cloud run on the in-process engine: each mode has a cost per
    committed token (ms, positive), the totals count every committed token, the session keeps
    its own figures, and Prometheus has both modes' gauges."""
    engine = Verifier(target_runtime, LimitSettings(), BatchSettings())
    assert engine._cpu_clock == (TEST_DEVICE == "cpu")  # one torch thread: passes by CPU time
    # the runtime's measured pass model reaches the shares (it once stopped at the backend)
    assert engine._pass_model == target_runtime.pass_model and engine._pass_model.fixed_ms > 0
    try:
        context = tokens[0]
        session = engine.open(OpenRequest(session_id="", model="",
                                          tokenizer_fingerprint=target_runtime.fingerprint,
                                          context_ids=context[:8],
                                          sampling=SamplingParams())).session
        committed = 0
        rounds = 2 * int(MIN_TOKENS)  # >= MIN_TOKENS committed, with the sums' forgetting
        for r in range(1, rounds + 1):
            start = session.context_length
            result = engine.draft(session, DraftRequest(round=r, start=start,
                                                        tokens=(context * 8)[start:start + 2],
                                                        q=[]))
            committed += result.verdict.accepted + 1
        generated = list(engine.generate(session, GenerateRequest(
            round=rounds + 1, start=session.context_length, max_tokens=rounds)))
        assert engine.token_costs.totals(SPECULATE)[1] == committed
        assert engine.token_costs.totals(CLOUD)[1] == len(generated)
        assert engine.token_costs.per_token_ms(CLOUD) > 0
        assert engine.token_costs.per_token_ms(SPECULATE) > 0
        assert session.token_costs.per_token_ms(CLOUD) == \
            pytest.approx(engine.token_costs.per_token_ms(CLOUD), rel=0.2)  # forgets faster
        gauges = [line for line in engine.metrics.render().decode().splitlines()
                  if line.startswith("tandem_verifier_token_cost_seconds{")]
        for mode in (SPECULATE, CLOUD):
            line = next(g for g in gauges if f'mode="{mode}"' in g)
            assert float(line.rsplit(" ", 1)[1]) > 0, line
        engine.close(session, "done")
    finally:
        engine.shutdown()


def test_a_priced_session_hears_the_costs_and_an_older_edge_does_not(dear_verifier,
                                                                    target_runtime, tokens):
    """Cloud runs and rounds on the dear verifier: Info says both modes' figures and the
    totals; a priced session's Generated and Verdict carry them, an older edge's none."""
    context = tokens[2][:10]
    runs = [pb.ClientMessage(generate=pb.Generate(round=1, start=10,
                                                  max_tokens=int(MIN_TOKENS) + 4))]
    _session(dear_verifier, _open_message(target_runtime, context, priced=True), runs)
    rounds = [pb.ClientMessage(draft=pb.Draft(round=r, start=10 + r - 1, tokens=[]))
              for r in range(1, int(MIN_TOKENS) + 2)]  # k = 0: one committed token a round
    _session(dear_verifier, _open_message(target_runtime, context, priced=True), rounds)
    info = pb_grpc.DecodingStub(channel_to(dear_verifier)).Info(pb.InfoRequest(), timeout=10)
    assert set(_said(info)) == FIELDS and all(v > 0 for v in _said(info).values())
    assert info.batches.cloud_tokens >= MIN_TOKENS + 4 and info.batches.cloud_ms > 0
    assert info.batches.speculate_tokens >= MIN_TOKENS + 1 and info.batches.speculate_ms > 0
    round_then_run = [pb.ClientMessage(draft=pb.Draft(round=1, start=10, tokens=[])),
                      pb.ClientMessage(generate=pb.Generate(round=2, start=11, max_tokens=2))]
    priced = _session(dear_verifier, _open_message(target_runtime, context, priced=True),
                      round_then_run)
    assert set(_said(priced[0].opened)) == FIELDS
    verdict = priced[1].verdict
    assert set(_said(verdict)) == FIELDS, verdict
    assert all(set(_said(r.generated)) == FIELDS for r in priced[2:])
    older = _session(dear_verifier, _open_message(target_runtime, context, priced=False),
                     round_then_run)
    assert older[1].verdict.token == verdict.token and len(older) == len(priced)
    for reply in older:
        assert not _said(getattr(reply, reply.WhichOneof("kind"))), reply


class CostsSeen(DraftPolicy):
    """A fixed-k policy that keeps the measured costs each round's view carried."""

    def __init__(self) -> None:
        self.inner = FixedK(3)
        self.token_ms: list[tuple] = []

    def plan(self, view: RoundView) -> Plan:
        self.token_ms.append(view.token_ms)
        return self.inner.plan(view)

    def update(self, record) -> None:
        pass


def test_the_edge_hands_the_measured_costs_to_its_policy(dear_verifier, target_runtime, tokens,
                                                         prompt_ids, draft_dir, gguf_path,
                                                         onnx_path):
    """After the verifier has measured both modes, every round's view after the first reply
    carries both figures (positive ms) as the last reply said them."""
    runs = [pb.ClientMessage(generate=pb.Generate(round=1, start=10,
                                                  max_tokens=int(MIN_TOKENS) + 4))]
    _session(dear_verifier, _open_message(target_runtime, tokens[3][:10], priced=True), runs)
    rounds = [pb.ClientMessage(draft=pb.Draft(round=r, start=10 + r - 1, tokens=[]))
              for r in range(1, int(MIN_TOKENS) + 2)]
    _session(dear_verifier, _open_message(target_runtime, tokens[3][:10], priced=True), rounds)
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        policy = CostsSeen()
        client = client_for(channel_to(dear_verifier), draft)
        client.policy = policy
        result = client.generate(GenerationRequest(prompt_ids[5], 12))
        assert all(result.verified) and len(result.token_ids) == 12
        assert policy.token_ms and all(s is not None and s > 0 and c is not None and c > 0
                                       for s, c in policy.token_ms[1:]), policy.token_ms
    finally:
        draft.close()
