"""Seconds-long smokes of the two benchmarks that have their own command: `tandem ladder`
(bench/ladder.py: switching vs each local model alone, the fast-mode curve) and the verifier
benchmark (bench/verifier_bench.py, torch backend here). Each runs the real parts on a tiny workload
and checks what its report must hold; the full runs are in bench/README.md and
docs/verifier-bench.md."""
from __future__ import annotations

import json

import pytest
import torch

from bench import ladder, verifier_bench

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_ladder_smoke_checks_lossless_outputs_and_draws_the_fast_curve(tmp_path, capsys):
    report_path, plot_path = tmp_path / "ladder.json", tmp_path / "curve.png"
    assert ladder.main(["--prompts", "1", "--max-tokens", "12", "--channels", "lan",
                        "--devices", "laptop", "--min-agreements", "0.9", "0.97",
                        "--fast-prompts", "1", "--max-unverified-run", "4", "--json", str(report_path),
                        "--plot", str(plot_path)]) == 0
    report = json.loads(report_path.read_text())
    assert [r["config"] for r in report["lossless"]] == ["draft", "small", "switch"]
    assert all(r["identical"] and r["tokens"] == 12 for r in report["lossless"])
    assert [(r["min_agreement"], r["source"]) for r in report["fast"]] == [
        (0.9, "code"), (0.9, "prose"), (0.97, "code"), (0.97, "prose")]
    for row in report["fast"]:
        assert 0.0 < row["verified_share"] <= 1.0 and 0.0 <= row["agreement"] <= 1.0
        assert row["min_agreement"] <= row["predicted"] <= 1.0
        assert row["longest_unverified_run"] <= 4
    assert plot_path.read_bytes()[:8] == PNG_MAGIC
    assert "fast goal" in capsys.readouterr().out


def test_verifier_bench_smoke_checks_every_verdict_and_reports_goodput(tmp_path, capsys):
    report_path = tmp_path / "verifier.json"
    assert verifier_bench.main(["--sessions", "1,2", "--rounds", "2", "--k", "3", "--backends", "torch",
                          "--json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    rows = report["rows"]
    assert {(r["backend"], r["sessions"]) for r in rows} == {
        (backend, n) for backend in ("torch", "torch-ar") for n in (1, 2)}
    assert all(r["tokens"] > 0 for r in rows)
    assert report["reopen"]["torch"]["open_ms"] > 0
    assert "crossover" in capsys.readouterr().out
