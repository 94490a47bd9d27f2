"""Reading a Session stream's client messages with deadlines, and decoding that never raises.

gRPC's sync server hands a stream handler a blocking request iterator with no timeout, so a
client that connects and sends nothing would hold its worker thread forever. `Inbox` drains the
iterator on a small reader thread into a queue; the handler waits on the queue with the open or
idle deadline and ends the stream with DEADLINE_EXCEEDED when it passes.

gRPC answers a request it cannot deserialize with INTERNAL and logs a traceback each time;
`lenient_deserializer` turns such bytes into an `Undecodable` marker instead, which the handler
refuses with INVALID_ARGUMENT.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from cloud.errors import StreamTimeout, Undecodable


@dataclass(frozen=True)
class UndecodableMessage:
    size: int
    error: str


def lenient_deserializer(message_class) -> Callable[[bytes], object]:
    def deserialize(data: bytes):
        try:
            return message_class.FromString(data)
        except (DecodeError, RuntimeWarning, ValueError) as exc:
            return UndecodableMessage(len(data), str(exc) or type(exc).__name__)
    return deserialize


_END = object()


class Inbox:
    """The client's messages of one stream, each awaited with a deadline."""

    def __init__(self, requests: Iterator) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(requests,),
                                        name="tandem-inbox", daemon=True)
        self._reader.start()

    def _read(self, requests: Iterator) -> None:
        try:
            for message in requests:
                self._queue.put(message)
        except Exception:  # noqa: BLE001 - the call ended (cancelled, broken): same as the end
            pass
        finally:
            self._queue.put(_END)

    def next(self, timeout_s: float, waiting_for: str):
        """The next message, None at the end of the stream. Raises StreamTimeout past the
        deadline and Undecodable for bytes that are no ClientMessage."""
        try:
            message = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            raise StreamTimeout(f"no {waiting_for} within {timeout_s:g} s: stream closed") from None
        if message is _END:
            self._queue.put(_END)
            return None
        if isinstance(message, UndecodableMessage):
            raise Undecodable(f"a message of {message.size} bytes is not a tandem.v1."
                              f"ClientMessage: {message.error}")
        return message
