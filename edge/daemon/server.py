"""The daemon's server: load the engine from an EdgeConfig and serve the HTTP API with uvicorn
(`tandem-edge serve`, see command.py).

SIGTERM / SIGINT stop it cleanly: uvicorn stops accepting, finishes open responses, then the
engine halts running generations, waits for its workers and closes the runtimes and the channel.
`DaemonThread` runs the same server in a background thread (tests, the simulation).
"""
from __future__ import annotations

import logging
import signal
import threading
import time

import uvicorn
from prometheus_client import CollectorRegistry

from edge.config import EdgeConfig
from edge.daemon.app import create_app
from edge.daemon.engine import Engine
from edge.daemon.metrics import DaemonMetrics
from edge.link import call_metadata, make_channel
from edge.runtime import load_draft_runtime
from edge.tokenizer import EdgeTokenizer

log = logging.getLogger(__name__)


def load_engine(config: EdgeConfig, registry: CollectorRegistry | None = None) -> Engine:
    """Load pool_size draft runtimes, the tokenizer and the channel named by `config`."""
    tokenizer = EdgeTokenizer(config.draft.resolved_tokenizer_dir)
    runtimes = []
    try:
        for _ in range(config.daemon.pool_size):
            runtimes.append(load_draft_runtime(config.draft))
    except BaseException:
        for runtime in runtimes:
            runtime.close()
        raise
    return Engine(config=config.daemon, client_config=config.client, channel=make_channel(config.cloud),
                  runtimes=runtimes, tokenizer=tokenizer,
                  metrics=DaemonMetrics(registry if registry is not None else CollectorRegistry()),
                  context_limit=config.draft.n_ctx, metadata=call_metadata(config.cloud))


def _uvicorn(engine: Engine, host: str, port: int) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(create_app(engine), host=host, port=port,
                                         log_level=engine.config.log_level, access_log=False,
                                         lifespan="off", timeout_graceful_shutdown=5))


def serve(config: EdgeConfig) -> None:
    """Run in the foreground until SIGTERM / SIGINT."""
    engine = load_engine(config)
    server = _uvicorn(engine, config.daemon.host, config.daemon.port)
    # uvicorn handles SIGTERM/SIGINT while it runs, then restores the previous handlers and
    # re-raises the signal: with these in place the re-raise only lands here, so the engine
    # still closes and the process exits 0 rather than dying of the signal.
    stops: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stops.append(signum))
    try:
        server.run()
    finally:
        engine.close()
    log.info("stopped (%s)", ", ".join(signal.Signals(s).name for s in stops) or "server exit")


class DaemonThread:
    """The daemon's HTTP server in a background thread on `host:port` (0 = a free port)."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0) -> None:
        self.engine = engine
        self._server = _uvicorn(engine, host, port)
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
        self.engine.close()

    def __enter__(self) -> DaemonThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
