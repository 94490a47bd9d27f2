"""vLLM's own load generator (`vllm bench serve`, from .venv-vllm) against the daemon, as the
README's "Load-testing the daemon" runs it: every request succeeds, every one runs its output
length, and with three times the pool in flight (so TTFT is mostly the wait for a slot) its
TTFT agrees with the daemon's own TTFT metric. Skipped, saying why, when .venv-vllm is missing
(scripts/bootstrap.sh --vllm makes it)."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest
import torch
from verifier_harness import target_runtime, verifier  # noqa: F401 (fixtures)

from edge.config import ClientConfig, CloudLinkConfig, DaemonConfig, EdgeConfig
from edge.daemon.server import DaemonThread, load_pool
from edge.runtime import DraftConfig

pytestmark = [pytest.mark.e2e,  # real verifier, daemon or processes end to end
              pytest.mark.skipif(not (Path(__file__).resolve().parents[2] / ".venv-vllm/bin/vllm")
                                 .exists(), reason=".venv-vllm is missing: scripts/bootstrap.sh "
                                                   "--vllm makes it (scripts/test.sh runs it)")]

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / ".venv-vllm/bin/vllm"
POOL = 2
PROMPTS = 3 * POOL
OUTPUT_LEN = 16
TTFT = "tandem_edge_time_to_first_token_seconds"


def ttft_sum_count(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text
    found = {kind: float(re.search(rf"^{TTFT}_{kind}{{[^}}]*}} (\S+)$", text, re.M).group(1))
             for kind in ("sum", "count")}
    return found["sum"], found["count"]


def test_vllm_bench_serve_against_the_daemon(verifier, gguf_path, draft_dir, tmp_path):
    config = EdgeConfig(
        cloud=CloudLinkConfig(address=f"127.0.0.1:{verifier}"),
        draft=DraftConfig(backend="llama.cpp", model_path=gguf_path, tokenizer_dir=draft_dir,
                          n_ctx=512, threads=1),
        client=ClientConfig(draft_length=4),
        daemon=DaemonConfig(port=0, pool_size=POOL, max_waiting=PROMPTS))
    with DaemonThread(load_pool(config)) as daemon:
        sum_before, count_before = ttft_sum_count(daemon.url)
        done = subprocess.run(
            [str(VLLM), "bench", "serve", "--backend", "openai-chat", "--base-url", daemon.url,
             "--endpoint", "/v1/chat/completions", "--model", "tandem-draft",
             "--tokenizer", str(ROOT / "models/tandem-target"), "--dataset-name", "random",
             "--random-input-len", "32", "--random-output-len", str(OUTPUT_LEN),
             "--num-prompts", str(PROMPTS), "--max-concurrency", str(PROMPTS), "--ignore-eos",
             "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path),
             "--result-filename", "bench.json"],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
        sum_after, count_after = ttft_sum_count(daemon.url)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert (result["completed"], result["total_output_tokens"]) == (PROMPTS, PROMPTS * OUTPUT_LEN)
    assert count_after - count_before == PROMPTS
    daemon_mean_ms = 1000.0 * (sum_after - sum_before) / PROMPTS
    assert daemon_mean_ms == pytest.approx(result["mean_ttft_ms"], rel=0.2), \
        (daemon_mean_ms, result["mean_ttft_ms"])
