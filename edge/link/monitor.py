"""The link state, probed: is the verifier there, overloaded, or misconfigured?

`LinkMonitor` asks the verifier for Info (which needs the API key, so auth and TLS are checked
too, and which reports the target's identity) at start and then in the background: every
`interval_up_s` while the link is up, every `interval_down_s` while it is not. Each answer
sets the state the daemon's /healthz and metrics read, and wakes the circuit breakers of
running generations (`add_listener`), so a returning verifier is used within interval_down_s
plus one Open (the recovery bound the fault tests check).

States:
  starting       no probe has finished yet
  up             Info answered and the target is the expected one
  down           unreachable, timed out, stalled (outage)
  overloaded     RESOURCE_EXHAUSTED (the verifier is there but full)
  misconfigured  TLS, API key, wrong target (identity), or the verifier refuses us: retrying
                 cannot help; `detail` names the cause
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from edge.link.channel import call_metadata
from edge.link.errors import FailureKind, IdentityMismatch, check_identity, classify_rpc_error
from edge.link_state import LinkState
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

STARTING, UP, DOWN, OVERLOADED, MISCONFIGURED = (
    LinkState.STARTING, LinkState.UP, LinkState.DOWN, LinkState.OVERLOADED,
    LinkState.MISCONFIGURED)  # the states a probe tells apart


@dataclass(frozen=True)
class LinkStatus:
    state: LinkState
    detail: str = ""
    since_s: float = 0.0           # monotonic time the state began
    checked_s: float = 0.0         # monotonic time of the last probe
    rtt_s: float | None = None     # the last Info round trip
    target: str = ""               # "name (sha256:...)" of the last target seen
    probes: int = 0

    def as_dict(self) -> dict:
        now = time.monotonic()
        return {"link_state": self.state, "link_detail": self.detail,
                "link_state_for_s": round(now - self.since_s, 3) if self.since_s else None,
                "link_checked_ago_s": round(now - self.checked_s, 3) if self.checked_s else None,
                "link_rtt_ms": round(self.rtt_s * 1000, 2) if self.rtt_s is not None else None,
                "target": self.target}


class LinkMonitor:
    """Thread-safe. start() probes once synchronously (so the state is exact from the first
    /healthz), then keeps probing on a daemon thread until stop()."""

    def __init__(self, channel: grpc.Channel, metadata: Sequence[tuple[str, str]] = (), *,
                 address: str = "", tls: bool = True, pinned_digest: str = "",
                 fingerprint: str = "", model: str = "",
                 interval_up_s: float = 2.0, interval_down_s: float = 0.25,
                 timeout_s: float = 1.0) -> None:
        """address / tls: the link's, so a TLS mismatch can be named (edge/link/errors.py probe_tls)."""
        self.stub = pb_grpc.DecodingStub(channel)
        self.address = address
        self.tls = tls
        # What the edge will ask for: its draft's tokenizer fingerprint and client.target_model
        # (empty = not checked). A verifier that serves otherwise refuses every Open.
        self.fingerprint = fingerprint
        self.model = model
        self.metadata = tuple(metadata)
        self.pinned_digest = pinned_digest
        self.interval_up_s = interval_up_s
        self.interval_down_s = interval_down_s
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._status = LinkStatus(STARTING)
        self._ever_up = False
        self._listeners: list[Callable[[LinkStatus], None]] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def status(self) -> LinkStatus:
        with self._lock:
            return self._status

    @property
    def state(self) -> LinkState:
        return self.status.state

    @property
    def ever_up(self) -> bool:
        """The verifier answered at least one probe since this monitor started."""
        return self._ever_up

    def add_listener(self, listener: Callable[[LinkStatus], None]) -> Callable[[], None]:
        """Call listener(status) after every probe; returns a function that removes it."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return remove

    def report(self, state: LinkState, detail: str = "") -> None:
        """A generation learnt something first-hand (a round timed out, the verifier said it
        is full): take it as the state now and probe again soon."""
        self._set(LinkState(state), detail)
        self._wake.set()

    def start(self) -> LinkMonitor:
        self.probe()
        self._thread = threading.Thread(target=self._run, name="tandem-link-monitor",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            interval = self.interval_up_s if self.state == UP else self.interval_down_s
            self._wake.wait(interval)
            self._wake.clear()
            if not self._stop.is_set():
                self.probe()

    def probe(self) -> LinkStatus:
        """Ask Info once; set and return the state."""
        started = time.monotonic()
        try:
            reply = self.stub.Info(pb.InfoRequest(), metadata=self.metadata,
                                   timeout=self.timeout_s)
        except grpc.RpcError as error:
            failure = classify_rpc_error(error, self.address, self.tls)
            state = {FailureKind.OUTAGE: DOWN, FailureKind.OVERLOADED: OVERLOADED}.get(
                failure.kind, MISCONFIGURED)
            return self._set(state, failure.message, checked=started)
        rtt = time.monotonic() - started
        target = reply.target if reply.HasField("target") else None
        try:
            check_identity(target, self.pinned_digest, None)
        except IdentityMismatch as mismatch:
            return self._set(MISCONFIGURED, str(mismatch), checked=started, rtt=rtt)
        if self.fingerprint and reply.tokenizer_fingerprint != self.fingerprint:
            return self._set(MISCONFIGURED, f"tokenizer mismatch: the verifier's target has "
                             f"tokenizer {reply.tokenizer_fingerprint}, this edge's draft "
                             f"{self.fingerprint}", checked=started, rtt=rtt)
        if self.model and reply.model != self.model:
            return self._set(MISCONFIGURED, f"wrong model: the verifier serves {reply.model!r}, "
                             f"client.target_model asks for {self.model!r}", checked=started,
                             rtt=rtt)
        described = f"{target.name} ({target.digest[:19]})" if target is not None else ""
        return self._set(UP, "", checked=started, rtt=rtt, target=described)

    def _set(self, state: LinkState, detail: str, checked: float | None = None,
             rtt: float | None = None, target: str | None = None) -> LinkStatus:
        with self._lock:
            old = self._status
            now = time.monotonic()
            status = LinkStatus(
                state=state, detail=detail, since_s=old.since_s if old.state == state else now,
                checked_s=checked if checked is not None else old.checked_s,
                rtt_s=rtt if rtt is not None else old.rtt_s,
                target=target if target is not None else old.target,
                probes=old.probes + (checked is not None))
            self._status = status
            self._ever_up = self._ever_up or state == UP
            listeners = list(self._listeners)
        if old.state != state:
            log.log(logging.WARNING if state != UP else logging.INFO, "verifier link %s%s",
                    state, f": {detail}" if detail else "")
        for listener in listeners:
            listener(status)
        return status


def start_monitor(config, channel: grpc.Channel, fingerprint: str = "") -> LinkMonitor:
    """The monitor of an edge.config.EdgeConfig's link over `channel`: one probe now (so the
    state is exact from the start), then probes in the background. fingerprint: the draft's
    tokenizer fingerprint, checked against the target's."""
    client = config.client
    return LinkMonitor(channel, call_metadata(config.cloud), address=config.cloud.address,
                       tls=config.cloud.tls, pinned_digest=client.target_digest,
                       fingerprint=fingerprint, model=client.target_model,
                       interval_up_s=client.monitor_interval_up_s,
                       interval_down_s=client.monitor_interval_s,
                       # A probe unanswered this long is the same evidence as a silent
                       # stream (edge/link/wait.py WaitRule): a slow answer on a cellular
                       # link is not an outage; a refused connection still is, at once.
                       timeout_s=client.stall_timeout_s).start()
