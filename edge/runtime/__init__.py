"""Draft runtimes behind one interface (base.DraftRuntime): llama.cpp, ONNX Runtime, torch.

`load_draft_runtime(DraftConfig)` picks the backend; each backend's package is imported only
when that backend is asked for, so a device needs just the one it runs."""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from typing import TYPE_CHECKING

from edge.runtime.config import DraftConfig
from edge.runtime.errors import ContextFull, MissingBackend

if TYPE_CHECKING:
    from edge.runtime.base import DraftRuntime, RuntimeSpeed


def __getattr__(name: str):
    # base.py imports torch: loaded on first use, so the CLIs' --help and config checks (which
    # import edge.runtime.config through this package) stay fast.
    if name in ("DraftRuntime", "RuntimeSpeed"):
        from edge.runtime import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["ContextFull", "DraftConfig", "DraftRuntime", "MissingBackend", "RuntimeSpeed",
           "load_draft_runtime"]


@dataclass(frozen=True)
class _BackendPackage:
    module: str        # what the runtime imports
    pip_name: str      # what to install


_PACKAGES = {
    "llama.cpp": _BackendPackage("llama_cpp", "llama-cpp-python"),
    "onnxruntime": _BackendPackage("onnxruntime", "onnxruntime"),
    "torch": _BackendPackage("transformers", "transformers"),
}


def _require(backend: str) -> None:
    package = _PACKAGES[backend]
    try:
        importlib.import_module(package.module)
    except ImportError as exc:
        raise MissingBackend(f"backend {backend!r} needs the package {package.pip_name}: "
                             f"pip install {package.pip_name}") from exc


def load_draft_runtime(config: DraftConfig) -> DraftRuntime:
    _require(config.backend)
    path = config.model_path
    if config.backend == "torch":
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"backend 'torch' needs an HF model directory; no config.json in {path}")
    elif not path.is_file():
        raise FileNotFoundError(f"backend {config.backend!r} needs a model file; not found: {path}")

    if config.backend == "llama.cpp":
        from edge.runtime.llama_runtime import LlamaDraftRuntime
        # The GGUF carries its own vocabulary; the fingerprint is computed from it.
        return LlamaDraftRuntime(path, n_ctx=config.n_ctx, threads=config.threads)
    if config.backend == "onnxruntime":
        from edge.runtime.onnx_runtime import OnnxDraftRuntime
        return OnnxDraftRuntime(path, tokenizer_dir=config.resolved_tokenizer_dir,
                                n_ctx=config.n_ctx, threads=config.threads)
    from edge.runtime.torch_runtime import TorchDraftRuntime
    return TorchDraftRuntime(path, tokenizer_dir=config.resolved_tokenizer_dir,
                             n_ctx=config.n_ctx, threads=config.threads)
