"""The one request record (edge/request.py): it checks its own values when built, fills what it
leaves to the client from the client's config in one place, and the daemon builds it once from
the HTTP request, every option under its own name, nothing copied by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from edge.config import ClientConfig, DaemonConfig
from edge.daemon.jobs import JobFactory
from edge.daemon.openai_schema import CompletionRequest
from edge.request import OPTION_DEFAULTS, OPTIONS, GenerationRequest
from edge.tokenizer import EdgeTokenizer

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "models/tokenizer"


@pytest.mark.parametrize("change, message", [
    ({"prompt_ids": []}, "at least one token"),
    ({"max_tokens": 0}, "max_tokens must be >= 1"),
    ({"draft_length": -1}, "draft_length must be >= 0"),
    ({"mode": "quick"}, "mode must be one of"),
    ({"max_unverified_run": -1}, "max_unverified_run must be >= 0"),
    ({"min_tokens_per_s": -1.0}, "min_tokens_per_s must be >= 0"),
    ({"min_agreement": 0.0}, r"min_agreement must be in \(0, 1\]"),
    ({"offline": "later"}, "offline must be one of"),
])
def test_a_request_checks_its_own_values_when_built(change, message):
    with pytest.raises(ValueError, match=message):
        GenerationRequest(**{"prompt_ids": [1], "max_tokens": 4, **change})


def test_resolved_fills_only_what_the_request_left_to_the_client():
    config = ClientConfig()
    given = GenerationRequest(prompt_ids=[1], max_tokens=4, mode="fast", min_tokens_per_s=3.0)
    resolved = given.resolved(config)
    assert (resolved.mode, resolved.min_tokens_per_s) == ("fast", 3.0)
    assert resolved.offline == config.offline and resolved.offline_wait_s == config.offline_wait_s
    assert resolved.min_agreement == config.fast.min_agreement
    assert resolved.max_unverified_run == config.max_unverified_run
    assert resolved.draft_length is None  # None is the policy's choice, not a default
    assert all(getattr(resolved, name) is not None for name in OPTION_DEFAULTS)


def test_the_daemon_builds_the_request_once_from_the_http_request():
    assert set(OPTIONS) <= set(CompletionRequest.model_fields)  # the same names, end to end
    tokenizer = EdgeTokenizer(TOKENIZER_DIR)
    jobs = JobFactory(DaemonConfig(), tokenizer, context_limit=512)
    req = CompletionRequest(model=DaemonConfig().model_name, prompt="def f():", max_tokens=8,
                            mode="fast", min_agreement=0.9, offline="continue",
                            offline_wait_s=2.0, min_tokens_per_s=3.0, draft_length=5,
                            max_unverified_run=7, ignore_eos=True, stop=["\n\n"])
    job, text = jobs.completion_job(req)
    request = job.request
    assert text == "def f():" and request.prompt_ids == tokenizer.encode("def f():")
    assert {name: getattr(request, name) for name in OPTIONS} == {
        "draft_length": 5, "mode": "fast", "max_unverified_run": 7, "min_agreement": 0.9,
        "offline": "continue", "offline_wait_s": 2.0, "min_tokens_per_s": 3.0}
    assert request.max_tokens == 8 and request.stop_ids == frozenset()  # ignore_eos
    assert job.stop_strings == ("\n\n",)
    plain = jobs.completion_job(CompletionRequest(model=req.model, prompt="x"))[0].request
    assert plain.stop_ids == tokenizer.stop_ids and plain.mode is None  # left to the client
