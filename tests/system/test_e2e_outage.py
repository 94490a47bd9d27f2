"""The cloud goes away mid-generation: the edge keeps generating locally (verified=False) and,
when a verifier comes back on the same port, resumes verified decoding from its full context.
Bounded in time: short retry deadlines, a few dozen tokens."""
from __future__ import annotations

import time

import grpc
import pytest
import torch
from verifier_harness import channel_to, client_for, open_draft, start_verifier
from verifier_harness import (edge_tokenizer, prompt_ids, reference,  # noqa: F401 (fixtures)
                              target_runtime)

from edge.request import GenerationRequest
from edge.link.errors import CloudUnavailable

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

torch.set_num_threads(1)

FAST_GIVE_UP = dict(max_retries=2, retry_initial_backoff_s=0.02, retry_max_backoff_s=0.05,
                    offline_after_s=0.5, round_timeout_s=5.0, open_timeout_s=5.0,
                    offline="continue")  # the default waits for the verifier; these go local


def runs(flags: list[bool]) -> list[tuple[bool, int]]:
    """[True, True, False, True] -> [(True, 2), (False, 1), (True, 1)]"""
    out: list[tuple[bool, int]] = []
    for flag in flags:
        if out and out[-1][0] == flag:
            out[-1] = (flag, out[-1][1] + 1)
        else:
            out.append((flag, 1))
    return out


def test_outage_goes_local_then_resumes_verified(target_runtime, prompt_ids, reference,
                                                 draft_dir, gguf_path, onnx_path):
    server, port = start_verifier(target_runtime)
    servers = [server]
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    channel = channel_to(port)
    client = client_for(channel, draft, offline_probe_tokens=6, **FAST_GIVE_UP)
    seen: list[int] = []

    def on_tokens(ids: list[int], verified: list[bool]) -> None:
        seen.extend(ids)
        if len(seen) >= 12 and servers[-1] is server:
            server.stop(0).wait()            # the cloud goes away between two rounds
            servers.append(None)
        elif not all(verified) and servers[-1] is None:
            # The first local tokens are out: bring a verifier back on the same port and let
            # the channel see it, so the next probe finds it.
            back, _ = start_verifier(target_runtime, port=port)
            servers.append(back)
            grpc.channel_ready_future(channel).result(timeout=10)

    ids = prompt_ids[150]
    started = time.monotonic()
    try:
        result = client.generate(GenerationRequest(ids, 48), on_tokens=on_tokens)
    finally:
        for s in servers:
            if s is not None:
                s.stop(0).wait()
        draft.close()
    assert time.monotonic() - started < 60
    assert result.token_ids == seen and len(result.token_ids) == 48
    pattern = runs(result.verified)
    assert [flag for flag, _ in pattern] == [True, False, True], pattern
    assert result.reopens >= 1
    # Verified tokens are the target's greedy continuation of whatever context they follow,
    # the unverified ones included.
    online, offline, _ = (n for _, n in pattern)
    assert result.token_ids[:online] == reference.greedy(ids, 64)[:online]
    resumed_at = online + offline
    context = ids + result.token_ids[:resumed_at]
    assert result.token_ids[resumed_at:] == reference.greedy(context, 48 - resumed_at)


def test_unreachable_cloud_from_the_start_generates_locally(target_runtime, prompt_ids,
                                                            draft_dir, gguf_path, onnx_path):
    # A port nothing listens on: bind a verifier, note its port, stop it.
    server, port = start_verifier(target_runtime)
    server.stop(0).wait()
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        client = client_for(channel_to(port), draft, offline_probe_tokens=8, **FAST_GIVE_UP)
        started = time.monotonic()
        result = client.generate(GenerationRequest(prompt_ids[151], 24))
        elapsed = time.monotonic() - started
        # Greedy local decoding is the draft's own argmax chain.
        expected = []
        context = list(prompt_ids[151])
        for _ in range(24):
            expected.append(int(draft.prefill(context).argmax()))
            context.append(expected[-1])
        strict = client_for(channel_to(port), draft, offline_enabled=False, **FAST_GIVE_UP)
        with pytest.raises(CloudUnavailable):
            strict.generate(GenerationRequest(prompt_ids[151], 4))
    finally:
        draft.close()
    assert result.verified == [False] * 24 and result.target_passes == 0
    assert result.token_ids == expected
    assert elapsed < 10
