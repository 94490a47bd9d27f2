"""`tandem load --verifiers 2 --compare-cloud-only`, run briefly as a user would: two verifiers
and a daemon as processes, a few streams, then the same against fresh verifiers with k = 0.
Both reports are printed and written; both verifiers served jobs; the comparison table (which
crashed on a missing LoadReport field) is printed."""
from __future__ import annotations

import pytest
import json

from sim.cli import main

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

STREAMS = 4


def test_load_with_two_verifiers_and_the_cloud_only_comparison(tmp_path, capsys):
    out = tmp_path / "load.json"
    code = main(["load", "--streams", str(STREAMS), "--duration", "1", "--max-tokens", "4",
                 "--verifiers", "2", "--compare-cloud-only", "--json", str(out),
                 "--log-dir", str(tmp_path / "logs")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "| tandem |" in printed and "| cloud-only (k = 0) |" in printed
    assert "jobs per verifier: verifier-1 " in printed
    for path in (out, tmp_path / "load-cloud-only.json"):
        report = json.loads(path.read_text())
        assert report["errors"] == 0 and report["requests"] >= STREAMS
        assert report["verified_share"] == 1.0
        jobs = report["jobs_per_verifier"]
        assert set(jobs) == {"verifier-1", "verifier-2"}, jobs
        assert all(n > 0 for n in jobs.values()), jobs  # round_robin: both served sessions
        assert {"verifier-1", "verifier-2", "daemon"} <= set(report["peak_rss_mb"])
