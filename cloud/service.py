"""The gRPC side of the verifier: a thin servicer over cloud.engine.Engine, the health service,
API-key auth and TLS, and `create_server(config) -> (server, port)`.

The servicer only converts messages and maps cloud.errors to status codes; every decision is
the engine's. A refused request ends that stream with a status and a clear message; every
other session goes on.
"""
from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cloud.auth import ApiKeyInterceptor
from cloud.config import CloudConfig
from cloud.engine import DraftRequest, Engine, EvictedNotice, OpenRequest
from cloud.errors import CloudError, InvalidRequest, PreconditionFailed
from cloud.runtime.target import TargetRuntime
from cloud.sessions import Session
from tandem.codec import from_proto
from tandem.config import ConfigError
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = "tandem.v1.Decoding"


class DecodingServicer(pb_grpc.DecodingServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def Session(self, request_iterator, context) -> Iterator[pb.ServerMessage]:
        stream = _Stream(self.engine)
        # Runs when the RPC ends for any reason (client gone, cancelled, deadline, done).
        context.add_callback(lambda: stream.end("stream ended"))
        try:
            for message in request_iterator:
                reply = stream.handle(message)
                if reply is not None:
                    yield reply
        except CloudError as exc:
            stream.end(f"refused: {exc.code}")
            context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
        except grpc.RpcError:
            raise  # the client went away or the call was cancelled: nothing to answer
        except Exception:  # noqa: BLE001 - the system's edge: log it, answer INTERNAL, serve on
            log.exception("session stream failed")
            stream.end("internal error")
            context.abort(grpc.StatusCode.INTERNAL, "internal error in the verifier (see its log)")
        finally:
            stream.end("stream ended")

    def Info(self, request, context) -> pb.InfoReply:
        runtime = self.engine.runtime
        return pb.InfoReply(model=runtime.name, tokenizer_fingerprint=runtime.fingerprint,
                            limits=_limits(self.engine), device=str(runtime.device),
                            dtype=runtime.dtype, active_sessions=self.engine.table.active)


class _Stream:
    """One Session stream: at most one open session at a time; Open again after Evicted or
    Close is allowed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.session: Session | None = None
        self._lock = threading.Lock()  # end() also runs from gRPC's termination callback

    def handle(self, message: pb.ClientMessage) -> pb.ServerMessage | None:
        kind = message.WhichOneof("kind")
        if kind == "open":
            return self._open(message.open)
        if kind == "draft":
            return self._draft(message.draft)
        if kind == "close":
            reason = message.close.reason
            self.end(f"closed by client: {reason}" if reason else "closed by client")
            return None
        raise InvalidRequest("empty ClientMessage: set one of open, draft, close")

    def _open(self, message: pb.Open) -> pb.ServerMessage:
        if self.session is not None and not (self.session.closed or self.session.evicted):
            raise PreconditionFailed(f"session {self.session.session_id!r} is already open on this "
                                     "stream: send Close first")
        opened = self.engine.open(OpenRequest(
            session_id=message.session_id, model=message.model,
            tokenizer_fingerprint=message.tokenizer_fingerprint,
            context_ids=list(message.context_ids), sampling=_sampling(message.sampling),
            mode=int(message.mode)))
        with self._lock:
            self.session = opened.session
        return pb.ServerMessage(opened=pb.Opened(
            session_id=opened.session.session_id, limits=_limits(self.engine),
            load=opened.load, prefill_ms=opened.prefill_ms))

    def _draft(self, message: pb.Draft) -> pb.ServerMessage:
        result = self.engine.draft(self.session, DraftRequest(
            round=message.round, start=message.start, tokens=list(message.tokens),
            q=[from_proto(dist) for dist in message.q]))
        if isinstance(result, EvictedNotice):
            self.end("evicted")
            return pb.ServerMessage(evicted=pb.Evicted(session_id=result.session_id,
                                                       round=result.round))
        timings = result.timings
        return pb.ServerMessage(verdict=pb.Verdict(
            round=result.round, accepted=result.verdict.accepted, token=result.verdict.token,
            context_length=result.context_length,
            timings=pb.Timings(queue_ms=timings.queue_ms, forward_ms=timings.forward_ms,
                               verify_ms=timings.verify_ms, batch_size=timings.batch_size)))

    def end(self, reason: str) -> None:
        with self._lock:
            session = self.session
        if session is not None:
            self.engine.close(session, reason)


def _sampling(message: pb.SamplingParams) -> SamplingParams:
    if not (math.isfinite(message.temperature) and math.isfinite(message.top_p)):
        raise InvalidRequest("sampling temperature and top_p must be finite")
    try:
        # The proto's top_p = 0 means "off", as does 1.
        return SamplingParams(temperature=message.temperature, top_k=message.top_k,
                              top_p=message.top_p if message.top_p > 0 else 1.0, seed=message.seed)
    except ValueError as exc:
        raise InvalidRequest(f"sampling: {exc}") from exc


def _limits(engine: Engine) -> pb.Limits:
    limits = engine.limits
    return pb.Limits(max_draft_length=limits.max_draft_length, max_context=limits.max_context,
                     vocab_size=limits.vocab_size, max_q_entries=limits.max_q_entries)


class CloudServer:
    """A started-or-not gRPC server with its engine; stop() drains rounds, then the batcher."""

    def __init__(self, server: grpc.Server, engine: Engine, health_servicer: health.HealthServicer,
                 port: int, secure: bool, grace_s: float) -> None:
        self.grpc_server = server
        self.engine = engine
        self.health = health_servicer
        self.port = port
        self.secure = secure
        self.grace_s = grace_s

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


def create_server(config: CloudConfig,
                  runtime: TargetRuntime | None = None) -> tuple[CloudServer, int]:
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
        runtime = TargetRuntime(config.model.resolved_path(), config.model.device,
                                config.model.dtype, name=config.model.name or None)
    engine = Engine(runtime, config.limits, config.batch)

    server = grpc.server(
        ThreadPoolExecutor(max_workers=settings.max_workers, thread_name_prefix="tandem-grpc"),
        interceptors=[ApiKeyInterceptor(keys)] if keys else [],
        # One worker thread per open stream: beyond that a call is refused, not left hanging.
        maximum_concurrent_rpcs=settings.max_workers)
    pb_grpc.add_DecodingServicer_to_server(DecodingServicer(engine), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)

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
    if port == 0:
        engine.shutdown()
        raise ConfigError(f"cannot bind {address}")
    cloud_server = CloudServer(server, engine, health_servicer, port, secure,
                               settings.shutdown_grace_s)
    return cloud_server, port
