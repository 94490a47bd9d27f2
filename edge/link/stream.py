"""One `Decoding.Session` call as send / receive-with-deadline.

grpc's streaming response iterator has no per-message timeout, so a reader thread drains it
into a queue and `recv` waits on the queue: a verdict that does not come in time cancels the
call and counts as a broken link, like a transport error.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence

import grpc

from edge.link.errors import (FailureKind, LinkDown, RecvTimeout, VerifierMisconfigured,
                              VerifierOverloaded, classify_rpc_error)
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

# Status codes that say "the link or the server is (temporarily) not there": reconnect and
# re-open. Everything else is the verifier refusing the request, which retrying cannot fix.
# edge/link/errors.py refines this: a TLS handshake failure is UNAVAILABLE but no outage, and
# RESOURCE_EXHAUSTED is an overloaded verifier (VerifierOverloaded, with its retry hint).
RETRYABLE_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.CANCELLED,           # a server that stops cancels its streams
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # too many sessions right now
})


_END = object()  # ends the request stream


class _StreamEnded:
    def __init__(self, error: grpc.RpcError | None) -> None:
        self.error = error


class SessionStream:
    """One bidirectional Session call."""

    def __init__(self, stub: pb_grpc.DecodingStub, metadata: Sequence[tuple[str, str]]) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._responses: queue.Queue = queue.Queue()
        self._call = stub.Session(self._request_iter(), metadata=tuple(metadata))
        self._reader = threading.Thread(target=self._read, name="tandem-session-reader",
                                        daemon=True)
        self._reader.start()

    def _request_iter(self) -> Iterator[pb.ClientMessage]:
        while (item := self._requests.get()) is not _END:
            yield item

    def _read(self) -> None:
        try:
            for message in self._call:
                self._responses.put(message)
            self._responses.put(_StreamEnded(None))
        except grpc.RpcError as error:
            self._responses.put(_StreamEnded(error))

    def send(self, message: pb.ClientMessage) -> int:
        """Queue a message; return its serialized size."""
        self._requests.put(message)
        return message.ByteSize()

    def recv(self, timeout_s: float, cancel_on_timeout: bool = True) -> pb.ServerMessage:
        """The next message. On timeout: cancel the call and raise LinkDown, or (when
        cancel_on_timeout is False, for a caller that waits in slices) raise RecvTimeout."""
        try:
            item = self._responses.get(timeout=timeout_s)
        except queue.Empty:
            if not cancel_on_timeout:
                raise RecvTimeout() from None
            self._call.cancel()
            raise LinkDown(f"no answer from the verifier within {timeout_s:.3g} s") from None
        if isinstance(item, _StreamEnded):
            self._responses.put(item)  # any later recv sees the end too
            error = item.error
            if error is None:
                raise LinkDown("the verifier ended the stream")
            failure = classify_rpc_error(error)
            if failure.kind is FailureKind.OVERLOADED:
                raise VerifierOverloaded(failure.message, failure.retry_after_s)
            if failure.kind is FailureKind.OUTAGE:
                raise LinkDown(failure.message)
            # Configuration or identity (TLS handshakes arrive as UNAVAILABLE, not outages).
            raise VerifierMisconfigured(failure.message, error.code())
        return item

    def close(self, reason: str = "") -> int:
        """Say Close and end the request stream (the server then ends its side); return the
        Close message's serialized size (0 when the call had already ended)."""
        if self._call.done():
            return 0
        size = self.send(pb.ClientMessage(close=pb.Close(reason=reason)))
        self._requests.put(_END)
        return size

    def abandon(self) -> None:
        """Drop a broken or evicted stream without waiting for the server."""
        self._requests.put(_END)
        self._call.cancel()
