"""Many sessions at once against one verifier (real server, real sockets, one draft runtime per
session): each output is identical to that session run alone, and with a KV budget too small
for all of them, evicted sessions re-open with their full context and lose nothing."""
from __future__ import annotations

import threading

import pytest
import torch
from verifier_harness import channel_to, client_for, open_draft, start_verifier
from verifier_harness import (edge_tokenizer, prompt_ids, reference,  # noqa: F401 (fixtures)
                              target_runtime)

from edge.client import EdgeClient
from edge.request import GenerationRequest
from edge.config import ClientConfig
from edge.control.policy import DraftPolicy, Plan, RoundView
from edge.record import RoundRecord
from tandem.sampling import SamplingParams

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

torch.set_num_threads(1)

SESSIONS = 8
NEW_TOKENS = 32


def requests_for(prompts: list[list[int]]) -> list[GenerationRequest]:
    """Half greedy, half sampled (each with its own seed), different prompts and draft lengths."""
    out = []
    for i, ids in enumerate(prompts):
        sampling = SamplingParams() if i % 2 == 0 else \
            SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=100 + i)
        out.append(GenerationRequest(ids, NEW_TOKENS, sampling=sampling, draft_length=2 + i % 4))
    return out


def run_concurrently(clients, requests):
    results: list = [None] * len(clients)
    errors: list = []
    start = threading.Barrier(len(clients))

    def worker(i: int) -> None:
        try:
            start.wait(timeout=30)
            results[i] = clients[i].generate(requests[i])
        except BaseException as exc:  # reported by the main thread  # noqa: BLE001
            errors.append((i, exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not any(thread.is_alive() for thread in threads), "a session hung"
    assert errors == []
    return results


def test_eight_concurrent_sessions_each_equal_that_session_alone(
        target_runtime, prompt_ids, reference, draft_dir, gguf_path, onnx_path):
    # A real gather window, so rounds of different sessions share forward passes.
    server, port = start_verifier(target_runtime, window_ms=5.0)
    drafts = [open_draft("llama.cpp", draft_dir, gguf_path, onnx_path) for _ in range(SESSIONS)]
    try:
        channel = channel_to(port)
        clients = [client_for(channel, draft) for draft in drafts]
        requests = requests_for(prompt_ids[100:100 + SESSIONS])
        alone = [client.generate(request) for client, request in zip(clients, requests)]
        passes_before = target_runtime.forward_passes
        together = run_concurrently(clients, requests)
        passes_together = target_runtime.forward_passes - passes_before
    finally:
        server.stop(0).wait()
        for draft in drafts:
            draft.close()
    for i, (a, b) in enumerate(zip(alone, together)):
        assert b.token_ids == a.token_ids, f"session {i} differs when run concurrently"
        assert all(b.verified) and len(b.token_ids) == NEW_TOKENS
        if requests[i].sampling.greedy:
            assert b.token_ids == reference.greedy(requests[i].prompt_ids, NEW_TOKENS)
    # Batching happened: fewer forward passes than rounds (+ prefills) of all sessions.
    assert passes_together < sum(r.rounds + 1 for r in together)


def test_evicted_sessions_reopen_with_full_context_and_lose_nothing(
        target_runtime, prompt_ids, reference, draft_dir, gguf_path, onnx_path):
    prompts = prompt_ids[120:124]
    longest = max(len(p) for p in prompts) + NEW_TOKENS + 16
    # Room for about one and a half sessions: every Open and every growing round of one session
    # evicts idle others, which are told so on their next Draft.
    budget = int(1.5 * longest * target_runtime.bytes_per_token)
    server, port = start_verifier(target_runtime, window_ms=1.0, kv_budget_bytes=budget)
    drafts = [open_draft("llama.cpp", draft_dir, gguf_path, onnx_path) for _ in prompts]
    try:
        channel = channel_to(port)
        clients = [client_for(channel, draft, retry_initial_backoff_s=0.01,
                              max_evictions_per_round=50) for draft in drafts]
        requests = [GenerationRequest(ids, NEW_TOKENS, draft_length=3) for ids in prompts]
        results = run_concurrently(clients, requests)
        evictions = server.engine.table.evictions
    finally:
        server.stop(0).wait()
        for draft in drafts:
            draft.close()
    print(f"evictions {evictions}, re-opens per session {[r.reopens for r in results]}")
    assert evictions > 0
    assert sum(r.reopens for r in results) > 0
    for request, result in zip(requests, results):
        assert all(result.verified), "an evicted session fell back to unverified tokens"
        assert result.token_ids == reference.greedy(request.prompt_ids, NEW_TOKENS)


class CloudRuns(DraftPolicy):
    """Always lets the cloud generate 4 tokens (its fallback k = 1 marks a round that was not
    one)."""

    def plan(self, view: RoundView) -> Plan:
        return Plan(k=1, cloud_generate=4)

    def update(self, record: RoundRecord) -> None:
        pass


def test_a_cloud_run_after_an_eviction_reopens_and_runs_in_the_cloud(
        target_runtime, prompt_ids, reference, draft_dir, gguf_path, onnx_path):
    """Cloud runs under a KV budget too small for every session: a run evicted mid-way keeps
    the tokens it got, and the next cloud run re-opens with the full context and runs as a cloud
    run (before, it went out as a speculative round, and the controller then kept off cloud runs
    for CLOUD_RETRY_ROUNDS rounds)."""
    prompts = prompt_ids[130:134]
    longest = max(len(p) for p in prompts) + NEW_TOKENS + 16
    budget = int(1.5 * longest * target_runtime.bytes_per_token)
    server, port = start_verifier(target_runtime, window_ms=1.0, kv_budget_bytes=budget)
    drafts = [open_draft("llama.cpp", draft_dir, gguf_path, onnx_path) for _ in prompts]
    try:
        channel = channel_to(port)
        clients = [EdgeClient(channel, draft, ClientConfig(retry_initial_backoff_s=0.01),
                              policy=CloudRuns()) for draft in drafts]
        requests = [GenerationRequest(ids, NEW_TOKENS) for ids in prompts]
        results = run_concurrently(clients, requests)
        evictions = server.engine.table.evictions
    finally:
        server.stop(0).wait()
        for draft in drafts:
            draft.close()
    assert evictions > 0 and sum(r.reopens for r in results) > 0
    for request, result in zip(requests, results):
        assert {r.mode for r in result.rounds_log} == {"cloud"}
        assert all(result.verified)
        assert result.token_ids == reference.greedy(request.prompt_ids, NEW_TOKENS)
