"""The gRPC channel to the verifier and the metadata every call carries (API key)."""
from __future__ import annotations

import os

import grpc

from edge.config import CloudLinkConfig


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
    if link.tls and link.tls_server_name:
        options.append(("grpc.ssl_target_name_override", link.tls_server_name))
    return options


def make_channel(link: CloudLinkConfig, address: str | None = None) -> grpc.Channel:
    """A channel to `address` (default: link.address), TLS when the link says so."""
    target = address or link.address
    if not link.tls:
        return grpc.insecure_channel(target, options=channel_options(link))
    root = link.tls_root_cert.read_bytes() if link.tls_root_cert else None
    credentials = grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.secure_channel(target, credentials, options=channel_options(link))
