"""scripts/gpu-check.sh --cpu: the prepared device check's every step at smoke size on this CPU
(the real runtimes, the real verifier server and users; nothing stubbed), each step finishing and
writing what the summary reads. About a minute and a half on a quiet 2-core host; several on a
loaded one (each step's own cap bounds it)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_every_step_at_smoke_size(tmp_path):
    out = tmp_path / "gpu-check"
    env = dict(os.environ, OUT=str(out))
    done = subprocess.run(["bash", "scripts/gpu-check.sh", "--cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    steps = (out / "steps.tsv").read_text().splitlines()
    assert done.returncode == 0, (steps, done.stderr[-3000:])
    names = [line.split("\t")[0] for line in steps]
    for name in ("identity", "surface-target", "surface-llama-1b", "surface-llama-8b",
                 "verifier-bench", "capacity", "paper-target", "paper-h100-7b-published",
                 "summary"):
        assert name in names, names
    identity = json.loads((out / "identity.json").read_text())
    assert identity["identical"] == identity["prompts"] > 0
    for name in ("target", "llama-1b", "llama-8b"):
        surface = json.loads((out / f"surface-{name}" / "surface.json").read_text())
        assert surface["points"] and surface["kv_bytes_per_token"] > 0
        assert (out / f"surface-{name}" / "surface.png").stat().st_size > 0
    paper = json.loads((out / "paper-h100-7b-published.json").read_text())
    assert {c["cell"] for c in paper["cells"]} == {"lte/phone", "wifi/laptop"}
    summary = (out / "summary.md").read_text()
    assert "Pass-cost surfaces" in summary and "llama-8b" in summary
