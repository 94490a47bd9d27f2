"""The edge model ladder and fast mode through the full system (real verifier on a loopback
socket, real llama.cpp runtimes of tandem-draft and tandem-small):

- lossless with the entropy switch flapping between the rungs every round: greedy output
  identical to the target's own, and sampled first tokens distributed as the target's (chi-square);
  switching re-syncs each model's cache by rolling back and feeding only what it missed;
- fast mode: every token is marked verified or not, the verified ones are the target's greedy
  choice after the emitted prefix, the longest unverified run honours the request's bound, the
  verifier follows the emitted context without a re-open, and a lossless request on the same
  client right after is unaffected.
"""
from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch
from scipy import stats
from verifier_harness import channel_to
from verifier_harness import (edge_tokenizer, prompt_ids, reference,  # noqa: F401 (fixtures)
                              target_runtime, verifier)

from edge.client import EdgeClient
from edge.request import GenerationRequest
from edge.link.errors import VerifierRefused
from edge.config import DEFAULT_DRAFTER, ClientConfig, EntropySwitchConfig, FastModeConfig
from edge.control.policy import DraftPolicy, Plan, RoundView
from edge.runtime import DraftConfig, load_draft_runtime
from tandem.sampling import SamplingParams, warp

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)

NEW_TOKENS = 32
# Fast mode without a stated agreement: the entropy switch's own confidence cut ends spans (the
# calibrated gate has its own tests, tests/edge/test_fast_calibration*.py).
UNCALIBRATED = FastModeConfig(min_agreement=None)


class Alternate(DraftPolicy):
    """Switches rung every round (the hardest case for keeping caches in step), k cycling 1..4.
    Counts across generations, so a generation may start on either rung."""

    def __init__(self) -> None:
        self.n = 0

    def plan(self, view: RoundView) -> Plan:
        self.n += 1
        return Plan(k=min(1 + self.n % 4, view.max_k), drafter=view.drafters[self.n % len(view.drafters)])

    def update(self, record) -> None:
        pass


def longest_unverified_run(flags: list[bool]) -> int:
    best = run = 0
    for flag in flags:
        run = 0 if flag else run + 1
        best = max(best, run)
    return best


@pytest.fixture(scope="module")
def ladder(draft_dir, gguf_path, small_dir):
    rungs = {DEFAULT_DRAFTER: load_draft_runtime(DraftConfig(model_path=gguf_path, threads=1)),
             "small": load_draft_runtime(DraftConfig(model_path=small_dir / "tandem-small-f32.gguf",
                                                     threads=1))}
    yield rungs
    for runtime in rungs.values():
        runtime.close()


def switching_client(port: int, ladder, policy=None, **config) -> EdgeClient:
    client_config = ClientConfig(policy="entropy", draft_length=4, **config)
    return EdgeClient(channel_to(port), ladder[DEFAULT_DRAFTER], client_config, policy=policy,
                      drafters={"small": ladder["small"]})


def first_token_law(client: EdgeClient, context: list[int], target_runtime,
                    n: int = 150) -> tuple[float, set[str]]:
    """Chi-square p-value of the first emitted token over n seeds against the target's warped
    p (temperature 1, top-k 8), and the rungs that drafted. One round each (max_tokens 2:
    k = 1): seconds, yet a wrong q shows. Fails at once on a token the target cannot emit."""
    params = SamplingParams(temperature=1.0, top_k=8)
    with torch.inference_mode():
        logits = target_runtime.score(target_runtime.new_state(), context)[-1]
    p = warp(logits[None], params)[0].double().numpy()
    first, drafters = [], set()
    for seed in range(n):
        result = client.generate(GenerationRequest(
            context, 2, sampling=SamplingParams(temperature=1.0, top_k=8, seed=seed)))
        first.append(result.token_ids[0])
        drafters |= {r.drafter for r in result.rounds_log}
    first = np.array(first)
    assert (p[first] > 0).all(), "emitted a token the target gives probability 0"
    support = np.flatnonzero(p * n >= 5)
    observed = np.array([(first == t).sum() for t in support] + [(~np.isin(first, support)).sum()])
    expected = np.append(p[support], 1 - p[support].sum()) * n
    keep = expected > 0
    return float(stats.chisquare(observed[keep], expected[keep] * observed[keep].sum()
                                 / expected[keep].sum()).pvalue), drafters


def test_lossless_switching_is_greedy_identical(verifier, ladder, prompt_ids, reference):
    client = switching_client(verifier, ladder, policy=Alternate())
    fed = {name: 0 for name in ladder}
    switches = 0
    for ids in prompt_ids[:4]:
        before = {name: rt.speed.prefill_tokens + rt.speed.decode_tokens for name, rt in ladder.items()}
        result = client.generate(GenerationRequest(ids, NEW_TOKENS))
        assert result.token_ids == reference.greedy(ids, NEW_TOKENS)
        assert all(result.verified)
        drafters = [r.drafter for r in result.rounds_log]
        assert set(drafters) == {DEFAULT_DRAFTER, "small"}
        switches += sum(a != b for a, b in zip(drafters, drafters[1:]))
        for name, rt in ladder.items():
            fed[name] += rt.speed.prefill_tokens + rt.speed.decode_tokens - before[name]
    assert switches >= 20
    # Catching up after a switch feeds only what the rung missed: far less than re-prefilling
    # the whole context at every switch would.
    prompt_total = sum(len(ids) for ids in prompt_ids[:4])
    assert sum(fed.values()) < 2 * prompt_total + switches * (NEW_TOKENS // 2)


def test_lossless_switching_samples_follow_the_target(verifier, ladder, prompt_ids, target_runtime):
    """The first emitted token over many seeds from a switching client, against the target's
    warped p (chi-square). Each generation's first block is drafted by whichever rung the
    previous generation left off on, so both rungs' q are tested."""
    client = switching_client(verifier, ladder, policy=Alternate())
    pvalue, _ = first_token_law(client, prompt_ids[3], target_runtime)
    assert pvalue > 1e-3


def test_the_entropy_switch_itself_is_lossless(verifier, ladder, prompt_ids, reference,
                                              target_runtime):
    """The real switch (thresholds, dwell, the rung measured fastest, another rung tried every
    2 rounds): greedy output identical to the target's, and the first sampled token distributed
    as the target's (chi-square), with both rungs drafting."""
    entropy = EntropySwitchConfig(explore_every=2)
    client = switching_client(verifier, ladder, entropy=entropy)
    drafters: set[str] = set()
    for ids in prompt_ids[6:9]:
        result = client.generate(GenerationRequest(ids, NEW_TOKENS))
        assert result.token_ids == reference.greedy(ids, NEW_TOKENS) and all(result.verified)
        drafters |= {r.drafter for r in result.rounds_log}
    pvalue, sampled_drafters = first_token_law(client, prompt_ids[3], target_runtime)
    assert pvalue > 1e-3
    assert drafters | sampled_drafters >= {DEFAULT_DRAFTER, "small"}, drafters | sampled_drafters


def test_fast_mode_marks_tokens_and_honours_the_unverified_bound(
        verifier, ladder, prompt_ids, reference, target_runtime):
    # Never hard and never unsure: every block it can skip, it skips, up to the bound.
    permissive = EntropySwitchConfig(enter_hard=20.0, exit_hard=20.0, fast_enter_hard=20.0,
                                     fast_exit_hard=20.0, start_state="easy",
                                     fast_min_confidence=0.0)
    client = switching_client(verifier, ladder, entropy=permissive, mode="fast",
                              max_unverified_run=16, fast=UNCALIBRATED)
    for ids, bound in zip(prompt_ids[:3], (3, 5, 7)):
        result = client.generate(GenerationRequest(ids, NEW_TOKENS, mode="fast",
                                                   max_unverified_run=bound))
        assert len(result.verified) == len(result.token_ids) == NEW_TOKENS
        assert 0 < sum(result.verified) < NEW_TOKENS
        assert longest_unverified_run(result.verified) <= bound
        assert result.reopens == 0  # the verifier followed the unverified tokens on the wire
        # Flags follow the rounds: verified rounds commit verified tokens, skipped ones not.
        flags = [flag for r in result.rounds_log for flag in [r.verified] * r.committed]
        assert flags == result.verified
        # A verified token is the target's greedy choice after the emitted prefix.
        with torch.inference_mode():
            logits = target_runtime.score(target_runtime.new_state(), ids + result.token_ids[:-1])
        greedy = logits[len(ids) - 1:].argmax(-1).tolist()
        assert all(g == t for g, t, v in zip(greedy, result.token_ids, result.verified) if v)

    # The same client (same policy object) serves a lossless request next: untouched by fast.
    ids = prompt_ids[4]
    result = client.generate(GenerationRequest(ids, NEW_TOKENS, mode="lossless"))
    assert all(result.verified) and result.token_ids == reference.greedy(ids, NEW_TOKENS)


@pytest.mark.parametrize("unsure_k", [0, 2])
def test_fast_mode_sends_only_unsure_positions_to_the_verifier(
        verifier, ladder, prompt_ids, target_runtime, unsure_k):
    """Never hard, confidence cut 0.3: every token emitted unverified had draft top probability
    >= 0.3; each verified round drafts at most fast_unsure_k tokens (0: the target is asked for
    the unsure position's token alone, one verified token per round); verified tokens are the
    target's greedy choice."""
    cut = 0.3
    entropy = EntropySwitchConfig(enter_hard=20.0, exit_hard=20.0, fast_enter_hard=20.0, fast_exit_hard=20.0,
                                     start_state="easy",
                                  fast_min_confidence=cut, fast_unsure_k=unsure_k)
    client = switching_client(verifier, ladder, entropy=entropy, mode="fast", max_unverified_run=16,
                              fast=UNCALIBRATED)
    ids = prompt_ids[5]
    result = client.generate(GenerationRequest(ids, 48, mode="fast"))
    local = [r for r in result.rounds_log if not r.verified]
    checked = [r for r in result.rounds_log if r.verified]
    assert local and checked
    assert all(c >= cut for r in local for c in r.confidences[:r.committed])
    assert all(r.drafted <= unsure_k for r in checked), [r.drafted for r in checked]
    if unsure_k == 0:
        assert all(r.committed == 1 for r in checked[:-1])
    with torch.inference_mode():
        logits = target_runtime.score(target_runtime.new_state(), ids + result.token_ids[:-1])
    greedy = logits[len(ids) - 1:].argmax(-1).tolist()
    assert all(g == t for g, t, v in zip(greedy, result.token_ids, result.verified) if v)
    print(f"fast, unsure_k={unsure_k}: verified share {sum(result.verified) / len(result.verified):.2f}")


def test_a_lossless_session_refuses_unverified_tokens(verifier, prompt_ids, ladder):
    """The verifier takes unverified tokens only in a session opened in fast mode."""
    from edge.drafting import Block
    from edge.link import VerifierLink
    from tandem.v1 import decoding_pb2_grpc as pb_grpc

    for fast in (False, True):
        link = VerifierLink(pb_grpc.DecodingStub(channel_to(verifier)), (), session_id=f"s{fast}",
                            target_model="", fingerprint=ladder[DEFAULT_DRAFTER].fingerprint(),
                            sampling=SamplingParams(), fast=fast)
        context = prompt_ids[0]
        link.open(context, 30.0)
        link.fast = True  # let the edge side send them even on the lossless session
        sent = link.send(len(context), Block(tokens=[5]), unverified=[7, 8])
        if fast:
            verdict, _ = link.await_verdict(sent, 30.0)
            assert link.server_context == len(context) + 2 + verdict.accepted + 1
        else:
            with pytest.raises(VerifierRefused) as refused:
                link.await_verdict(sent, 30.0)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        link.close()


def test_daemon_keeps_the_ladder_loaded_and_reports_the_verified_share(
        verifier, gguf_path, draft_dir, small_dir, heldout_prompts):
    """`ladder:` in the edge config: the daemon loads every rung; a request's `mode` and
    `max_unverified_run` reach the loop; the response's stats and /metrics give the verified
    share; a lossless request on the same pooled client stays fully verified."""
    import httpx

    from edge.config import CloudLinkConfig, DaemonConfig, EdgeConfig, LadderModelConfig
    from edge.daemon.server import DaemonThread, load_pool

    config = EdgeConfig(
        cloud=CloudLinkConfig(address=f"127.0.0.1:{verifier}"),
        draft=DraftConfig(model_path=gguf_path, tokenizer_dir=draft_dir, n_ctx=512, threads=1),
        ladder=[LadderModelConfig(name="small", model_path=small_dir / "tandem-small-f32.gguf",
                                  n_ctx=512, threads=1)],
        client=ClientConfig(policy="entropy", draft_length=4, entropy=EntropySwitchConfig(
            enter_hard=20.0, exit_hard=20.0, fast_enter_hard=20.0, fast_exit_hard=20.0,
            start_state="easy", fast_min_confidence=0.0)),
        daemon=DaemonConfig(port=0, pool_size=1, max_tokens_limit=64, max_prompt_tokens=400))
    body = {"model": "tandem-draft", "prompt": heldout_prompts[0][-300:], "max_tokens": 24,
            "temperature": 0, "ignore_eos": True}
    with DaemonThread(load_pool(config)) as daemon:
        assert set(daemon.pool._clients[0].cursors) == {DEFAULT_DRAFTER, "small"}
        fast = httpx.post(f"{daemon.url}/v1/completions", timeout=120,
                          json={**body, "mode": "fast", "max_unverified_run": 4}).json()["tandem"]
        lossless = httpx.post(f"{daemon.url}/v1/completions", timeout=120, json=body).json()["tandem"]
        metrics = httpx.get(f"{daemon.url}/metrics").text
    assert 0 < fast["verified_fraction"] < 1 and fast["unverified_tokens"] > 0
    assert lossless["verified_fraction"] == 1.0
    assert 'verified="false"' in metrics
