"""The edge daemon end to end: a real verifier (cloud.server on a loopback port), a real daemon
(uvicorn on a free loopback port, llama.cpp draft runtimes) and the official `openai` client.

Greedy output through the HTTP API must be the target's own greedy text; bad requests get
OpenAI's error body and status and the daemon keeps serving; requests run concurrently."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
import yaml
from verifier_harness import edge_tokenizer, reference, start_verifier, target_runtime, verifier  # noqa: F401

from sim.cli import main as loadgen_main
from edge.config import ClientConfig, CloudLinkConfig, DaemonConfig, EdgeConfig
from edge.daemon.jobs import chat_prompt
from edge.daemon.openai_schema import ChatMessageIn
from edge.daemon.server import DaemonThread, load_pool
from edge.runtime import DraftConfig

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

torch.set_num_threads(1)

MODEL = "tandem-draft"
NEW_TOKENS = 24
POOL = 3


def edge_config(port: int, gguf_path: Path, draft_dir: Path, **daemon) -> EdgeConfig:
    return EdgeConfig(
        cloud=CloudLinkConfig(address=f"127.0.0.1:{port}"),
        draft=DraftConfig(backend="llama.cpp", model_path=gguf_path, tokenizer_dir=draft_dir,
                          n_ctx=512, threads=1),
        client=ClientConfig(draft_length=4),
        daemon=DaemonConfig(port=0, pool_size=POOL, max_tokens_limit=128, max_prompt_tokens=200,
                            **daemon))


@pytest.fixture(scope="module")
def daemon(verifier, gguf_path, draft_dir):
    with DaemonThread(load_pool(edge_config(verifier, gguf_path, draft_dir))) as running:
        yield running


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def prompts(heldout_prompts, edge_tokenizer, reference) -> list[str]:
    """Short held-out prompts (well inside max_prompt_tokens) whose target greedy continuation
    runs the full 32 tokens without an eos, so every test has output to look at."""
    chosen = []
    for prompt in heldout_prompts:
        ids = edge_tokenizer.encode(prompt)
        if 8 <= len(ids) <= 120 and edge_tokenizer.eos_id not in reference.greedy(ids, 32):
            chosen.append(prompt)
        if len(chosen) == 4:
            return chosen
    pytest.fail("fewer than 4 held-out prompts without an early eos")


def target_greedy_text(reference, edge_tokenizer, prompt: str, n: int) -> str:
    """The target's own greedy continuation as text, ending at its first eos like the daemon."""
    ids = reference.greedy(edge_tokenizer.encode(prompt), n)
    if edge_tokenizer.eos_id in ids:
        ids = ids[:ids.index(edge_tokenizer.eos_id)]
    return edge_tokenizer.decode(ids)


def completion(client, prompt: str, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=kw.pop("max_tokens", NEW_TOKENS),
                                     temperature=kw.pop("temperature", 0), **kw)


# ---- models, health -------------------------------------------------------------------------

def test_models_and_health(client, daemon):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(daemon.url + "/healthz").json()
    assert health["status"] == "ok" and health["pool_size"] == POOL and health["draft_backend"] == "llama.cpp"


# ---- completions ----------------------------------------------------------------------------

def test_greedy_completion_is_the_targets_greedy_text(client, prompts, reference, edge_tokenizer):
    for prompt in prompts[:3]:
        out = completion(client, prompt)
        assert out.object == "text_completion"
        assert out.choices[0].text == target_greedy_text(reference, edge_tokenizer, prompt, NEW_TOKENS)
        stats = out.tandem
        assert stats["verified_fraction"] == 1.0 and stats["unverified_tokens"] == 0
        assert stats["rounds"] == len(stats["accepted_lengths"]) == stats["target_passes"] >= 1
        assert stats["mean_accepted_length"] == pytest.approx(1 + sum(stats["accepted_lengths"]) / stats["rounds"])
        assert out.usage.completion_tokens == stats["verified_tokens"]
        assert out.usage.prompt_tokens == len(edge_tokenizer.encode(prompt))
        assert stats["bytes_up"] > 0 and stats["bytes_down"] > 0


def test_streamed_completion_equals_the_whole_one(client, prompts):
    whole = completion(client, prompts[0])
    chunks = list(completion(client, prompts[0], stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole.choices[0].text
    assert sum(1 for t in texts if t) >= 2, "the text should arrive in several chunks"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert finals[0].tandem["verified_fraction"] == 1.0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_token_id_prompt_and_echo(client, prompts, edge_tokenizer):
    text_out = completion(client, prompts[1])
    ids_out = client.completions.create(model=MODEL, prompt=edge_tokenizer.encode(prompts[1]),
                                        max_tokens=NEW_TOKENS, temperature=0, echo=True)
    assert ids_out.choices[0].text == edge_tokenizer.decode(edge_tokenizer.encode(prompts[1])) + text_out.choices[0].text


def test_stop_string_cuts_before_it_and_ends_early(client, prompts):
    whole = completion(client, prompts[2]).choices[0].text
    assert len(whole) >= 12, "need some output to pick a stop string from"
    stop = whole[6:9]
    cut = completion(client, prompts[2], stop=[stop])
    assert cut.choices[0].text == whole[:whole.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in completion(client, prompts[2], stop=stop, stream=True))
    assert streamed == cut.choices[0].text


def test_seeded_sampling_is_reproducible(client, prompts):
    a = completion(client, prompts[0], temperature=0.9, seed=7)
    b = completion(client, prompts[0], temperature=0.9, seed=7)
    assert a.choices[0].text == b.choices[0].text
    assert a.tandem["verified_fraction"] == 1.0


def test_trace_reports_each_round(client, prompts):
    out = completion(client, prompts[0], extra_body={"tandem_trace": True})
    trace = out.tandem["trace"]
    assert len(trace) == out.tandem["rounds"]
    assert [r["accepted"] for r in trace] == out.tandem["accepted_lengths"]
    assert all(0 < r["draft_length"] <= 4 or r["draft_length"] == 0 for r in trace)
    assert all(r["rtt_ms"] > 0 for r in trace)
    assert [r["t_s"] for r in trace] == sorted(r["t_s"] for r in trace)


# ---- chat ------------------------------------------------------------------------------------

def test_chat_uses_the_plain_template_streamed_or_not(client, prompts):
    messages = [{"role": "system", "content": "# helper module"}, {"role": "user", "content": prompts[0]}]
    prompt = chat_prompt([ChatMessageIn.model_validate(m) for m in messages])
    assert prompt == "# helper module\n" + prompts[0]
    expected = completion(client, prompt).choices[0].text
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=NEW_TOKENS, temperature=0)
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == expected
    assert chat.tandem["verified_fraction"] == 1.0
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=NEW_TOKENS,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason in ("stop", "length") and chunks[-1].tandem["rounds"] >= 1


# ---- errors ----------------------------------------------------------------------------------

def _error(exc_info) -> dict:
    return exc_info.value.body


def test_bad_requests_get_openai_errors_and_the_daemon_keeps_serving(client, daemon, prompts):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=4)
    assert info.value.status_code == 404 and _error(info)["code"] == "model_not_found"

    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=100_000)
    assert _error(info)["param"] == "max_tokens" and _error(info)["type"] == "invalid_request_error"

    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)
    assert _error(info)["param"] == "max_tokens"

    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x = 1\n" * 400, max_tokens=4)
    assert _error(info)["code"] == "context_length_exceeded"

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=4, temperature=7)
    assert _error(info)["param"] == "temperature"

    with pytest.raises(openai.BadRequestError) as info:  # a streamed request is refused before any event
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4, stream=True)
    assert _error(info)["param"] == "messages"

    raw = httpx.post(daemon.url + "/v1/completions", content=b'{"model": "tandem-draft", "prompt": ',
                     headers={"content-type": "application/json"})
    assert raw.status_code == 400
    assert raw.json()["error"]["type"] == "invalid_request_error"
    assert "JSON" in raw.json()["error"]["message"]
    assert httpx.get(daemon.url + "/v1/nothing").json()["error"]["code"] == "not_found"

    # Still serving, and the same answer as before.
    assert completion(client, prompts[0]).choices[0].text == completion(client, prompts[0]).choices[0].text


# ---- concurrency, disconnects, metrics --------------------------------------------------------

def test_concurrent_requests_overlap(client, daemon, prompts):
    pool = daemon.pool
    walls: list[float] = []
    errors: list[BaseException] = []

    def one(prompt: str) -> None:
        start = time.monotonic()
        try:
            completion(client, prompt, max_tokens=32)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)
        walls.append(time.monotonic() - start)

    pool.peak_inflight = 0
    threads = [threading.Thread(target=one, args=(p,)) for p in prompts[:POOL]]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    total = time.monotonic() - start
    assert not errors, errors
    assert pool.peak_inflight == POOL
    assert total < sum(walls)


def test_a_dropped_stream_frees_its_session(client, daemon, prompts):
    stream = completion(client, prompts[3], max_tokens=120, stream=True)
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 30
    while daemon.pool.health()["inflight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon.pool.health()["inflight"] == 0
    assert completion(client, prompts[0], max_tokens=4).choices[0].finish_reason == "length"


def test_metrics_count_rounds_tokens_and_requests(client, daemon, prompts):
    completion(client, prompts[0])
    text = httpx.get(daemon.url + "/metrics").text
    for name in ("tandem_edge_round_accepted_tokens_count", "tandem_edge_round_draft_tokens_count",
                 "tandem_edge_round_trip_seconds_count", "tandem_edge_sent_bytes_total",
                 "tandem_edge_received_bytes_total", "tandem_edge_generation_tokens_per_second_count",
                 "tandem_edge_time_to_first_token_seconds_count", "tandem_edge_spec_decode_num_drafts_total"):
        assert _metric(text, name) > 0, name
    assert _metric(text, 'tandem_edge_generated_tokens_total{model="tandem-draft",verified="true"}') > 0
    assert _metric(text, 'tandem_edge_link_state{model="tandem-draft",state="up"}') == 1.0
    assert _metric(text, 'tandem_edge_requests_total{endpoint="/v1/completions",model="tandem-draft",'
                         'status="200"}') >= 1
    assert 'tandem_edge_requests_total{endpoint="/v1/completions",model="tandem-draft",status="404"}' in text
    assert "_created" not in text


def _metric(text: str, name: str) -> float:
    """The value of a series; a name without labels sums the series of every label set."""
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name + " ") or ("{" not in name and line.startswith(name + "{"))]
    if not values:
        raise AssertionError(f"{name} not in /metrics")
    return sum(values)


def test_unreachable_verifier_gives_unverified_tokens_and_link_down(gguf_path, draft_dir, prompts):
    config = edge_config(_free_port(), gguf_path, draft_dir)  # nothing listens there
    config = config.model_copy(update={
        "client": ClientConfig(offline_after_s=0.2, retry_initial_backoff_s=0.05, offline_probe_tokens=64),
        "daemon": config.daemon.model_copy(update={"pool_size": 1})})
    with DaemonThread(load_pool(config)) as offline:
        client = openai.OpenAI(base_url=offline.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        out = completion(client, prompts[0], max_tokens=8)
        assert out.usage.completion_tokens == 8
        assert out.tandem["verified_fraction"] == 0.0 and out.tandem["rounds"] == 0
        assert httpx.get(offline.url + "/healthz").json()["link_state"] == "down"
        text = httpx.get(offline.url + "/metrics").text
        assert _metric(text, 'tandem_edge_link_state{model="tandem-draft",state="down"}') == 1.0
        assert _metric(text, 'tandem_edge_generated_tokens_total{model="tandem-draft",verified="false"}') == 8


def test_require_verified_with_the_verifier_away_is_a_503(target_runtime, gguf_path, draft_dir,
                                                         prompts):
    server, port = start_verifier(target_runtime)
    config = edge_config(port, gguf_path, draft_dir)
    config = config.model_copy(update={
        "client": ClientConfig(draft_length=4, offline_after_s=0.2, retry_initial_backoff_s=0.05),
        "daemon": config.daemon.model_copy(update={"pool_size": 1})})
    body = {"model": MODEL, "prompt": prompts[1], "max_tokens": 8, "temperature": 0,
            "offline": "require_verified"}
    try:
        with DaemonThread(load_pool(config)) as running:
            served = httpx.post(running.url + "/v1/completions", json=body, timeout=60)
            assert served.status_code == 200 and served.json()["tandem"]["verified_fraction"] == 1.0
            server.stop(0).wait()  # the verifier goes away; the daemon stays up
            server = None
            for _ in range(2):  # and answers the same way again: it kept serving
                away = httpx.post(running.url + "/v1/completions", json=body, timeout=60)
                assert away.status_code == 503, away.text
                assert away.headers["Retry-After"]
                error = away.json()["error"]
                assert error["code"] == "verifier_unavailable"
                assert "requires verified tokens" in error["message"]
    finally:
        if server is not None:
            server.stop(0).wait()


def test_a_verifier_that_refuses_the_session_is_a_502(target_runtime, gguf_path, draft_dir, prompts):
    server, port = start_verifier(target_runtime, api_keys=("the-right-key",))
    config = edge_config(port, gguf_path, draft_dir)
    config = config.model_copy(update={
        "cloud": config.cloud.model_copy(update={"api_key": "a-wrong-key"}),
        "daemon": config.daemon.model_copy(update={"pool_size": 1})})
    try:
        with DaemonThread(load_pool(config)) as refused:
            client = openai.OpenAI(base_url=refused.url + "/v1", api_key="unused", max_retries=0, timeout=60)
            for _ in range(2):  # the daemon answers the same way again: it kept serving
                with pytest.raises(openai.APIStatusError) as info:
                    completion(client, prompts[0], max_tokens=4)
                assert info.value.status_code == 502
                assert info.value.body["code"] == "verifier_refused"
                assert "API key" in info.value.body["message"]
    finally:
        server.stop(0).wait()


def test_loadgen_against_the_running_daemon(daemon, tmp_path, capsys):
    out = tmp_path / "loadgen.json"
    code = loadgen_main(["loadgen", "--url", daemon.url, "--requests", "3", "--concurrency", "3",
                         "--max-tokens", "8", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "tok/s" in printed and "run" in printed
    summary = json.loads(out.read_text())["summaries"]["run"]
    assert summary["requests"] == 3 and summary["errors"] == 0 and summary["tokens"] == 3 * 8
    assert summary["verified_share"] == 1.0


# ---- the command -----------------------------------------------------------------------------

def test_serve_command_answers_and_stops_on_sigterm(verifier, gguf_path, draft_dir, tmp_path):
    config = edge_config(verifier, gguf_path, draft_dir).model_dump(mode="json")
    config["daemon"].update(port=_free_port(), pool_size=1)
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "edge.cli", "serve", "--config", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{config['daemon']['port']}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
            time.sleep(0.1)
        reply = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "def f(", "max_tokens": 4},
                           timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    log = proc.stdout.read().decode()
    assert code == 0, log
    # At the default level: the listening line and one access line per request with its tokens.
    assert f"listening on http://127.0.0.1:{config['daemon']['port']}" in log, log
    completion_tokens = reply.json()["usage"]["completion_tokens"]
    assert f'"POST /v1/completions" 200 {completion_tokens} tokens' in log, log


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
