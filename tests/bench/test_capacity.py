"""`tandem capacity` (bench/capacity/): the replay draft proposes what the live draft proposes,
the figures follow the serving field's definitions, and a seconds-long sweep runs end to end
against a real verifier process through real emulated links."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.matrix.oracle import target_greedy
from bench.capacity.replay import ReplayDraft, ReplayTable
from bench.capacity.stats import ServerReading, capacity_of, is_good, point_row
from bench.capacity.users import Sample
from cloud.runtime.target import TargetRuntime
from edge.drafting import DraftCursor, TokenChooser
from edge.runtime import load_draft_runtime
from edge.runtime.config import DraftConfig
from edge.tokenizer import EdgeTokenizer
from tandem.sampling import SamplingParams

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def trajectories(target_dir, draft_dir, heldout_prompts):
    """Two held-out prompts (past the decided bench's 16) and the target's greedy output."""
    tokenizer = EdgeTokenizer(draft_dir)
    target = TargetRuntime(target_dir, device="cpu", dtype="float32")
    prompts = [tokenizer.encode(p[-400:]) for p in heldout_prompts[20:22]]
    return [(p, target_greedy(target, p, MAX_TOKENS)) for p in prompts]


def _llama(gguf_path):
    return load_draft_runtime(DraftConfig(backend="llama.cpp", model_path=gguf_path, threads=1))


def _block(runtime, context, k):
    chooser = TokenChooser(SamplingParams(), q_scale=1)
    return DraftCursor(runtime).draft(context, k, chooser, vocab_size=runtime.vocab_size, max_entries=1)


def test_replay_drafts_the_live_drafts_blocks_along_the_targets_output(trajectories, gguf_path):
    source, live = _llama(gguf_path), _llama(gguf_path)
    table = ReplayTable(source)
    for prompt, reference in trajectories:
        table.precompute(prompt, reference, depth=10)
    replay = ReplayDraft(table)
    checked = 0
    for prompt, reference in trajectories:
        for i in range(0, len(reference) + 1, 3):
            context = prompt + reference[:i]
            want, got = _block(live, context, 8), _block(replay, context, 8)
            assert got.tokens == want.tokens, f"position {i}"
            assert got.confidences == pytest.approx(want.confidences, abs=1e-4)
            assert got.entropies == pytest.approx(want.entropies, abs=1e-3)
            checked += 1
    assert checked >= 16 and table.misses == 0


def test_replay_computes_a_context_it_did_not_foresee_with_the_real_draft(trajectories, gguf_path):
    table = ReplayTable(_llama(gguf_path))
    prompt, reference = trajectories[0]
    table.precompute(prompt, reference, depth=2)
    off_path = prompt + [reference[0], (reference[1] + 7) % table.vocab_size, 5, 9]
    replay, live = ReplayDraft(table), _llama(gguf_path)
    got = replay.extend(off_path)
    want = live.extend(off_path)
    assert table.misses == 1
    assert torch.allclose(got[-1], want[-1], atol=1e-3)
    assert int(got[-1].argmax()) == int(want[-1].argmax())
    replay.rollback(len(prompt) + 1)
    assert replay.position == len(prompt) + 1


def _sample(user, ttft, wall, tokens=11, error=None):
    return Sample(user=user, prompt=0, started=0.0, wall_s=wall, ttft_s=ttft, tokens=tokens,
                  verified_tokens=tokens, target_passes=tokens // 2, error=error)


def test_a_request_is_good_only_when_it_meets_every_slo():
    assert is_good(_sample(0, ttft=0.5, wall=1.5), slo_ttft_s=1.0, slo_tpot_s=0.1)   # TPOT 0.1
    assert not is_good(_sample(0, ttft=1.2, wall=1.5), slo_ttft_s=1.0, slo_tpot_s=0.1)
    assert not is_good(_sample(0, ttft=0.5, wall=2.0), slo_ttft_s=1.0, slo_tpot_s=0.1)  # TPOT 0.15
    assert not is_good(_sample(0, ttft=0.5, wall=1.0, error="boom"), slo_ttft_s=1.0, slo_tpot_s=0.1)


def test_a_point_counts_errors_as_not_good_and_reads_server_cost_per_token():
    samples = [_sample(0, 0.2, 1.0), _sample(1, 0.2, 1.0), _sample(1, 0.2, 1.0, error="x"),
               _sample(2, 3.0, 4.0)]
    reading = ServerReading(window_s=10.0, window_tokens=40, batched_passes=10, verifier_cpu_s=2.0,
                            driver_cpu_s=9.5, driver_cores=1)
    row = point_row("lte", "phone", "adaptive", 3, samples, reading, 1.0, 0.1, (0.05,))
    assert row.good_share == 0.5 and row.errors == 1 and row.requests == 4
    assert row.good_share_by_tpot == {"0.1": 0.5, "0.05": 0.0}
    assert row.good_share_high_by_tpot["0.05"] == 0.0 and row.good_share_high_by_tpot["0.1"] > 0.5
    assert row.batched_passes_per_token == 0.25 and row.verifier_cpu_s_per_token == 0.05
    assert row.verifier_busy == 0.2 and row.emulator_saturated  # 95% of its one core
    assert row.other_cpu_share is None and not row.contended


def _row(users, share):
    reading = ServerReading(window_s=1.0, window_tokens=1)
    samples = [_sample(0, 0.1, 0.5)] * round(share * 10) + [_sample(0, 2.0, 3.0)] * round((1 - share) * 10)
    return point_row("c", "d", "x", users, samples, reading, 1.0, 0.1, ())


def test_capacity_is_the_last_user_count_before_the_first_clear_miss():
    rows = [_row(1, 1.0), _row(2, 1.0), _row(4, 0.9), _row(8, 0.3), _row(16, 1.0)]
    assert capacity_of(rows, 0.1) == 4
    assert capacity_of([_row(1, 0.2), _row(2, 1.0)], 0.1) == 0
    # 8 of 10 good: under 0.9 but its interval reaches it; it neither counts nor ends the run
    assert capacity_of([_row(1, 0.8), _row(2, 1.0), _row(4, 0.1)], 0.1) == 2


def test_the_summary_reads_a_configuration_that_missed_at_its_first_point():
    """A sweep of one point that missed (capacity 0): the summary says so instead of failing on
    an empty span of points up to capacity."""
    from bench.capacity.report import summary_table
    from bench.capacity.stats import Capacity
    rows = [_row(64, 0.3)]
    caps = [Capacity("c", "d", "x", 0.1, capacity_of(rows, 0.1), swept_to=64, saturated=False,
                     contended=False)]
    table = summary_table(rows, caps, 0.1)
    assert caps[0].users == 0 and "| c/d | x | 0 @ 100 ms |" in table and table.endswith("| 0 | - |")


def test_capacity_smoke_sweeps_users_against_a_pinned_verifier(tmp_path):
    """The real command, seconds long: two configurations, 1 and 2 users on lan/laptop, spread
    over two verifier processes (both on core 0), interleaved by default (each count for both
    before the next: the rows come in that order)."""
    out = tmp_path / "capacity.json"
    command = [sys.executable, "-m", "sim.cli", "capacity", "--channel", "lan", "--device", "laptop",
               "--configs", "cloud-only,fixed-k4", "--users", "1,2", "--warmup-s", "1", "--window-s", "3",
               "--drain-s", "20", "--prompts", "2", "--max-tokens", "16", "--no-refine", "--verifiers", "2",
               "--json", str(out), "--plots", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [(r["config"], r["users"]) for r in rows] == [(c, n) for n in (1, 2) for c in ("cloud-only", "fixed-k4")]
    for row in rows:
        assert row["requests"] >= 1 and row["errors"] == 0
        assert row["verified_share"] == 1.0 and row["agreement"] == 1.0
        for key in ("good_share", "ttft_p90_s", "tpot_p90_s", "user_tokens_per_s_p10",
                    "user_tokens_per_s_p50", "passes_per_token", "verifier_cpu_s_per_token",
                    "price"):
            assert row[key] is not None, key
        assert 0.0 <= row["price"] <= 1.0   # read from the verifiers through the window
    k4 = [r for r in rows if r["config"] == "fixed-k4"]
    assert all(r["passes_per_token"] < 1.0 for r in k4)   # speculation: fewer passes than tokens
    caps = {(c["config"], c["tpot_slo_s"]) for c in report["capacity"]}
    assert caps == {(c, t) for c in ("cloud-only", "fixed-k4") for t in (0.1, 0.05)}
    assert (tmp_path / "capacity.png").read_bytes()[:8] == PNG_MAGIC
    assert "Capacity" in done.stdout and report["options"]["verifiers"] == 2
    from bench.capacity import report as report_module
    assert report_module.main([str(out)]) == 0      # the tables again, from the JSON alone
    assert len(list((tmp_path / "logs").glob("*/server-1/verifier.log"))) == 2


@pytest.mark.skipif(not (ROOT / ".venv-vllm/bin/python").exists(),
                    reason=".venv-vllm is missing: scripts/bootstrap.sh --vllm makes it (scripts/test.sh runs it)")
def test_capacity_smoke_serves_vllm_alone_through_the_same_links(tmp_path):
    """The baseline an operator would pick instead: `vllm serve` pinned to the same core, one
    user streaming OpenAI completions through its emulated link; output identical to the
    target's greedy references."""
    out = tmp_path / "capacity.json"
    command = [sys.executable, "-m", "sim.cli", "capacity", "--channel", "lan", "--device", "laptop",
               "--configs", "vllm-alone", "--users", "1", "--warmup-s", "4", "--window-s", "3",
               "--drain-s", "20", "--prompts", "2", "--max-tokens", "16", "--json", str(out),
               "--plots", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["config"] == "vllm-alone" and row["requests"] >= 1 and row["errors"] == 0
    assert row["agreement"] == 1.0 and row["passes_per_token"] == 1.0
    assert row["verifier_cpu_s_per_token"] is not None and row["ttft_p90_s"] is not None


def test_compare_reads_two_sample_files_and_says_where_intervals_overlap(tmp_path):
    from bench.capacity.compare import compare, read

    def write(path, walls):
        rows = [{"channel": "lte", "device": "phone", "config": "adaptive", "users": 1, "user": 0,
                 "prompt": i, "started": 0.0, "wall_s": w, "ttft_s": 0.1, "tokens": 10,
                 "verified_tokens": 10, "target_passes": 4, "reopens": 0, "agrees": True,
                 "error": None, "finished": True} for i, w in enumerate(walls)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return read(path)

    same = write(tmp_path / "a.jsonl", [1.0, 1.1, 0.9, 1.0])
    close = write(tmp_path / "b.jsonl", [1.05, 0.95, 1.0, 1.1])
    far = write(tmp_path / "c.jsonl", [3.0, 3.1, 2.9, 3.0])
    _, compared, overlapping = compare(same, close, ("a", "b"))
    assert compared == 4 and overlapping == 4          # TTFT, TPOT, tok/s, passes/tok
    table, compared, overlapping = compare(same, far, ("a", "c"))
    assert overlapping == 2 and "NO" in table          # TTFT and passes/tok equal; speed not


def test_a_second_cell_splits_the_cores_as_the_first_did():
    """The driver pins itself to its cores in a run's first cell; the next cell must still find
    the server's core (it once read the driver's own affinity and stopped)."""
    import os

    from bench.capacity.servers import pin_self, server_core_split

    before = os.sched_getaffinity(0)
    try:
        servers, driver = server_core_split((0,))
        pin_self(driver)
        assert server_core_split((0,)) == (servers, driver)
    finally:
        os.sched_setaffinity(0, before)


def _sweep(name: str, counts: list[int], log: list[str]):
    """A configuration's sweep as sweep_config yields it: its server up at the first row, down
    when it ends or is closed (the log says when)."""
    log.append(f"{name} up")
    try:
        for n in counts:
            log.append(f"{name} {n}")
            yield (name, n)
    finally:
        log.append(f"{name} down")


def test_a_cell_interleaves_its_configurations_count_by_count():
    from bench.capacity.sweep import sweep_cell

    log: list[str] = []
    rows = sweep_cell([_sweep("a", [1, 2, 4], log), _sweep("b", [1, 2], log)], interleave=True)
    assert rows == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 4)]  # b stopped at its miss
    assert log[:4] == ["a up", "a 1", "b up", "b 1"] and log[-1] == "a down"
    assert log.index("b 2") < log.index("b down")
    log.clear()
    rows = sweep_cell([_sweep("a", [1, 2], log), _sweep("b", [1], log)], interleave=False)
    assert rows == [("a", 1), ("a", 2), ("b", 1)]
    assert log == ["a up", "a 1", "a 2", "a down", "b up", "b 1", "b down"]


def test_the_command_interleaves_unless_told_not_to():
    import argparse

    from bench.capacity.cli import add_parser, options_of

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert options_of(parser.parse_args(["capacity"])).interleave
    assert not options_of(parser.parse_args(["capacity", "--no-interleave"])).interleave


def test_an_interleaved_cell_that_fails_stops_every_server():
    from bench.capacity.sweep import sweep_cell

    log: list[str] = []

    def failing():
        yield from _sweep("b", [1], log)
        raise RuntimeError("the verifier died")

    with pytest.raises(RuntimeError):
        sweep_cell([_sweep("a", [1, 2, 4], log), failing()], interleave=True)
    assert "a down" in log and "b down" in log and "a 4" not in log
