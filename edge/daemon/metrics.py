"""Prometheus metrics of the edge daemon, on a registry passed in (no global default registry,
so tests and the simulation can run several daemons in one process).

Names follow the vocabulary of protos/tandem/v1/decoding.proto: per round we observe the draft
length k, the accepted length n and the round trip; per generation the bytes on the wire,
tokens/s, time to first token, and how many emitted tokens the target verified.
"""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LINK_STATES = ("up", "degraded", "down")

_LENGTH_BUCKETS = tuple(float(b) for b in (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32))
_RTT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
_TOKS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class DaemonMetrics:
    def __init__(self, registry: CollectorRegistry, namespace: str = "tandem_edge") -> None:
        self.registry = registry
        ns = namespace
        self.requests = Counter("requests", "HTTP API requests by endpoint and status code",
                                ["endpoint", "status"], namespace=ns, registry=registry)
        self.request_seconds = Histogram("request_seconds", "wall time of a generation request",
                                         ["endpoint"], namespace=ns, registry=registry,
                                         buckets=_SECONDS_BUCKETS)
        self.inflight = Gauge("inflight_sessions", "generations running now (one draft runtime each)",
                              namespace=ns, registry=registry)
        self.waiting = Gauge("waiting_requests", "requests waiting for a free draft runtime",
                             namespace=ns, registry=registry)
        self.accepted_length = Histogram("accepted_length", "accepted length n per round",
                                         namespace=ns, registry=registry, buckets=_LENGTH_BUCKETS)
        self.draft_length = Histogram("draft_length", "draft length k per round",
                                      namespace=ns, registry=registry, buckets=_LENGTH_BUCKETS)
        self.rtt_seconds = Histogram("rtt_seconds", "round trip Draft -> Verdict",
                                     namespace=ns, registry=registry, buckets=_RTT_BUCKETS)
        self.rounds = Counter("rounds", "Draft -> Verdict rounds", namespace=ns, registry=registry)
        self.target_passes = Counter("target_passes", "target forward passes spent",
                                     namespace=ns, registry=registry)
        self.bytes_up = Counter("bytes_up", "bytes sent to the verifier", namespace=ns, registry=registry)
        self.bytes_down = Counter("bytes_down", "bytes received from the verifier",
                                  namespace=ns, registry=registry)
        self.tokens = Counter("tokens", "emitted tokens, by whether the target verified them",
                              ["verified"], namespace=ns, registry=registry)
        self.tokens_per_second = Histogram("tokens_per_second", "generated tokens / wall time per request",
                                           namespace=ns, registry=registry, buckets=_TOKS_BUCKETS)
        self.ttft_seconds = Histogram("ttft_seconds", "time to first token", namespace=ns,
                                      registry=registry, buckets=_SECONDS_BUCKETS)
        self.reopens = Counter("reopens", "sessions re-opened after an outage or eviction",
                               namespace=ns, registry=registry)
        self.link_state = Gauge("link_state", "1 for the current link state to the verifier",
                                ["state"], namespace=ns, registry=registry)
        for state in ("verified", "unverified"):
            self.tokens.labels(verified="true" if state == "verified" else "false")
        self.set_link_state("up")

    def set_link_state(self, state: str) -> None:
        assert state in LINK_STATES, state
        for name in LINK_STATES:
            self.link_state.labels(state=name).set(1.0 if name == state else 0.0)

    def observe_rounds(self, draft_lengths: Iterable[int], accepted: Iterable[int],
                       rtts_s: Iterable[float]) -> None:
        for k in draft_lengths:
            self.draft_length.observe(k)
        n_rounds = 0
        for n in accepted:
            self.accepted_length.observe(n)
            n_rounds += 1
        self.rounds.inc(n_rounds)
        for rtt in rtts_s:
            self.rtt_seconds.observe(rtt)

    def observe_generation(self, *, verified: int, unverified: int, target_passes: int,
                           bytes_up: int, bytes_down: int, wall_s: float, ttft_s: float | None,
                           reopens: int) -> None:
        self.tokens.labels(verified="true").inc(verified)
        self.tokens.labels(verified="false").inc(unverified)
        self.target_passes.inc(target_passes)
        self.bytes_up.inc(bytes_up)
        self.bytes_down.inc(bytes_down)
        self.reopens.inc(reopens)
        if wall_s > 0:
            self.tokens_per_second.observe((verified + unverified) / wall_s)
        if ttft_s is not None:
            self.ttft_seconds.observe(ttft_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
