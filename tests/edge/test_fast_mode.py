"""edge/fast_mode.py's gate: which plans may skip verification, the bound on the unverified
run, and verification again after an unsure position."""
from __future__ import annotations

import pytest

from edge.control.policy import Plan
from edge.drafting import Block
from edge.fast_mode import FastModeGate

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


def test_the_gate_verifies_a_skippable_plan_outside_fast_mode():
    plan = FastModeGate(fast=False, max_unverified_run=8).gate(
        Plan(k=4, verify=False, min_confidence=0.5, drafter="nope"), drafters=("draft",))
    assert plan == Plan(k=4, verify=True, min_confidence=0.0, drafter="")


def test_the_gate_bounds_the_unverified_run():
    gate = FastModeGate(fast=True, max_unverified_run=5)
    skip = Plan(k=4, verify=False, unsure_k=1, drafter="")
    assert gate.gate(skip, ()) == skip and gate.bound(skip, 4) == (skip, 4)
    gate.committed(4, verified=False)
    assert gate.bound(skip, 4) == (skip, 1)
    gate.committed(1, verified=False)
    assert gate.gate(skip, ()) == Plan(k=1, verify=True, unsure_k=1, drafter="")  # run full
    gate.committed(2, verified=True)
    assert gate.gate(skip, ()) == skip


def test_the_gate_verifies_after_an_unsure_position():
    gate = FastModeGate(fast=True, max_unverified_run=50)
    skip = Plan(k=4, verify=False, min_confidence=0.5, unsure_k=2)
    unsure = Block(tokens=[1, 2, 3], confidences=[0.4, 0.9, 0.9])
    plan, block, k = gate.after_draft(skip, unsure, 4)
    assert plan.verify and block.tokens == [1, 2] and k == 2
    gate.skipped(Block(tokens=[1], confidences=[0.9], end_reason="confidence"))
    assert gate.gate(skip, ()).verify
