"""Exact by default: with the shipped configs, verification does not fall away in ordinary
conditions, and where a token does go out unverified a plain OpenAI client can tell.

Real parts throughout: `tandem-cloud serve` and `tandem-edge serve` as processes (the start-up
race, a busy CPU), the link emulator replaying the LTE trace (`tandem sim`), an in-process
daemon on a real socket in front of a real verifier (fast mode, the sampled law).
"""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from scipy.stats import chisquare
from verifier_harness import start_verifier
from verifier_harness import edge_tokenizer, prompt_ids, target_runtime  # noqa: F401 (fixtures)

from bench.startup_race import run_race
from edge.config import EdgeConfig, resolve_paths
from edge.daemon.responses import UNVERIFIED_TOKENS_HEADER, VERIFIED_FRACTION_HEADER
from edge.daemon.server import DaemonThread, load_pool
from tandem.config import load_config, resolve_path
from tandem.sampling import SamplingParams, warp

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)


def test_requests_sent_before_the_verifier_exists_wait_for_it(tmp_path):
    """The daemon answers first; requests go out at once; the verifier starts only after
    them. /health says not ready until the verifier is reached, and every response comes back
    fully verified (bound: the verifier's start-up, inside the default offline_wait_s)."""
    report = run_race(requests=12, concurrency=12, order="daemon-first", log_dir=tmp_path)
    print(report.table())
    assert report.errors == 0, report.first_errors
    assert report.fully_verified == report.requests == 12
    assert report.health_before_verifier and set(report.health_before_verifier) == {503}


def test_sampled_requests_on_a_busy_cpu_are_all_verified(tmp_path):
    """Both cores kept busy by other processes, sampled requests 4 at a time once the daemon
    has reached the verifier: slow rounds are waited for, not turned into local output. (The
    verifier's own start-up on a busy CPU is not bounded here: it can pass offline_wait_s on a
    slow machine, and the start-up race is the test above.)"""
    report = run_race(requests=8, concurrency=4, max_tokens=24, temperature=0.8, busy=2,
                      order="verifier-ready", log_dir=tmp_path)
    print(report.table())
    assert report.errors == 0, report.first_errors
    assert report.fully_verified == report.requests == 8


def test_a_short_sim_on_the_lte_trace_verifies_every_token(tmp_path, target_dir, draft_dir,
                                                           gguf_path):
    """The LTE profile replays a real trace whose silent gaps made rounds of over a second:
    late verdicts are used, so the verified share is 1."""
    import json

    import yaml

    from sim.cli import main
    config = tmp_path / "sim.yaml"
    config.write_text(yaml.safe_dump({
        "edge_overrides": {"draft": {"backend": "llama.cpp", "model_path": str(gguf_path),
                                     "tokenizer_dir": str(draft_dir), "threads": 1}},
        "cloud_overrides": {"model": {"path": str(target_dir), "device": "cpu"}},
        "profiles": ["lte"], "prompts": 3, "max_tokens": 32, "concurrency": 3,
        "warmup_requests": 1, "trace_profile": "lte"}))
    out = tmp_path / "out"
    assert main(["sim", "--config", str(config), "--json", str(out / "sim.json"), "--plots",
                 str(out), "--no-progress"]) == 0
    summary = json.loads((out / "sim.json").read_text())["summaries"]["lte"]
    assert summary["errors"] == 0 and summary["tokens"] == 3 * 32
    assert summary["verified_share"] == 1.0
    assert summary["local_tokens_per_s"] == 0.0 and summary["verified_tokens_per_s"] > 0


@pytest.fixture(scope="module")
def shipped_daemon(target_runtime):
    """The shipped configs/edge.yaml in front of a verifier."""
    server, port = start_verifier(target_runtime)
    try:
        config = resolve_paths(load_config(resolve_path(Path("configs/edge.yaml")), EdgeConfig, {
            "cloud": {"address": f"127.0.0.1:{port}"},
            "daemon": {"host": "127.0.0.1", "port": 0, "pool_size": 2}}))
        assert config.client.offline == "wait"  # (and client.policy is not the entropy switch)
        daemon = DaemonThread(load_pool(config)).start()
        try:
            yield daemon
        finally:
            daemon.stop()
    finally:
        server.stop(0).wait()


def unverified_counter(url: str, cause: str) -> float:
    metrics = httpx.get(url + "/metrics", timeout=5).text
    line = next(line for line in metrics.splitlines()
                if line.startswith("tandem_edge_unverified_tokens_total{")
                and f'cause="{cause}"' in line)
    return float(line.rsplit(" ", 1)[1])


def test_fast_mode_works_with_the_shipped_config_and_says_so(shipped_daemon, prompt_ids):
    """"mode": "fast" under client.policy fixed is fast mode (not silently lossless): some
    tokens go out unverified, the headers, the stats and the counter name them; a lossless
    request beside it is fully verified."""
    url = shipped_daemon.url
    before = unverified_counter(url, "fast_mode")
    body = {"model": "tandem-draft", "prompt": prompt_ids[180], "max_tokens": 96,
            "temperature": 0, "ignore_eos": True}
    with httpx.Client(timeout=60) as http:
        fast = http.post(url + "/v1/completions", json={**body, "mode": "fast"})
        lossless = http.post(url + "/v1/completions", json=body)
    assert fast.status_code == 200 and lossless.status_code == 200, fast.text
    stats = fast.json()["tandem"]
    unverified = stats["unverified_tokens"]
    assert unverified > 0 and stats["unverified_by_cause"] == {"fast_mode": unverified}
    assert int(fast.headers[UNVERIFIED_TOKENS_HEADER]) == unverified
    assert float(fast.headers[VERIFIED_FRACTION_HEADER]) == pytest.approx(
        stats["verified_fraction"], abs=1e-4) and stats["verified_fraction"] < 1.0
    assert unverified_counter(url, "fast_mode") == before + unverified
    assert lossless.headers[VERIFIED_FRACTION_HEADER] == "1.0000"
    assert lossless.headers[UNVERIFIED_TOKENS_HEADER] == "0"


def test_sampled_output_through_the_daemon_has_the_targets_law(shipped_daemon, prompt_ids,
                                                              target_runtime):
    """First sampled token over 150 seeds, drafted (draft_length 1) and verified through the
    daemon, against the target's warped distribution (temperature 1, top-k 8): chi-square, and
    every sample verified."""
    context = list(prompt_ids[181])
    params = SamplingParams(temperature=1.0, top_k=8)
    with torch.inference_mode():
        logits = target_runtime.score(target_runtime.new_state(), context)[-1]
    p = warp(logits[None], params)[0].double().numpy()
    counts = {}
    with httpx.Client(timeout=60) as http:
        for seed in range(150):
            response = http.post(shipped_daemon.url + "/v1/completions", json={
                "model": "tandem-draft", "prompt": context, "max_tokens": 2, "temperature": 1.0,
                "top_k": 8, "seed": seed, "draft_length": 1, "ignore_eos": True,
                "return_token_ids": True})
            assert response.status_code == 200, response.text
            assert response.headers[VERIFIED_FRACTION_HEADER] == "1.0000"
            first = response.json()["choices"][0]["token_ids"][0]
            assert p[first] > 0, f"token {first} is outside the target's top-k"
            counts[first] = counts.get(first, 0) + 1
    support = [i for i in range(len(p)) if p[i] > 0]
    observed = [counts.get(i, 0) for i in support]
    expected = [p[i] / sum(p[j] for j in support) * 150 for i in support]
    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected)


def test_fast_mode_bench_smoke(capsys):
    """`tandem fast-mode-bench` on one prompt per source: the shipped config's verified
    share, teacher-forced and predicted agreement come out per source (the full run: README)."""
    from bench.fast_mode_bench import main
    assert main(["--prompts", "1", "--max-tokens", "16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[-2:]
    for line, source in zip(lines, ("code", "prose")):
        assert source in line and "verified" in line and "predicted" in line, line
