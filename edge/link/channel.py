"""The gRPC channel to the verifier (or several: gRPC's own client-side load balancing) and its
call metadata (API key, TLS, keepalive)."""
from __future__ import annotations

import json
import os

import grpc

from edge.config import CloudLinkConfig

# Call metadata carrying the session id (edge/link/verifier_link.py sends it on every call of a
# session): ring_hash hashes it, and so can a proxy (docker/nginx-grpc.conf).
SESSION_HEADER = "x-tandem-session"
# grpcio 1.85 implements ring_hash's requestHashHeader (gRFC A76: ring_hash without xDS) but
# reads it only with this set; without it every pick fails "hash attribute not present".
RING_HASH_HEADER_ENV = "GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY"


def api_key(link: CloudLinkConfig) -> str:
    """The configured key, else the one in the environment variable, else empty (send none)."""
    return link.api_key or (os.environ.get(link.api_key_env, "") if link.api_key_env else "")


def call_metadata(link: CloudLinkConfig) -> tuple[tuple[str, str], ...]:
    key = api_key(link)
    return ((link.api_key_header, key),) if key else ()


def channel_options(link: CloudLinkConfig) -> list[tuple[str, int | str]]:
    # grpc's own reconnect backoff defaults to 1 s growing to 120 s: a returning server would go
    # unseen for minutes. Our client retries on its own schedule, so keep the channel's short.
    options: list[tuple[str, int | str]] = [
        ("grpc.initial_reconnect_backoff_ms", int(link.reconnect_backoff_s * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(link.reconnect_backoff_s * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(link.max_reconnect_backoff_s * 1000)),
    ]
    if link.keepalive_s > 0:
        # HTTP/2 pings, also while idle: a NAT or a mobile link that silently dropped the
        # connection is noticed within keepalive_s + keepalive_timeout_s, not at the next
        # request. The verifier permits pings this often (cloud/server.py). gRPC core enforces
        # an unanswered ping through its ping timeout, not keepalive_timeout_ms (grpc/grpc#39239;
        # measured: a silent peer went unnoticed for 36 s with only the latter), so set both.
        timeout_ms = int(link.keepalive_timeout_s * 1000)
        options += [("grpc.keepalive_time_ms", int(link.keepalive_s * 1000)),
                    ("grpc.keepalive_timeout_ms", timeout_ms),
                    ("grpc.http2.ping_timeout_ms", timeout_ms),
                    ("grpc.keepalive_permit_without_calls", 1),
                    ("grpc.http2.max_pings_without_data", 0)]
    if link.tls and link.tls_server_name:
        options.append(("grpc.ssl_target_name_override", link.tls_server_name))
    return options


def names_several(target: str) -> bool:
    """Whether a gRPC target can name several verifiers: an ipv4:/ipv6: list with a comma, or
    a dns: name (it may resolve to several addresses)."""
    scheme, colon, rest = target.partition(":")
    if scheme in ("ipv4", "ipv6") and colon:
        return "," in rest
    return scheme == "dns" and bool(colon)


def load_balancing(link: CloudLinkConfig, target: str) -> str:
    """The policy for `target`: link.load_balancing, with auto resolved."""
    if link.load_balancing != "auto":
        return link.load_balancing
    return "round_robin" if names_several(target) else "pick_first"


def service_config(policy: str) -> str:
    """gRPC's service config selecting `policy` (ring_hash keyed on the session id)."""
    if policy == "ring_hash":
        return json.dumps({"loadBalancingConfig": [
            {"ring_hash_experimental": {"requestHashHeader": SESSION_HEADER}}]})
    return json.dumps({"loadBalancingConfig": [{policy: {}}]})


def make_channel(link: CloudLinkConfig, address: str | None = None) -> grpc.Channel:
    """A channel to `address` (default: link.address), any gRPC target, balanced by gRPC's
    own policy (link.load_balancing), TLS when the link says so."""
    target = address or link.address
    options = channel_options(link)
    policy = load_balancing(link, target)
    if policy != "pick_first" or link.load_balancing == "pick_first":
        # (auto on one address sets nothing: gRPC's default, as before several were possible)
        options.append(("grpc.service_config", service_config(policy)))
    if policy == "ring_hash":
        os.environ.setdefault(RING_HASH_HEADER_ENV, "true")
    if not link.tls:
        return grpc.insecure_channel(target, options=options)
    root = link.tls_root_cert.read_bytes() if link.tls_root_cert else None
    credentials = grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.secure_channel(target, credentials, options=options)
