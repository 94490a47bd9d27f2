"""NGINX (Debian's package) as the gRPC balancer in front of verifiers on loopback, from the
shipped docker/nginx-grpc.conf: its `listen` line and its upstream `server` lines are rewritten
to loopback ports, everything else (the session-id hash, fail-over, timeouts) is the shipped
file's. Started as a foreground process in its own prefix folder, stopped by its PID.
"""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench.processes import ROOT, free_port, stop_process, wait_until

TEMPLATE = ROOT / "docker" / "nginx-grpc.conf"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)

_TEMP = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
_SERVER = re.compile(r"^(\s*)server \S+:\d+( [^;]*)?;\n", re.M)
_SERVERS = re.compile(r"(?:^\s*server \S+:\d+[^;]*;\n)+", re.M)
_LISTEN = re.compile(r"^(\s*)listen \d+ http2;\s*$", re.M)


def render(upstreams: Sequence[str], port: int, template: str | None = None) -> str:
    """The shipped config with `listen 127.0.0.1:port http2;` and one upstream `server` line
    per HOST:PORT in `upstreams` (the shipped lines' parameters kept)."""
    text = template if template is not None else TEMPLATE.read_text()
    shipped = _SERVER.findall(text)
    if not shipped or len(_LISTEN.findall(text)) != 1:
        raise ValueError(f"{TEMPLATE}: expected upstream `server` lines and one `listen` line")
    indent, params = shipped[0]
    lines = "".join(f"{indent}server {address}{params};\n" for address in upstreams)
    text = _SERVERS.sub(lambda _: lines, text, count=1)
    return _LISTEN.sub(lambda m: f"{m.group(1)}listen 127.0.0.1:{port} http2;", text)


class NginxProxy:
    """nginx in front of `upstreams` on 127.0.0.1:port (a free one)."""

    def __init__(self, upstreams: Sequence[str], folder: Path) -> None:
        if NGINX is None:
            raise FileNotFoundError("nginx is not installed (Debian: apt-get install nginx-light)")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "nginx.conf"
        # Its own temp folders too (the package's are under /var/lib/nginx, root's).
        temp = "".join(f"    {name}_temp_path {folder / name};\n" for name in _TEMP)
        self.config.write_text(render(upstreams, self.port).replace("http {\n",
                                                                    "http {\n" + temp, 1))
        self.log_path = folder / "nginx.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        # Its own prefix and pid file: no root-owned default path is touched.
        for name in _TEMP:
            (self.folder / name).mkdir(exist_ok=True)
        directives = (f"daemon off; pid {self.folder / 'nginx.pid'};")
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [NGINX, "-p", str(self.folder), "-c", str(self.config), "-e", "stderr",
                 "-g", directives], stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: _accepts(self.port), self.process, "nginx", timeout_s, self.log_path)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)


def _accepts(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1.0):
        return True
