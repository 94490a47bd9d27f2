"""Per-round wire timings, measured on the daemon's channel to the verifier.

The session client reports totals (rounds, accepted lengths, bytes); the daemon's metrics and
the simulation's plots also want each round's draft length k and round-trip time. A gRPC client
interceptor on the engine's channel sees every message of every Session call, so it records
them without the client knowing:

  Draft  (as gRPC takes it to send)  -> round number, k, time sent
  Verdict (as it arrives)            -> accepted length n, RTT = arrival - sent
  Open                               -> counts (re-)opens

Calls are attributed to the generation running in the thread that starts them (the session
client opens its streams from the generation's worker thread), via `WireTracer.recording()`.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc

from tandem.v1 import decoding_pb2 as pb


@dataclass
class WireRound:
    round: int
    draft_length: int
    sent_s: float                      # monotonic clock
    rtt_s: float | None = None         # None until (unless) its verdict arrives
    server_s: float | None = None      # the verifier's own queue + forward + verify time
    accepted: int | None = None


@dataclass
class WireLog:
    """What one generation put on the wire."""
    t0: float = field(default_factory=time.monotonic)
    opens: int = 0
    rounds: list[WireRound] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0
    _pending: dict[tuple[int, int], WireRound] = field(default_factory=dict)  # (call, round) -> round

    def sent(self, call: int, message: pb.ClientMessage) -> None:
        self.bytes_up += message.ByteSize()
        kind = message.WhichOneof("kind")
        if kind == "open":
            self.opens += 1
        elif kind == "draft":
            entry = WireRound(round=message.draft.round, draft_length=len(message.draft.tokens),
                              sent_s=time.monotonic())
            self.rounds.append(entry)
            self._pending[(call, entry.round)] = entry

    def received(self, call: int, message: pb.ServerMessage) -> None:
        self.bytes_down += message.ByteSize()
        if message.WhichOneof("kind") != "verdict":
            return
        entry = self._pending.pop((call, message.verdict.round), None)
        if entry is not None:
            entry.rtt_s = time.monotonic() - entry.sent_s
            entry.accepted = message.verdict.accepted
            timings = message.verdict.timings
            entry.server_s = (timings.queue_ms + timings.forward_ms + timings.verify_ms) / 1000.0

    def verified_rounds(self) -> list[WireRound]:
        """Rounds that got a verdict (a round redone after a broken link appears once per try)."""
        return [r for r in self.rounds if r.rtt_s is not None]


class _TracedCall:
    """The Call-and-iterator the channel returned, with every response recorded."""

    def __init__(self, call, log: WireLog, call_id: int) -> None:
        self._call = call
        self._log = log
        self._id = call_id

    def __iter__(self) -> _TracedCall:
        return self

    def __next__(self):
        message = next(self._call)
        self._log.received(self._id, message)
        return message

    def __getattr__(self, name: str):  # cancel(), done(), code(), details(), ...
        return getattr(self._call, name)


class WireTracer(grpc.StreamStreamClientInterceptor):
    def __init__(self) -> None:
        self._local = threading.local()
        self._next_call = 0
        self._lock = threading.Lock()

    def wrap(self, channel: grpc.Channel) -> grpc.Channel:
        return grpc.intercept_channel(channel, self)

    @contextmanager
    def recording(self) -> Iterator[WireLog]:
        """Attribute the Session calls this thread starts inside the block to a new WireLog."""
        log = WireLog()
        self._local.log = log
        try:
            yield log
        finally:
            self._local.log = None

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        log: WireLog | None = getattr(self._local, "log", None)
        if log is None:
            return continuation(client_call_details, request_iterator)
        with self._lock:
            self._next_call += 1
            call_id = self._next_call

        def traced_requests() -> Iterator[pb.ClientMessage]:
            for message in request_iterator:
                log.sent(call_id, message)
                yield message

        return _TracedCall(continuation(client_call_details, traced_requests()), log, call_id)
