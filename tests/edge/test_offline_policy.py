"""The offline policy's parts on a fake clock: RTT-derived deadlines, the circuit breaker's
closed / open / half-open cycle with probes by time and by tokens, the monitor's wake-up and an
overloaded verifier's retry hint; and the error classification of the edge."""
from __future__ import annotations

import grpc
import pytest

from edge.link.breaker import BreakerState, CircuitBreaker
from edge.link.deadlines import LinkTimings, RttEstimator
from edge.link.errors import FailureKind, IdentityMismatch, check_identity, classify
from edge.link_state import LinkState
from tandem.v1 import decoding_pb2 as pb

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


SETTINGS = LinkTimings(deadline_floor_s=0.2, deadline_ceiling_s=8.0, deadline_margin=2.0,
                       open_deadline_s=5.0, probe_interval_s=0.25, max_probe_interval_s=1.0,
                       probe_tokens=16)


def test_deadline_follows_the_measured_link_and_the_servers_time():
    rtt = RttEstimator(SETTINGS)
    assert rtt.late_s(4) == SETTINGS.deadline_ceiling_s  # nothing measured yet
    for _ in range(20):
        rtt.observe(rtt_s=0.050, k=4, server_s=0.010)  # 40 ms network, 2 ms per position
    # 2 * (srtt 40 ms + 4 * rttvar ~0 + 5 positions * 2 ms) = ~100 ms, floored at 200 ms.
    assert rtt.late_s(4) == pytest.approx(0.2)
    slow = RttEstimator(SETTINGS)
    for _ in range(20):
        slow.observe(rtt_s=0.400, k=4, server_s=0.050)
    assert slow.late_s(4) == pytest.approx(2 * (0.350 + 0.050), rel=0.05)
    # Jitter widens it (rttvar), but never past the ceiling.
    jittery = RttEstimator(SETTINGS)
    for i in range(40):
        jittery.observe(rtt_s=0.1 if i % 2 else 1.5, k=4, server_s=0.0)
    assert slow.late_s(4) < jittery.late_s(4) <= SETTINGS.deadline_ceiling_s


def test_breaker_opens_on_failure_probes_by_time_with_backoff_and_closes_on_success():
    clock = FakeClock()
    breaker = CircuitBreaker(SETTINGS, clock)
    assert breaker.closed and not breaker.probe_due()
    breaker.failure("verifier unreachable")
    assert breaker.state is BreakerState.OPEN and breaker.reason == "verifier unreachable"
    assert not breaker.probe_due()
    clock.now += 0.25
    assert breaker.probe_due() and breaker.state is BreakerState.HALF_OPEN
    breaker.failure("still down")                    # the probe failed: wait twice as long
    clock.now += 0.3
    assert not breaker.probe_due()
    clock.now += 0.2
    assert breaker.probe_due()
    for _ in range(5):                                # the interval stops doubling at 1 s
        breaker.failure("down")
    clock.now += 1.0
    assert breaker.probe_due()
    breaker.success()
    assert breaker.closed and breaker.failures == 0
    breaker.failure("down again")                     # a new outage starts from 0.25 s again
    clock.now += 0.25
    assert breaker.probe_due()


def test_breaker_probes_by_tokens_and_at_once_when_the_monitor_sees_the_link_up():
    clock = FakeClock()
    breaker = CircuitBreaker(SETTINGS, clock)
    breaker.failure("down")
    breaker.local_tokens(15)
    assert not breaker.probe_due()
    breaker.local_tokens(1)
    assert breaker.probe_due()
    breaker.failure("down")
    assert not breaker.probe_due()
    breaker.link_up()
    assert breaker.probe_due()


def test_an_overloaded_verifiers_retry_hint_is_the_earliest_probe():
    clock = FakeClock()
    breaker = CircuitBreaker(SETTINGS, clock)
    breaker.failure("verifier overloaded", retry_after_s=2.5)
    clock.now += 2.4
    assert not breaker.probe_due() and breaker.seconds_to_probe() == pytest.approx(0.1)
    clock.now += 0.11
    assert breaker.probe_due()


@pytest.mark.parametrize("code, details, kind, names", [
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: "
     "UNAVAILABLE: ipv4:127.0.0.1:1: Connection refused", FailureKind.OUTAGE, "unreachable"),
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: "
     "ipv4:127.0.0.1:1: Ssl handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:"
     "100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER", FailureKind.MISCONFIGURED,
     "TLS"),
    (grpc.StatusCode.UNAVAILABLE, "CERTIFICATE_VERIFY_FAILED", FailureKind.MISCONFIGURED, "TLS"),
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: "
     "ipv4:127.0.0.1:38199: tcp handshaker shutdown", FailureKind.OUTAGE, "unreachable"),
    (grpc.StatusCode.UNAUTHENTICATED, "missing API key", FailureKind.MISCONFIGURED,
     "authentication"),
    (grpc.StatusCode.PERMISSION_DENIED, "API key not accepted", FailureKind.MISCONFIGURED,
     "not accepted"),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "all 32 stream slots", FailureKind.OVERLOADED,
     "overloaded"),
    (grpc.StatusCode.FAILED_PRECONDITION, "tokenizer fingerprint 'x' does not match",
     FailureKind.MISCONFIGURED, "tokenizer"),
    (grpc.StatusCode.NOT_FOUND, "model 'x' is not served here", FailureKind.MISCONFIGURED,
     "wrong model"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "", FailureKind.OUTAGE, "unreachable"),
    (grpc.StatusCode.INVALID_ARGUMENT, "top_p", FailureKind.MISCONFIGURED, "refused"),
])
def test_errors_are_told_apart_from_outages(code, details, kind, names):
    failure = classify(code, details, retry_after_s=1.5)
    assert failure.kind is kind
    assert names in failure.message
    assert (failure.retry_after_s == 1.5) == (kind is FailureKind.OVERLOADED)


def test_identity_checks_pin_and_mid_generation_change():
    a = pb.TargetIdentity(name="tandem-target", digest="sha256:aaaa")
    b = pb.TargetIdentity(name="tandem-draft", digest="sha256:bbbb")
    check_identity(a, "", None)
    check_identity(a, "sha256:aaaa", "sha256:aaaa")
    with pytest.raises(IdentityMismatch, match="serves tandem-draft .* pins sha256:aaaa"):
        check_identity(b, "sha256:aaaa", None)
    with pytest.raises(IdentityMismatch, match="now serves tandem-draft"):
        check_identity(b, "", "sha256:aaaa")
    with pytest.raises(IdentityMismatch, match="does not report"):
        check_identity(None, "sha256:aaaa", None)


# --- the wait rule (edge/link/wait.py), with a stream that never answers ---------------------
class _SilentStream:
    """A live stream whose verdict never comes (RecvTimeout each poll)."""
    abandoned = False

    def recv(self, timeout_s: float, cancel_on_timeout: bool = True):
        from edge.link.errors import RecvTimeout
        raise RecvTimeout()

    def abandon(self) -> None:
        self.abandoned = True


def _answered_probe(_timeout_s: float):
    import concurrent.futures
    future = concurrent.futures.Future()
    future.set_result(pb.InfoReply())
    return future


def _silent_probe(_timeout_s: float):
    import concurrent.futures
    return concurrent.futures.Future()  # never done: nobody answers


def test_a_late_reply_is_waited_for_while_probes_are_answered():
    """Slow is not down: with every probe answered the wait ends only at the cap, however
    long past late_s and stall_s it runs."""
    from edge.link.errors import LinkDown
    from edge.link.wait import WaitRule
    rule, stream = WaitRule(stall_s=0.2, cap_s=0.6, probe_every_s=0.02), _SilentStream()
    with pytest.raises(LinkDown, match="although the verifier answers probes"):
        rule.recv(stream, late_s=0.05, should_stop=lambda: False, probe=_answered_probe)
    assert stream.abandoned


def test_silence_on_the_stream_and_to_probes_is_down():
    from edge.link.errors import LinkDown
    from edge.link.wait import WaitRule
    rule = WaitRule(stall_s=0.2, cap_s=30.0, probe_every_s=0.02)
    with pytest.raises(LinkDown, match="on the stream or to a probe, for 0.2 s"):
        rule.recv(_SilentStream(), late_s=0.05, should_stop=lambda: False, probe=_silent_probe)


def test_a_link_slower_than_the_stall_bound_gets_its_own_pace():
    """late_s past stall_s (a far link's measured pace): silence counts as down only after
    late_s, and probing starts at half of it."""
    from edge.link.errors import LinkDown
    from edge.link.wait import WaitRule
    asked: list[float] = []

    def probe(timeout_s: float):
        asked.append(timeout_s)
        return _silent_probe(timeout_s)
    rule = WaitRule(stall_s=0.1, cap_s=30.0, probe_every_s=0.02)
    with pytest.raises(LinkDown, match="for 0.4 s"):
        rule.recv(_SilentStream(), late_s=0.4, should_stop=lambda: False, probe=probe)
    assert asked == [0.4]  # one probe, given the whole window


# --- what a failure tells the monitor, and the wait budget -----------------------------------------
class _UpMonitor:
    """A link monitor that always sees the verifier answer, and records what it is told."""
    state, ever_up, timeout_s = LinkState.UP, True, 0.1

    def __init__(self) -> None:
        self.probes, self.reports = 0, []
        self.status = type("Status", (), {"checked_s": 0.0, "state": LinkState.UP,
                                          "detail": ""})()

    def add_listener(self, listener):
        return lambda: None

    def probe(self):
        self.probes += 1
        return self.status

    def report(self, state: str, detail: str = "") -> None:
        self.reports.append(state)


def _client_config(**fields):
    from edge.config import ClientConfig
    return ClientConfig(**fields)


def test_a_silent_link_is_reported_down_without_probing_it_again():
    """The WaitRule probed throughout the silence; a reset is checked with one probe."""
    from edge.link.offline import OfflineControl
    from edge.link.errors import LinkDown, LinkSilent
    monitor = _UpMonitor()
    control = OfflineControl(_client_config(), monitor)
    control.failure(LinkSilent("no answer for 3 s"))
    assert monitor.reports == ["down"] and monitor.probes == 0
    control.failure(LinkDown("verifier unreachable: UNAVAILABLE: reset"))
    assert monitor.reports == ["down"] and monitor.probes == 1


def test_failed_opens_spend_the_wait_budget():
    """offline: wait with a verifier that answers probes but whose every Open fails: the wait
    ends within its budget (failed Opens count) instead of retrying for ever."""
    import time as clock

    from edge.link.offline import OfflineControl
    from edge.link.reconnect import Reconnect
    from edge.link.errors import LinkDown

    class _RefusingLink:
        opens = 0

        def open(self, context, late_s, cap_s=None):
            self.opens += 1
            assert self.opens < 1000, "the wait never ended"
            clock.sleep(0.01)
            raise LinkDown("stream reset")

    config = _client_config(offline="wait", offline_wait_s=0.2)
    control = OfflineControl(config, _UpMonitor())
    link = _RefusingLink()
    reconnect = Reconnect(link, control, config, stopped=lambda: False)
    assert reconnect.reopen_if_waiting([1, 2, 3]) is False
    assert control.wait_s == 0.0 and 1 <= link.opens < 1000


class _ScriptedLink:
    """A verifier link whose Opens fail `failures` times (a reset stream), then succeed."""

    def __init__(self, failures: int) -> None:
        self.failures, self.opens = failures, 0
        self.open_rtt_s: float | None = None  # a link's Open timing: none measured here
        self.prefill_s = 0.0

    def open(self, context, late_s, cap_s=None):
        from edge.link.errors import LinkDown
        self.opens += 1
        if self.opens <= self.failures:
            raise LinkDown("stream reset")


@pytest.mark.parametrize("offline, failures, outcome, opens", [
    ("continue", 0, True, 1),             # opens at once
    ("continue", 1, True, 2),             # one retry (no monitor: retry once) and it opens
    ("continue", 99, False, 2),           # given up after the retry: the caller goes local
    ("require_verified", 99, "raises", 2),
])
def test_ensure_open_retries_then_does_what_the_offline_mode_says(offline, failures, outcome,
                                                                   opens):
    from edge.link.errors import VerifierUnavailable
    from edge.link.offline import OfflineControl
    from edge.link.reconnect import Reconnect

    config = _client_config(offline=offline, retry_initial_backoff_s=0.0)
    link = _ScriptedLink(failures)
    reconnect = Reconnect(link, OfflineControl(config), config, stopped=lambda: False)
    if outcome == "raises":
        with pytest.raises(VerifierUnavailable, match="requires verified tokens"):
            reconnect.ensure_open([1, 2, 3])
    else:
        assert reconnect.ensure_open([1, 2, 3]) is outcome
    assert link.opens == opens
