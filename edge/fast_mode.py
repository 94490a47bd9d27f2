"""The fast-mode gate: which plans may skip verification, and what bounds an unverified span.

In fast mode (a session opened with MODE_FAST) a policy may mark a block skippable (Plan.verify
False): it is committed unverified while the unverified run (tokens committed unverified since
the last verified one) stays within max_unverified_run, and the next verified block carries
those tokens to the verifier (VerifierLink.send's `unverified`). Everywhere else a skippable
plan is verified like any block, so a lossless request is verified whatever the policy says.

With a calibration (edge/fast_calibration.py) a fast request is held to its stated agreement
A = min_agreement, the expected share of emitted tokens the target would itself choose:
- the span is drafted up to the first position below the calibration's cut for A (the draft's
  top probability under which positions go to the target; the policy's own fast_min_confidence
  is then not used);
- it goes unverified only while the generation's expected agreement (verified tokens count as
  agreeing, unverified ones at their calibrated agreement) stays at or above A: the span ends
  before the token that would take it below, and that position goes to the target;
- every block the policy drafts is such a span (the policy's hard state does not force
  verification: a threshold in nats means different agreement on different text);
- an `audit_share` of the confident spans is verified anyway (so the calibration can see
  itself being wrong), and every verified round's checked tokens feed the calibration.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from edge.config import DEFAULT_DRAFTER
from edge.control.policy import Plan
from edge.drafting import Block
from edge.fast_calibration import AgreementTally, FastCalibration
from edge.record import RoundRecord


class FastModeGate:
    def __init__(self, fast: bool, max_unverified_run: int,
                 calibration: FastCalibration | None = None, min_agreement: float | None = None,
                 sampling: bool = False, unsure_k: int = 0) -> None:
        self.fast = fast
        self.max_unverified_run = max_unverified_run
        self.unverified_run = 0      # tokens committed unverified since the last verified one
        self.force_verify = False    # the last skipped span ended on an unsure position
        self.calibration = calibration
        self.sampling = sampling
        self.unsure_k = unsure_k      # a calibrated span's verified round after an unsure position
        # a fast request with a calibration and a min_agreement is held to it (else the
        # policy's own confidence cut ends spans); its tally is reported
        self.tally = AgreementTally(min_agreement) \
            if fast and calibration is not None and min_agreement is not None else None
        self._pending: list[float] = []  # expected agreement of the span being committed

    def before_draft(self, plan: Plan, max_k: int, drafters: Collection[str]) -> tuple[Plan, int]:
        """The round's one decision before drafting: the plan the loop runs (gate) and the
        block length it drafts (bound), within max_k (every cap already applied)."""
        plan = self.gate(plan, drafters)
        return self.bound(plan, min(max(plan.k, 0), max_k))

    def gate(self, plan: Plan, drafters: Collection[str]) -> Plan:
        """The plan the loop runs: a skippable block stays skippable only in fast mode, within
        the unverified-run bound, and not right after a skipped span that ended on an unsure
        position (with a calibration: drafted up to its cut); otherwise it is verified like any
        block, without the fast-mode confidence cut (in fast mode, drafting the plan's unsure_k
        tokens). The drafter is one of `drafters` ("" = the default)."""
        drafter = plan.drafter if plan.drafter in drafters else ""
        if plan.drafter != drafter:
            plan = replace(plan, drafter=drafter)
        if plan.verify and self.tally is not None and plan.k and not plan.cloud_generate:
            # Held to an agreement, the calibration decides what goes unverified, not the
            # policy's state (the entropy switch's hard text): its block is a span like any.
            plan = replace(plan, verify=False, unsure_k=self.unsure_k
                           if plan.unsure_k is None else plan.unsure_k)
        if plan.verify:
            return plan
        if self.fast and not self.force_verify and self.unverified_run < self.max_unverified_run:
            if self.tally is not None:
                plan = replace(plan, min_confidence=self.calibration.cut(
                    _name(drafter), self.tally.min_agreement, self.sampling))
            return plan
        k = plan.unsure_k if self.fast and plan.unsure_k is not None else plan.k
        return replace(plan, k=min(k, plan.k), verify=True, min_confidence=0.0)

    def bound(self, plan: Plan, k: int) -> tuple[Plan, int]:
        """A skippable block drafts no more than the unverified run may still grow; with
        nothing to skip (e.g. one token left) a verified round makes progress instead."""
        if plan.verify:
            return plan, k
        k = min(k, self.max_unverified_run - self.unverified_run)
        if k == 0:
            plan = replace(plan, verify=True, min_confidence=0.0)
        return plan, k

    def after_draft(self, plan: Plan, block: Block, k: int) -> tuple[Plan, Block, int]:
        """The round's one decision after drafting: the span a skippable block may emit
        unverified (its positions from the first at or above the plan's confidence cut, and,
        with a calibration, while the generation's expected agreement holds). Nothing to skip:
        the verifier checks the block (just the plan's unsure_k first tokens, in fast mode). An
        audit: the verifier checks the whole span."""
        if plan.verify or not block.confidences:
            return plan, block, k
        n = len(block) if block.confidences[0] >= plan.min_confidence else 0
        if n and self.tally is not None:
            p = self.calibration.agreement(_name(plan.drafter), block.confidences, self.sampling)
            after = self.tally.expected_after(p)
            n = next((i for i, e in enumerate(after) if e < self.tally.min_agreement), n)
            if n and self.calibration.audit_due():
                self.calibration.count(n, audited=True)
                block = block.head(n, end_reason="confidence")
                return replace(plan, verify=True), block, len(block)
            self._pending = p[:n]
            if n:
                self.calibration.count(n, audited=False)
        if n == 0:
            plan = replace(plan, verify=True)
            if plan.unsure_k is not None:
                block = block.head(plan.unsure_k, end_reason="confidence")
                k = len(block)
        elif n < len(block):
            block = block.head(n, end_reason="confidence")
            k = n
        return plan, block, k

    def skipped(self, block: Block) -> None:
        """A block goes unverified: the next round is verified if it ended on an unsure
        position."""
        self.force_verify = block.end_reason == "confidence"

    def committed(self, n: int, verified: bool) -> None:
        self.unverified_run = 0 if verified else self.unverified_run + n
        if verified:
            self.force_verify = False
        if self.tally is not None:
            if verified:
                self.tally.expected_sum += n
                self._pending = []
            else:
                # a skipped span's own expectation; tokens of an offline stretch (no span
                # planned) at the default model's mean agreement
                p, self._pending = self._pending[:n], self._pending[n:]
                mean = self.calibration.model(DEFAULT_DRAFTER, self.sampling).mean()
                self.tally.expected_sum += sum(p) + (n - len(p)) * mean
            self.tally.emitted += n

    def observe(self, record: RoundRecord) -> None:
        """A finished round: its checked tokens feed the calibration (any mode: a lossless
        round's checks are measurements too), and in a fast request the confident ones (at or
        above the cut) the tally of measured agreement."""
        if self.calibration is None or record.mode != "verify" or record.accepted is None \
                or not record.confidences:
            return
        name = _name(record.drafter)
        checked = record.confidences[:record.accepted + 1]
        if self.tally is not None:
            cut = self.calibration.cut(name, self.tally.min_agreement, self.sampling)
            p = self.calibration.agreement(name, checked, self.sampling)
            for i, (confidence, expected) in enumerate(zip(checked, p)):
                if confidence >= cut:
                    self.tally.checked += 1
                    self.tally.checked_agreed += int(i < record.accepted)
                    self.tally.checked_expected += expected
        self.calibration.observe(name, record.confidences, record.accepted, self.sampling)

    def report(self) -> dict | None:
        """The generation's agreement (AgreementTally.report); None unless a calibrated fast
        request."""
        return self.tally.report() if self.tally is not None else None


def _name(drafter: str | None) -> str:
    return drafter or DEFAULT_DRAFTER
