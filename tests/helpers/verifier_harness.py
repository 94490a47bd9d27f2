"""What the full-system tests share: a real verifier (cloud.server.create_server) on a real
loopback socket, edge clients with real draft runtimes, and the reference the output must equal
(transformers' greedy generate of the target alone)."""
from __future__ import annotations

import concurrent.futures
import functools
import os
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from cloud.config import BatchSettings, CloudConfig, LimitSettings, ModelSettings, ServerSettings
from cloud.runtime.target import TargetRuntime
from cloud.server import CloudServer, create_server
from edge.client import EdgeClient
from edge.config import ClientConfig, CloudLinkConfig
from edge.link import make_channel
from edge.request import GenerationRequest
from edge.runtime import DraftConfig, DraftRuntime, load_draft_runtime
from edge.tokenizer import EdgeTokenizer

BACKENDS = ("llama.cpp", "onnxruntime", "torch")
# The same tests on other hardware: TANDEM_TEST_DEVICE=cuda puts the verifier's target on the
# GPU (the reference stays transformers on the CPU); TANDEM_TEST_DRAFT_BACKEND=torch drafts with
# that runtime wherever a test asks for another (a host without llama.cpp).
TEST_DEVICE = os.environ.get("TANDEM_TEST_DEVICE", "cpu")
TEST_DRAFT_BACKEND = os.environ.get("TANDEM_TEST_DRAFT_BACKEND", "")


def start_verifier(runtime: TargetRuntime, *, port: int = 0, window_ms: float = 0.0,
                   api_keys: tuple[str, ...] = (), tls: tuple[Path, Path] | None = None,
                   **limits) -> tuple[CloudServer, int]:
    """A started verifier on 127.0.0.1:port (0 = a free one) serving the shared runtime;
    tls = (certificate, key) PEM files."""
    cert, key = tls if tls else (None, None)
    config = CloudConfig(
        server=ServerSettings(host="127.0.0.1", port=port, api_keys=api_keys, shutdown_grace_s=0,
                              tls_cert=cert, tls_key=key),
        model=ModelSettings(path=runtime.model_dir, device=TEST_DEVICE),
        limits=LimitSettings(**limits), batch=BatchSettings(window_ms=window_ms))
    server, bound = create_server(config, runtime)
    server.start()
    return server, bound


def open_draft(backend: str, draft_dir: Path, gguf_path: Path, onnx_path: Path,
               threads: int = 1) -> DraftRuntime:
    backend = TEST_DRAFT_BACKEND or backend
    path = {"llama.cpp": gguf_path, "onnxruntime": onnx_path, "torch": draft_dir}[backend]
    return load_draft_runtime(DraftConfig(backend=backend, model_path=path, tokenizer_dir=draft_dir,
                                          n_ctx=1024, threads=threads))


def channel_to(port: int, link: CloudLinkConfig | None = None) -> grpc.Channel:
    return make_channel(link or CloudLinkConfig(), f"127.0.0.1:{port}")


def client_for(channel: grpc.Channel, draft: DraftRuntime, metadata=(), **config) -> EdgeClient:
    return EdgeClient(channel, draft, ClientConfig(**config), metadata=metadata)


def generate_concurrently(port: int, drafts: Sequence[DraftRuntime], prompts: Sequence[list[int]],
                          draft_lengths: Sequence[int], new_tokens: int) -> list:
    """One edge client per draft, all at once against the verifier on `port`: their results."""
    def one(job) -> object:
        draft, prompt, k = job
        return client_for(channel_to(port), draft).generate(
            GenerationRequest(prompt, new_tokens, draft_length=k))
    with concurrent.futures.ThreadPoolExecutor(len(drafts)) as pool:
        return list(pool.map(one, zip(drafts, prompts, draft_lengths)))


class Reference:
    """transformers' greedy generate of the target alone, eos stopping off (the edge side runs
    with no stop ids), so both produce exactly max_new_tokens tokens."""

    def __init__(self, target_dir: Path) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        self._cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    @torch.no_grad()
    def greedy(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(prompt_ids), max_new_tokens)
        if key not in self._cache:
            config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                      min_new_tokens=0, eos_token_id=None, pad_token_id=0)
            out = self.model.generate(torch.tensor([prompt_ids]), generation_config=config)
            self._cache[key] = out[0, len(prompt_ids):].tolist()
            assert len(self._cache[key]) == max_new_tokens, "generate stopped early"
        return self._cache[key]


# Loaded once per process: the test modules that import these fixtures share them.
@functools.cache
def _target_runtime(target_dir: Path) -> TargetRuntime:
    return TargetRuntime(target_dir, device=TEST_DEVICE)


@functools.cache
def _reference(target_dir: Path) -> Reference:
    return Reference(target_dir)


@pytest.fixture(scope="session")
def target_runtime(target_dir) -> TargetRuntime:
    return _target_runtime(target_dir)


@pytest.fixture(scope="session")
def reference(target_dir) -> Reference:
    return _reference(target_dir)


@pytest.fixture(scope="session")
def edge_tokenizer(draft_dir) -> EdgeTokenizer:
    return EdgeTokenizer(draft_dir)


@pytest.fixture(scope="session")
def prompt_ids(heldout_prompts, edge_tokenizer) -> list[list[int]]:
    """The held-out prompts as token ids, in the fixture's fixed order."""
    return [edge_tokenizer.encode(p) for p in heldout_prompts]


@pytest.fixture(scope="module")
def verifier(target_runtime):
    """A verifier with default limits for a module's tests: yields its port."""
    server, port = start_verifier(target_runtime)
    yield port
    server.stop(0).wait()
