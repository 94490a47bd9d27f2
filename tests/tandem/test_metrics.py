"""tandem/metrics.py, the one source of the figures (τ, acceptance, passes per token, TPOT),
and a generation's summary (edge/record.py GenerationResult) read through it."""
from __future__ import annotations

import pytest

from edge.record import GenerationResult, RoundRecord
from tandem import metrics

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


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
