"""Tandem's servers as processes on loopback, for every benchmark that starts them and the tests
that kill them: the one launcher (`launch`, `launch_in`), the one readiness wait (`wait_until`),
free ports, stopping, a verifier's Info, and `VerifierProcess` (one
`tandem-cloud serve` with its own name and metrics port, which can be SIGKILLed and started
again on the same ports, and whose Prometheus counters can be read).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from contextlib import ExitStack

import grpc
import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(name: str) -> str:
    """One of the project's console scripts (tandem-cloud, tandem-edge) beside this Python."""
    return str(Path(sys.executable).parent / name)


def launch(argv: Sequence[str], log_path: Path, *, env: dict[str, str] | None = None,
           core: int | None = None) -> subprocess.Popen:
    """A server as a child process run from the repository root, its output in `log_path`;
    pinned to one `core` when given (the capacity bench measures a server on one core)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    with log_path.open("wb") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env if env is not None else dict(os.environ), preexec_fn=pin)


def launch_in(stack: ExitStack, argv: Sequence[str], log_path: Path, **how) -> subprocess.Popen:
    """`launch`, stopped (SIGTERM, then SIGKILL) when `stack` closes."""
    process = launch(argv, log_path, **how)
    stack.callback(stop_process, process)
    return process


def wait_until(ready, process: subprocess.Popen | None, what: str, timeout_s: float,
               log_path: Path | None) -> None:
    """Until `ready()` is true (an exception: not yet); the process's log tail if it exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            tail = log_path.read_text()[-2000:] if log_path else ""
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{tail}")
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready within {timeout_s:.0f} s (log: {log_path})")


def cloud_info(address: str, timeout_s: float = 5.0, metadata=None):
    from tandem.v1 import decoding_pb2 as pb
    from tandem.v1 import decoding_pb2_grpc as pb_grpc
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.DecodingStub(channel).Info(pb.InfoRequest(), timeout=timeout_s,
                                                   metadata=metadata)


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)


def several(addresses: Sequence[str]) -> str:
    """The gRPC target naming every verifier in `addresses` (HOST:PORT each, IPv4)."""
    return addresses[0] if len(addresses) == 1 else "ipv4:" + ",".join(addresses)


def prometheus_values(text: str) -> dict[str, float]:
    """Each series' value, summed over its labels, from a Prometheus text page."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
    return values


class VerifierProcess:
    """One `tandem-cloud serve` on 127.0.0.1 with a fixed name, port and metrics port; start()
    again after kill() brings it back on the same ports (a restart: fresh counters)."""

    def __init__(self, name: str, log_dir: Path, args: Sequence[str] = ()) -> None:
        self.name = name
        self.port, self.metrics_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.args = list(args)
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}-{self.starts}.log"

    def start(self, env: dict[str, str] | None = None) -> None:
        """Start the process (not waiting for it: wait_ready)."""
        self.starts += 1
        self.process = launch([command("tandem-cloud"), "serve", "--host", "127.0.0.1", "--port",
                               str(self.port), "--metrics-port", str(self.metrics_port),
                               "--set", f"server.name={self.name}", *self.args],
                              self.log_path, env=env)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Until Info answers (the model is loaded and the port bound)."""
        wait_until(lambda: cloud_info(self.address, 1.0), self.process, f"verifier {self.name}",
                   timeout_s, self.log_path)

    def kill(self) -> None:
        """SIGKILL, as a crash: no stream is closed cleanly."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(15)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)

    def metrics(self) -> dict[str, float]:
        """This process's Prometheus counters now (tandem_verifier_*: opens, prefill tokens)."""
        page = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5.0)
        page.raise_for_status()
        return prometheus_values(page.text)
