"""The verifier's gRPC server: `create_server(config) -> (server, port)` builds the engine, the
servicer (cloud/service.py), the health service, API-key auth, TLS and server reflection, and
binds the port (0 picks one); CloudServer starts it and stops it with a grace period."""
from __future__ import annotations

import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cloud.admission import Admission
from cloud.auth import ApiKeyInterceptor
from cloud.backend import TargetBackend
from cloud.config import CloudConfig
from cloud.engine import Verifier
from cloud.inbox import lenient_deserializer
from cloud.runtime.factory import make_backend
from cloud.runtime.target import TargetRuntime
from cloud.service import DecodingServicer
from tandem.config import ConfigError
from tandem.v1 import decoding_pb2 as pb

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
