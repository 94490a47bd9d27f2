"""`tandem bench` end to end on a seconds-long workload: the real verifier, channel emulators
(one on a real LTE capacity trace from ../shared/traces, given as a --channel file), a throttled
phone-class draft and the edge clients, all on loopback; the table, goal ratios, JSON rows with
the issue's fields and the PNG plots come out."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from bench.bench.results import ROW_FIELDS
from bench.cli import main

torch.set_num_threads(1)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
CONFIGS = ["cloud-only", "edge-only", "fixed-k1", "fixed-k4", "hf-heuristic", "adaptive",
           "adaptive-pipelined", "oracle"]


@pytest.fixture
def tiny_bench(tmp_path, target_dir, draft_dir, gguf_path):
    trace = SHARED_TRACES / "TMobile-LTE-short.up"
    if not trace.is_file():
        pytest.skip(f"no shared LTE trace at {trace}")
    channel = tmp_path / "tmobile.yaml"
    channel.write_text(yaml.safe_dump({
        "name": "tmobile", "description": "T-Mobile LTE trace, 5 ms one-way",
        "delay_ms": 5.0, "uplink": {"trace": str(trace)},
        "downlink": {"trace": str(SHARED_TRACES / "TMobile-LTE-short.down")}}))
    device = tmp_path / "slowphone.yaml"
    device.write_text(yaml.safe_dump({
        "name": "phone", "draft_tokens_per_s": 300.0, "prefill_tokens_per_s": 20000.0,
        "profile": {"name": "phone", "joules_per_draft_token": 0.075, "joules_per_byte_up": 5e-6,
                    "joules_per_byte_down": 1e-6}}))
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump({
        "edge_overrides": {"draft": {"backend": "llama.cpp", "model_path": str(gguf_path),
                                     "tokenizer_dir": str(draft_dir), "threads": 1}},
        "cloud_overrides": {"model": {"path": str(target_dir), "device": "cpu"},
                            "batch": {"window_ms": 0.0}},
        "configurations": CONFIGS, "warmup_requests": 1, "max_prompt_chars": 300,
        "lte_channel": "tmobile"}))
    return config, channel, device


def test_bench_writes_rows_goals_and_plots(tiny_bench, tmp_path, capsys):
    config, channel, device = tiny_bench
    out = tmp_path / "out"
    code = main(["bench", "--config", str(config), "--channel", "configs/channels/lan.yaml",
                 "--channel", str(channel), "--device", "laptop", "--device", str(device),
                 "--prompts", "2", "--max-tokens", "8", "--json", str(out / "bench.json"),
                 "--plots", str(out), "--markdown", str(out / "bench.md"), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "goals (measured in this run)" in printed and "oracle" in printed

    result = json.loads((out / "bench.json").read_text())
    rows = result["rows"]
    assert all(tuple(row) == ROW_FIELDS for row in rows)
    # a configuration this build cannot run (its policy not registered) is named, not faked
    assert set(result["skipped"]) <= {"adaptive", "adaptive-pipelined"}
    ran = [n for n in CONFIGS if n not in result["skipped"]]
    cells = {(r["channel"], r["device"], r["config"]) for r in rows}
    assert cells == {(c, d, n) for c in ("lan", "tmobile") for d in ("laptop", "phone") for n in ran}
    by = {(r["channel"], r["device"], r["config"]): r for r in rows}
    details = {(d["channel"], d["device"], d["config"]): d for d in result["details"]}
    assert set(details) == set(by)
    for (channel_name, device_name, name), row in by.items():
        assert row["tokens_per_s"] > 0 and row["ttft_s"] > 0 and row["tpot_s"] > 0
        if name == "edge-only":
            assert row["passes_per_token"] == 0 and row["bytes_per_token"] == 0 and row["tau"] == 1.0
            assert 0 <= row["agreement"] <= 1
        else:
            # verification is lossless: unless the client fell back to local decoding (those
            # tokens are counted in details), the output is the target's own greedy output
            if details[(channel_name, device_name, name)]["unverified_share"] == 0:
                assert row["agreement"] == 1.0, (channel_name, device_name, name)
            assert 0 < row["passes_per_token"] <= 1.0 and row["bytes_per_token"] > 0
        assert row["joules_per_token"] > 0 or device_name == "laptop" and name == "cloud-only"
    for channel_name in ("lan", "tmobile"):
        for device_name in ("laptop", "phone"):
            cell = {n: by[(channel_name, device_name, n)] for n in ran}
            # the oracle never wastes a round: no more target passes than any fixed k
            assert cell["oracle"]["passes_per_token"] <= cell["fixed-k4"]["passes_per_token"]
            assert cell["oracle"]["tau"] >= cell["fixed-k1"]["tau"]
            assert cell["fixed-k1"]["tau"] <= 2.0
    assert {g["goal"] for g in result["goals"]} and all(
        set(g) == {"goal", "measured", "met", "detail"} for g in result["goals"])
    markdown = (out / "bench.md").read_text()
    assert markdown.startswith("| channel | device | config |") and "| goal |" in markdown
    for png in ("bench_tokens_per_s.png", "bench_session_trace.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
