"""The daemon's pure parts: request schemas and their error mapping, incremental detokenizer,
stop strings, SSE framing, metrics. The end-to-end daemon is in test_daemon.py."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from tokenizers import Tokenizer

from edge.daemon import sse
from edge.daemon.detokenizer import IncrementalDetokenizer
from edge.daemon.errors import ContextLengthExceeded, ModelNotFound, from_validation_errors
from edge.daemon.metrics import DaemonMetrics
from edge.daemon.openai_schema import ChatCompletionRequest, CompletionRequest, CompletionResponse
from edge.daemon.stop import StopMatcher

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

TOKENIZER = Path(__file__).resolve().parents[2] / "models/tokenizer/tokenizer.json"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER))


def _error_for(cls, body: dict):
    with pytest.raises(ValidationError) as info:
        cls.model_validate(body)
    return from_validation_errors(info.value.errors())


# --- schemas and error mapping ------------------------------------------------------------------

def test_completion_request_defaults_follow_openai():
    req = CompletionRequest.model_validate({"model": "m", "prompt": "def f("})
    assert (req.temperature, req.top_p, req.n, req.stream, req.stop_strings) == (1.0, 1.0, 1, False, [])
    assert CompletionRequest.model_validate({"model": "m", "prompt": ["x"]}).prompts == ["x"]
    assert CompletionRequest.model_validate({"model": "m", "prompt": [[1, 2]]}).prompts == [[1, 2]]
    assert CompletionRequest.model_validate({"model": "m", "prompt": [1, 2]}).prompts == [[1, 2]]
    assert CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"]}).prompts == ["a", "b"]
    # Unknown fields are kept aside (the app warns, or refuses in strict mode); nulls = defaults.
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "bogus": 1,
                                            "temperature": None, "top_k": -1})
    assert req.unknown_fields == ["bogus"] and req.temperature == 1.0 and req.top_k == 0
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x", "stop": "\n"}).stop_strings == ["\n"]


def test_chat_request_max_completion_tokens_wins_and_parts_join():
    req = ChatCompletionRequest.model_validate({
        "model": "m", "max_tokens": 5, "max_completion_tokens": 9,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert req.max_tokens == 9
    assert req.messages[0].text == "ab"


@pytest.mark.parametrize("body, param, needle", [
    ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"model": "m", "prompt": "x", "temperature": 3}, "temperature", "less than or equal to 2"),
    ({"model": "m", "prompt": "x", "n": 2}, "n", "only n=1"),
    ({"model": "m", "prompt": "x", "presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ({"model": "m", "prompt": "x", "repetition_penalty": 1.2}, "repetition_penalty", "not supported"),
    ({"model": "m", "prompt": "x", "min_p": 0.1}, "min_p", "not supported"),
    ({"model": "m", "prompt": "x", "logprobs": 2}, "logprobs", "not supported"),
    ({"model": "m", "prompt": "x", "seed": 2**64}, "seed", "less than 18446744073709551616"),
    ({"model": "m", "prompt": "x", "top_k": 2**32}, "top_k", "less than 4294967296"),
    ({"model": "m", "prompt": [[]]}, "prompt", "must not be empty"),
    ({"model": "m"}, "prompt", "Missing required parameter"),
    ({"model": "m", "prompt": "x", "stop": ["s"] * 65}, "stop", "at most 64"),
])
def test_invalid_completion_fields_name_the_param(body, param, needle):
    err = _error_for(CompletionRequest, body)
    assert err.status == 400 and err.type == "invalid_request_error"
    assert err.param == param
    assert needle in err.message


def test_invalid_chat_fields_name_the_param():
    err = _error_for(ChatCompletionRequest, {"model": "m", "messages": [{"role": "robot", "content": "x"}]})
    assert err.param == "messages.0.role"
    err = _error_for(ChatCompletionRequest, {"model": "m", "messages": []})
    assert err.param == "messages"


def test_error_bodies_have_openai_shape():
    body = ModelNotFound("gpt-9").body().model_dump()
    assert body == {"error": {"message": "The model 'gpt-9' does not exist", "type": "invalid_request_error",
                              "param": "model", "code": "model_not_found"}}
    err = ContextLengthExceeded("too long", param="prompt")
    assert (err.status, err.code) == (400, "context_length_exceeded")
    json_err = from_validation_errors([{"type": "json_invalid", "loc": ("body", 7), "msg": "JSON decode error"}])
    assert json_err.status == 400 and "could not parse the JSON body" in json_err.message
    empty = from_validation_errors([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    assert empty.param is None and "empty" in empty.message


# --- incremental detokenizer --------------------------------------------------------------------

SAMPLES = [
    "def f(x):\n    return x + 1\n",
    'print("héllo wörld — 中文字符 🐍🐍 ok")\n',
    "# ∑ ∫ ≤ ≥ ≠ ñ ü ß\nvalue = '日本語'\n",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_detokenizer_streams_exactly_the_full_decode(tokenizer, text):
    ids = tokenizer.encode(text).ids
    rng = random.Random(0)
    for _ in range(5):
        detok = IncrementalDetokenizer(tokenizer.decode)
        pieces, i = [], 0
        while i < len(ids):
            step = rng.randint(1, 4)
            pieces.append(detok.push(ids[i:i + step]))
            i += step
        pieces.append(detok.flush())
        assert "".join(pieces) == tokenizer.decode(ids) == text
        assert not any("\ufffd" in piece for piece in pieces)


def test_detokenizer_holds_back_a_split_character(tokenizer):
    ids = tokenizer.encode("🐍").ids
    assert len(ids) > 1, "the emoji must span several byte-level tokens for this test"
    detok = IncrementalDetokenizer(tokenizer.decode)
    assert [detok.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1:]) == "🐍"


def test_detokenizer_flushes_an_incomplete_character_at_the_end(tokenizer):
    ids = tokenizer.encode("a🐍").ids
    detok = IncrementalDetokenizer(tokenizer.decode)
    assert detok.push(ids[:1]) == "a"
    assert detok.push(ids[1:-1]) == ""
    assert detok.flush() == tokenizer.decode(ids[:-1])[1:]  # the lone bytes, as U+FFFD


# --- stop strings -------------------------------------------------------------------------------

def test_stop_string_split_across_pushes_is_cut_before_it():
    stop = StopMatcher(["\n\n", "END"])
    out = [stop.push(t) for t in ["a = 1\n", "\nb = 2", "more"]]
    assert "".join(out) == "a = 1" and stop.stopped
    assert stop.flush() == ""


def test_stop_prefix_that_does_not_complete_is_released():
    stop = StopMatcher(["END"])
    assert stop.push("x EN") == "x "
    assert stop.push("d") == "ENd"
    assert stop.push(" E") == " "
    assert stop.flush() == "E" and not stop.stopped


def test_no_stop_strings_passes_everything():
    stop = StopMatcher([])
    assert stop.push("abc") == "abc" and stop.flush() == ""


# --- SSE and metrics ----------------------------------------------------------------------------

def test_sse_event_framing():
    chunk = CompletionResponse(id="cmpl-1", created=1, model="m", choices=[{"text": "hi", "finish_reason": None}])
    raw = sse.event(chunk)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    assert json.loads(raw[len(b"data: "):])["choices"][0]["text"] == "hi"
    assert sse.DONE == b"data: [DONE]\n\n"


def test_metrics_on_a_private_registry():
    registry = CollectorRegistry()
    metrics = DaemonMetrics(registry)
    metrics.observe_rounds([4, 4, 2], [4, 1, 2], [0.01, 0.02, 0.03])
    metrics.observe_generation(verified=9, unverified=3, target_passes=3, bytes_up=100, bytes_down=40,
                               wall_s=2.0, ttft_s=0.1, reopens=1)
    metrics.set_link_state("down")
    text = metrics.render().decode()
    assert 'tandem_edge_generated_tokens_total{model="",verified="true"} 9.0' in text
    assert 'tandem_edge_generated_tokens_total{model="",verified="false"} 3.0' in text
    assert 'tandem_edge_round_accepted_tokens_count{model=""} 3.0' in text
    assert 'tandem_edge_round_trip_seconds_sum{model=""} 0.06' in text
    assert 'tandem_edge_link_state{model="",state="down"} 1.0' in text
    assert 'tandem_edge_link_state{model="",state="up"} 0.0' in text
    assert 'tandem_edge_sent_bytes_total{model=""} 100.0' in text
    # vLLM's spec-decode counters: τ = 1 + 7 / 3 from the rounds above; per position.
    assert 'tandem_edge_spec_decode_num_drafts_total{model=""} 3.0' in text
    assert 'tandem_edge_spec_decode_num_draft_tokens_total{model=""} 10.0' in text
    assert 'tandem_edge_spec_decode_num_accepted_tokens_total{model=""} 7.0' in text
    assert 'tandem_edge_spec_decode_num_accepted_tokens_per_pos_total{model="",position="0"} 3.0' in text
    assert 'tandem_edge_spec_decode_num_accepted_tokens_per_pos_total{model="",position="1"} 2.0' in text
    assert 'tandem_edge_spec_decode_num_accepted_tokens_per_pos_total{model="",position="3"} 1.0' in text
    assert "_created" not in text
    # A second daemon in the same process gets its own registry without clashes.
    DaemonMetrics(CollectorRegistry())
