"""Prometheus metrics of the edge daemon, on a registry passed in (no global default registry,
so tests and the simulation can run several daemons in one process).

Names follow Prometheus conventions: base units last (`_seconds`, `_bytes`, `_tokens`), `_total`
on counters, no `_created` series, and a `model` label (daemon.model_name) on every series. The
speculative-decoding counters use vLLM's names and meanings, like the verifier's
(cloud/metrics.py), so τ = 1 + num_accepted_tokens / num_drafts (tandem.metrics.tau) and the
per-position acceptance = num_accepted_tokens_per_pos{position=i} / rounds that drafted
position i (tandem_edge_round_draft_tokens_bucket gives those counts).
"""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

from edge.link.offline import UNVERIFIED_CAUSES
from edge.link_state import LinkState

disable_created_metrics()  # no `_created` series (they double every counter's cardinality)

MAX_POSITIONS = 64

_LENGTH_BUCKETS = tuple(float(b) for b in (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32))
_RTT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
_TOKS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# TTFT and queue time, finer where queued requests land (0.1-5 s), so a quantile read from the
# histogram (histogram_quantile) is close to a client's own percentile of the same requests.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1,
                    1.25, 1.5, 2, 2.5, 3, 4, 5, 7.5, 10, 20, 40, 80)


class DaemonMetrics:
    def __init__(self, registry: CollectorRegistry, namespace: str = "tandem_edge",
                 model: str = "") -> None:
        self.registry = registry
        self.model = model
        ns, m = namespace, {"model": model}

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, ("model", *labels), namespace=ns, registry=registry)

        def histogram(name: str, doc: str, buckets, labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(name, doc, ("model", *labels), namespace=ns, registry=registry,
                             buckets=buckets)

        self._requests = counter("requests", "HTTP API requests by endpoint and status code",
                                 ("endpoint", "status"))
        self._request_seconds = histogram("request_duration_seconds",
                                          "wall time of a generation request",
                                          _SECONDS_BUCKETS, ("endpoint",))
        # Children bound to the model label, so the pool can inc()/dec() them directly.
        self.inflight = Gauge("inflight_sessions", "generations running now (one draft runtime "
                              "each)", ("model",), namespace=ns, registry=registry).labels(**m)
        self.waiting = Gauge("waiting_requests", "requests waiting for a free draft runtime",
                             ("model",), namespace=ns, registry=registry).labels(**m)
        self.accepted_tokens = histogram("round_accepted_tokens", "draft tokens accepted per "
                                         "verified round (the bonus token not counted)",
                                         _LENGTH_BUCKETS).labels(**m)
        self.draft_tokens = histogram("round_draft_tokens", "draft tokens sent per verified "
                                      "round (k)", _LENGTH_BUCKETS).labels(**m)
        self.round_trip_seconds = histogram("round_trip_seconds", "round trip Draft -> Verdict, "
                                            "the verifier's time included",
                                            _RTT_BUCKETS).labels(**m)
        self.rounds = counter("rounds", "verified Draft -> Verdict rounds").labels(**m)
        self.num_drafts = counter("spec_decode_num_drafts", "verified draft blocks (vLLM's "
                                  "spec_decode_num_drafts)").labels(**m)
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens",
                                        "draft tokens verified").labels(**m)
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "draft tokens "
                                           "accepted, the bonus token not counted").labels(**m)
        self._accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                         "verified rounds that accepted the draft token at this "
                                         "position (0-based)", ("position",))
        self.target_passes = counter("target_passes", "target forward passes spent").labels(**m)
        self.sent_bytes = counter("sent_bytes", "bytes sent to the verifier").labels(**m)
        self.received_bytes = counter("received_bytes", "bytes received from the "
                                      "verifier").labels(**m)
        self._tokens = counter("generated_tokens", "emitted tokens, by whether the target "
                               "verified them", ("verified",))
        self.tokens_per_second = histogram("generation_tokens_per_second", "generated tokens / "
                                           "the generation's wall time (after its queue), per "
                                           "request", _TOKS_BUCKETS).labels(**m)
        # From the request's arrival, its wait for a pool slot included: what a client (or
        # vLLM's load generator) measures, so the two agree.
        self.ttft_seconds = histogram("time_to_first_token_seconds", "time to first token, "
                                      "from the request's arrival (queue time included)",
                                      _LATENCY_BUCKETS).labels(**m)
        self.queue_seconds = histogram("request_queue_seconds", "time a request waited for a "
                                       "free draft runtime (pool slot) before its generation "
                                       "started", _LATENCY_BUCKETS).labels(**m)
        self.reopens = counter("session_reopens", "sessions re-opened after an outage or "
                               "eviction").labels(**m)
        self.moves = counter("session_moves", "re-opens that another verifier took (several "
                             "behind a balancer)").labels(**m)
        self._link_state = Gauge("link_state", "1 for the current state of the link to the "
                                 "verifier", ("model", "state"), namespace=ns, registry=registry)
        self._unverified = counter("unverified_tokens", "tokens emitted without the target's "
                                   "check, by cause: outage, startup (the verifier not reached "
                                   "yet), overload, fast_mode", ("cause",))
        for verified in ("true", "false"):
            self._tokens.labels(model=model, verified=verified)
        for cause in UNVERIFIED_CAUSES:
            self._unverified.labels(model=model, cause=cause)
        self.set_link_state(LinkState.UP)

    def observe_request(self, endpoint: str, status: int, seconds: float | None) -> None:
        self._requests.labels(model=self.model, endpoint=endpoint, status=str(status)).inc()
        if seconds is not None:
            self._request_seconds.labels(model=self.model, endpoint=endpoint).observe(seconds)

    def set_link_state(self, state: LinkState) -> None:
        for name in LinkState:
            self._link_state.labels(model=self.model, state=name).set(
                1.0 if name == state else 0.0)

    def observe_rounds(self, draft_lengths: Iterable[int], accepted: Iterable[int],
                       rtts_s: Iterable[float]) -> None:
        """Verified rounds: their draft lengths and accepted lengths pairwise, and the RTTs."""
        for k, n in zip(list(draft_lengths), list(accepted)):
            self.draft_tokens.observe(k)
            self.accepted_tokens.observe(n)
            self.rounds.inc()
            if k == 0:
                continue
            self.num_drafts.inc()
            self.num_draft_tokens.inc(k)
            self.num_accepted_tokens.inc(n)
            for position in range(min(n, MAX_POSITIONS)):
                self._accepted_per_pos.labels(model=self.model, position=str(position)).inc()
        for rtt in rtts_s:
            self.round_trip_seconds.observe(rtt)

    def observe_generation(self, *, verified: int, unverified: int, target_passes: int,
                           bytes_up: int, bytes_down: int, wall_s: float, ttft_s: float | None,
                           reopens: int, moves: int = 0) -> None:
        self._tokens.labels(model=self.model, verified="true").inc(verified)
        self._tokens.labels(model=self.model, verified="false").inc(unverified)
        self.target_passes.inc(target_passes)
        self.sent_bytes.inc(bytes_up)
        self.received_bytes.inc(bytes_down)
        self.reopens.inc(reopens)
        self.moves.inc(moves)
        if wall_s > 0:
            self.tokens_per_second.observe((verified + unverified) / wall_s)
        if ttft_s is not None:
            self.ttft_seconds.observe(ttft_s)

    def observe_unverified(self, by_cause: dict[str, int]) -> None:
        for cause, n in by_cause.items():
            self._unverified.labels(model=self.model, cause=cause).inc(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
