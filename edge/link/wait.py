"""The one deadline rule of every wait on the verifier (`WaitRule`): late is not down; down only
on transport evidence or silence; a cap for a reply that never comes while probes are answered.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from edge.link.errors import LinkDown, LinkSilent, RecvTimeout, Stopped
from edge.link.stream import SessionStream
from tandem.v1 import decoding_pb2 as pb


# A stop event is checked this often while waiting on the verifier: the wait ends within this
# much of a stop (a threading.Event cannot wake a queue wait by itself).
STOP_POLL_S = 0.01


@dataclass(frozen=True)
class WaitRule:
    """The one deadline rule of every wait on the verifier: for Opened, a verdict (sequential or
    pipelined round) or a generated token (cloud-generates round).

    - Late is not down. Past `late_s` (the caller's, from the measured RTT and the verifier's
      reported time: edge/link/deadlines.py) the reply is late: the link starts asking the
      verifier for Info on the same channel every `probe_every_s`, and keeps waiting. A late
      reply is used like any other; slowness alone never makes a generation go local.
    - Down only on transport evidence: the call fails (connect failure, reset, an HTTP/2
      keepalive ping unanswered: gRPC ends the call with UNAVAILABLE), or nothing came from the
      verifier, neither on the stream nor as an answer to a probe, for `stall_s` (a stalled
      process or a dead path that TCP has not noticed yet) — or for late_s, when the link's
      own measured pace makes that longer (probing then starts at half of it).
    - `cap_s`: a reply still missing this long although the verifier answers its probes fails
      the round (alive, but not answering this stream); the loop re-opens.
    """
    stall_s: float = 3.0
    cap_s: float = 30.0
    probe_every_s: float = 0.25

    def recv(self, stream: SessionStream, late_s: float, cap_s: float | None = None, *,
             should_stop: Callable[[], bool],
             probe: Callable[[float], grpc.Future]) -> pb.ServerMessage:
        """The next message on `stream`, waited for under this rule: late after late_s, then
        `probe(stall_s)` (an Info call) every probe_every_s; down after stall_s without a sign
        of life, failed after cap_s (default: this rule's). Raises LinkDown (the stream
        abandoned), Stopped when should_stop() turns true."""
        cap_s = self.cap_s if cap_s is None else cap_s
        # A link whose measured RTT makes replies late only after stall_s (a slow, far link)
        # gets as long as late_s without a sign of life, and is probed from half of it.
        stall_s = max(self.stall_s, late_s)
        started = time.monotonic()
        heard = started              # the last sign of life: the send, or a probe answered
        next_probe = started + min(late_s, stall_s / 2)
        asked: grpc.Future | None = None
        try:
            while True:
                if should_stop():
                    raise Stopped()
                try:
                    return stream.recv(STOP_POLL_S, cancel_on_timeout=False)
                except RecvTimeout:
                    pass
                now = time.monotonic()
                if asked is not None and asked.done():
                    if _answered(asked):
                        heard = now
                    asked, next_probe = None, now + self.probe_every_s
                if asked is None and now >= next_probe:
                    asked = probe(stall_s)
                if now - heard >= stall_s:
                    stream.abandon()
                    raise LinkSilent(f"no answer from the verifier, on the stream or to a "
                                     f"probe, for {stall_s:.3g} s")
                if now - started >= cap_s:
                    stream.abandon()
                    raise LinkDown(f"no reply on the stream within {cap_s:.3g} s although the "
                                   "verifier answers probes")
        finally:
            if asked is not None:
                asked.cancel()


# Probe answers that mean "nobody answered": anything else (even a refusal) came from the verifier.
_SILENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                           grpc.StatusCode.CANCELLED})


def _answered(probe: grpc.Future) -> bool:
    """A finished Info probe: did the verifier answer it (successfully or not)?"""
    error = probe.exception()
    return error is None or getattr(error, "code", lambda: None)() not in _SILENT_CODES
