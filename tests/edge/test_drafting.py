"""edge/drafting.py on the shipped draft (llama.cpp): the draft cursor's sync/rollback against
a fresh prefill, greedy and stopped drafts, and the sampled draft's q (valid, reproducible,
drawn from the quantized q, the edge's RNG distinct from the verifier's)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edge.drafting import DraftCursor, TokenChooser, draft_seed
from edge.runtime import DraftConfig, load_draft_runtime
from tandem.sampling import SamplingParams

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def draft(gguf_path):
    runtime = load_draft_runtime(DraftConfig(backend="llama.cpp", model_path=gguf_path,
                                             n_ctx=512, threads=1))
    yield runtime
    runtime.close()


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
