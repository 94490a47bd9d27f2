"""The gRPC side of the verifier: a thin servicer over cloud.engine.Verifier, the health service,
API-key auth and TLS, and `create_server(config) -> (server, port)`.

The servicer only converts messages and maps cloud.errors to status codes; every decision is
the engine's. A refused request ends that stream with a status and a clear message; every
other session goes on.
"""
from __future__ import annotations

import logging
import math
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cloud.admission import RETRY_AFTER_HEADER, Admission, Overloaded
from cloud.auth import ApiKeyInterceptor, key_from_metadata
from cloud.backend import TargetBackend
from cloud.runtime.factory import make_backend
from cloud.config import CloudConfig, LimitSettings
from cloud.engine import (Discarded, DraftRequest, Verifier, EvictedNotice, GenerateRequest,
                          OpenRequest)
from cloud.errors import CloudError, ContextTooLong, InvalidRequest, PreconditionFailed
from cloud.identity import TargetIdentity
from cloud.inbox import Inbox, UndecodableMessage, lenient_deserializer
from cloud.runtime.target import TargetRuntime
from cloud.sessions import Session
from tandem.codec import from_proto
from tandem.config import ConfigError
from tandem.qcodec import MAX_CODED_BYTES_PER_TOKEN
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = "tandem.v1.Decoding"
# so_reuseport off: a second server on a port in use fails to bind instead of silently
# sharing it (the kernel would split connections between the two). Keepalive pings from
# edges (edge/link/channel.py: every 20 s or more, also between calls) are allowed, not answered
# with GOAWAY "too many pings".
SERVER_SOCKET_OPTIONS = (("grpc.so_reuseport", 0),
                         ("grpc.keepalive_permit_without_calls", 1),
                         ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                         ("grpc.http2.max_ping_strikes", 0))
RESERVED_THREADS = 4   # pool threads beyond the stream slots: Info and health always answer
MAX_NAME_CHARS = 256   # session_id, model, tokenizer_fingerprint, close reason
MAX_Q_CODECS = 16      # names in Open.q_codecs


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
                elif reply is not None:  # a Generate streams its tokens
                    yield from reply
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
                            limits=_limits(self.engine), device=str(runtime.device),
                            dtype=runtime.dtype, active_sessions=self.engine.table.active,
                            target=_identity(self.engine.identity),
                            batches=_batch_stats(self.engine), price=self.engine.price.value(),
                            queue_delay_ms=self.engine.price.queue_delay_ms(),
                            verifier=self.name)


def _batch_stats(engine: Verifier) -> pb.BatchStats:
    # A copy: the batcher thread adds to it. The vLLM backend has no batcher (vLLM batches).
    counts = dict(engine.batcher.size_counts) if engine.batcher is not None else {}
    largest = max(counts, default=0)
    return pb.BatchStats(passes=sum(counts.values()),
                         rounds=sum(size * n for size, n in counts.items()), largest=largest,
                         size_counts=[counts.get(size, 0) for size in range(1, largest + 1)])


def _abort(context, exc: CloudError) -> None:
    """End the call with the error's status; an overload also says when to retry (the
    session table's "all busy" has no better hint than about one round: 0.5 s)."""
    if exc.code == "RESOURCE_EXHAUSTED":
        retry_after_s = exc.retry_after_s if isinstance(exc, Overloaded) else 0.5
        context.set_trailing_metadata(
            ((RETRY_AFTER_HEADER, str(max(int(retry_after_s * 1000), 1))),))
    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))


def _identity(identity: TargetIdentity) -> pb.TargetIdentity:
    return pb.TargetIdentity(name=identity.name, weights_digest=identity.weights_digest,
                             tokenizer_fingerprint=identity.tokenizer_fingerprint,
                             digest=identity.digest)


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
        _check_open_sizes(message, self.engine)
        opened = self.engine.open(OpenRequest(
            session_id=message.session_id, model=message.model,
            tokenizer_fingerprint=message.tokenizer_fingerprint,
            context_ids=list(message.context_ids), sampling=_sampling(message.sampling, self.engine.limits.vocab_size),
            mode=int(message.mode), q_codecs=tuple(message.q_codecs)))
        with self._lock:
            self.session = opened.session
        self.priced = message.priced
        reply = pb.Opened(session_id=opened.session.session_id, limits=_limits(self.engine),
                          load=opened.load, prefill_ms=opened.prefill_ms, q_codec=opened.q_codec,
                          target=_identity(self.engine.identity), verifier=self.name)
        if self.priced:  # an older edge did not offer: its Opened stays as it was
            reply.priced, reply.price = True, self._price()
        return pb.ServerMessage(opened=reply)

    def _price(self) -> float:
        """The price for this session's replies: 0 (not sent) unless it offered Open.priced."""
        return self.engine.price.value() if self.priced else 0.0

    def _draft(self, message: pb.Draft) -> pb.ServerMessage:
        _check_draft_sizes(message, self.engine)
        if self.session is not None:
            self.admission.take_draft_tokens(self.key, len(message.tokens))
        result = self.engine.draft(self.session, DraftRequest(
            round=message.round, start=message.start, tokens=list(message.tokens),
            q=[from_proto(dist) for dist in message.q], q_coded=message.q_coded,
            unverified=tuple(message.unverified),
            ahead=message.ahead, assumed_token=message.assumed_token,
            in_flight=max(message.in_flight, 1)))
        if isinstance(result, Discarded):
            return pb.ServerMessage(verdict=pb.Verdict(
                round=result.round, discarded=True, context_length=result.context_length,
                price=self._price()))
        if isinstance(result, EvictedNotice):
            self.end("evicted")
            return pb.ServerMessage(evicted=pb.Evicted(session_id=result.session_id,
                                                       round=result.round))
        timings = result.timings
        return pb.ServerMessage(verdict=pb.Verdict(
            round=result.round, accepted=result.verdict.accepted, token=result.verdict.token,
            context_length=result.context_length,
            timings=pb.Timings(queue_ms=timings.queue_ms, forward_ms=timings.forward_ms,
                               verify_ms=timings.verify_ms, batch_size=timings.batch_size),
            price=self._price()))

    def _generate(self, message: pb.Generate) -> Iterator[pb.ServerMessage]:
        tokens = self.engine.generate(self.session, GenerateRequest(
            round=message.round, start=message.start, max_tokens=message.max_tokens,
            stop_ids=frozenset(message.stop_ids)))
        for item in tokens:  # a refusal (CloudError) surfaces at the first step
            if isinstance(item, EvictedNotice):
                self.end("evicted")
                yield pb.ServerMessage(evicted=pb.Evicted(session_id=item.session_id,
                                                          round=item.round))
                return
            t = item.timings
            yield pb.ServerMessage(generated=pb.Generated(
                round=message.round, token=item.token, context_length=item.context_length,
                done=item.done, timings=pb.Timings(queue_ms=t.queue_ms, forward_ms=t.forward_ms,
                                                   batch_size=t.batch_size),
                price=self._price()))

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


def _check_open_sizes(message: pb.Open, engine: Verifier) -> None:
    """Refuse oversized fields before any of them is converted or looked at."""
    for name in ("session_id", "model", "tokenizer_fingerprint"):
        if len(getattr(message, name)) > MAX_NAME_CHARS:
            raise InvalidRequest(f"Open.{name} is longer than {MAX_NAME_CHARS} characters")
    if len(message.q_codecs) > MAX_Q_CODECS or any(len(c) > MAX_NAME_CHARS
                                                   for c in message.q_codecs):
        raise InvalidRequest(f"Open.q_codecs: at most {MAX_Q_CODECS} names of at most "
                             f"{MAX_NAME_CHARS} characters")
    if len(message.context_ids) > engine.limits.max_context:
        raise ContextTooLong(f"context of {len(message.context_ids)} tokens exceeds "
                             f"max_context {engine.limits.max_context}")


def _check_draft_sizes(message: pb.Draft, engine: Verifier) -> None:
    limits = engine.limits
    for name, n in (("tokens", len(message.tokens)), ("q", len(message.q))):
        if n > limits.max_draft_length:
            raise InvalidRequest(f"block of {n} {name} exceeds max_draft_length "
                                 f"{limits.max_draft_length}")
    if len(message.q_coded) > MAX_CODED_BYTES_PER_TOKEN * (len(message.tokens) + 1):
        raise InvalidRequest(f"Draft.q_coded of {len(message.q_coded)} bytes for "
                             f"{len(message.tokens)} tokens: more than any coded q needs")
    for i, dist in enumerate(message.q):
        if len(dist.ids) > limits.max_q_entries or len(dist.weights) > limits.max_q_entries:
            raise InvalidRequest(f"q at block position {i} lists {len(dist.ids)} ids and "
                                 f"{len(dist.weights)} weights, limit is {limits.max_q_entries}")


def _sampling(message: pb.SamplingParams, vocab_size: int) -> SamplingParams:
    if not (math.isfinite(message.temperature) and math.isfinite(message.top_p)):
        raise InvalidRequest("sampling temperature and top_p must be finite")
    if not 0.0 <= message.top_p <= 1.0:
        raise InvalidRequest(f"sampling top_p must be in [0, 1] (0 = off), got {message.top_p:g}")
    if message.top_k > vocab_size:
        raise InvalidRequest(f"sampling top_k {message.top_k} exceeds the vocabulary "
                             f"({vocab_size}; 0 = off)")
    try:
        # The proto's top_p = 0 means "off", as does 1.
        return SamplingParams(temperature=message.temperature, top_k=message.top_k,
                              top_p=message.top_p if message.top_p > 0 else 1.0, seed=message.seed)
    except ValueError as exc:
        raise InvalidRequest(f"sampling: {exc}") from exc


def _limits(engine: Verifier) -> pb.Limits:
    limits = engine.limits
    return pb.Limits(max_draft_length=limits.max_draft_length, max_context=limits.max_context,
                     vocab_size=limits.vocab_size, max_q_entries=limits.max_q_entries,
                     max_in_flight=limits.max_in_flight,
                     max_generate_tokens=limits.max_generate_tokens)


def _decoding_handlers(servicer: DecodingServicer) -> grpc.GenericRpcHandler:
    """The generated add_DecodingServicer_to_server, but with decoders that do not raise, so
    undecodable bytes reach the servicer and are refused with INVALID_ARGUMENT."""
    return grpc.method_handlers_generic_handler(SERVICE_NAME, {
        "Session": grpc.stream_stream_rpc_method_handler(
            servicer.Session, request_deserializer=lenient_deserializer(pb.ClientMessage),
            response_serializer=pb.ServerMessage.SerializeToString),
        "Info": grpc.unary_unary_rpc_method_handler(
            servicer.Info, request_deserializer=lenient_deserializer(pb.InfoRequest),
            response_serializer=pb.InfoReply.SerializeToString),
    })


class CloudServer:
    """A started-or-not gRPC server with its engine; stop() drains rounds, then the batcher."""

    def __init__(self, server: grpc.Server, engine: Verifier, health_servicer: health.HealthServicer,
                 port: int, secure: bool, grace_s: float) -> None:
        self.grpc_server = server
        self.engine = engine
        self.health = health_servicer
        self.port = port
        self.secure = secure
        self.grace_s = grace_s
        self.name = ""  # this verifier (server.name), as Opened and Info say it

    def start(self) -> None:
        self.grpc_server.start()

    def stop(self, grace: float | None = None) -> threading.Event:
        """Refuse new calls, let in-flight ones finish for `grace` seconds, then stop the
        batcher. Returns an event set once everything has stopped."""
        self.health.enter_graceful_shutdown()
        stopped = self.grpc_server.stop(self.grace_s if grace is None else grace)
        done = threading.Event()

        def finish() -> None:
            stopped.wait()
            self.engine.shutdown()
            done.set()

        threading.Thread(target=finish, name="tandem-cloud-stop", daemon=True).start()
        return done

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self.grpc_server.wait_for_termination(timeout)


def enable_reflection(server: grpc.Server) -> None:
    """gRPC server reflection, so `grpcurl` lists and calls the services without the proto."""
    from grpc_reflection.v1alpha import reflection

    reflection.enable_server_reflection(
        (pb.DESCRIPTOR.services_by_name["Decoding"].full_name, health.SERVICE_NAME,
         reflection.SERVICE_NAME), server)


def create_server(config: CloudConfig,
                  runtime: TargetRuntime | TargetBackend | None = None,
                  ) -> tuple[CloudServer, int]:
    """Build the server (not started) and bind config.server.host:port; port 0 picks one.

    `runtime` lets tests share one loaded target across servers; by default the model in
    config.model is loaded. Raises ConfigError when the server would be reachable beyond
    loopback without an API key and the config does not explicitly allow it.
    """
    settings = config.server
    keys = settings.resolved_api_keys()
    if not keys:
        if settings.is_loopback:
            log.warning("serving %s without an API key (loopback only)", settings.host)
        elif settings.allow_insecure_public:
            log.warning("serving %s WITHOUT AN API KEY: allow_insecure_public is set",
                        settings.host)
        else:
            raise ConfigError(
                f"refusing to serve {settings.host} without an API key: set server.api_keys or "
                "server.api_keys_env, bind a loopback address, or set "
                "server.allow_insecure_public: true")
    if runtime is None:
        runtime = make_backend(config)  # model.backend: torch or vllm
    engine = Verifier(runtime, config.limits, config.batch)
    limits = config.limits
    admission = Admission(max_streams=settings.max_workers,
                          max_streams_per_key=limits.max_streams_per_key,
                          draft_tokens_per_s_per_key=limits.draft_tokens_per_s_per_key,
                          burst_tokens=limits.max_draft_length + 1)

    threads = settings.max_workers + RESERVED_THREADS
    server = grpc.server(
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tandem-grpc"),
        interceptors=[ApiKeyInterceptor(keys)] if keys else [],
        # One worker thread per call: beyond that a call is refused, not left hanging. Streams
        # are held to max_workers by Admission, so RESERVED_THREADS stay for Info and health.
        maximum_concurrent_rpcs=threads,
        options=[("grpc.max_receive_message_length", limits.max_message_bytes),
                 *SERVER_SOCKET_OPTIONS])
    servicer = DecodingServicer(engine, admission, limits)
    server.add_generic_rpc_handlers((_decoding_handlers(servicer),))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    enable_reflection(server)

    address = f"[{settings.host}]:{settings.port}" if ":" in settings.host else \
        f"{settings.host}:{settings.port}"
    secure = settings.tls_cert is not None
    try:
        if secure:
            credentials = grpc.ssl_server_credentials(
                [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())])
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except (OSError, RuntimeError) as exc:
        engine.shutdown()
        raise ConfigError(f"cannot bind {address}: {exc}") from exc
    if port == 0 or (settings.port and port != settings.port):
        engine.shutdown()
        raise ConfigError(f"cannot bind {address}: the port is in use (or the address is not "
                          "this host's)")
    # Named once the port is known (port 0 picks one): replicas on one host differ by port.
    servicer.name = settings.name or f"{socket.gethostname()}:{port}"
    cloud_server = CloudServer(server, engine, health_servicer, port, secure,
                               settings.shutdown_grace_s)
    cloud_server.name = servicer.name
    return cloud_server, port
