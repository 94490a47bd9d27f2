"""Prometheus metrics of the verifier, served over HTTP on `server.metrics_port`
(`tandem-cloud serve --metrics-port P`).

Names follow Prometheus conventions (base units last, `_total` on counters, no `_created`
series) and, for speculative decoding, vLLM's names and meanings, so dashboards built for vLLM
read Tandem the same way:

  tandem_spec_decode_num_drafts_total                  verified rounds (one draft block each)
  tandem_spec_decode_num_draft_tokens_total            draft tokens verified (sum of k)
  tandem_spec_decode_num_accepted_tokens_total         draft tokens accepted (bonus not counted)
  tandem_spec_decode_num_accepted_tokens_per_pos_total{position}  rounds that accepted position i

so τ = 1 + accepted_tokens / drafts (tandem.metrics.tau) and the acceptance rate is
accepted_tokens / draft_tokens. The engine calls the observe_* hooks; with no metrics port the
hooks go to a registry nobody reads (cheap counters, no HTTP).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest, start_http_server)

from cloud.token_cost import MODES as TOKEN_COST_MODES

log = logging.getLogger(__name__)

disable_created_metrics()  # no `_created` series (they double every counter's cardinality)

_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
MAX_POSITIONS = 64  # per-position series beyond this are folded into the last one


class VerifierMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, model: str = "") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg, ns = self.registry, "tandem"
        labels = {"model": model}
        self._model = model

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, ("model", *extra), namespace=ns, registry=reg)

        self.sessions_opened = counter("verifier_sessions_opened", "sessions opened (Open)")
        self.sessions_ended = counter("verifier_sessions_ended", "sessions ended, by reason",
                                      ("reason",))
        self.evictions = counter("verifier_evictions", "sessions evicted to keep the KV budget")
        self.refusals = counter("verifier_refusals", "calls refused, by gRPC status code",
                                ("code",))
        self.rounds = counter("verifier_rounds", "verification rounds (Draft -> Verdict)")
        self.generated_tokens = counter("verifier_generated_tokens", "tokens the verifier "
                                        "generated itself (cloud runs: Generate)")
        self.prefill_tokens = counter("verifier_prefill_tokens", "context tokens prefilled by "
                                                                 "Open")
        self.batch_size = Histogram("verifier_batch_size", "sessions in one batched forward "
                                    "pass, per round", ("model",), namespace=ns, registry=reg,
                                    buckets=_BATCH_BUCKETS)
        self.queue_seconds = Histogram("verifier_queue_seconds", "time a round waited for its "
                                       "forward pass", ("model",), namespace=ns, registry=reg,
                                       buckets=_SECONDS_BUCKETS)
        self.forward_seconds = Histogram("verifier_forward_seconds", "time of the batched "
                                         "forward pass a round ran in", ("model",), namespace=ns,
                                         registry=reg, buckets=_SECONDS_BUCKETS)
        self.verify_seconds = Histogram("verifier_verify_seconds", "time of the verification "
                                        "(greedy match or rejection sampling)", ("model",),
                                        namespace=ns, registry=reg, buckets=_SECONDS_BUCKETS)
        self.num_drafts = counter("spec_decode_num_drafts", "verified draft blocks (vLLM's "
                                                            "spec_decode_num_drafts)")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens",
                                        "draft tokens verified (vLLM's meaning)")
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens",
                                           "draft tokens accepted, the bonus token not counted "
                                           "(vLLM's meaning)")
        self.num_accepted_tokens_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "rounds that accepted the draft token at this position (0-based)", ("position",))
        self.sessions = Gauge("verifier_sessions", "sessions open now", ("model",),
                              namespace=ns, registry=reg)
        self.kv_cache_bytes = Gauge("verifier_kv_cache_bytes", "KV-cache bytes the sessions "
                                    "hold now", ("model",), namespace=ns, registry=reg)
        self.price = Gauge("verifier_price", "the price edges read in every verdict, 0..1: 0 "
                           "while rounds wait at most batch.target_queue_ms for their pass, 1 "
                           "from twice that (cloud/price.py)", ("model",), namespace=ns,
                           registry=reg)
        self.queue_delay_seconds = Gauge("verifier_queue_delay_seconds", "the smoothed time a "
                                         "job waits for its forward pass (the price's input)",
                                         ("model",), namespace=ns, registry=reg)
        self.position_cost = Gauge("verifier_position_cost", "what one more drafted position "
                                   "adds to a session's share of a pass, in one-token steps "
                                   "(measured at start, over the live passes: cloud/pass_cost.py); "
                                   "NaN until measured", ("model",), namespace=ns, registry=reg)
        self.token_cost_seconds = Gauge("verifier_token_cost_seconds", "what a committed "
                                        "token costs the passes in each mode (speculate, "
                                        "cloud), lately: each pass's time shared among its "
                                        "sessions (cloud/token_cost.py); NaN until measured",
                                        ("model", "mode"), namespace=ns, registry=reg)
        self.kv_budget_bytes = Gauge("verifier_kv_budget_bytes", "KV-cache bytes all sessions "
                                     "may hold (limits.kv_budget_bytes)", ("model",),
                                     namespace=ns, registry=reg)
        for metric in (self.sessions_opened, self.evictions, self.rounds, self.generated_tokens,
                       self.prefill_tokens,
                       self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens):
            metric.labels(**labels)  # present (at 0) from the start
        self.price.labels(**labels)
        self.queue_delay_seconds.labels(**labels)
        self.position_cost.labels(**labels)
        for mode in TOKEN_COST_MODES:
            self.token_cost_seconds.labels(mode=mode, **labels)

    # ---- gauges read when scraped ----------------------------------------------------------

    def watch(self, sessions: Callable[[], float], kv_bytes: Callable[[], float],
              kv_budget_bytes: float) -> None:
        self.sessions.labels(model=self._model).set_function(sessions)
        self.kv_cache_bytes.labels(model=self._model).set_function(kv_bytes)
        self.kv_budget_bytes.labels(model=self._model).set(kv_budget_bytes)

    def watch_price(self, price: Callable[[], float], queue_delay_ms: Callable[[], float],
                    position_cost: Callable[[], float | None]) -> None:
        self.price.labels(model=self._model).set_function(price)
        self.position_cost.labels(model=self._model).set_function(
            lambda: _or_nan(position_cost()))
        self.queue_delay_seconds.labels(model=self._model).set_function(
            lambda: queue_delay_ms() / 1000.0)

    def watch_token_costs(self, per_token_ms: Callable[[str], float | None]) -> None:
        for mode in TOKEN_COST_MODES:
            self.token_cost_seconds.labels(model=self._model, mode=mode).set_function(
                lambda mode=mode: _or_nan(per_token_ms(mode)) / 1000.0)

    # ---- hooks -----------------------------------------------------------------------------

    def observe_open(self, prefill_tokens: int) -> None:
        self.sessions_opened.labels(model=self._model).inc()
        self.prefill_tokens.labels(model=self._model).inc(prefill_tokens)

    def observe_end(self, reason: str) -> None:
        reason = reason.split(":")[0].strip() or "unknown"  # "refused: CODE" -> "refused"
        self.sessions_ended.labels(model=self._model, reason=reason).inc()
        if reason == "evicted":
            self.evictions.labels(model=self._model).inc()

    def observe_refusal(self, code: str) -> None:
        self.refusals.labels(model=self._model, code=code).inc()

    def observe_generated(self) -> None:
        self.generated_tokens.labels(model=self._model).inc()

    def observe_round(self, drafted: int, accepted: int, batch_size: int, queue_s: float,
                      forward_s: float, verify_s: float) -> None:
        model = self._model
        self.rounds.labels(model=model).inc()
        self.batch_size.labels(model=model).observe(batch_size)
        self.queue_seconds.labels(model=model).observe(queue_s)
        self.forward_seconds.labels(model=model).observe(forward_s)
        self.verify_seconds.labels(model=model).observe(verify_s)
        if drafted == 0:
            return  # a k = 0 round verifies nothing (plain decoding by the target)
        self.num_drafts.labels(model=model).inc()
        self.num_draft_tokens.labels(model=model).inc(drafted)
        self.num_accepted_tokens.labels(model=model).inc(accepted)
        for position in range(min(accepted, MAX_POSITIONS)):
            self.num_accepted_tokens_per_pos.labels(model=model, position=str(position)).inc()

    # ---- serving ---------------------------------------------------------------------------

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> int:
        """Serve GET /metrics on host:port (0 = a free port) in a daemon thread; the port.
        Raises OSError when the port is taken."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        bound = server.server_address[1]
        log.info("metrics on http://%s:%d/metrics", host, bound)
        return bound


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value
