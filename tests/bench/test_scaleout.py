"""Several verifiers behind one daemon, as real processes on loopback (bench/failover.py): two
`tandem-cloud serve`, one `tandem-edge serve` reaching both through gRPC's own ring_hash
(affinity on the session id) or through NGINX started from docker/nginx-grpc.conf (`hash ...
consistent` on the same id). 32 concurrent greedy streams; the verifier serving about half of
them is SIGKILLed mid-run and started again at once; then a second wave runs on both.

Every request completes, fully verified, each output equal to its solo run. Only the killed
verifier's sessions re-open (each counted as moved, on the daemon's metrics and in its own
`tandem` stats) and the survivor prefilled each of them once; after the restart both serve."""
from __future__ import annotations

import pytest

from bench.failover import FailoverRun, run_failover, two_verifiers
from bench.nginx import NGINX

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

STREAMS = 32
MAX_TOKENS = 16
PROMPT_CHARS = 300


@pytest.fixture(scope="module")
def prompts(heldout_prompts) -> list[str]:
    return [prompt[-PROMPT_CHARS:] for prompt in heldout_prompts[:STREAMS]]


@pytest.fixture(scope="module")
def verifiers(tmp_path_factory):
    """Both verifiers, shared by the tests (each kills and restarts verifier-a)."""
    with two_verifiers(tmp_path_factory.mktemp("verifiers")) as running:
        yield running


@pytest.fixture(scope="module")
def solo() -> list[list[str]]:
    """The prompts' outputs alone, once found (greedy: the same through any daemon)."""
    return []


def failover(prompts, verifiers, solo, tmp_path, **how) -> FailoverRun:
    run = run_failover(prompts, MAX_TOKENS, verifiers, log_dir=tmp_path,
                       solo=solo[0] if solo else None, **how)
    solo[:] = [run.solo]
    return run


def check_failover(run: FailoverRun) -> None:
    for wave in (run.first, run.second):
        assert len(wave.records) == STREAMS
        for record in wave.records:
            assert record.ok, record.error
            assert record.completion_tokens == MAX_TOKENS
            assert record.verified_tokens == MAX_TOKENS, record.tandem  # 100% verified
    assert run.texts_equal_solo == [True] * (2 * STREAMS), "an output differs from its solo run"

    first = run.first
    assert run.killed_live_sessions >= 1
    moved = [r for r in first.records if r.tandem["moves"]]
    assert moved, "no session was live on the killed verifier"
    # Affinity: the re-opens after the kill are exactly the moved sessions', counted alike
    # by the daemon's metrics and the requests' own stats.
    assert first.moves == first.reopens == sum(r.tandem["moves"] for r in moved) == len(moved)
    assert all(r.tandem["reopens"] == 1 and r.tandem["verifier"] == "verifier-b" for r in moved)
    # The survivor opened each session it finished once: its own and every moved one.
    survivor = first.verifiers["verifier-b"]
    assert survivor.opens == first.by_verifier().get("verifier-b")
    assert survivor.prefill_tokens > 0

    # After the restart both verifiers serve, and nothing moves.
    spread = run.second.by_verifier()
    assert spread.get("verifier-a", 0) >= 1 and spread.get("verifier-b", 0) >= 1, spread
    assert run.second.moves == run.second.reopens == 0


def test_grpc_ring_hash_survives_a_killed_verifier(prompts, verifiers, solo, tmp_path):
    check_failover(failover(prompts, verifiers, solo, tmp_path, policy="ring_hash"))


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install "
                    "nginx-light; .ci/run installs it): the proxy fail-over is not tested")
def test_nginx_proxy_survives_a_killed_verifier(prompts, verifiers, solo, tmp_path):
    check_failover(failover(prompts, verifiers, solo, tmp_path, proxy=True))
