"""`--set` with keys that also have named flags, as users run the commands (real processes):
`tandem-cloud serve --set server.port=P --set model.path=DIR` listens on P and serves DIR,
`tandem-edge serve --set daemon.port=P` listens on P, and `tandem capacity --cloud-set
model.path=DIR` starts its verifier on DIR (its own --port named beside it)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.capacity.cli import options_of
from bench.capacity.servers import start_verifier
from bench.cli import build_parser
from bench.processes import cloud_info, free_port, stop_process, wait_until

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START_S = 120.0


def spawn(argv: list[str], log_path: Path) -> subprocess.Popen:
    with log_path.open("wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def test_cloud_serve_listens_on_the_set_port_and_loads_the_set_model(tmp_path, draft_dir):
    port = free_port()
    log = tmp_path / "cloud.log"
    # The draft's HF directory as the target: a model the shipped config does not name.
    process = spawn([str(BIN / "tandem-cloud"), "serve", "--config", "configs/cloud.yaml",
                     "--set", f"server.port={port}", "--set", f"model.path={draft_dir}",
                     "--set", "model.device=cpu", "--set", "model.threads=1"], log)
    try:
        wait_until(lambda: cloud_info(f"127.0.0.1:{port}"), process, "tandem-cloud", START_S, log)
        info = cloud_info(f"127.0.0.1:{port}")
    finally:
        stop_process(process)
    assert (info.model, info.device) == (draft_dir.name, "cpu")


def test_edge_serve_listens_on_the_set_port(tmp_path):
    port = free_port()
    log = tmp_path / "edge.log"
    # No verifier: the daemon still listens (its /health says "starting").
    process = spawn([str(BIN / "tandem-edge"), "serve", "--cloud", "127.0.0.1:1",
                     "--set", f"daemon.port={port}", "--set", "daemon.pool_size=1"], log)
    try:
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/version").status_code == 200,
                   process, "tandem-edge", START_S, log)
        health = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
    finally:
        stop_process(process)
    assert health["pool_size"] == 1


def test_capacity_cloud_set_model_path_reaches_its_verifier(tmp_path, draft_dir):
    args = build_parser().parse_args(["capacity", "--cloud-set", f"model.path={draft_dir}"])
    options = options_of(args)
    server = start_verifier(ROOT / "configs/cloud.yaml", 0, tmp_path, max_users=1,
                            sets=options.cloud_sets)
    try:
        info = cloud_info(server.address)
    finally:
        server.close()
    assert info.model == draft_dir.name
