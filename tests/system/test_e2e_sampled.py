"""Sampled decoding end to end (real verifier, real draft): a seeded run is reproducible, its
tokens are valid and verified, and top-k = 1 sampling reduces exactly to the target's greedy
output. (The statistical losslessness test lives with the verifier's own tests.)"""
from __future__ import annotations

import pytest
import torch
from verifier_harness import channel_to, client_for, open_draft, start_verifier
from verifier_harness import (edge_tokenizer, prompt_ids, reference,  # noqa: F401 (fixtures)
                              target_runtime, verifier)

from edge.request import GenerationRequest
from tandem.sampling import SamplingParams

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

torch.set_num_threads(1)

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def client(verifier, draft_dir, gguf_path, onnx_path):
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    yield client_for(channel_to(verifier), draft, draft_length=4, max_q_entries=16)
    draft.close()


def test_seeded_sampled_run_is_reproducible(client, prompt_ids, target_runtime):
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=1234)
    request = GenerationRequest(prompt_ids[140], NEW_TOKENS, sampling=params)
    first, second = client.generate(request), client.generate(request)
    assert first.token_ids == second.token_ids
    assert first.accepted_lengths == second.accepted_lengths
    assert len(first.token_ids) == NEW_TOKENS and all(first.verified)
    assert all(0 <= t < target_runtime.vocab_size for t in first.token_ids)
    others = [client.generate(GenerationRequest(prompt_ids[140], NEW_TOKENS,
                                                sampling=SamplingParams(temperature=0.8, seed=s)))
              for s in (1, 2)]
    assert any(o.token_ids != first.token_ids for o in others)


def test_sampled_uplink_carries_sparse_q(client, prompt_ids):
    sampled = client.generate(GenerationRequest(
        prompt_ids[141], NEW_TOKENS, sampling=SamplingParams(temperature=0.8, seed=5)))
    greedy = client.generate(GenerationRequest(prompt_ids[141], NEW_TOKENS))
    per_token_sampled = sampled.uplink_bytes_per_drafted_token
    per_token_greedy = greedy.uplink_bytes_per_drafted_token
    print(f"uplink bytes per drafted token: greedy {per_token_greedy:.1f}, "
          f"sampled {per_token_sampled:.1f}")
    # q travels only when sampling, and stays far below a vocabulary-sized vector.
    assert per_token_greedy < per_token_sampled < 16 * 6 + 16


def test_top_k_one_sampling_is_exactly_greedy(client, prompt_ids, reference):
    params = SamplingParams(temperature=0.7, top_k=1, seed=9)
    for ids in prompt_ids[142:144]:
        result = client.generate(GenerationRequest(ids, NEW_TOKENS, sampling=params))
        assert result.token_ids == reference.greedy(ids, 64)[:NEW_TOKENS]


def test_q_travels_coded_and_an_older_verifier_gets_plain_q(client, prompt_ids, target_runtime):
    """The same seeded request: coded q against a verifier that takes it, plain q (what it took
    before) against one that does not (limits.coded_q off: its Opened names no format), and
    both verified; the coded uplink is well under half the plain one."""
    request = GenerationRequest(prompt_ids[141], NEW_TOKENS,
                                sampling=SamplingParams(temperature=0.8, seed=5))
    coded = client.generate(request)
    older, port = start_verifier(target_runtime, coded_q=False)
    try:
        plain = client_for(channel_to(port), client.draft, draft_length=4,
                           max_q_entries=16).generate(request)
    finally:
        older.stop(0).wait()
    assert all(coded.verified) and all(plain.verified)
    assert len(coded.token_ids) == len(plain.token_ids) == NEW_TOKENS
    print(f"uplink per drafted token: coded {coded.uplink_bytes_per_drafted_token:.1f} B, "
          f"plain {plain.uplink_bytes_per_drafted_token:.1f} B")
    assert coded.uplink_bytes_per_drafted_token < plain.uplink_bytes_per_drafted_token / 2
