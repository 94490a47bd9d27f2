"""`tandem sim` end to end on a tiny workload: verifier, link emulators, edge daemons and the
HTTP workload all real, on loopback; the table, the JSON file and the PNG plots come out."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from sim.cli import main
from sim.report import COLUMNS, format_table, run_summary
from sim.workload import RequestRecord

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

torch.set_num_threads(1)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def tiny_sim(tmp_path, target_dir, draft_dir, gguf_path):
    # Fixed k = 4, not the shipped controller: the checks below are of speculation's formulas
    # (tau, passes/token), and the controller may let the cloud generate these short requests
    # outright (tau = 1). The shipped controller runs through a sim in test_exact_by_default.py.
    config = {
        "edge_overrides": {"draft": {"backend": "llama.cpp", "model_path": str(gguf_path),
                                     "tokenizer_dir": str(draft_dir), "threads": 1},
                           "client": {"policy": "fixed", "draft_length": 4}},
        "cloud_overrides": {"model": {"path": str(target_dir), "device": "cpu"}},
        "profiles": ["lan", "wifi"],
        "prompts": 2, "max_tokens": 16, "concurrency": 2, "warmup_requests": 1,
        "trace_profile": "wifi",
    }
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_sim_writes_table_json_and_plots(tiny_sim, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["sim", "--config", str(tiny_sim), "--json", str(out / "sim.json"), "--plots", str(out),
                 "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert all(header in printed for header, _, _ in COLUMNS)

    result = json.loads((out / "sim.json").read_text())
    assert list(result["summaries"]) == ["lan", "wifi"]
    for name, summary in result["summaries"].items():
        assert summary["requests"] == 2 and summary["errors"] == 0
        assert summary["tokens"] == 2 * 16
        assert summary["verified_tokens_per_s"] > 0 and summary["ttft_ms"] > 0
        # tau > 1: the shipped draft gets tokens accepted (tau ~3 at k = 4); 1.0 would mean the
        # verifier rejected every draft token, or that tau is computed over no rounds.
        tau, passes = summary["mean_accepted_length"], summary["target_passes_per_token"]
        assert tau > 1.0
        assert 0 < passes < 1.0
        # Each round commits at most n + 1 = its share of tau tokens, so passes/token >= 1/tau;
        # only the last round of a request is cut at max_tokens (at most k = 4 tokens each).
        tokens = summary["tokens"]
        rounds = passes * tokens
        assert 1.0 - 1e-9 <= passes * tau <= rounds * tau / (rounds * tau - 2 * 4)
        assert summary["bytes_per_token"] > 0
        assert summary["verified_share"] == 1.0  # neither profile has outages
        assert name in printed
        assert len(result["requests"][name]) == 2
    trace = result["trace"]
    assert trace["profile"] == "wifi" and trace["rounds"]
    assert {"t_s", "draft_length", "accepted", "rtt_ms"} <= set(trace["rounds"][0])
    for png in ("tokens_per_s.png", "session_trace.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC


def test_summary_formulas_on_synthetic_records():
    def record(i, tokens, wall, rounds, accepted, verified):
        return RequestRecord(index=i, ok=True, wall_s=wall, ttft_s=0.1, completion_tokens=tokens,
                             finish_reason="length",
                             tandem={"rounds": rounds, "accepted_lengths": accepted, "target_passes": rounds,
                                     "verified_tokens": verified, "unverified_tokens": tokens - verified,
                                     "bytes_up": 10 * tokens, "bytes_down": 5 * tokens, "reopens": 0})

    records = [record(0, 10, 1.0, 4, [3, 2, 0, 1], 10), record(1, 20, 4.0, 5, [4, 4, 4, 3, 0], 15),
               RequestRecord(index=2, ok=False, error="HTTP 503")]
    summary = run_summary("x", records, wall_s=4.0)
    assert summary.requests == 3 and summary.errors == 1 and summary.tokens == 30
    assert summary.verified_tokens_per_s == pytest.approx((10 / 1.0 + 15 / 4.0) / 2)
    assert summary.local_tokens_per_s == pytest.approx((0 / 1.0 + 5 / 4.0) / 2)
    assert summary.verified_throughput_tok_s == pytest.approx(25 / 4.0)
    assert summary.local_throughput_tok_s == pytest.approx(5 / 4.0)
    assert summary.mean_accepted_length == pytest.approx(1 + 21 / 9)
    assert summary.target_passes_per_token == pytest.approx(9 / 30)
    assert summary.bytes_per_token == pytest.approx(15.0)
    assert summary.verified_share == pytest.approx(25 / 30)
    table = format_table([summary])
    assert "83.3%" in table and "x" in table.splitlines()[2]
