"""`tandem load` at N = 16: a verifier and a daemon as real processes, 16 concurrent greedy
streams through the daemon. No crosstalk: every stream's output equals the same prompt's
output when it ran alone through the same daemon. Bounded memory: the peak RSS of each process
stays under a stated bound. The report's figures are all present and consistent."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.load import drive, peak_rss_mb, spawn_system, load_report
from sim.workload import advertised_model
from tandem.prompts import load_prompts
from tandem.config import resolve_path

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

STREAMS = 16
MAX_TOKENS = 16
# Measured on the 2-core CI machine: verifier ~550 MB, daemon ~450 MB with 4 runtimes; each
# llama.cpp draft runtime adds a few MB. 1.5 GB each is the bound a leak or a per-stream copy
# of a model would break.
RSS_BOUND_MB = 1500


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    with spawn_system(STREAMS, log_dir=tmp_path_factory.mktemp("load")) as running:
        yield running


def test_sixteen_streams_without_crosstalk_and_with_bounded_memory(system):
    prompts = load_prompts(resolve_path(Path("models/prompts/heldout.jsonl")), STREAMS, 0,
                           max_chars=300)
    model = advertised_model(system.url)
    solo = []
    for prompt in prompts:
        results, _ = asyncio.run(drive(system.url, model, [prompt], duration_s=60.0,
                                       max_tokens=MAX_TOKENS, max_requests_per_stream=1))
        assert results[0].errors == 0, results[0].records[0].error
        solo.append(results[0].texts[0])

    results, wall_s = asyncio.run(drive(system.url, model, prompts, duration_s=60.0,
                                        max_tokens=MAX_TOKENS, max_requests_per_stream=1))
    for stream, alone in zip(results, solo):
        assert stream.errors == 0, stream.records[0].error
        assert stream.texts == [alone], f"stream {stream.index} differs from its solo run"

    rss = {name: peak_rss_mb(pid) for name, pid in system.pids.items()}
    report = load_report(results, wall_s, 60.0, None, None, rss)
    assert report.requests == STREAMS and report.errors == 0
    assert report.tokens == STREAMS * MAX_TOKENS
    assert report.ttft_ms_p50 is not None and report.ttft_ms_p50 <= report.ttft_ms_p99
    assert report.tpot_ms_p50 is not None and report.verified_share == 1.0
    for name, mb in rss.items():
        assert mb is not None and mb < RSS_BOUND_MB, f"{name}: peak RSS {mb:.0f} MB"
