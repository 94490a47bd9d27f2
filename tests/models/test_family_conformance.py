"""The conformance table: every model family transformers ships that tests/helpers/family_models.py
builds (tiny random weights, windows shorter than the contexts, softcaps and sinks on) is served
exactly by the torch backend or refused at load by name; none crashes.

Per family: the verifier (a real server on a loopback socket) serving it to four concurrent
edge clients (the shipped llama.cpp draft, different k) gives transformers' greedy `generate`
of the target alone, token for token; one ragged batched pass equals each session alone; and
for a windowed family and a softcapped one, sampled output follows the target's law
(chi-square). The table (family, path, why) is printed.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_models import FURTHER, NAMED, build_family
from sampling_law import chi_square_pvalue, joint_law
from verifier_harness import (Reference, channel_to, client_for, generate_concurrently, open_draft,
                              start_verifier)
from verifier_harness import edge_tokenizer, prompt_ids  # noqa: F401 (fixtures)

from cloud.runtime.serving_path import UnsupportedTarget
from cloud.runtime.target import TargetRuntime
from edge.request import GenerationRequest
from tandem.sampling import SamplingParams

pytestmark = pytest.mark.e2e  # real verifier on a socket, real draft runtimes

torch.set_num_threads(1)

NEW_TOKENS = 20
DRAFT_LENGTHS = (2, 3, 5, None)   # None: the client's own policy (it may let the cloud run)
ATOL = 1e-4                       # float32 rounding between differently shaped passes
SAMPLES = 150
TABLE: dict[str, str] = {}


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="module")
def drafts(draft_dir, gguf_path, onnx_path):
    opened = [open_draft("llama.cpp", draft_dir, gguf_path, onnx_path) for _ in DRAFT_LENGTHS]
    yield opened
    for draft in opened:
        draft.close()


@pytest.fixture(scope="module")
def long_prompts(prompt_ids) -> list[list[int]]:
    """Four held-out prompts of 60-160 tokens: every context is past the families' windows."""
    chosen = [ids for ids in prompt_ids if 60 <= len(ids) <= 160][: len(DRAFT_LENGTHS)]
    assert len(chosen) == len(DRAFT_LENGTHS)
    return chosen


def _served(family: str, families: Path) -> TargetRuntime | None:
    """The family's runtime, or None when refused by name (only further families may be)."""
    model_dir = build_family(family, Path(__file__).parents[2] / "models/tokenizer", families)
    try:
        runtime = TargetRuntime(model_dir, device="cpu")
    except UnsupportedTarget as refusal:
        message = str(refusal)
        TABLE[family] = f"refused: {message}"
        assert family in FURTHER, message
        assert f"'{family}'" in message and "model.backend: vllm" in message
        assert "\n" not in message
        return None
    TABLE[family] = f"{runtime.path.name}: {runtime.path.reason}"
    return runtime


def _batched_equals_solo(runtime: TargetRuntime) -> float:
    """Three sessions of different lengths and k in one pass vs each alone: max |diff|."""
    generator = torch.Generator().manual_seed(1)
    contexts = [torch.randint(runtime.vocab_size, (n,), generator=generator).tolist()
                for n in (70, 45, 12)]
    blocks = [[5], [6, 7, 8, 9], [10, 11, 12, 13, 14, 15]]
    together = [runtime.new_state() for _ in contexts]
    runtime.forward(list(zip(together, contexts)))
    joint = runtime.forward(list(zip(together, blocks)))
    worst = 0.0
    for context, block, rows in zip(contexts, blocks, joint):
        alone = runtime.new_state()
        runtime.score(alone, context)
        worst = max(worst, float((runtime.score(alone, block) - rows.cpu()).abs().max()))
        alone.release()
    for state in together:
        state.release()
    return worst


@pytest.mark.parametrize("family", NAMED + FURTHER)
def test_family_is_served_exactly_or_refused_by_name(family, families, drafts, long_prompts):
    runtime = _served(family, families)
    if runtime is None:
        return
    assert _batched_equals_solo(runtime) < ATOL
    reference = Reference(runtime.model_dir)
    server, port = start_verifier(runtime)
    try:
        results = generate_concurrently(port, drafts, long_prompts, DRAFT_LENGTHS, NEW_TOKENS)
    finally:
        server.stop(grace=0).wait()
    for ids, result in zip(long_prompts, results):
        assert all(result.verified)
        assert result.token_ids == reference.greedy(ids, NEW_TOKENS), \
            f"{family} ({runtime.path.name} path) differs from generate"


@pytest.mark.parametrize("family", ["mistral", "gemma2"])  # a window; a softcap (+ window)
def test_sampled_output_follows_the_targets_law(family, families, drafts, long_prompts):
    runtime = _served(family, families)
    reference = Reference(runtime.model_dir)
    ids = long_prompts[0]
    params = SamplingParams(temperature=1.0, top_k=3)
    law = joint_law(reference.model, ids, params, 2)
    server, port = start_verifier(runtime)
    counts: dict[tuple, int] = {}
    try:
        client = client_for(channel_to(port), drafts[0])
        for seed in range(SAMPLES):
            sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
            result = client.generate(GenerationRequest(ids, 3, sampling=sampling, draft_length=3))
            key = tuple(result.token_ids[:2])
            assert key in law, f"sampled {key}, impossible for the target"
            assert all(result.verified)
            counts[key] = counts.get(key, 0) + 1
    finally:
        server.stop(grace=0).wait()
    pvalue = chi_square_pvalue(law, counts, SAMPLES)
    print(f"{family}: chi-square p = {pvalue:.3f}")
    assert pvalue > 1e-3


def test_print_the_table():
    """The table the tests above filled (run last in this module), for the log."""
    for family, row in TABLE.items():
        print(f"{family:14s} {row}")
