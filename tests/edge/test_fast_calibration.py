"""Fast mode's calibration and the gate that holds a fast request to its min_agreement
(edge/fast_calibration.py, edge/fast_mode.py): pure parts, no model or network.

- the cut for a stated agreement is the lowest confidence whose expected agreement over the
  mix reaches it, and rises when the measured agreement falls (drift);
- only checked tokens count (positions 0..accepted of a verified round), the prior decays like
  evidence, sampled and greedy rounds are kept apart;
- the gate ends a span where the generation's expected agreement would drop below the target,
  sends an unsure first position to the verifier, audits a share of confident spans, reports
  expected and measured agreement, and changes nothing in a lossless request.
"""
from __future__ import annotations

import json

import pytest

from edge.config import FastModeConfig
from edge.control.policy import Plan
from edge.drafting import Block
from edge.fast_calibration import (BUCKETS, CONFIDENCE_EDGES, FastCalibration, ModelCalibration,
                                   bucket, monotone)
from edge.fast_mode import FastModeGate
from edge.record import RoundRecord

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)


def prior(rates: list[float], seen: float = 100.0) -> dict:
    """A prior entry with `seen` positions per bucket at these agreement rates."""
    return {"seen": [seen] * BUCKETS, "agreed": [seen * r for r in rates]}


STEP = [0.5] * 8 + [1.0] * 8   # unsure below 0.18, certain above


def calibration(rates=STEP, **settings) -> FastCalibration:
    settings.setdefault("audit_share", 0.0)
    settings.setdefault("prior_tokens", 1e5)  # rates close to the prior's (SHRINK aside)
    return FastCalibration({"m": prior(rates)}, models={"draft": "m"}, **settings)


def verified(confidences: list[float], accepted: int, drafter: str = "") -> RoundRecord:
    return RoundRecord(index=0, k_asked=len(confidences), drafted=len(confidences),
                       accepted=accepted, mode="verify", verified=True,
                       confidences=confidences, drafter=drafter)


def test_buckets_and_the_monotone_fit():
    assert [bucket(c) for c in (0.0, 0.05, 0.18, 0.999, 1.0)] == [0, 1, 8, BUCKETS - 1, BUCKETS - 1]
    assert monotone([0.9, 0.5, 0.7, 1.0], [1, 1, 2, 1]) == pytest.approx([0.7, 0.7, 0.7, 1.0])


def test_the_cut_is_the_lowest_confidence_that_meets_the_agreement():
    model = ModelCalibration.from_prior(prior(STEP), tokens=1e6)
    # Half the mix agrees half the time: cutting below bucket b verifies the first b buckets.
    # E(b) = b/16 + (8 - b)/16 * 0.5 + 8/16  ->  0.75 at b = 0, 1.0 at b = 8.
    assert model.cut(0.749) == CONFIDENCE_EDGES[0]
    assert model.cut(0.85) == CONFIDENCE_EDGES[4]    # E(3) = 3/16 + 2.5/16 + 0.5 = 0.84375
    assert model.cut(0.999) == CONFIDENCE_EDGES[8]
    assert ModelCalibration().cut(0.95) == 1.0        # flat: verify everything until measured


def test_only_checked_tokens_count_and_sampling_is_kept_apart():
    cal = calibration(prior_tokens=0.0)
    cal.observe("draft", [0.9, 0.9, 0.9, 0.9], accepted=1)   # 0 agreed, 1 not, 2-3 unchecked
    model = cal.model("draft")
    assert sum(model.checked) == pytest.approx(2.0, rel=1e-2)
    assert model.agreed[bucket(0.9)] == pytest.approx(1.0, rel=1e-2)
    assert sum(cal.model("draft", sampling=True).checked) == 0.0


def test_the_prior_decays_like_evidence_and_drift_raises_the_cut():
    cal = calibration(prior_tokens=1000.0, half_life_tokens=500.0)
    model = cal.model("draft")
    assert model.rates()[bucket(0.9)] == pytest.approx(1.0, abs=0.01)
    cut_before = cal.cut("draft", 0.95)
    for _ in range(500):                                 # confident tokens, wrong half the time
        cal.observe("draft", [0.9, 0.9], accepted=1)     # one agrees, one does not
    # After 1000 checked tokens (two half-lives) the prior holds a quarter of its weight.
    prior_left = model.checked[bucket(0.5)]              # a bucket no observation touched
    assert prior_left == pytest.approx(1000.0 / BUCKETS / 4, rel=0.01)
    assert model.rates()[bucket(0.9)] < 0.8
    assert cal.cut("draft", 0.95) > cut_before


def skip_plan(**fields) -> Plan:
    return Plan(k=8, verify=False, min_confidence=0.125, unsure_k=0, drafter="", **fields)


def test_a_fast_request_is_drafted_up_to_the_calibrated_cut():
    gate = FastModeGate(True, 64, calibration(), min_agreement=0.99)
    plan = gate.gate(skip_plan(), drafters=("draft",))
    assert not plan.verify and plan.min_confidence == CONFIDENCE_EDGES[8]


def test_the_span_ends_where_the_expected_agreement_would_fall_below_the_target():
    rates = [0.5] * 8 + [0.9] * 8                        # confident tokens agree 90%
    gate = FastModeGate(True, 64, calibration(rates), min_agreement=0.945)
    gate.committed(4, verified=True)                     # 4 verified tokens: credit
    plan = gate.gate(skip_plan(), ("draft",))
    block = Block(tokens=list(range(8)), confidences=[0.9] * 8)
    plan, block, k = gate.after_draft(plan, block, 8)
    # (4 + 0.9 n) / (4 + n) >= 0.945 holds for n <= 4
    assert not plan.verify and len(block) == k == 4 and block.end_reason == "confidence"
    gate.skipped(block)
    gate.committed(4, verified=False)
    assert gate.report()["expected_agreement"] == pytest.approx((4 + 3.6) / 8, rel=1e-3)
    # The next round goes to the verifier (the unsure position's token alone).
    plan = gate.gate(skip_plan(), ("draft",))
    assert plan.verify and plan.k == 0


def test_an_unsure_first_position_goes_to_the_verifier():
    gate = FastModeGate(True, 64, calibration(), min_agreement=0.99)
    plan = gate.gate(skip_plan(), ("draft",))
    plan, block, k = gate.after_draft(plan, Block(tokens=[1, 2], confidences=[0.1, 0.9]), 8)
    assert plan.verify and len(block) == k == 0


def test_a_share_of_confident_spans_is_audited_and_measured():
    cal = calibration(audit_share=0.25)
    gate = FastModeGate(True, 1000, cal, min_agreement=0.9)
    audits = 0
    for _ in range(40):
        plan = gate.gate(skip_plan(), ("draft",))
        plan, block, k = gate.after_draft(plan, Block(tokens=[1, 2, 3, 4],
                                                      confidences=[0.9] * 4), 8)
        if plan.verify:
            audits += 1
            assert len(block) == 4                        # the whole confident span is checked
            gate.observe(verified(block.confidences, accepted=3))
            gate.committed(4, verified=True)
        else:
            gate.skipped(block)
            gate.committed(4, verified=False)
    assert audits == 10                                   # a quarter of the confident tokens
    report = gate.report()
    assert report["checked_tokens"] == 40 and report["measured_agreement"] == pytest.approx(0.75)
    assert report["checked_expected_agreement"] > 0.75    # it expected better: drift shows
    assert report["min_agreement"] == 0.9


def test_a_lossless_request_is_untouched_by_the_calibration():
    cal = calibration()
    gate = FastModeGate(False, 64, cal, min_agreement=0.95)
    plan = gate.gate(skip_plan(), ("draft",))
    assert plan.verify and plan.min_confidence == 0.0 and plan.k == 8
    block = Block(tokens=[1, 2], confidences=[0.9, 0.9])
    assert gate.after_draft(plan, block, 2) == (plan, block, 2)
    gate.observe(verified([0.9, 0.9], accepted=2))       # its checks are still measurements
    assert sum(cal.model("draft").checked) > 1000.0 - 1e-6 and gate.report() is None


def test_the_shipped_prior_loads_and_a_foreign_one_starts_flat(tmp_path, caplog):
    shipped = FastCalibration.from_config(FastModeConfig())
    cut = shipped.cut("small", 0.95)
    assert 0.0 < cut < 0.5, cut                           # most positions may go unverified
    assert shipped.cut("small", 0.99) > cut
    bad = tmp_path / "prior.json"
    bad.write_text(json.dumps({"edges": [0.0, 1.0], "models": {}}))
    flat = FastCalibration.load(bad)
    assert flat.cut("small", 0.95) == 1.0 and "starts flat" in caplog.text
