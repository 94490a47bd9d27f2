"""The daemon's HTTP surface as real clients meet it: a real verifier and a real daemon (llama.cpp
drafts) on loopback, with an API key, CORS origins, a small body limit and a tokenizer that has
a chat template (ChatML with tools, like Qwen2.5's). The official `openai` client, and raw
requests shaped like LiteLLM's, LangChain ChatOpenAI's and a Continue-style IDE completion.
Plus the chat template rendered exactly as transformers' apply_chat_template renders it, and
hypothesis over request bodies: every refusal is a 4xx OpenAI error, never a 500."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import httpx
import openai
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from verifier_harness import edge_tokenizer, reference, start_verifier, target_runtime, verifier  # noqa: F401

from edge.config import ClientConfig, CloudLinkConfig, DaemonConfig, EdgeConfig
from edge.daemon.app import error_response
from edge.daemon.chat_template import ChatTemplate
from edge.daemon.errors import QueueFull, ServiceUnavailable, from_validation_errors
from edge.daemon.openai_schema import ChatCompletionRequest, CompletionRequest
from edge.daemon.server import DaemonThread, check_exposure, load_pool
from edge.runtime import DraftConfig
from tandem.config import ConfigError

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)

MODEL = "tandem-draft"
KEY = "sekrit-key"
ORIGIN = "http://localhost:3000"
BODY_LIMIT = 64 * 1024

CHATML = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}"
    "{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.function.name + '\", \"arguments\": ' "
    "+ tool_call.function.arguments + '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TOOL_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"},
]


@pytest.fixture(scope="module")
def chat_tokenizer_dir(tmp_path_factory, draft_dir) -> Path:
    """The draft's tokenizer with a ChatML chat template in tokenizer_config.json."""
    directory = tmp_path_factory.mktemp("chat-tokenizer")
    shutil.copy(draft_dir / "tokenizer.json", directory / "tokenizer.json")
    config = json.loads((draft_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = CHATML
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def daemon(verifier, gguf_path, chat_tokenizer_dir):
    config = EdgeConfig(
        cloud=CloudLinkConfig(address=f"127.0.0.1:{verifier}"),
        draft=DraftConfig(backend="llama.cpp", model_path=gguf_path,
                          tokenizer_dir=chat_tokenizer_dir, n_ctx=512, threads=1),
        client=ClientConfig(draft_length=4),
        daemon=DaemonConfig(port=0, pool_size=2, max_tokens_limit=64, max_prompt_tokens=300,
                            api_key=KEY, cors_origins=[ORIGIN], max_body_bytes=BODY_LIMIT))
    with DaemonThread(load_pool(config)) as running:
        yield running


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(daemon):
    with httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=120) as session:
        yield session


def chatml(messages, tools=None) -> str:
    return ChatTemplate(CHATML).render(messages, tools=tools)


# ---- the chat template ----------------------------------------------------------------------

def test_chat_template_renders_like_transformers(chat_tokenizer_dir):
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=str(chat_tokenizer_dir / "tokenizer.json"))
    hf.chat_template = CHATML
    ours = ChatTemplate.from_dir(chat_tokenizer_dir)
    assert ours.has_template and ours.takes_tools
    cases = [([{"role": "user", "content": "def f(): ¿qué? 中文"}], None),
             (TOOL_TURNS, TOOLS), (TOOL_TURNS[:2], None)]
    for messages, tools in cases:
        expected = hf.apply_chat_template(messages, tools=tools, tokenize=False,
                                          add_generation_prompt=True)
        assert ours.render(messages, tools=tools) == expected


def test_plain_join_without_a_template_and_tools_refused_there(draft_dir):
    plain = ChatTemplate.from_dir(draft_dir)
    assert not plain.has_template
    assert plain.render([{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]) == "a\nb"
    with pytest.raises(ValueError, match="no chat template"):
        plain.render([{"role": "user", "content": "x"}], tools=TOOLS)


# ---- the official client ------------------------------------------------------------------

def test_models_health_version_tokenize_detokenize(client, daemon, http, chat_tokenizer_dir):
    card = http.get("/v1/models").json()["data"][0]
    assert card["id"] == MODEL and card["max_model_len"] == 512
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(daemon.url + "/health")  # open without the key, like /healthz
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert httpx.get(daemon.url + "/version").json()["version"]
    text = "def fib(n): # ¿qué? 中文 🙂"
    tokens = http.post("/tokenize", json={"model": MODEL, "prompt": text}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 512
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"] == text
    chat = http.post("/tokenize", json={"messages": TOOL_TURNS[:2]}).json()
    assert http.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"] == chatml(TOOL_TURNS[:2])
    bad = http.post("/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_chat_uses_the_template_and_accepts_tool_turns(client, http):
    plain = client.completions.create(model=MODEL, prompt=chatml(TOOL_TURNS, TOOLS), max_tokens=8,
                                      temperature=0)
    chat = client.chat.completions.create(model=MODEL, messages=TOOL_TURNS, tools=TOOLS,
                                          tool_choice="auto", max_tokens=8, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    assert chat.tandem["verified_fraction"] == 1.0
    with pytest.raises(openai.BadRequestError) as info:  # forcing a call would constrain decoding
        client.chat.completions.create(model=MODEL, messages=TOOL_TURNS[:2], tools=TOOLS,
                                       tool_choice="required", max_tokens=4)
    assert info.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError):  # null content only for assistant tool calls
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": None}],
                                       max_tokens=4)


def test_unknown_fields_are_ignored_with_a_warning(client, caplog):
    with caplog.at_level(logging.WARNING, logger="edge.daemon"):
        out = client.completions.create(model=MODEL, prompt="def f(", max_tokens=4, temperature=0,
                                        extra_body={"min_p": 0, "repetition_penalty": 1.0,
                                                    "ignore_eos": True, "some_vendor_knob": 3,
                                                    "service_tier": "auto"})
    assert out.usage.completion_tokens == 4
    assert any("some_vendor_knob" in r.getMessage() for r in caplog.records)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, frequency_penalty=0.5)
    assert info.value.body["param"] == "frequency_penalty"


def test_strict_mode_refuses_unknown_fields_naming_them(verifier, gguf_path, draft_dir):
    config = EdgeConfig(
        cloud=CloudLinkConfig(address=f"127.0.0.1:{verifier}"),
        draft=DraftConfig(backend="llama.cpp", model_path=gguf_path, tokenizer_dir=draft_dir,
                          n_ctx=512, threads=1),
        daemon=DaemonConfig(port=0, pool_size=1, strict_openai=True))
    with DaemonThread(load_pool(config)) as strict:
        client = openai.OpenAI(base_url=strict.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt="def f(", max_tokens=4,
                                      extra_body={"some_vendor_knob": 3})
        assert info.value.body["param"] == "some_vendor_knob"
        assert "some_vendor_knob" in info.value.body["message"]
        out = client.completions.create(model=MODEL, prompt="def f(", max_tokens=4,
                                        temperature=0, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 4


def test_several_prompts_give_one_choice_each(client):
    prompts = ["def add(a, b):", "import os\n"]
    batch = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0)
    singles = [client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0)
               for p in prompts]
    assert [c.index for c in batch.choices] == [0, 1]
    assert [c.text for c in batch.choices] == [s.choices[0].text for s in singles]
    assert batch.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    streamed = list(client.completions.create(model=MODEL, prompt=prompts, max_tokens=6,
                                              temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    for i, single in enumerate(singles):
        text = "".join(c.choices[0].text for c in streamed if c.choices and c.choices[0].index == i)
        assert text == single.choices[0].text
    assert streamed[-1].usage.completion_tokens == batch.usage.completion_tokens


def test_stop_newline_counts_tokens_up_to_the_stop(client, http, edge_tokenizer, reference):
    prompt = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):"
    ids = edge_tokenizer.encode(prompt)
    greedy = reference.greedy(ids, 24)
    text = edge_tokenizer.decode(greedy)
    assert "\n" in text, "the continuation needs a newline to stop at"
    # The token that completes the first "\n" ends the output, as in vLLM.
    n = next(i for i in range(1, len(greedy) + 1) if "\n" in edge_tokenizer.decode(greedy[:i]))
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                    stop=["\n"])
    assert out.choices[0].text == text[:text.index("\n")]
    assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == n


# ---- raw requests as other clients send them -------------------------------------------------

def test_litellm_shaped_streaming_chat(http):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write hello world"}],
            "max_tokens": 8, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": False},
            "user": "litellm-user", "drop_params": True}
    with http.stream("POST", "/v1/chat/completions", json=body,
                     headers={"User-Agent": "litellm/1.0"}) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"]["completion_tokens"] >= 1 and chunks[-1]["choices"] == []
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content and all(c["usage"] is None for c in content)
    assert all(c["tandem"] == {"verified": True, "link_state": "up"} for c in content)


def test_continuous_usage_stats_put_usage_so_far_in_every_chunk(http):
    body = {"model": MODEL, "prompt": "def fib(n):\n", "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with http.stream("POST", "/v1/completions", json=body) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: {")]
    chunks = [json.loads(e) for e in events]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
    counts = [c["usage"]["completion_tokens"] for c in content]
    assert counts == sorted(counts) and 1 <= counts[0] and counts[-1] <= 24
    prompt_tokens = chunks[-1]["usage"]["prompt_tokens"]
    assert all(c["usage"]["prompt_tokens"] == prompt_tokens and c["usage"]["total_tokens"]
               == prompt_tokens + c["usage"]["completion_tokens"] for c in content)
    assert chunks[-1]["usage"]["completion_tokens"] == 24 and chunks[-1]["choices"] == []


def test_langchain_shaped_chat_with_tools(http):
    body = {"messages": [{"content": "You are helpful.", "role": "system"},
                         {"content": "Weather in Zürich?", "role": "user"}],
            "model": MODEL, "stream": False, "n": 1, "temperature": 0.0, "max_completion_tokens": 6,
            "tools": TOOLS, "parallel_tool_calls": False, "logprobs": None, "stop": None,
            "frequency_penalty": None, "presence_penalty": None, "seed": None, "top_p": None}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["object"] == "chat.completion" and data["usage"]["completion_tokens"] <= 6


def test_continue_shaped_ide_completion_with_many_stops(http):
    stops = ["\n\n", "\n```", "/src/", "#- coding: utf-8", "```", "\ndef ", "\nclass "]
    body = {"model": MODEL, "prompt": "import os\n\ndef list_files(path):\n    ", "max_tokens": 32,
            "temperature": 0.01, "stop": stops, "stream": True, "suffix": "\n", "top_p": 1}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]
                   if json.loads(e)["choices"])
    assert not any(s in text for s in stops)


# ---- security and limits ----------------------------------------------------------------------

def test_api_key_is_required_and_cors_answers_allowed_origins(daemon):
    denied = httpx.post(daemon.url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=daemon.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    ok = httpx.get(daemon.url + "/v1/models", headers={"x-api-key": KEY})
    assert ok.status_code == 200
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    allowed = httpx.options(daemon.url + "/v1/chat/completions", headers=preflight)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(daemon.url + "/v1/chat/completions",
                          headers={**preflight, "Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_exposed_daemon_needs_a_key():
    with pytest.raises(ConfigError, match="without an API key"):
        check_exposure(DaemonConfig(host="0.0.0.0"))
    check_exposure(DaemonConfig(host="0.0.0.0", api_key="k"))
    check_exposure(DaemonConfig(host="127.0.0.1"))


def test_body_limit_is_enforced_while_reading(daemon, http):
    big = json.dumps({"model": MODEL, "prompt": "x" * (BODY_LIMIT + 10)}).encode()
    declared = http.post("/v1/completions", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: counted while read
        for i in range(0, len(big), 8192):
            yield big[i:i + 8192]
    streamed = http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert http.get("/healthz").status_code == 200


def test_bad_numbers_and_text_are_400s(http):
    for extra, param in (({"seed": 2**64}, "seed"), ({"top_k": 2**32}, "top_k"),
                         ({"max_tokens": 2**40}, "max_tokens")):
        response = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", **extra})
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    surrogate = b'{"model": "tandem-draft", "prompt": "a\\ud800b", "max_tokens": 2}'
    response = http.post("/v1/completions", content=surrogate, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "surrogate" in response.json()["error"]["message"]
    ok = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "seed": 2**64 - 1,
                                            "max_tokens": 2, "temperature": 1, "top_k": 2**32 - 1})
    assert ok.status_code == 200, ok.text


def test_503s_carry_retry_after():
    for error in (QueueFull("busy"), ServiceUnavailable("down")):
        response = error_response(error)
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1


# ---- property tests of request parsing -------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12)
FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed",
          "stop", "stream", "n", "logprobs", "echo", "tools", "tool_choice", "stream_options",
          "ignore_eos", "min_p", "suffix", "draft_length", "response_format"]
bodies = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), json_values, max_size=8)


@settings(max_examples=300, deadline=None)
@given(body=bodies)
def test_parsing_any_body_succeeds_or_is_a_400(body):
    for schema in (CompletionRequest, ChatCompletionRequest):
        try:
            schema.model_validate(body)
        except ValidationError as exc:
            error = from_validation_errors(exc.errors())
            assert error.status == 400 and error.message


def test_tokenize_with_no_messages_is_a_400_not_a_500(http):
    """Found by the fuzz test below: an empty `messages` list failed inside the handler."""
    response = http.post("/tokenize", json={"messages": []})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "messages"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300) | bodies.map(lambda b: json.dumps({**b, "max_tokens": 1}).encode()),
       path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/tokenize"]))
def test_live_daemon_never_answers_500_to_fuzzed_bodies(http, raw, path):
    response = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert response.status_code < 500, (raw, response.text)
    if response.status_code >= 400:
        assert response.json()["error"]["message"]


def test_daemon_still_serves_after_the_fuzzing(client):
    assert client.completions.create(model=MODEL, prompt="def f(", max_tokens=2).usage.completion_tokens >= 1


def test_daemon_refuses_a_port_in_use():
    from edge.daemon.server import bind
    first = bind("127.0.0.1", 0)
    first.listen()
    try:
        with pytest.raises(ConfigError, match=r"cannot bind 127\.0\.0\.1:\d+: Address already in use"):
            bind("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()
