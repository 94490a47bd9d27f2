"""The peers' draft-length rules (edge/control/peers.py) on synthetic round records: each
scenario is one rule of transformers, llama.cpp or SGLang, checked against what their code does."""
from __future__ import annotations

import pytest

from edge.config import ClientConfig
from edge.control.peers import (HFHeuristic, HFHeuristicConfig, LlamaCppConfig, LlamaCppPMin,
                                SGLangEMA, SGLangEMAConfig, roc_threshold)
from edge.control.policy import RoundView, make_policy
from edge.record import RoundRecord

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


def view(max_k: int = 64, round_: int = 0) -> RoundView:
    return RoundView(round=round_, generated=0, remaining=1000, max_k=max_k, link_state="up",
                     sampling=False, history=())


def record(drafted: int, accepted: int | None, confidences: list[float] | None = None,
           mode: str = "verify") -> RoundRecord:
    return RoundRecord(index=0, k_asked=drafted, drafted=drafted, accepted=accepted, mode=mode,
                       verified=accepted is not None,
                       confidences=confidences if confidences is not None else [0.9] * drafted)


def test_registered_by_name():
    config = ClientConfig()
    assert isinstance(make_policy("hf-heuristic", config), HFHeuristic)
    assert isinstance(make_policy("llamacpp-pmin", config), LlamaCppPMin)
    assert isinstance(make_policy("sglang-ema", config), SGLangEMA)


def test_hf_starts_at_20_grows_by_2_on_full_accept_shrinks_by_1_floor_1():
    policy = HFHeuristic(HFHeuristicConfig(dynamic_threshold=False))
    assert policy.plan(view()).k == 20
    assert policy.plan(view()).min_confidence == 0.4
    policy.update(record(20, 20))
    assert policy.plan(view()).k == 22
    policy.update(record(22, 3))
    assert policy.plan(view()).k == 21
    # a block cut short by the confidence stop and fully accepted still counts as full
    policy.update(record(5, 5))
    assert policy.plan(view()).k == 23
    for _ in range(40):
        policy.update(record(1, 0))
    assert policy.plan(view()).k == 1
    assert policy.plan(view(max_k=0)).k == 0  # the loop's caps win


def test_hf_ignores_rounds_that_were_not_verified():
    policy = HFHeuristic()
    policy.update(record(8, None, mode="local"))
    policy.update(record(8, None, mode="discarded"))
    assert policy.plan(view()).k == 20 and policy.threshold == 0.4


def test_roc_threshold_minimises_fpr_plus_3_fnr():
    # accepted tokens had high confidence, rejected ones low: the cut lands between them
    probs = [0.9, 0.8, 0.7, 0.3, 0.2, 0.95]
    matches = [1, 1, 1, 0, 0, 1]
    assert roc_threshold(probs, matches) == 0.7
    # one accepted token at 0.1 of four: missing it (3 x 1/4) is cheaper than admitting both
    # negatives (1); two of five at 0.1 are not (3 x 2/5 > 1)
    assert roc_threshold([0.9, 0.8, 0.7, 0.3, 0.2, 0.1], [1, 1, 1, 0, 0, 1]) == 0.7
    assert roc_threshold([0.9, 0.8, 0.7, 0.3, 0.2, 0.1, 0.1], [1, 1, 1, 0, 0, 1, 1]) == 0.1
    assert roc_threshold([0.5, 0.6], [1, 1]) is None


def test_hf_refits_its_threshold_from_verdicts():
    policy = HFHeuristic()
    # drafts above 0.6 get accepted, the first below is rejected
    for _ in range(3):
        policy.update(record(4, 2, [0.95, 0.8, 0.5, 0.45]))
    # the tokens after the first rejection are not evidence: 2 positives + 1 negative a round
    assert len(policy.probs) == len(policy.matches) == 9
    assert policy.threshold == pytest.approx(0.8)
    assert policy.plan(view()).min_confidence == pytest.approx(0.8)


def test_llamacpp_drafts_draft_max_with_p_min_and_skips_below_draft_min():
    policy = LlamaCppPMin()
    plan = policy.plan(view())
    assert (plan.k, plan.min_confidence) == (16, 0.75)
    assert policy.plan(view(max_k=5)).k == 5
    strict = LlamaCppPMin(LlamaCppConfig(draft_max=8, draft_min=3, p_min=0.9))
    assert strict.plan(view(max_k=2)).k == 0   # could not reach draft-min: no draft
    assert strict.plan(view(max_k=3)).k == 3
    policy.update(record(16, 0))
    assert policy.plan(view()).k == 16         # stateless


def test_sglang_holds_through_warmup_then_moves_between_tiers():
    policy = SGLangEMA()
    assert policy.plan(view()).k == 3 and policy.ema == 2.0
    for _ in range(10):                        # warm-up: the EMA moves, the steps do not
        policy.update(record(3, 3))
    assert policy.plan(view()).k == 3
    for _ in range(4):
        policy.update(record(3, 3))
    assert policy.plan(view()).k == 3          # not yet on the update interval
    policy.update(record(3, 3))                # 15th verify: EMA ~2.96 > 3 - 0.5 - 0.25
    assert policy.plan(view()).k == 7
    for _ in range(20):
        policy.update(record(7, 0))
    assert policy.plan(view()).k == 1          # EMA collapsed: down through both tiers
    assert policy.plan(view(max_k=0)).k == 0


def test_sglang_ema_follows_its_formula_and_hysteresis():
    policy = SGLangEMA(SGLangEMAConfig(warmup_batches=0, update_interval=1))
    policy.update(record(3, 1))
    assert policy.ema == pytest.approx(0.8 * 2.0 + 0.2 * 1)  # 1.8
    assert policy.steps == 3                   # 1.8 > 1 - 0.5: no drop to tier 1
    policy.update(record(3, 0))                # 1.44
    policy.update(record(3, 0))                # 1.152
    policy.update(record(3, 0))                # 0.92 > 0.5
    assert policy.steps == 3
    policy.update(record(3, 0))
    policy.update(record(3, 0))                # 0.59
    policy.update(record(3, 0))                # 0.47 <= 1 - 0.5: down to tier 1, but
    assert policy.steps == 3                   # > 1 - 0.5 - 0.25: up again (as SGLang)
    policy.update(record(3, 0))                # 0.38
    policy.update(record(3, 0))                # 0.30
    policy.update(record(3, 0))                # 0.24 <= 0.25: stays down
    assert policy.steps == 1
