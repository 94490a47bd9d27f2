"""The edge client's round logic, tested plainly: block length, truncation at stop ids and
max_tokens, verdict checks, the draft cursor's sync/rollback against a fresh prefill, and the
sampled draft's q (valid, reproducible, the edge's RNG distinct from the verifier's)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edge.caps import Caps
from edge.client import GenerationResult, RoundRecord, block_length, check_verdict, truncate
from edge.config import ClientConfig, EdgeConfig
from edge.control.policy import Plan
from edge.drafting import Block, DraftCursor, TokenChooser, draft_seed
from edge.fast_mode import FastModeGate
from edge.runtime import DraftConfig, load_draft_runtime
from edge.link.errors import ProtocolError
from tandem import metrics
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def draft(gguf_path):
    runtime = load_draft_runtime(DraftConfig(backend="llama.cpp", model_path=gguf_path,
                                             n_ctx=512, threads=1))
    yield runtime
    runtime.close()


def limits(**kw) -> pb.Limits:
    return pb.Limits(**kw)


# ---- block length -------------------------------------------------------------------------

def test_block_length_never_drafts_past_max_tokens():
    assert block_length(4, remaining=10, context_length=5) == 4
    assert block_length(4, remaining=3, context_length=5) == 2
    # One token left: k = 0, the verdict's token is the target's plain next token.
    assert block_length(4, remaining=1, context_length=5) == 0


def test_block_length_respects_server_limits():
    assert block_length(8, 100, 5, max_draft_length=3) == 3
    assert block_length(8, 100, 5, max_draft_length=0) == 0  # a server that takes no drafts
    # The round takes the context to start + n + 1 <= max_context.
    assert block_length(8, 100, 10, max_context=14) == 3
    assert block_length(8, 100, 13, max_context=14) == 0
    assert block_length(8, 100, 14, max_context=14) is None


class _Link:
    def __init__(self, limits: pb.Limits | None = None, q_codec: object | None = None) -> None:
        self.limits = limits
        self.q_codec = q_codec


def test_caps_use_the_coded_q_cap_when_the_session_codes_q():
    coded = Caps(_Link(q_codec=object()), n_ctx=512, max_q_entries=16, coded_q_entries=24)
    assert coded.q_entries_cap() == 24 and coded.q_entries_cap(8) == 8  # a plan may lower it
    assert Caps(_Link(), n_ctx=512, max_q_entries=16,
                coded_q_entries=24).q_entries_cap() == 16


def test_caps_without_limits_leave_the_edge_its_own_bounds():
    caps = Caps(_Link(), n_ctx=512, max_q_entries=32)
    assert caps.max_draft_length is None and caps.max_k(100, 5, 8) == 8
    assert caps.max_context == 512 and caps.max_k(100, 512) is None
    assert (caps.q_entries_cap(), caps.q_entries_cap(8), caps.vocab(100)) == (32, 8, 100)
    assert (caps.window(4), caps.generate_tokens) == (1, 0)


def test_caps_read_zero_as_the_proto_says():
    """0: no drafts, no send-ahead, no Generate; no limit set on the context and q entries,
    the vocabulary unchecked. The same cap for a block drafted ahead as for any other."""
    caps = Caps(_Link(limits()), n_ctx=512, max_q_entries=32)
    assert caps.max_draft_length == 0 and caps.max_k(100, 5, 8) == 0
    assert caps.max_context == 512
    assert (caps.q_entries_cap(), caps.vocab(100), caps.window(4), caps.generate_tokens) == \
        (32, 100, 1, 0)


def test_caps_take_the_tighter_of_the_verifier_and_the_edge():
    caps = Caps(_Link(limits(max_draft_length=3, max_context=100, vocab_size=50,
                             max_q_entries=16, max_in_flight=2, max_generate_tokens=7)),
                n_ctx=64, max_q_entries=32)
    assert caps.max_k(100, 5, 8) == 3 and caps.max_context == 64
    assert caps.max_k(100, 62) == 1 and caps.max_k(100, 64) is None
    assert (caps.q_entries_cap(), caps.q_entries_cap(8), caps.vocab(100)) == (16, 8, 50)
    assert (caps.window(), caps.window(1), caps.generate_tokens) == (2, 1, 7)


# ---- the fast-mode gate -------------------------------------------------------------------

def test_the_gate_verifies_a_skippable_plan_outside_fast_mode():
    plan = FastModeGate(fast=False, max_unverified_run=8).gate(
        Plan(k=4, verify=False, min_confidence=0.5, drafter="nope"), drafters=("draft",))
    assert plan == Plan(k=4, verify=True, min_confidence=0.0, drafter="")


def test_the_gate_bounds_the_unverified_run():
    gate = FastModeGate(fast=True, max_unverified_run=5)
    skip = Plan(k=4, verify=False, unsure_k=1, drafter="")
    assert gate.gate(skip, ()) == skip and gate.bound(skip, 4) == (skip, 4)
    gate.committed(4, verified=False)
    assert gate.bound(skip, 4) == (skip, 1)
    gate.committed(1, verified=False)
    assert gate.gate(skip, ()) == Plan(k=1, verify=True, unsure_k=1, drafter="")  # run full
    gate.committed(2, verified=True)
    assert gate.gate(skip, ()) == skip


def test_the_gate_verifies_after_an_unsure_position():
    gate = FastModeGate(fast=True, max_unverified_run=50)
    skip = Plan(k=4, verify=False, min_confidence=0.5, unsure_k=2)
    unsure = Block(tokens=[1, 2, 3], confidences=[0.4, 0.9, 0.9])
    plan, block, k = gate.after_draft(skip, unsure, 4)
    assert plan.verify and block.tokens == [1, 2] and k == 2
    gate.skipped(Block(tokens=[1], confidences=[0.9], end_reason="confidence"))
    assert gate.gate(skip, ()).verify


# ---- truncation ---------------------------------------------------------------------------

def test_truncate_keeps_the_stop_id_and_drops_what_follows():
    assert truncate([5, 6, 0, 7], room=10, stop_ids=frozenset({0})) == ([5, 6, 0], "stop")


def test_truncate_at_max_tokens():
    assert truncate([5, 6, 7], room=2, stop_ids=frozenset()) == ([5, 6], "length")
    assert truncate([5, 6], room=2, stop_ids=frozenset()) == ([5, 6], "length")
    assert truncate([5], room=2, stop_ids=frozenset()) == ([5], "")
    # A stop id beyond the room does not count.
    assert truncate([5, 6, 0], room=2, stop_ids=frozenset({0})) == ([5, 6], "length")


# ---- verdict checks -----------------------------------------------------------------------

def test_check_verdict_accepts_a_consistent_verdict():
    check_verdict(pb.Verdict(round=3, accepted=2, token=9, context_length=13), 3, 10, 4,
                  limits(vocab_size=100))


@pytest.mark.parametrize("verdict, why", [
    (pb.Verdict(round=2, accepted=1, token=9, context_length=12), "round"),
    (pb.Verdict(round=3, accepted=5, token=9, context_length=16), "accepted"),
    (pb.Verdict(round=3, accepted=1, token=9, context_length=13), "context length"),
    (pb.Verdict(round=3, accepted=1, token=100, context_length=12), "vocabulary"),
])
def test_check_verdict_refuses_an_inconsistent_verdict(verdict, why):
    with pytest.raises(ProtocolError, match=why):
        check_verdict(verdict, 3, 10, 4, limits(vocab_size=100))


# ---- the draft cursor ---------------------------------------------------------------------

def test_sync_after_a_partial_accept_matches_a_fresh_prefill(draft):
    cursor = DraftCursor(draft)
    greedy = TokenChooser(SamplingParams(), q_scale=1023)
    context = [17, 300, 42, 9, 1000, 5]
    block = cursor.draft(context, 4, greedy, vocab_size=draft.vocab_size, max_entries=16)
    assert len(block) == 4 and block.q == []
    assert draft.position == len(context) + 3  # the last draft token is never fed
    # The verifier accepts 2 and corrects the third.
    new_context = context + block.tokens[:2] + [77]
    cursor.sync(new_context)
    assert draft.position == len(new_context) and cursor.tokens == new_context
    synced = cursor.next_logits.clone()
    fresh = draft.prefill(new_context)
    assert torch.allclose(synced, fresh, atol=1e-4)
    # After a full accept the cursor feeds the last draft token and the bonus token.
    block = cursor.draft(new_context, 3, greedy, vocab_size=draft.vocab_size, max_entries=16)
    full = new_context + block.tokens + [123]
    cursor.sync(full)
    assert torch.allclose(cursor.next_logits, draft.prefill(full), atol=1e-4)


def test_greedy_draft_is_the_argmax_chain(draft):
    cursor = DraftCursor(draft)
    context = [17, 300, 42]
    block = cursor.draft(context, 3, TokenChooser(SamplingParams(), 1023),
                         vocab_size=draft.vocab_size, max_entries=16)
    chain = list(context)
    for token in block.tokens:
        assert token == int(draft.prefill(chain).argmax())
        chain.append(token)


def test_draft_stops_at_a_stop_id(draft):
    cursor = DraftCursor(draft)
    context = [17, 300, 42]
    first = int(draft.prefill(context).argmax())
    block = cursor.draft(context, 4, TokenChooser(SamplingParams(), 1023),
                         vocab_size=draft.vocab_size, max_entries=16, stop_ids=frozenset({first}))
    assert block.tokens == [first]


def test_draft_never_proposes_ids_outside_the_target_vocabulary(draft):
    cursor = DraftCursor(draft)
    block = cursor.draft([17, 300, 42], 4, TokenChooser(SamplingParams(temperature=1.0), 1023),
                         vocab_size=50, max_entries=16)
    assert all(t < 50 for t in block.tokens)
    assert all(q.ids.max() < 50 for q in block.q)


# ---- sampled drafting ---------------------------------------------------------------------

def test_sampled_draft_sends_the_q_each_token_was_drawn_from(draft):
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=7)
    cursor = DraftCursor(draft)
    block = cursor.draft([17, 300, 42, 9], 6, TokenChooser(params, 1023),
                         vocab_size=draft.vocab_size, max_entries=8)
    assert len(block.q) == len(block.tokens) == 6
    for token, q in zip(block.tokens, block.q):
        q.validate(draft.vocab_size, max_entries=8)
        assert q.prob_of(token) > 0
        assert q.weights.max() == 1023


def test_sampled_draft_is_reproducible_from_the_seed(draft):
    params = SamplingParams(temperature=1.0, seed=11)

    def run(p):
        return DraftCursor(draft).draft([17, 300, 42], 8, TokenChooser(p, 1023),
                                        vocab_size=draft.vocab_size, max_entries=16).tokens

    assert run(params) == run(params)
    others = {tuple(run(SamplingParams(temperature=1.0, seed=s))) for s in range(12, 16)}
    assert len(others | {tuple(run(params))}) > 1


def test_the_edge_rng_is_not_the_verifiers_stream():
    # The verifier seeds its acceptance test from the session seed; the edge must not draw its
    # draft tokens from the same stream, or token and acceptance would be dependent.
    for seed in (0, 1, 12345):
        assert draft_seed(seed) != seed
        edge = torch.rand(8, generator=torch.Generator().manual_seed(draft_seed(seed)))
        plain = torch.rand(8, generator=torch.Generator().manual_seed(seed))
        assert not torch.equal(edge, plain)


def test_sampled_draft_samples_from_the_quantized_q():
    # With a fixed logits vector, the empirical draw frequencies follow q, not the dense probs.
    logits = torch.tensor([2.0, 1.9, 0.5, -1.0, -8.0])
    chooser = TokenChooser(SamplingParams(temperature=1.0, seed=3), q_scale=7)
    draws = [chooser.choose(logits, max_entries=3) for _ in range(4000)]
    q = draws[0][1]
    assert set(q.ids.tolist()) == {0, 1, 2}
    counts = np.bincount([t for t, _ in draws], minlength=5)
    assert counts[3] == counts[4] == 0
    expected = np.array([q.prob_of(i) for i in range(5)]) * len(draws)
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected + 1))


# ---- result and config --------------------------------------------------------------------

def test_result_metrics_use_the_anchor_formulas():
    log = [RoundRecord(index=i, k_asked=4, drafted=4, accepted=n, mode="verify", verified=True,
                       target_passes=1) for i, n in enumerate([3, 0, 2, 1])]
    log.append(RoundRecord(index=4, k_asked=4, drafted=4, accepted=None, mode="local"))
    result = GenerationResult(token_ids=list(range(10)), rounds_log=log, drafted_tokens=16,
                              draft_bytes_up=160, wall_s=2.0, ttft_s=0.2)
    assert result.rounds == 4 and result.accepted_lengths == [3, 0, 2, 1]
    assert result.target_passes == 4
    assert result.mean_accepted_length == pytest.approx(1 + 6 / 4)
    assert result.acceptance_rate == pytest.approx(6 / 16)
    assert result.per_position_acceptance == pytest.approx([3 / 4, 2 / 4, 1 / 4, 0.0])
    assert result.passes_per_token == pytest.approx(0.4)
    assert result.tpot_s == pytest.approx(1.8 / 9)
    assert result.uplink_bytes_per_drafted_token == pytest.approx(10.0)
    out = result.as_dict()
    assert out["mean_accepted_length"] == pytest.approx(2.5) and out["rounds"] == 4
    assert len(out["rounds_log"]) == 5


def test_metrics_empty_cases():
    assert metrics.tau(0, 0) == 1.0 and metrics.tau_of([]) == 1.0
    assert metrics.acceptance_rate(0, 0) == 0.0
    assert metrics.per_position_acceptance([]) == [] == metrics.conditional_acceptance([])
    assert metrics.passes_per_token(0, 0) == 0.0
    assert metrics.tpot(1.0, 0.5, 0) == 0.0 == metrics.tpot(1.0, 0.5, 1)
    empty = GenerationResult()
    assert empty.mean_accepted_length == 1.0 and empty.acceptance_rate == 0.0
    assert empty.passes_per_token == 0.0 and empty.per_position_acceptance == []
    with pytest.raises(ValueError):
        metrics.acceptance_rate(3, 2)


def test_metrics_formulas():
    rounds = [metrics.Round(drafted=4, accepted=4), metrics.Round(drafted=4, accepted=1),
              metrics.Round(drafted=2, accepted=0), metrics.Round(drafted=3, accepted=None)]
    assert metrics.tau(5, 3) == pytest.approx(1 + 5 / 3)
    # unconditional: accepted at i / blocks that had position i
    assert metrics.per_position_acceptance(rounds) == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2])
    # conditional: accepted at i / blocks that had i and accepted everything before it
    assert metrics.conditional_acceptance(rounds) == pytest.approx([2 / 3, 1 / 2, 1.0, 1.0])
    assert metrics.tpot(3.0, 1.0, 5) == pytest.approx(0.5)
    assert metrics.expected_tokens_per_round(1.0, 4) == 5.0
    assert metrics.expected_tokens_per_round(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_edge_yaml_validates(tmp_path):
    from pathlib import Path

    from tandem.config import ConfigError, load_config
    root = Path(__file__).resolve().parents[1]
    config = load_config(root / "configs/edge.yaml", EdgeConfig)
    assert config.draft.backend == "llama.cpp" and config.client.draft_length == 4
    assert config.cloud.address == "127.0.0.1:50051"
    bad = tmp_path / "bad.yaml"
    bad.write_text("client:\n  draft_lenght: 3\n")
    with pytest.raises(ConfigError):
        load_config(bad, EdgeConfig)
    with pytest.raises(ValueError):
        ClientConfig(retry_initial_backoff_s=3.0, retry_max_backoff_s=1.0)
