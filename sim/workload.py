"""The workload: held-out code prompts sent to an edge daemon's OpenAI-compatible API, streamed,
`concurrency` at a time, timed from the client's side (what an application would see).

Shared by `tandem sim` and `tandem loadgen`.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class RequestRecord:
    """One request as the HTTP client saw it, plus the daemon's `tandem` stats."""
    index: int
    ok: bool
    error: str | None = None
    started_s: float = 0.0          # since the workload started
    wall_s: float = 0.0             # request sent -> last byte
    ttft_s: float | None = None     # request sent -> first non-empty text chunk
    completion_tokens: int = 0
    finish_reason: str | None = None
    text: str = ""
    tandem: dict[str, Any] = field(default_factory=dict)

    # Verified and local (unverified) speed are two numbers, never one: a local token is the
    # draft's alone, and adding it into one speed would hide verification falling away.
    @property
    def verified_tokens(self) -> int:
        return int(self.tandem.get("verified_tokens", 0))

    @property
    def local_tokens(self) -> int:
        return int(self.tandem.get("unverified_tokens", 0))

    @property
    def verified_tokens_per_s(self) -> float:
        return self.verified_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def local_tokens_per_s(self) -> float:
        return self.local_tokens / self.wall_s if self.wall_s > 0 else 0.0


async def one_request(client: httpx.AsyncClient, url: str, body: dict, index: int, t0: float) -> RequestRecord:
    record = RequestRecord(index=index, ok=False, started_s=time.monotonic() - t0)
    start = time.monotonic()
    pieces: list[str] = []
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                record.error = f"HTTP {response.status_code}: {response.text[:300]}"
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = chunk["error"].get("message", "error event")
                    return record
                for choice in chunk.get("choices", []):
                    if choice.get("text"):
                        if record.ttft_s is None:
                            record.ttft_s = time.monotonic() - start
                        pieces.append(choice["text"])
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
                if chunk.get("tandem"):
                    record.tandem = chunk["tandem"]
                if chunk.get("usage"):
                    record.completion_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    finally:
        record.wall_s = time.monotonic() - start
    record.text = "".join(pieces)
    record.ok = record.finish_reason is not None
    if not record.ok:
        record.error = "stream ended without a finish_reason"
    return record


async def run_workload(base_url: str, model: str, prompts: list[str], *, max_tokens: int,
                       concurrency: int, temperature: float = 0.0, seed: int = 0,
                       timeout_s: float = 120.0, trace: bool = True,
                       on_done: Callable[[RequestRecord], None] | None = None,
                       api_key: str = "") -> list[RequestRecord]:
    """Send every prompt as a streaming /v1/completions request, at most `concurrency` at once;
    records in prompt order."""
    url = base_url.rstrip("/") + "/v1/completions"
    gate = asyncio.Semaphore(concurrency)
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(timeout=timeout_s, limits=limits,
                                 headers=auth_headers(api_key)) as client:
        async def send(index: int, prompt: str) -> RequestRecord:
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": temperature, "seed": seed + index, "stream": True,
                    "stream_options": {"include_usage": True}, "tandem_trace": trace}
            async with gate:
                record = await one_request(client, url, body, index, t0)
            if on_done is not None:
                on_done(record)
            return record

        return list(await asyncio.gather(*(send(i, p) for i, p in enumerate(prompts))))


def auth_headers(api_key: str) -> dict[str, str]:
    """The daemon's API key (daemon.api_key) as an OpenAI client sends it; none when empty."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def advertised_model(base_url: str, timeout_s: float = 10.0, api_key: str = "") -> str:
    """The first model id GET /v1/models lists."""
    response = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout_s,
                         headers=auth_headers(api_key))
    response.raise_for_status()
    return response.json()["data"][0]["id"]
