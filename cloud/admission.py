"""Admission: who may hold a stream and how fast a key may send draft tokens.

A Session stream holds one gRPC worker thread for as long as it is open, so streams are the
verifier's scarce resource. `Admission` counts them in total (max_streams, a few threads fewer
than the pool, so Info and health always find a thread) and per API key (max_streams_per_key),
and meters draft tokens per key with a token bucket (draft_tokens_per_s_per_key). Every refusal
is a ResourceExhausted that says which limit and when to retry; the servicer passes
`retry_after_s` on as trailing metadata (RETRY_AFTER_HEADER) so an edge backs off for that long.

Thread-safe; no gRPC here.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cloud.errors import ResourceExhausted

RETRY_AFTER_HEADER = "tandem-retry-after-ms"  # trailing metadata on RESOURCE_EXHAUSTED


class Overloaded(ResourceExhausted):
    """A limit of this server was hit; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class Admission:
    def __init__(self, max_streams: int, max_streams_per_key: int = 0,
                 draft_tokens_per_s_per_key: float = 0.0, burst_tokens: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """0 for a per-key limit = none. burst_tokens: the bucket's size (at least one block)."""
        self.max_streams = max_streams
        self.max_streams_per_key = max_streams_per_key
        self.rate = draft_tokens_per_s_per_key
        self.burst = max(float(burst_tokens), self.rate)
        self._clock = clock
        self._lock = threading.Lock()
        self._streams = 0
        self._per_key: dict[str, int] = {}
        self._buckets: dict[str, _Bucket] = {}

    # --- streams ------------------------------------------------------------------------------
    def enter(self, key: str) -> None:
        """Take a stream slot for `key` ("" = no key); raises Overloaded when none is free."""
        with self._lock:
            if self._streams >= self.max_streams:
                raise Overloaded(f"all {self.max_streams} stream slots of this verifier are in "
                                 "use: retry later", retry_after_s=1.0)
            held = self._per_key.get(key, 0)
            if self.max_streams_per_key and held >= self.max_streams_per_key:
                raise Overloaded(f"this API key already holds {held} streams, its limit is "
                                 f"{self.max_streams_per_key}", retry_after_s=1.0)
            self._streams += 1
            self._per_key[key] = held + 1

    def leave(self, key: str) -> None:
        with self._lock:
            self._streams -= 1
            held = self._per_key.get(key, 0) - 1
            if held > 0:
                self._per_key[key] = held
            else:
                self._per_key.pop(key, None)

    @property
    def streams(self) -> int:
        with self._lock:
            return self._streams

    # --- draft tokens ---------------------------------------------------------------------------
    def take_draft_tokens(self, key: str, n: int) -> None:
        """Charge n draft tokens (plus one for the verdict's own token) to key's bucket; raises
        Overloaded, charging nothing, when the bucket does not hold them."""
        if self.rate <= 0:
            return
        cost = min(float(n + 1), self.burst)  # a block larger than the bucket waits for a full one
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.rate)
            bucket.stamp = now
            if bucket.tokens < cost:
                wait = (cost - bucket.tokens) / self.rate
                raise Overloaded(f"this API key's draft rate limit of {self.rate:g} tokens/s is "
                                 f"exceeded: retry in {wait:.2f} s", retry_after_s=wait)
            bucket.tokens -= cost
