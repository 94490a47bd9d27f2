"""Fast mode held to a stated agreement, through the daemon's API (real verifier on a loopback
socket, real llama.cpp runtimes of tandem-draft and tandem-small, the shipped calibration
prior):

- a fast request's response and a stream's final chunk report the agreement: the stated
  min_agreement, the expected agreement (at or above it), the measured one on checked tokens;
- every verified token is the target's greedy choice after the emitted prefix; every token
  emitted unverified was drafted at or above the calibration's cut;
- min_agreement 1 verifies everything; a lossless request right after on the same pooled client
  is the target's own greedy output with no agreement block; a min_agreement out of (0, 1] is
  a 400.
"""
from __future__ import annotations

import json

import httpx
import pytest
import torch
from verifier_harness import (edge_tokenizer, prompt_ids, reference,  # noqa: F401 (fixtures)
                              target_runtime, verifier)

from edge.request import GenerationRequest
from edge.config import (CloudLinkConfig, ClientConfig, DaemonConfig, EdgeConfig,
                         EntropySwitchConfig, LadderModelConfig)
from edge.daemon.server import DaemonThread, load_pool
from edge.runtime import DraftConfig

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)

NEW_TOKENS = 48


@pytest.fixture(scope="module")
def daemon(verifier, gguf_path, draft_dir, small_dir):
    config = EdgeConfig(
        cloud=CloudLinkConfig(address=f"127.0.0.1:{verifier}"),
        draft=DraftConfig(model_path=gguf_path, tokenizer_dir=draft_dir, n_ctx=512, threads=1),
        ladder=[LadderModelConfig(name="small", model_path=small_dir / "tandem-small-f32.gguf",
                                  n_ctx=512, threads=1)],
        client=ClientConfig(policy="entropy", draft_length=4, max_unverified_run=32,
                            entropy=EntropySwitchConfig(start_state="easy")),
        daemon=DaemonConfig(port=0, pool_size=1, max_tokens_limit=64, max_prompt_tokens=400))
    with DaemonThread(load_pool(config)) as running:
        yield running


def complete(daemon, ids: list[int], **extra) -> dict:
    body = {"model": "tandem-draft", "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, **extra}
    reply = httpx.post(f"{daemon.url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def target_greedy_after(target_runtime, ids: list[int], out: list[int]) -> list[int]:
    with torch.inference_mode():
        logits = target_runtime.score(target_runtime.new_state(), ids + out[:-1])
    return logits[len(ids) - 1:].argmax(-1).tolist()


def test_a_fast_request_reports_its_agreement_and_keeps_to_it(daemon, prompt_ids, target_runtime):
    for ids in prompt_ids[:3]:
        stats = complete(daemon, ids[-300:], mode="fast", min_agreement=0.95)["tandem"]
        agreement = stats["agreement"]
        assert agreement["min_agreement"] == 0.95
        assert agreement["expected_agreement"] >= 0.95
        assert stats["unverified_tokens"] > 0, stats  # easy code goes out unverified
    # The same pooled client, asked directly, shows each round: every token emitted unverified
    # was drafted at or above a cut the calibration gave, and every verified token is the
    # target's greedy choice after the emitted prefix.
    client = daemon.pool._clients[0]
    calibration, cuts = client.calibration, []
    real_cut = calibration.cut

    def spied_cut(*args, **kwargs):
        cuts.append(real_cut(*args, **kwargs))
        return cuts[-1]

    calibration.cut = spied_cut
    try:
        ids = prompt_ids[5][-300:]
        result = client.generate(GenerationRequest(ids, NEW_TOKENS, mode="fast",
                                                   min_agreement=0.95))
    finally:
        del calibration.cut
    skipped = [r for r in result.rounds_log if r.mode == "local"]
    assert skipped and cuts and all(r.cause == "fast_mode" for r in skipped)
    assert all(c >= min(cuts) for r in skipped for c in r.confidences[:r.committed])
    greedy = target_greedy_after(target_runtime, ids, result.token_ids)
    assert all(g == t for g, t, v in zip(greedy, result.token_ids, result.verified) if v)
    assert result.agreement["expected_agreement"] >= 0.95


def test_the_stream_marks_tokens_and_its_last_chunk_carries_the_agreement(
        daemon, prompt_ids, target_runtime):
    ids = prompt_ids[3][-300:]
    body = {"model": "tandem-draft", "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "mode": "fast", "min_agreement": 0.95}
    chunks = []
    with httpx.stream("POST", f"{daemon.url}/v1/completions", json=body, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    deltas = [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][-1]
    assert {d["tandem"]["verified"] for d in deltas} == {True, False}
    agreement = final["tandem"]["agreement"]
    assert agreement["expected_agreement"] >= agreement["min_agreement"] == 0.95


def test_min_agreement_one_verifies_all_and_lossless_is_untouched(daemon, prompt_ids, reference):
    ids = prompt_ids[4][-300:]
    strict = complete(daemon, ids, mode="fast", min_agreement=1.0)["tandem"]
    assert strict["verified_fraction"] == 1.0 and strict["agreement"]["expected_agreement"] == 1.0
    lossless = complete(daemon, ids)
    assert lossless["tandem"]["verified_fraction"] == 1.0 and lossless["tandem"]["agreement"] is None
    assert lossless["choices"][0]["token_ids"] == reference.greedy(ids, NEW_TOKENS)
    for bad in (0, 1.5):
        reply = httpx.post(f"{daemon.url}/v1/completions", timeout=30, json={
            "model": "tandem-draft", "prompt": ids, "max_tokens": 4, "mode": "fast",
            "min_agreement": bad})
        assert reply.status_code == 400 and "min_agreement" in reply.text
