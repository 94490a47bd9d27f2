"""The fast-mode gate: which plans may skip verification, and the unverified-run bound.

In fast mode (a session opened with MODE_FAST) a policy may mark a block skippable (Plan.verify
False): it is committed unverified while the unverified run (tokens committed unverified since
the last verified one) stays within max_unverified_run, and the next verified block carries
those tokens to the verifier (VerifierLink.send's `unverified`). Everywhere else a skippable
plan is verified like any block, so a lossless request is verified whatever the policy says.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from edge.control.policy import Plan
from edge.drafting import Block


class FastModeGate:
    def __init__(self, fast: bool, max_unverified_run: int) -> None:
        self.fast = fast
        self.max_unverified_run = max_unverified_run
        self.unverified_run = 0      # tokens committed unverified since the last verified one
        self.force_verify = False    # the last skipped span ended on an unsure position

    def gate(self, plan: Plan, drafters: Collection[str]) -> Plan:
        """The plan the loop runs: a skippable block stays skippable only in fast mode, within
        the unverified-run bound, and not right after a skipped span that ended on an unsure
        position; otherwise it is verified like any block, without the fast-mode confidence cut
        (in fast mode, drafting the plan's unsure_k tokens). The drafter is one of `drafters`
        ("" = the default)."""
        drafter = plan.drafter if plan.drafter in drafters else ""
        if plan.drafter != drafter:
            plan = replace(plan, drafter=drafter)
        if plan.verify or (self.fast and not self.force_verify
                           and self.unverified_run < self.max_unverified_run):
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

    def confirm(self, plan: Plan, block: Block, k: int) -> tuple[Plan, Block, int]:
        """After drafting: a skippable block unsure from its first position has nothing to
        skip; the verifier checks it (just the plan's unsure_k first tokens, in fast mode)."""
        if plan.verify or not block.confidences or block.confidences[0] >= plan.min_confidence:
            return plan, block, k
        plan = replace(plan, verify=True)
        if plan.unsure_k is not None:
            block = block.head(plan.unsure_k, end_reason="confidence")
            k = len(block)
        return plan, block, k

    def skipped(self, block: Block) -> None:
        """A block goes unverified: the next round is verified if it ended on an unsure
        position."""
        self.force_verify = block.end_reason == "confidence"

    def committed(self, n: int, verified: bool) -> None:
        self.unverified_run = 0 if verified else self.unverified_run + n
        if verified:
            self.force_verify = False
