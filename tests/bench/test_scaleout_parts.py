"""The parts of the scale-out path, each on its own: which gRPC policy a target gets, gRPC's
ring_hash keeping each session on one server and moving it when that server stops (real gRPC
servers on loopback), a proxy's stream reset read as an outage, the NGINX config rendered from
the shipped one (and accepted by nginx where it is installed), the compose `scaleout` profile,
and `tandem load`'s comparison table."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml

from bench.load import server_table, load_report
from bench.nginx import NGINX, TEMPLATE, render
from edge.config import CloudLinkConfig
from edge.link.channel import (SESSION_HEADER, load_balancing, make_channel, names_several,
                               service_config)
from edge.link.errors import FailureKind, classify
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = [f"session-{i}" for i in range(24)]


def test_targets_that_name_several_verifiers_get_round_robin():
    auto = CloudLinkConfig()
    assert names_several("ipv4:127.0.0.1:5001,127.0.0.1:5002")
    assert names_several("dns:///verifiers:50051")
    for one in ("127.0.0.1:50051", "localhost:50051", "ipv4:127.0.0.1:5001", "[::1]:50051"):
        assert not names_several(one), one
        assert load_balancing(auto, one) == "pick_first"
    assert load_balancing(auto, "ipv4:127.0.0.1:5001,127.0.0.1:5002") == "round_robin"
    assert load_balancing(CloudLinkConfig(load_balancing="ring_hash"), "x:1") == "ring_hash"
    ring = json.loads(service_config("ring_hash"))["loadBalancingConfig"][0]
    assert ring == {"ring_hash_experimental": {"requestHashHeader": SESSION_HEADER}}


class _Named(pb_grpc.DecodingServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    def Info(self, request, context) -> pb.InfoReply:
        return pb.InfoReply(verifier=self.name)


@pytest.fixture
def two_servers():
    servers = {}
    for name in ("a", "b"):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DecodingServicer_to_server(_Named(name), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers[name] = (server, port)
    yield servers
    for server, _ in servers.values():
        server.stop(0)


def _served_by(stub, session: str, timeout_s: float = 5.0) -> str:
    metadata = ((SESSION_HEADER, session),)
    return stub.Info(pb.InfoRequest(), metadata=metadata, timeout=timeout_s,
                     wait_for_ready=True).verifier


def test_ring_hash_keeps_each_session_on_one_server_and_moves_only_a_stopped_ones(two_servers):
    target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for _, port in two_servers.values())
    link = CloudLinkConfig(address=target, load_balancing="ring_hash")
    with make_channel(link) as channel:
        stub = pb_grpc.DecodingStub(channel)
        home = {session: _served_by(stub, session) for session in SESSIONS}
        assert set(home.values()) == {"a", "b"}, "ring_hash sent every session to one server"
        for session in SESSIONS:  # affinity: every later call of a session goes home
            assert [_served_by(stub, session) for _ in range(3)] == [home[session]] * 3
        two_servers["a"][0].stop(0).wait()
        # a's sessions move to b, b's stay (each call waits for a ready server, bounded).
        assert {session: _served_by(stub, session) for session in SESSIONS} == \
            dict.fromkeys(SESSIONS, "b")


def test_round_robin_spreads_calls_over_every_server(two_servers):
    target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for _, port in two_servers.values())
    with make_channel(CloudLinkConfig(address=target)) as channel:  # auto: round_robin
        stub = pb_grpc.DecodingStub(channel)
        for _ in range(2):  # both subchannels connected
            _served_by(stub, "warm-up")
        served = [_served_by(stub, "one-session") for _ in range(8)]
    assert served.count("a") == served.count("b") == 4, served


def test_a_proxys_stream_reset_is_an_outage_not_a_refusal():
    reset = classify(grpc.StatusCode.INTERNAL,
                     "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))")
    assert reset.kind is FailureKind.OUTAGE
    own = classify(grpc.StatusCode.INTERNAL, "internal error in the verifier (see its log)")
    assert own.kind is FailureKind.MISCONFIGURED


def test_nginx_config_is_rendered_from_the_shipped_one(tmp_path):
    shipped = TEMPLATE.read_text()
    assert "hash $http_x_tandem_session consistent;" in shipped
    assert "server cloud:50051" in shipped and "server cloud-b:50051" in shipped
    text = render(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"], 7000)
    servers = [line.split()[1] for line in text.splitlines()
               if line.strip().startswith("server ") and ":" in line.split()[1]]
    assert servers == ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
    assert "listen 127.0.0.1:7000 http2;" in text and "cloud-b" not in text.split("upstream")[1]
    assert text.count("max_fails=1 fail_timeout=2s;") == 3
    if NGINX is None:
        return
    config = tmp_path / "nginx.conf"
    config.write_text(text)
    check = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(config), "-e", "stderr",
                            "-g", f"pid {tmp_path / 'nginx.pid'};"], capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check.stderr


DOCKER_COMPOSE = shutil.which("docker-compose")


@pytest.mark.skipif(DOCKER_COMPOSE is None, reason="docker-compose binary not found (Debian: "
                    "apt-get install docker-compose): the scaleout profile is not validated")
def test_compose_scaleout_profile_wires_two_replicas_behind_the_balancer():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    result = subprocess.run([DOCKER_COMPOSE, "-f", str(ROOT / "docker-compose.yml"), "config"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**env, "TANDEM_API_KEY": "k",
                                 "TANDEM_CLOUD_UPSTREAM": "balancer:50051"})
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    balancer, replica = services["balancer"], services["cloud-b"]
    assert balancer["profiles"] == replica["profiles"] == ["scaleout"]
    assert balancer["build"]["dockerfile"] == "docker/Dockerfile.nginx"
    assert "BASE_IMAGE" in balancer["build"]["args"]
    assert {name: dep["condition"] for name, dep in balancer["depends_on"].items()} == \
        {"cloud": "service_healthy", "cloud-b": "service_healthy"}
    assert replica["command"] == services["cloud"]["command"]
    for name in ("cloud", "cloud-b"):  # dns:///verifiers:50051 names both
        assert "verifiers" in services[name]["networks"]["default"]["aliases"]
        assert services[name]["environment"]["TANDEM_CLOUD_SERVER__NAME"] == name
    upstreams = [line.split()[1] for line in TEMPLATE.read_text().splitlines()
                 if line.strip().startswith("server ") and ":" in line.split()[1]]
    assert upstreams == ["cloud:50051", "cloud-b:50051"]
    channel = services["channel"]["command"]
    assert channel[channel.index("--upstream") + 1] == "balancer:50051"
    dockerfile = (ROOT / "docker/Dockerfile.nginx").read_text()
    assert "ARG BASE_IMAGE" in dockerfile and "nginx-grpc.conf" in dockerfile


def test_load_comparison_table_prints():
    report = load_report([], 1.0, 1.0, None, None, {})
    table = server_table(report, report)
    assert "| tandem |" in table and "| cloud-only (k = 0) |" in table
