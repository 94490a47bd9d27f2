"""`tandem bench` end to end on a seconds-long workload: the real verifier, link emulators
(one on a real LTE capacity trace from ../shared/traces, given as --held-out-trace and replayed
from two offsets), a throttled phone-class draft and the edge clients, all on loopback; the
table, goal ratios with their intervals and verdicts, JSON rows with the issue's fields and the
PNG plots come out, and every configuration ran on every (prompt, offset) unit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from bench.matrix.results import ROW_FIELDS
from sim.cli import main

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
CONFIGS = ["cloud-only", "edge-only", "fixed-k1", "fixed-k4", "hf-heuristic", "adaptive",
           "adaptive-pipelined", "adaptive-capped", "oracle"]
HELD_OUT = "heldout-TMobile-LTE-short"
VERDICTS = {"met", "not met", "tie", "n/a"}


@pytest.fixture
def tiny_bench(tmp_path, target_dir, draft_dir, gguf_path):
    trace = SHARED_TRACES / "TMobile-LTE-short.up"
    if not trace.is_file():
        pytest.skip(f"no shared LTE trace at {trace}")
    base = tmp_path / "near.yaml"  # the held-out trace's delay: 5 ms one-way keeps it short
    base.write_text(yaml.safe_dump({"name": "near", "delay_ms": 5.0}))
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
        "lte_channel": HELD_OUT, "held_out_base": str(base), "resamples": 200,
        "goal_rtt_ms": 10.0}))
    return config, trace, device


def test_bench_writes_rows_goals_and_plots(tiny_bench, tmp_path, capsys):
    config, trace, device = tiny_bench
    out = tmp_path / "out"
    code = main(["bench", "--config", str(config), "--channel", "configs/channels/lan.yaml",
                 "--held-out-trace", str(trace), "--device", "laptop", "--device", str(device),
                 "--prompts", "2", "--offsets", "2", "--max-tokens", "8",
                 "--json", str(out / "bench.json"), "--generations", str(out / "gens.jsonl"),
                 "--plots", str(out), "--markdown", str(out / "bench.md"), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "goals (measured in this run)" in printed and "oracle" in printed

    result = json.loads((out / "bench.json").read_text())
    rows = result["rows"]
    assert all(tuple(row) == ROW_FIELDS for row in rows)
    # a configuration this build cannot run (its policy not registered, or adaptive-capped's
    # max_passes_per_token before ClientConfig has it) is named, not faked
    assert set(result["skipped"]) <= {"adaptive", "adaptive-pipelined", "adaptive-capped"}
    ran = [n for n in CONFIGS if n not in result["skipped"]]
    channels = ("lan", HELD_OUT)
    cells = {(r["channel"], r["device"], r["config"]) for r in rows}
    assert cells == {(c, d, n) for c in channels for d in ("laptop", "phone") for n in ran}

    # paired units: the trace channel from 2 offsets spread over its period, the rate link from
    # one; every configuration of a cell ran on exactly the same (prompt, offset) units
    period = 139.986  # the shorter of the TMobile traces (.down)
    assert result["offsets"] == {"lan": [0.0], HELD_OUT: [0.0, pytest.approx(period / 2, abs=1e-3)]}
    units: dict[tuple[str, str, str], set] = {}
    for line in (out / "gens.jsonl").read_text().splitlines():
        g = json.loads(line)
        units.setdefault((g["channel"], g["device"], g["config"]), set()).add((g["prompt"], g["offset_s"]))
    for (channel_name, device_name, name), seen in units.items():
        assert seen == {(p, o) for p in (0, 1) for o in result["offsets"][channel_name]}
    for row in rows:
        assert row["prompts"] == 2 and row["units"] == 2 * len(result["offsets"][row["channel"]])
        assert row["tokens_per_s_low"] <= row["tokens_per_s"] <= row["tokens_per_s_high"]
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
    for channel_name in channels:
        for device_name in ("laptop", "phone"):
            cell = {n: by[(channel_name, device_name, n)] for n in ran}
            # the oracle never wastes a round: no more target passes than any fixed k
            assert cell["oracle"]["passes_per_token"] <= cell["fixed-k4"]["passes_per_token"]
            assert cell["oracle"]["tau"] >= cell["fixed-k1"]["tau"]
            assert cell["fixed-k1"]["tau"] <= 2.0
    goals = {g["goal"]: g for g in result["goals"]}
    assert all(set(g) == {"goal", "measured", "met", "detail", "low", "high", "verdict",
                          "threshold", "cells"} and g["verdict"] in VERDICTS for g in goals.values())
    other = goals["adaptive >= 0.95x the best other verified configuration (cloud-only included)"]
    if "adaptive" in ran:
        assert len(other["cells"]) == 4
        for cell in other["cells"]:
            assert cell["b"] not in ("edge-only", "oracle", "adaptive-pipelined", "adaptive-capped")
            assert cell["low"] <= cell["value"] <= cell["high"] and cell["verdict"] in VERDICTS
            assert cell["versus_one"] in ("faster", "slower", "tie")
        peer = next(g for name, g in goals.items() if name.startswith("adaptive >= 1.1x"))
        assert {c["cell"] for c in peer["cells"]} == {f"{HELD_OUT}/laptop", f"{HELD_OUT}/phone"}
    capped = [g for name, g in goals.items() if name.startswith("adaptive-capped")]
    assert len(capped) == 3 and all(len(g["cells"]) == (4 if "adaptive-capped" in ran else 0)
                                    for g in capped if "within" not in g["goal"])
    within = next(g for g in capped if "within" in g["goal"])
    assert all(by[(*c["cell"].split("/"), c["b"])]["passes_per_token"] <= 0.30 for c in within["cells"])
    markdown = (out / "bench.md").read_text()
    assert markdown.startswith("| channel | device | config |") and "| goal |" in markdown
    assert "95% CI" in markdown
    for png in ("bench_tokens_per_s.png", "bench_session_trace.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC

    # the same table and goals again, reported from the generations file alone
    again = tmp_path / "again"
    assert main(["bench", "--config", str(config), "--channel", "configs/channels/lan.yaml",
                 "--held-out-trace", str(trace), "--device", "laptop", "--device", str(device),
                 "--prompts", "2", "--offsets", "2", "--from-generations", str(out / "gens.jsonl"),
                 "--json", str(again / "bench.json"), "--plots", str(again)]) == 0
    assert "reported from a generations file" in capsys.readouterr().out
    reported = json.loads((again / "bench.json").read_text())
    assert reported["rows"] == rows and reported["goals"] == result["goals"]


def test_workers_measure_every_cell_in_their_own_processes(tiny_bench, tmp_path, capsys):
    """--workers 2: the cells are spread over two spawned processes (each its own verifier and
    draft), yet every cell has every configuration on every unit, the output is still the
    target's own, and the table lists the cells in the order of the flags."""
    config, trace, device = tiny_bench
    out = tmp_path / "out"
    names = ["cloud-only", "fixed-k4", "adaptive"]
    code = main(["bench", "--config", str(config), "--channel", "configs/channels/lan.yaml",
                 "--held-out-trace", str(trace), "--device", "laptop", "--device", str(device),
                 "--configs", ",".join(names), "--prompts", "2", "--offsets", "1",
                 "--max-tokens", "8", "--workers", "2", "--json", str(out / "bench.json"),
                 "--generations", str(out / "gens.jsonl"), "--plots", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    rows = json.loads((out / "bench.json").read_text())["rows"]
    order = [(c, d) for d in ("laptop", "phone") for c in ("lan", HELD_OUT)]
    assert [(r["channel"], r["device"], r["config"]) for r in rows] == [
        (c, d, n) for c, d in order for n in names]
    assert all(r["agreement"] == 1.0 and r["units"] == 2 for r in rows)
    lines = [json.loads(line) for line in (out / "gens.jsonl").read_text().splitlines()]
    assert len(lines) == len(order) * len(names) * 2
