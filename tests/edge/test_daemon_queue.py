"""Streams that wait for the daemon's pool, over HTTP (a real verifier, a real daemon, raw SSE
read event by event): a stream's first chunk goes out with its first token (role and first text
together, as vLLM sends them), never while it waits for a slot; the final chunk reports the wait
(`queue_s`), the daemon's TTFT counts from arrival, and the access log names the wait. Waiting
requests start in arrival order (FIFO) and past daemon.max_waiting are refused with a 503 and
Retry-After."""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
import torch
from verifier_harness import edge_tokenizer, reference, target_runtime, verifier  # noqa: F401
from waiting import wait_for

from edge.config import ClientConfig, CloudLinkConfig, DaemonConfig, EdgeConfig
from edge.daemon.server import DaemonThread, load_pool
from edge.runtime import DraftConfig

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

torch.set_num_threads(1)

MODEL = "tandem-draft"
POOL = 2
STREAMS = 3 * POOL
NEW_TOKENS = 64         # ignore_eos: every generation runs this long, so the pool stays full
FIRST_CHUNK_GAP_S = 0.15  # the product bound: first chunk within this of the first token


def start_daemon(port: int, gguf_path, draft_dir, pool_size: int, max_waiting: int) -> DaemonThread:
    config = EdgeConfig(
        cloud=CloudLinkConfig(address=f"127.0.0.1:{port}"),
        draft=DraftConfig(backend="llama.cpp", model_path=gguf_path, tokenizer_dir=draft_dir,
                          n_ctx=512, threads=1),
        client=ClientConfig(draft_length=4),
        daemon=DaemonConfig(port=0, pool_size=pool_size, max_waiting=max_waiting,
                            max_tokens_limit=128, max_prompt_tokens=200))
    return DaemonThread(load_pool(config)).start()


@pytest.fixture(scope="module")
def daemon(verifier, gguf_path, draft_dir):
    running = start_daemon(verifier, gguf_path, draft_dir, POOL, STREAMS)
    yield running
    running.stop()


@dataclass
class Stream:
    """One streaming request read event by event: each `data:` event with the monotonic time it
    arrived (the daemon runs in this process: one clock for both sides)."""
    url: str
    body: dict
    sent: float = 0.0
    status: int = 0
    events: list[tuple[float, dict | str]] = field(default_factory=list)
    other_lines: list[str] = field(default_factory=list)
    error: BaseException | None = None
    headers: dict = field(default_factory=dict)

    def run(self) -> None:
        try:
            with httpx.Client(timeout=120) as http:
                # Connected first, so `sent` is the request's own start, not a TCP handshake
                # that waits on this busy process's accept loop.
                http.get(self.url.split("/v1/")[0] + "/version").raise_for_status()
                self.sent = time.monotonic()
                with http.stream("POST", self.url, json=self.body) as response:
                    self.status, self.headers = response.status_code, dict(response.headers)
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            data = line.removeprefix("data: ")
                            self.events.append((time.monotonic(),
                                                data if data == "[DONE]" else json.loads(data)))
                        elif line:
                            self.other_lines.append(line)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc

    @property
    def chunks(self) -> list[dict]:
        return [data for _, data in self.events if isinstance(data, dict)]

    @property
    def final(self) -> dict:
        return next(c for c in self.chunks if c["choices"] and c["choices"][0]["finish_reason"])


def body(kind: str, prompt: str) -> dict:
    common = {"model": MODEL, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
              "stream": True, "stream_options": {"include_usage": True}}
    if kind == "chat":
        return {**common, "messages": [{"role": "user", "content": prompt}]}
    return {**common, "prompt": prompt}


def start_in_order(daemon: DaemonThread, streams: list[Stream]) -> list[threading.Thread]:
    """Start the streams one at a time, each once the daemon holds the one before it (running or
    waiting), so their arrival order is the list's."""
    pool, threads = daemon.pool, []
    for i, stream in enumerate(streams):
        threads.append(threading.Thread(target=stream.run))
        threads[-1].start()
        wait_for(lambda: pool.inflight + pool.waiting == i + 1, f"request {i} admitted")
    return threads


def join(threads: list[threading.Thread], streams: list[Stream]) -> None:
    for thread in threads:
        thread.join(180)
    assert not any(t.is_alive() for t in threads), "a stream hung"
    assert [s.error for s in streams] == [None] * len(streams)


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_three_times_the_pool_first_chunk_comes_with_the_first_token(daemon, heldout_prompts,
                                                                     caplog):
    caplog.set_level(logging.INFO, logger="edge.daemon.access")
    metrics_before = httpx.get(daemon.url + "/metrics").text
    kinds = ["chat", "completion"] * (STREAMS // 2)
    streams = [Stream(daemon.url + ("/v1/chat/completions" if kind == "chat" else "/v1/completions"),
                      body(kind, heldout_prompts[i][:300])) for i, kind in enumerate(kinds)]
    join(start_in_order(daemon, streams), streams)

    for i, (kind, stream) in enumerate(zip(kinds, streams)):
        assert stream.status == 200 and stream.other_lines == [], (i, stream.other_lines)
        first = stream.chunks[0]["choices"][0]
        # The first chunk carries the first text (and, in a chat, the role) together.
        if kind == "chat":
            assert first["delta"]["role"] == "assistant" and first["delta"]["content"], first
            assert all(c["choices"][0]["delta"].get("role") is None
                       for c in stream.chunks[1:] if c["choices"])
        else:
            assert first["text"], first
        assert stream.events[-1][1] == "[DONE]"
        stats = stream.final["tandem"]
        assert stats["ttft_s"] >= stats["queue_s"] >= 0.0
        assert stats["wall_s"] >= stats["ttft_s"]
        # The first chunk left within the bound after the first token: the client's TTFT (from
        # sending, a little before the daemon's arrival stamp) less the daemon's (from arrival).
        gap = (stream.events[0][0] - stream.sent) - stats["ttft_s"]
        assert 0.0 <= gap < FIRST_CHUNK_GAP_S, (i, gap, stats)
    # The pool held POOL; the others each waited for a whole generation before theirs started.
    queues = [s.final["tandem"]["queue_s"] for s in streams]
    shortest = min(s.final["tandem"]["wall_s"] - s.final["tandem"]["queue_s"] for s in streams)
    assert sum(q > shortest / 2 for q in queues) == STREAMS - POOL, queues
    # The histogram beside TTFT counted every wait, and the access log names each one.
    metrics_after = httpx.get(daemon.url + "/metrics").text
    name = "tandem_edge_request_queue_seconds"
    assert metric(metrics_after, name + "_count") - metric(metrics_before, name + "_count") == STREAMS
    assert metric(metrics_after, name + "_sum") - metric(metrics_before, name + "_sum") == \
        pytest.approx(sum(queues), abs=1e-6)
    access = [r.getMessage() for r in caplog.records if r.name == "edge.daemon.access"]
    assert sum("(queued " in line for line in access) >= STREAMS, access


def test_waiting_requests_start_in_arrival_order_and_past_max_waiting_get_a_503(
        verifier, gguf_path, draft_dir, heldout_prompts):
    """One slot, two waiting places: three streams finish in the order they arrived (each starts
    only when the one before it ended), and a fourth request is refused with Retry-After."""
    daemon = start_daemon(verifier, gguf_path, draft_dir, pool_size=1, max_waiting=2)
    try:
        url = daemon.url + "/v1/completions"
        streams = [Stream(url, body("completion", heldout_prompts[20 + i][:300]))
                   for i in range(3)]
        threads = start_in_order(daemon, streams)
        refused = httpx.post(url, json={**body("completion", "x"), "stream": False}, timeout=60)
        join(threads, streams)
    finally:
        daemon.stop()
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "overloaded"
    # One slot: each ran after the one before it ended, in arrival order (FIFO), so they
    # ended in that order and each waited longer than the one before it.
    ends = [next(t for t, data in s.events if isinstance(data, dict) and data["choices"]
                 and data["choices"][0]["finish_reason"]) for s in streams]
    assert ends == sorted(ends)
    queues = [s.final["tandem"]["queue_s"] for s in streams]
    assert queues == sorted(queues), queues
