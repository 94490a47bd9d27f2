"""The daemon's server: load the pool from an EdgeConfig and serve the HTTP API with uvicorn
(`tandem-edge serve`, see command.py).

SIGTERM / SIGINT stop it cleanly: uvicorn stops accepting, finishes open responses, then the
pool halts running generations, waits for its workers and closes the runtimes and the channel.
`DaemonThread` runs the same server in a background thread (tests, the simulation).
"""
from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
import time

import uvicorn
from prometheus_client import CollectorRegistry

from edge.config import DaemonConfig, EdgeConfig
from edge.daemon.app import create_app
from edge.daemon.pool import GenerationPool
from edge.daemon.metrics import DaemonMetrics
from edge.link import call_metadata, make_channel
from edge.link.monitor import start_monitor
from edge.runtime import load_draft_runtime
from edge.tokenizer import EdgeTokenizer
from tandem.config import ConfigError

log = logging.getLogger(__name__)


def load_pool(config: EdgeConfig, registry: CollectorRegistry | None = None) -> GenerationPool:
    """Load pool_size draft runtimes, the tokenizer and the channel named by `config`."""
    tokenizer = EdgeTokenizer(config.draft.resolved_tokenizer_dir)
    runtimes = []
    ladders: list[dict] = []  # per pool slot, the ladder's other local models, all kept loaded
    try:
        for _ in range(config.daemon.pool_size):
            runtimes.append(load_draft_runtime(config.draft))
            ladders.append({})
            for model in config.ladder:
                ladders[-1][model.name] = runtime = load_draft_runtime(model)
                if runtime.fingerprint() != runtimes[-1].fingerprint():
                    raise ConfigError(f"ladder model {model.name!r} reads token ids differently "
                                      "from the draft (tokenizer fingerprints differ)")
    except BaseException:
        for runtime in runtimes + [rt for ladder in ladders for rt in ladder.values()]:
            runtime.close()
        raise
    channel = make_channel(config.cloud)
    return GenerationPool(config=config.daemon, client_config=config.client, channel=channel,
                  runtimes=runtimes, tokenizer=tokenizer,
                  monitor=start_monitor(config, channel, runtimes[0].fingerprint()),
                  metrics=DaemonMetrics(registry if registry is not None else CollectorRegistry(),
                                        model=config.daemon.model_name),
                  context_limit=min(m.n_ctx for m in config.local_models().values()),
                  metadata=call_metadata(config.cloud), ladders=ladders)


class _Server(uvicorn.Server):
    """uvicorn's server, logging one line once it listens (with the port really bound)."""

    def __init__(self, config: uvicorn.Config, pool: GenerationPool, verifier: str) -> None:
        super().__init__(config)
        self._pool = pool
        self._verifier = verifier

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        bound = [s.getsockname() for server in self.servers for s in server.sockets]
        daemon = self._pool.config
        log.info("listening on %s, model %s (%s draft), verifier %s, %s", ", ".join(
            f"http://{addr[0]}:{addr[1]}" for addr in bound), daemon.model_name,
            self._pool.backend, self._verifier,
            "API key required" if daemon.api_key else "no API key")


def _uvicorn(pool: GenerationPool, host: str, port: int, verifier: str = "?") -> uvicorn.Server:
    # uvicorn's own access log is off: app._AccessLog writes one line with the token count.
    level = "debug" if pool.config.log_level == "trace" else pool.config.log_level
    return _Server(uvicorn.Config(create_app(pool), host=host, port=port, log_level=level,
                                  access_log=False, lifespan="off", timeout_graceful_shutdown=5),
                   pool, verifier)


def check_exposure(daemon: DaemonConfig) -> None:
    """A daemon reachable beyond loopback must ask for a key: it spends the verifier's."""
    if daemon.api_key or daemon.allow_insecure_public or is_loopback(daemon.host):
        return
    raise ConfigError(f"refusing to serve {daemon.host} without an API key: set daemon.api_key "
                      "(e.g. TANDEM_EDGE_DAEMON__API_KEY), bind 127.0.0.1, or set "
                      "daemon.allow_insecure_public: true")


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on host:port; ConfigError when it cannot be bound (a port
    in use is refused, never shared)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart after TIME_WAIT
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    return sock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name or 0.0.0.0: reachable from elsewhere


def serve(config: EdgeConfig) -> None:
    """Run in the foreground until SIGTERM / SIGINT. Raises ConfigError for an exposed daemon
    without a key."""
    check_exposure(config.daemon)
    sock = bind(config.daemon.host, config.daemon.port)  # a port in use fails here, in one line
    try:
        pool = load_pool(config)
    except BaseException:
        sock.close()
        raise
    server = _uvicorn(pool, config.daemon.host, config.daemon.port, config.cloud.address)
    # uvicorn handles SIGTERM/SIGINT while it runs, then restores the previous handlers and
    # re-raises the signal: with these in place the re-raise only lands here, so the pool
    # still closes and the process exits 0 rather than dying of the signal.
    stops: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stops.append(signum))
    try:
        server.run(sockets=[sock])
    finally:
        pool.close()
        sock.close()
    log.info("stopped (%s)", ", ".join(signal.Signals(s).name for s in stops) or "server exit")


class DaemonThread:
    """The daemon's HTTP server in a background thread on `host:port` (0 = a free port)."""

    def __init__(self, pool: GenerationPool, host: str = "127.0.0.1", port: int = 0) -> None:
        self.pool = pool
        self._server = _uvicorn(pool, host, port)
        self._thread = threading.Thread(target=self._server.run, name="tandem-daemon", daemon=True)
        self.host = host
        self.port = 0

    def start(self, timeout_s: float = 30.0) -> DaemonThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon's HTTP server did not start on {self.host}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.pool.close()

    def __enter__(self) -> DaemonThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
