"""The cloud verifier's configuration: one typed schema, validated from configs/cloud.yaml."""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tandem.config import Settings, resolve_path


class ServerSettings(Settings):
    host: str = Field("127.0.0.1", description="address to bind; loopback by default")
    port: int = Field(50051, ge=0, le=65535, description="TCP port; 0 picks a free one")
    max_workers: int = Field(32, ge=2, le=1024, description=(
        "gRPC worker threads; each open stream holds one, so this bounds concurrent streams "
        "(one more is answered RESOURCE_EXHAUSTED)"))
    tls_cert: Path | None = Field(None, description="PEM certificate chain; TLS when set with "
                                  "tls_key")
    tls_key: Path | None = Field(None, description="PEM private key for tls_cert")
    api_keys: tuple[str, ...] = Field((), description=(
        "accepted API keys (metadata 'x-api-key: KEY' or 'authorization: Bearer KEY'); "
        "none = no authentication"))
    api_keys_env: str | None = Field(None, description=(
        "name of an environment variable holding more accepted keys, comma-separated"))
    allow_insecure_public: bool = Field(False, description=(
        "allow serving a non-loopback address without any API key"))
    shutdown_grace_s: float = Field(5.0, ge=0, le=300, description=(
        "on stop, how long in-flight rounds may finish before streams are cancelled"))

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("server.tls_cert and server.tls_key must be set together")
        return self

    def resolved_api_keys(self) -> tuple[str, ...]:
        """Keys from the config plus those in the environment variable named by api_keys_env."""
        keys = list(self.api_keys)
        if self.api_keys_env:
            keys += [key.strip() for key in os.environ.get(self.api_keys_env, "").split(",")]
        return tuple(key for key in keys if key)

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False  # a host name: assume it is reachable from elsewhere


class ModelSettings(Settings):
    path: Path = Field(Path("models/tandem-target"), description=(
        "local HF causal-LM directory; relative paths resolve against the current directory, "
        "then the repository root"))
    name: str = Field("", description=(
        "name the target is served as (Info.model; Open.model must match it or be empty); "
        "empty = the directory's name"))
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
                        description="auto = cuda when available, else cpu")
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="weights and KV dtype")
    threads: int = Field(0, ge=0, le=256, description="torch CPU threads; 0 = torch's default")

    def resolved_path(self) -> Path:
        return resolve_path(self.path)


class LimitSettings(Settings):
    max_draft_length: int = Field(16, ge=0, le=256,
                                  description="most tokens one block may carry (k)")
    max_context: int = Field(0, ge=0, le=1_048_576, description=(
        "most context tokens per session; 0 = the target's own limit (never above it)"))
    max_q_entries: int = Field(64, ge=1, le=65_536,
                               description="most ids one SparseDistribution may list")
    max_sessions: int = Field(64, ge=1, le=100_000,
                              description="open sessions at once (LRU-evicted beyond)")
    kv_budget_bytes: int = Field(512 * 2**20, ge=1, description=(
        "KV-cache bytes all sessions may hold together; least recently used idle sessions are "
        "evicted beyond it"))


class BatchSettings(Settings):
    window_ms: float = Field(2.0, ge=0, le=1000, description=(
        "how long the first waiting round waits for other sessions to join its forward pass"))
    max_batch: int = Field(16, ge=1, le=1024, description="most sessions in one forward pass")


class CloudConfig(Settings):
    server: ServerSettings = ServerSettings()
    model: ModelSettings = ModelSettings()
    limits: LimitSettings = LimitSettings()
    batch: BatchSettings = BatchSettings()
