"""make_backend(config): the target backend config.model.backend names, built here beside the
implementations so that the interface (cloud/backend.py) imports none of them."""
from __future__ import annotations

from collections.abc import Callable

from cloud.backend import TargetBackend
from cloud.config import CloudConfig


def make_backend(config: CloudConfig,
                 active_sessions: Callable[[], int] | None = None) -> TargetBackend:
    """torch: the target in this process (TargetRuntime) behind TorchBackend; vllm: a vLLM
    engine (imports vLLM, so only when chosen). active_sessions: how many sessions might join
    a batched pass (the engine sets it when it takes the backend, if not given here)."""
    model = config.model
    if model.backend == "vllm":
        from cloud.runtime.vllm_backend import VllmBackend
        return VllmBackend(model, config.vllm)
    from cloud.runtime.target import TargetRuntime
    from cloud.runtime.torch_backend import TorchBackend
    runtime = TargetRuntime(model.resolved_path(), model.device, model.dtype,
                            name=model.name or None, serving_path=model.serving_path)
    return TorchBackend(runtime, config.batch, active_sessions)
