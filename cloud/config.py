"""The cloud verifier's configuration: one typed schema, validated from configs/cloud.yaml."""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from tandem.config import Settings, resolve_path


class ServerSettings(Settings):
    host: str = Field("127.0.0.1", description="address to bind; loopback by default")
    port: int = Field(50051, ge=0, le=65535, description="TCP port; 0 picks a free one")
    metrics_port: int | None = Field(None, ge=0, le=65535, description=(
        "port of the Prometheus endpoint (GET /metrics over HTTP, on `host`); None = none; "
        "0 = a free port"))
    max_workers: int = Field(32, ge=2, le=1024, description=(
        "concurrent Session streams (each holds one gRPC worker thread; one more is answered "
        "RESOURCE_EXHAUSTED); the pool has a few threads more, so Info and health always answer"))
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
    name: str = Field("", max_length=256, description=(
        "this verifier's name in Opened and Info (with several verifiers behind a balancer, "
        "edges count the sessions that moved between them) and its log; empty = HOSTNAME:PORT"))

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
    backend: Literal["torch", "vllm"] = Field("torch", description=(
        "what runs the target: torch = transformers in this process (the embedded default); "
        "vllm = a vLLM engine (paged KV cache, continuous batching, prefix caching, tensor/"
        "data parallel; needs the vLLM environment: scripts/bootstrap.sh --vllm, see the "
        "`vllm` section)"))

    serving_path: Literal["auto", "slots", "exact"] = Field("auto", description=(
        "torch backend: how the target's passes run. auto = the batched slot pool when the "
        "load-time self-test shows it gives the model's own logits, else the exact path (the "
        "model's own attention, one session per pass, slower); slots = the slot pool or refuse "
        "to load; exact = always the exact path (`tandem-cloud check DIR` says which)"))

    def resolved_path(self) -> Path:
        return resolve_path(self.path)


class LimitSettings(Settings):
    max_draft_length: int = Field(16, ge=0, le=256,
                                  description="most tokens one block may carry (k)")
    max_context: int = Field(0, ge=0, le=1_048_576, description=(
        "most context tokens per session; 0 = the target's own limit (never above it)"))
    max_q_entries: int = Field(64, ge=1, le=65_536,
                               description="most ids one SparseDistribution may list")
    coded_q: bool = Field(True, description=(
        "accept entropy-coded draft distributions (Draft.q_coded, tandem/qcodec.py) from edges "
        "that offer the same format; False = SparseDistribution messages only"))
    max_sessions: int = Field(64, ge=1, le=100_000,
                              description="open sessions at once (LRU-evicted beyond)")
    kv_budget_bytes: int = Field(512 * 2**20, ge=1, description=(
        "KV-cache bytes all sessions may hold together; least recently used idle sessions are "
        "evicted beyond it"))
    max_message_bytes: int = Field(4 * 2**20, ge=1024, le=2**31 - 1, description=(
        "largest ClientMessage accepted, checked by gRPC before it is decoded "
        "(RESOURCE_EXHAUSTED beyond)"))
    open_timeout_s: float = Field(10.0, gt=0, le=3600, description=(
        "a stream that sends no Open within this long after it starts is closed "
        "(DEADLINE_EXCEEDED), so silent connections cannot hold workers"))
    idle_timeout_s: float = Field(60.0, gt=0, le=86_400, description=(
        "a stream that sends nothing for this long between rounds is closed "
        "(DEADLINE_EXCEEDED); the edge re-opens with its full context"))
    max_streams_per_key: int = Field(0, ge=0, le=100_000, description=(
        "open streams one API key (or all callers without one) may hold; 0 = no per-key limit "
        "(server.max_workers bounds all)"))
    max_in_flight: int = Field(4, ge=1, le=64, description=(
        "most Draft blocks one session may have in flight (send-ahead, Draft.ahead); a Draft "
        "declaring more is refused INVALID_ARGUMENT; 1 = no send-ahead"))
    max_generate_tokens: int = Field(256, ge=0, le=65_536, description=(
        "most tokens one Generate (cloud-generates) may ask for; 0 = Generate not served"))
    draft_tokens_per_s_per_key: float = Field(0.0, ge=0, description=(
        "draft tokens per second one API key may send (token bucket, bursts of one second or "
        "one block); beyond it a round is refused RESOURCE_EXHAUSTED with a retry hint; 0 = "
        "unlimited"))


class BatchSettings(Settings):
    window_ms: float = Field(2.0, ge=0, le=1000, description=(
        "how long the first waiting round waits for other sessions to join its forward pass"))
    max_batch: int = Field(64, ge=1, le=1024, description=(
        "most sessions in one forward pass (passes read the KV slots in place: one pass for all "
        "waiting sessions is the cheapest)"))
    target_queue_ms: float = Field(10.0, ge=0, le=60_000, description=(
        "the verifier's price (cloud/price.py: edges that read it spend fewer passes per token "
        "while it is high) is 0 while rounds wait at most this long for their forward pass "
        "(smoothed) and rises to 1 at twice this; 0 = always 1, a very large value = always 0"))


class VllmSettings(Settings):
    """vLLM engine arguments that matter for verification (model.backend: vllm); anything else
    vLLM's AsyncEngineArgs takes goes in engine_args."""
    tensor_parallel_size: int = Field(1, ge=1, le=64, description=(
        "GPUs one copy of the target is split over (tensor parallel)"))
    pipeline_parallel_size: int = Field(1, ge=1, le=64, description="pipeline stages")
    data_parallel_size: int = Field(1, ge=1, le=64, description=(
        "engine replicas behind this one server; a session's rows always go to the same "
        "replica, so its prefix cache is reused"))
    max_model_len: int = Field(0, ge=0, le=1_048_576, description=(
        "positions per sequence; 0 = the target's own limit (limits.max_context is capped by "
        "it)"))
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description=(
        "share of each GPU's memory vLLM may take (weights + KV cache); CUDA only"))
    cpu_kv_cache_gib: int = Field(1, ge=1, le=1024, description=(
        "KV-cache GiB on a CPU host (VLLM_CPU_KVCACHE_SPACE, unless that is set already)"))
    dtype: Literal["float32", "float16", "bfloat16"] | None = Field(None, description=(
        "weights and KV dtype; None = model.dtype"))
    enable_prefix_caching: bool = Field(True, description=(
        "reuse cached KV blocks of shared prefixes: each round's rows and every re-open after "
        "an eviction recompute only the tokens past the last full cached block"))
    block_size: int = Field(32, ge=16, le=1024, multiple_of=16, description=(
        "KV-cache block (tokens); the prefix cache reuses whole blocks only, so a round "
        "recomputes up to one block per row: small blocks suit verification"))
    max_num_seqs: int = Field(256, ge=1, le=65_536, description=(
        "requests per engine step; a round of k draft tokens is k + 1 requests"))
    max_num_batched_tokens: int = Field(0, ge=0, description=(
        "tokens per engine step; 0 = vLLM's default"))
    enforce_eager: bool = Field(True, description=(
        "no CUDA graphs / torch.compile: starts in seconds; rounds are prefill-shaped, so "
        "graphs gain little"))
    max_logprobs: int = Field(0, ge=0, description=(
        "most logits returned per row for sampled sessions; 0 = the whole vocabulary. A "
        "sampled session needs top_k + 1 per row (the whole vocabulary without top_k): one "
        "that needs more is refused at Open, naming the setting"))
    scoring: Literal["auto", "per_round", "per_row"] = Field("auto", description=(
        "how a round's rows are scored: auto = one request per round where the engine takes "
        "prompt_logprob_token_ids (probed at start), else one request per row; per_round "
        "skips the probe; per_row never tries. A refused per-round request falls back to "
        "per row for good, saying so in the log"))
    seed: int = Field(0, description="vLLM's seed (its own sampling is not used: rows only)")
    engine_args: dict[str, Any] = Field(default_factory=dict, description=(
        "more vllm.AsyncEngineArgs fields, passed as they are (e.g. {quantization: fp8})"))


class CloudConfig(Settings):
    server: ServerSettings = ServerSettings()
    model: ModelSettings = ModelSettings()
    limits: LimitSettings = LimitSettings()
    batch: BatchSettings = BatchSettings()
    vllm: VllmSettings = VllmSettings()
