"""The emulated users of one sweep point: closed loop, each sends its next held-out prompt when
the last one ends (after an optional think time), until the point's window closes.

A Tandem user is an emulated device: the real EdgeClient (round loop, controller, codec) on its
own gRPC channel through its own emulated link, drafting with a ReplayDraft paced at its device's
speed. A vLLM user streams OpenAI completions from `vllm serve` through its own link, as an app
in front of vLLM alone would. Both record one Sample per request.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from edge.client import EdgeClient
from edge.request import GenerationRequest


@dataclass
class Sample:
    """One request as its user saw it. Times are time.monotonic() seconds."""
    user: int
    prompt: int
    started: float
    wall_s: float = 0.0
    ttft_s: float | None = None
    tokens: int = 0
    verified_tokens: int = 0
    target_passes: int = 0          # this request's rounds that cost the target a pass
    reopens: int = 0                # sessions it re-opened (evictions, reconnects, stalls)
    agrees: bool = True             # output identical to the target's greedy reference
    error: str | None = None
    finished: bool = True           # False: still running when the point's drain ended
    # Where a Tandem request's TTFT went (seconds): before its first round (the draft's
    # prefill, the Open with the verifier's prefill), then that round's drafting, its round
    # trip and, of that, the wait for a pass and the pass; its kind and k. None: not a Tandem
    # request, or no round.
    first_round: dict | None = None
    # Its speculative rounds: how many, the mean k asked, tokens drafted and tokens committed a
    # round (what the controller chose and what it bought). None: no such round.
    blocks: dict | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finished


@dataclass
class Window:
    """The point's clock: requests started in [measure_from, measure_until) are measured;
    users start nothing after measure_until and in-flight requests may run until drain_until."""
    measure_from: float
    measure_until: float
    drain_until: float
    think_s: float = 0.0


class PromptCycle:
    """User u's j-th request sends prompt (u + j) mod P: users start spread over the prompts."""

    def __init__(self, user: int, count: int) -> None:
        self.next, self.count = user % count, count

    def take(self) -> int:
        index, self.next = self.next, (self.next + 1) % self.count
        return index


def run_tandem_user(user: int, client: EdgeClient, prompts: Sequence[list[int]],
                    references: Sequence[list[int]], max_tokens: int, window: Window,
                    record: Callable[[Sample], None], count: Callable[[int], None],
                    stop: threading.Event) -> None:
    """One device's closed loop (runs on its own thread); count(n) is told of every n tokens
    committed, as they are."""

    def on_tokens(ids: list[int], verified: list[bool]) -> bool:
        count(len(ids))
        return True

    cycle = PromptCycle(user, len(prompts))
    while not stop.is_set() and time.monotonic() < window.measure_until:
        index = cycle.take()
        sample = Sample(user, index, started=time.monotonic())
        try:
            result = client.generate(GenerationRequest(prompts[index], max_tokens),
                                     on_tokens=on_tokens, stop_event=stop)
            sample.wall_s, sample.ttft_s = result.wall_s, result.ttft_s
            sample.tokens = len(result.token_ids)
            sample.verified_tokens = sum(result.verified)
            sample.target_passes = result.target_passes
            sample.reopens = result.reopens
            sample.agrees = result.token_ids == references[index][:len(result.token_ids)]
            sample.finished = result.finish_reason != "cancelled" and sample.tokens == max_tokens
            sample.first_round = first_round_of(result.rounds_log)
            sample.blocks = blocks_of(result.rounds_log)
        except Exception as error:  # noqa: BLE001 - a failed request is a measured error
            sample.wall_s = time.monotonic() - sample.started
            sample.error = f"{type(error).__name__}: {error}"[:300]
        record(sample)
        if window.think_s and stop.wait(window.think_s):
            break


def first_round_of(rounds: Sequence) -> dict | None:
    """The first round's share of the TTFT (Sample.first_round), from its RoundRecord."""
    if not rounds:
        return None
    r = rounds[0]
    return {"before_s": round(r.t_start_s, 5), "mode": r.mode, "k": r.k_asked,
            "draft_s": round(r.draft_s, 5), "rtt_s": round(r.rtt_s, 5),
            "queue_s": round(r.server_queue_s, 5), "forward_s": round(r.server_forward_s, 5)}


def blocks_of(rounds: Sequence) -> dict | None:
    """The speculative rounds' means (Sample.blocks)."""
    verified = [r for r in rounds if r.mode == "verify"]
    if not verified:
        return None
    n = len(verified)
    return {"rounds": n, "k": round(sum(r.k_asked for r in verified) / n, 2),
            "drafted": round(sum(r.drafted for r in verified) / n, 2),
            "committed": round(sum(r.committed for r in verified) / n, 2)}


async def run_openai_user(user: int, base_url: str, model: str, prompts: Sequence[list[int]],
                          reference_texts: Sequence[str], max_tokens: int, window: Window,
                          record: Callable[[Sample], None], count: Callable[[int], None],
                          stop: threading.Event, timeout_s: float) -> None:
    """One app streaming greedy completions (prompt token ids) from an OpenAI server."""
    import asyncio

    cycle = PromptCycle(user, len(prompts))
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as http:
        while not stop.is_set() and time.monotonic() < window.measure_until:
            index = cycle.take()
            sample = Sample(user, index, started=time.monotonic())
            body = {"model": model, "prompt": prompts[index], "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            text = []
            try:
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
                    async for line in response.aiter_lines():
                        if stop.is_set():
                            sample.finished = False
                            break
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if chunk.get("usage"):
                            sample.tokens = int(chunk["usage"]["completion_tokens"])
                        delta = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
                        if delta and sample.ttft_s is None:
                            sample.ttft_s = time.monotonic() - sample.started
                        if delta:
                            count(1)   # one streamed chunk is one token when vLLM keeps up
                        text.append(delta)
            except Exception as error:  # noqa: BLE001 - a failed request is a measured error
                sample.error = f"{type(error).__name__}: {error}"[:300]
            sample.wall_s = time.monotonic() - sample.started
            sample.finished = sample.finished and sample.tokens == max_tokens
            joined = "".join(text)
            sample.agrees = joined == reference_texts[index][:len(joined)]
            sample.verified_tokens = sample.tokens   # the target itself produced every token
            sample.target_passes = sample.tokens     # one decode step of the target per token
            record(sample)
            if window.think_s:
                await asyncio.sleep(window.think_s)
