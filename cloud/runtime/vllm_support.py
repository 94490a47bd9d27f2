"""What vLLM's build on this host can run, checked before its engine starts (a failing start
dies in the engine process after pages of worker tracebacks). Imports vLLM: only on the vLLM
backend's path."""
from __future__ import annotations

from cloud.runtime.serving_path import UnsupportedTarget


def refuse_unsupported_head_dim(family: str, head_dim: int) -> None:
    """vLLM's CPU attention has kernels for some head sizes only; any other dies in the engine
    process after pages of worker tracebacks. Say so in one line before starting it."""
    from vllm.platforms import current_platform
    if current_platform.device_type != "cpu":
        return
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # another vLLM layout: let the engine decide
        return
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise UnsupportedTarget(family, f"vLLM's CPU attention has no kernel for head_dim "
                                        f"{head_dim} (it has {supported})", backend="vllm")
