"""Greedy output of the full system (real verifier on a real loopback socket, edge client with a
real draft runtime) is token-for-token what transformers' greedy generate of the target alone
produces: on 50 held-out prompts with the llama.cpp draft, and a few with each other backend."""
from __future__ import annotations

import pytest
import torch
from verifier_harness import channel_to, client_for, open_draft
from verifier_harness import (edge_tokenizer, prompt_ids, reference,  # noqa: F401 (fixtures)
                              target_runtime, verifier)

from edge.request import GenerationRequest

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

torch.set_num_threads(1)

NEW_TOKENS = 64

def greedy_mismatches(client, prompts, reference, draft_length=None):
    """Run every prompt; return the mismatching ones and the totals of what they cost."""
    mismatches, rounds, accepted, passes, tokens, drafted, draft_bytes = [], 0, 0, 0, 0, 0, 0
    for index, ids in enumerate(prompts):
        result = client.generate(GenerationRequest(ids, NEW_TOKENS, draft_length=draft_length))
        assert all(result.verified) and result.finish_reason == "length"
        assert result.rounds == result.target_passes == len(result.accepted_lengths)
        expected = reference.greedy(ids, NEW_TOKENS)
        if result.token_ids != expected:
            first = next(i for i, (a, b) in enumerate(zip(result.token_ids, expected)) if a != b)
            mismatches.append((index, first, result.token_ids[first], expected[first]))
        rounds += result.rounds
        accepted += sum(result.accepted_lengths)
        passes += result.target_passes
        tokens += len(result.token_ids)
        drafted += result.drafted_tokens
        draft_bytes += result.draft_bytes_up
    stats = {"mean_accepted_length": 1 + accepted / rounds, "passes_per_token": passes / tokens,
             "uplink_bytes_per_drafted_token": draft_bytes / max(drafted, 1)}
    return mismatches, stats


def test_greedy_llama_cpp_equals_target_greedy_on_50_prompts(
        verifier, prompt_ids, reference, draft_dir, gguf_path, onnx_path, record_property):
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        client = client_for(channel_to(verifier), draft, draft_length=4)
        mismatches, stats = greedy_mismatches(client, prompt_ids[:50], reference)
    finally:
        draft.close()
    for name, value in stats.items():
        record_property(name, round(value, 3))
    print(f"llama.cpp greedy k=4 on 50 prompts: {stats}")
    # (prompt index, first differing position, system's token, target's token)
    assert mismatches == []
    # A round never emits fewer than one token: at most one target pass per token.
    assert stats["passes_per_token"] <= 1.0


@pytest.mark.parametrize("backend, draft_length", [("onnxruntime", 3), ("torch", 6)])
def test_greedy_other_backends_equal_target_greedy(
        backend, draft_length, verifier, prompt_ids, reference, draft_dir, gguf_path, onnx_path):
    draft = open_draft(backend, draft_dir, gguf_path, onnx_path)
    try:
        client = client_for(channel_to(verifier), draft)
        mismatches, stats = greedy_mismatches(client, prompt_ids[50:54], reference,
                                              draft_length=draft_length)
    finally:
        draft.close()
    print(f"{backend} greedy k={draft_length} on 4 prompts: {stats}")
    assert mismatches == []


def test_draft_length_zero_is_plain_target_decoding(verifier, prompt_ids, reference, draft_dir,
                                                    gguf_path, onnx_path):
    """k = 0: every verdict is the target's plain next token, one pass per token."""
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        client = client_for(channel_to(verifier), draft)
        result = client.generate(GenerationRequest(prompt_ids[60], 16, draft_length=0))
    finally:
        draft.close()
    assert result.token_ids == reference.greedy(prompt_ids[60], 64)[:16]
    assert result.target_passes == 16 and result.drafted_tokens == 0
    assert result.accepted_lengths == [0] * 16


def test_stop_id_ends_generation_right_after_it(verifier, prompt_ids, reference, draft_dir,
                                                gguf_path, onnx_path):
    ids = prompt_ids[61]
    expected = reference.greedy(ids, NEW_TOKENS)
    stop = expected[10]
    cut = expected.index(stop) + 1
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        client = client_for(channel_to(verifier), draft)
        result = client.generate(GenerationRequest(ids, NEW_TOKENS, stop_ids=frozenset({stop})))
    finally:
        draft.close()
    assert result.finish_reason == "stop"
    assert result.token_ids == expected[:cut]
