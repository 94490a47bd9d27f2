"""Domain errors of the draft runtimes; the session client and daemon map them to user messages."""
from __future__ import annotations


class MissingBackend(RuntimeError):
    """The Python package a configured backend needs is not installed (the message names it)."""


class ContextFull(ValueError):
    """An extend would put more tokens in the KV cache than the runtime's n_ctx."""
