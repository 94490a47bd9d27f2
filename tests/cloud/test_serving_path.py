"""The load-time self-test that decides a target's serving path (cloud/runtime/serving_path.py),
on the shipped target: its contexts reach past the widest window, a path that gives the model's
own logits passes, one off by a real error fails, and a near-tie flip within rounding does not."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, MistralConfig

from cloud.runtime.serving_path import (SELF_TEST_MARGIN, SELF_TEST_MAX_CONTEXT,
                                        length_dependent_rope, run_self_test,
                                        self_test_lengths)
from cloud.runtime.target import TargetRuntime

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def runtime(target_dir) -> TargetRuntime:
    torch.set_num_threads(1)
    return TargetRuntime(target_dir, device="cpu")


def test_contexts_reach_past_the_widest_window():
    assert max(self_test_lengths(MistralConfig(sliding_window=100), 4096)) == \
        100 + SELF_TEST_MARGIN
    assert max(self_test_lengths(MistralConfig(sliding_window=10**6), 10**7)) == \
        SELF_TEST_MAX_CONTEXT
    assert len(set(self_test_lengths(LlamaConfig(), 2048))) == 3  # ragged


def _test(runtime, forward):
    return run_self_test(runtime.new_state, forward, runtime.reference_logits,
                         runtime.vocab_size, [40, 25, 9], torch.float32)


def test_the_served_path_passes_and_a_shifted_one_fails(runtime):
    exact = _test(runtime, lambda batch: list(runtime.forward(batch)))
    assert exact.passed and exact.rows == 40 + 25 + 9 + 1 + 4 + 7
    assert exact.max_logit_diff < exact.tolerance

    def off_by_one_position(batch):  # a cache error: every row one position late
        rows = list(runtime.forward(batch))
        return [torch.cat([row[:1], row[:-1]]) for row in rows]
    wrong = _test(runtime, off_by_one_position)
    assert not wrong.passed and wrong.decisive_disagreements > 0


def test_a_failing_pass_is_reported_not_raised(runtime):
    def broken(batch):
        raise RuntimeError("shape mismatch in layer 3\nmore detail")
    report = _test(runtime, broken)
    assert not report.passed and report.error == "RuntimeError: shape mismatch in layer 3"


def test_a_near_tie_flip_within_rounding_is_not_decisive(runtime):
    """Where the model's own top two tie, a path whose rounding puts the second first still
    passes: the flip is not decisive."""
    def tied(logits):
        """Ties row 0's top two; returns (the one argmax picks, the other)."""
        first, second = logits[0].topk(2).indices.tolist()
        logits[0, second] = logits[0, first]
        picked = int(logits[0].argmax())
        return picked, first + second - picked

    calls = []

    def reference(tokens):  # the first session's context is compared first
        logits = runtime.reference_logits(tokens).clone()
        if not calls:
            tied(logits)
        calls.append(tokens)
        return logits

    def flipped(batch):  # the first pass: the first session's first row
        rows = [row.clone() for row in runtime.forward(batch)]
        if len(calls) == 0 and len(rows[0]) == 40:
            _, other = tied(rows[0])
            rows[0][0, other] += 1e-4  # under the tolerance, above a float32 ulp
        return rows
    report = run_self_test(runtime.new_state, flipped, reference, runtime.vocab_size,
                           [40, 25, 9], torch.float32)
    assert report.argmax_agreement < 1.0 and report.decisive_disagreements == 0
    assert report.passed


def test_rope_that_changes_with_the_longest_position_takes_the_exact_path():
    from transformers import Phi3Config
    longrope = Phi3Config(rope_parameters={
        "rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48,
        "original_max_position_embeddings": 256, "rope_theta": 10000.0})
    assert length_dependent_rope(longrope) == "longrope"
    assert length_dependent_rope(LlamaConfig(rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})) == "dynamic"
    assert length_dependent_rope(LlamaConfig()) is None
