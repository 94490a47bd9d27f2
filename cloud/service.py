"""The verifier's gRPC servicer: a thin layer over cloud.engine.Verifier.

It admits streams, hands each message to the engine through cloud/convert.py (proto <->
engine) and maps cloud.errors to status codes; every decision is the engine's. A refused
request ends that stream with a status and a clear message; every other session goes on. The
server around it (health, auth, TLS, binding): cloud/server.py.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc

from cloud import convert
from cloud.admission import RETRY_AFTER_HEADER, Admission, Overloaded
from cloud.auth import key_from_metadata
from cloud.config import LimitSettings
from cloud.engine import Verifier
from cloud.engine_api import EvictedNotice
from cloud.errors import CloudError, InvalidRequest, PreconditionFailed
from cloud.inbox import Inbox, UndecodableMessage
from cloud.sessions import Session
from cloud.token_cost import CLOUD, SPECULATE, ServingClock, said
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
SERVED_MODES = {"verdict": SPECULATE, "generated": CLOUD}  # a reply's kind -> its mode


class DecodingServicer(pb_grpc.DecodingServicer):
    def __init__(self, engine: Verifier, admission: Admission, limits: LimitSettings,
                 name: str = "") -> None:
        self.engine = engine
        self.admission = admission
        self.name = name  # this verifier (server.name), said in Opened and Info
        self.open_timeout_s = limits.open_timeout_s
        self.idle_timeout_s = limits.idle_timeout_s

    def Session(self, request_iterator, context) -> Iterator[pb.ServerMessage]:
        key = key_from_metadata(context.invocation_metadata()) or ""
        try:
            self.admission.enter(key)
        except Overloaded as exc:
            self.engine.metrics.observe_refusal(exc.code)
            _abort(context, exc)
        stream = _Stream(self.engine, self.admission, key, self.name)
        # Runs when the RPC ends for any reason (client gone, cancelled, deadline, done).
        context.add_callback(stream.release)
        inbox = Inbox(request_iterator)
        serving = ServingClock()
        try:
            while True:
                if stream.opened:
                    message = inbox.next(self.idle_timeout_s, "message (idle timeout)")
                else:
                    message = inbox.next(self.open_timeout_s, "Open")
                if message is None:
                    break
                reply = stream.handle(message)
                if isinstance(reply, pb.ServerMessage):
                    yield reply
                    stream.charge_serving(reply, serving.lap())
                elif reply is not None:  # a Generate streams its tokens
                    for item in reply:
                        yield item
                        stream.charge_serving(item, serving.lap())
        except CloudError as exc:
            stream.end(f"refused: {exc.code}")
            self.engine.metrics.observe_refusal(exc.code)
            _abort(context, exc)
        except grpc.RpcError:
            raise  # the client went away or the call was cancelled: nothing to answer
        except Exception:  # noqa: BLE001 - the system's edge: log it, answer INTERNAL, serve on
            log.exception("session stream failed")
            stream.end("internal error")
            self.engine.metrics.observe_refusal("INTERNAL")
            context.abort(grpc.StatusCode.INTERNAL, "internal error in the verifier (see its log)")
        finally:
            stream.release()

    def Info(self, request, context) -> pb.InfoReply:
        if isinstance(request, UndecodableMessage):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a tandem.v1.InfoRequest")
        runtime = self.engine.runtime
        return pb.InfoReply(model=runtime.name, tokenizer_fingerprint=runtime.fingerprint,
                            limits=convert.limits_message(self.engine.limits),
                            device=str(runtime.device), dtype=runtime.dtype,
                            active_sessions=self.engine.table.active,
                            target=convert.identity_message(self.engine.identity),
                            batches=convert.batch_stats_message(self.engine),
                            price=self.engine.price.value(),
                            queue_delay_ms=self.engine.price.queue_delay_ms(),
                            position_cost=self.engine.pass_costs.position_cost(),
                            verifier=self.name, **said(self.engine.token_costs))


def _set(message, fields: dict[str, float]) -> None:
    for name, value in fields.items():
        setattr(message, name, value)


def _abort(context, exc: CloudError) -> None:
    """End the call with the error's status; an overload also says when to retry (the
    session table's "all busy" has no better hint than about one round: 0.5 s)."""
    if exc.code == "RESOURCE_EXHAUSTED":
        retry_after_s = exc.retry_after_s if isinstance(exc, Overloaded) else 0.5
        context.set_trailing_metadata(
            ((RETRY_AFTER_HEADER, str(max(int(retry_after_s * 1000), 1))),))
    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))


class _Stream:
    """One Session stream: at most one open session at a time; Open again after Evicted or
    Close is allowed."""

    def __init__(self, engine: Verifier, admission: Admission, key: str, name: str = "") -> None:
        self.engine = engine
        self.admission = admission
        self.key = key
        self.name = name
        self.session: Session | None = None
        self.priced = False  # the edge offered Open.priced: its replies carry the price
        self._lock = threading.Lock()  # end() also runs from gRPC's termination callback
        self._left = False

    @property
    def opened(self) -> bool:
        return self.session is not None

    def handle(self, message: pb.ClientMessage
               ) -> pb.ServerMessage | Iterator[pb.ServerMessage] | None:
        kind = message.WhichOneof("kind")
        if kind == "open":
            return self._open(message.open)
        if kind == "draft":
            return self._draft(message.draft)
        if kind == "generate":
            return self._generate(message.generate)
        if kind == "close":
            reason = message.close.reason
            self.end(f"closed by client: {reason}" if reason else "closed by client")
            return None
        raise InvalidRequest("empty ClientMessage: set one of open, draft, close")

    def _open(self, message: pb.Open) -> pb.ServerMessage:
        if self.session is not None and not (self.session.closed or self.session.evicted):
            raise PreconditionFailed(f"session {self.session.session_id!r} is already open on this "
                                     "stream: send Close first")
        opened = self.engine.open(convert.open_request(message, self.engine.limits.vocab_size))
        with self._lock:
            self.session = opened.session
        self.priced = message.priced
        reply = pb.Opened(session_id=opened.session.session_id,
                          limits=convert.limits_message(self.engine.limits),
                          load=opened.load, prefill_ms=opened.prefill_ms, q_codec=opened.q_codec,
                          target=convert.identity_message(self.engine.identity), verifier=self.name)
        if self.priced:  # an older edge did not offer: its Opened stays as it was
            reply.priced, reply.price = True, self._price()
            position_cost = self.engine.pass_costs.position_cost()
            if position_cost is not None:  # absent: not measured yet
                reply.position_cost = position_cost
            _set(reply, said(self.engine.token_costs))
        return pb.ServerMessage(opened=reply)

    def _price(self) -> float:
        """The price for this session's replies: 0 (not sent) unless it offered Open.priced."""
        return self.engine.price.value() if self.priced else 0.0

    def _draft(self, message: pb.Draft) -> pb.ServerMessage:
        convert.check_draft_sizes(message, self.engine.limits)
        if self.session is not None:
            self.admission.take_draft_tokens(self.key, len(message.tokens))
        result = self.engine.draft(self.session, convert.draft_request(message))
        if isinstance(result, EvictedNotice):
            self.end("evicted")
            return convert.evicted_message(result)
        reply = convert.verdict_message(result, self._price())
        self._token_costs(reply.verdict)
        return reply

    def _generate(self, message: pb.Generate) -> Iterator[pb.ServerMessage]:
        tokens = self.engine.generate(self.session, convert.generate_request(message))
        for item in tokens:  # a refusal (CloudError) surfaces at the first step
            if isinstance(item, EvictedNotice):
                self.end("evicted")
                yield convert.evicted_message(item)
                return
            reply = convert.generated_message(message.round, item, self._price())
            self._token_costs(reply.generated)
            yield reply

    def charge_serving(self, reply: pb.ServerMessage, ms: float) -> None:
        """What serving `reply` cost (sent, the request before it read), charged to its mode;
        an Opened's (a prompt's) to neither."""
        mode = SERVED_MODES.get(reply.WhichOneof("kind"))
        if mode is not None and self.session is not None:
            self.engine.charge_serving(self.session, mode, ms)

    def _token_costs(self, reply: pb.Verdict | pb.Generated) -> None:
        """A priced session's reply says what a committed token costs per mode: its own
        figure where it has one, else the verifier's (an older edge's reply stays as it was)."""
        if self.priced and self.session is not None:
            _set(reply, said(self.session.token_costs, self.engine.token_costs))

    def end(self, reason: str) -> None:
        with self._lock:
            session = self.session
        if session is not None:
            self.engine.close(session, reason)

    def release(self) -> None:
        """The stream is over: close its session and give back its slot (once)."""
        self.end("stream ended")
        with self._lock:
            leave, self._left = not self._left, True
        if leave:
            self.admission.leave(self.key)
