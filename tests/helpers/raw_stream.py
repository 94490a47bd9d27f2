"""One Session call on the verifier driven message by message, raw bytes allowed: for the tests
of hostile input and of faults, which must send what no edge client would."""
from __future__ import annotations

import contextlib
import queue

import grpc
import pytest

from tandem.v1 import decoding_pb2 as pb

TIMEOUT = 30
SESSION_METHOD = "/tandem.v1.Decoding/Session"


class Stream:
    """One Session call driven message by message (bytes or ClientMessage)."""

    def __init__(self, channel: grpc.Channel, metadata=None) -> None:
        self._requests: queue.Queue = queue.Queue()
        call = channel.stream_stream(SESSION_METHOD, request_serializer=serialize,
                                     response_deserializer=pb.ServerMessage.FromString)
        self.call = call(iter(self._requests.get, None), metadata=metadata, timeout=TIMEOUT)

    def send(self, message) -> pb.ServerMessage:
        self._requests.put(message)
        return next(self.call)

    def end(self, close: bool = True) -> grpc.StatusCode:
        """Finish the request side (unless not close: then wait for the server to end the
        call); the call's final status."""
        if close:
            self._requests.put(None)
        with contextlib.suppress(grpc.RpcError, StopIteration):
            for _ in self.call:
                pass
        return self.call.code()

    def refused(self, message) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            self.send(message)
        return info.value


def serialize(message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()
