"""The target-backend interface: what the verifier engine needs from whatever runs the target.

The engine (cloud/engine.py) owns sessions, limits and the acceptance test; a backend only runs
the target. Two implement it:

  torch  cloud/runtime/torch_backend.py  the embedded default: transformers in this process,
                                         KV caches in one slot pool, the batcher's passes
  vllm   cloud/runtime/vllm_backend.py   a vLLM AsyncLLM engine: paged KV cache, continuous
                                         batching, prefix caching, tensor/pipeline/data parallel

cloud/runtime/factory.py make_backend(config) builds the one config.model.backend names; this
module imports neither implementation.

A session's life on a backend:
  state = backend.new_state(params)                        open (sampling fixed for its life)
  backend.submit(state, context[:-1], alone=True, rows=0)     prefill
  backend.submit(state, [pending] + block, rows=k + 1, check=check)
                                                           score a block: [k + 1, vocab], and
                                                           maybe its verdict
  backend.rollback(state, start + accepted)                keep the accepted prefix only
  backend.release(state)                                   evicted or closed

Rows are float32 logits. A backend may leave -inf on ids the session's warp can never give
mass to (vLLM returns only what the session needs: the argmax for greedy, the top_k for
top-k sampling); the warp (tandem.sampling.warp) and the greedy test then give exactly what
the full row would. A setting the backend cannot score exactly is refused at Open by
check_sampling, naming the setting; it is never approximated.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cloud.identity import TargetIdentity
from cloud.verify import RoundCheck
from tandem.sampling import SamplingParams

if TYPE_CHECKING:
    from cloud.batcher import Batcher
    from cloud.token_cost import PassModel


class BackendState(Protocol):
    """A session's target-side state: what has been fed (`length` positions) and whatever the
    backend keeps for it (a KV cache, or only the token ids when the engine caches by prefix)."""

    @property
    def length(self) -> int: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class BackendInfo:
    """What a backend reports about itself (Info, logs, metrics, benchmarks)."""
    kind: str                 # "torch" | "vllm"
    device: str               # e.g. "cpu", "cuda:0", "cpu x1 (vllm)"
    in_flight: int            # scoring requests running or queued now
    passes: int               # batched passes (torch) or engine requests (vllm) so far
    details: dict[str, Any]   # backend-specific, plain values only


class TargetBackend(abc.ABC):
    """Runs the target for the engine. submit() is thread-safe; everything else is called by
    the one thread that holds the session (the engine never scores a session twice at once)."""

    kind: str
    name: str               # served model name (Info.model; Open.model must match)
    fingerprint: str        # tokenizer fingerprint (tandem.fingerprint)
    vocab_size: int
    max_context: int        # most positions a session may hold on this backend
    bytes_per_token: int    # KV bytes one position costs (what the session table charges)
    device: str
    dtype: str
    model_dir: Path         # the target's directory (its identity is hashed from it)
    # The served identity when the backend pins one; None: the engine hashes model_dir, name
    # and fingerprint (cloud/identity.py).
    identity: TargetIdentity | None = None
    # The backend's own batcher when it groups rounds into passes (torch), read for Info's batch
    # sizes; None where the engine behind it batches (vLLM).
    batcher: Batcher | None = None
    # What one more fed position adds to a batched pass, ms, measured at start (cloud/
    # pass_cost.py); None: this backend does not measure it (edges use their own estimate).
    position_ms: float | None = None
    # What a pass costs by its parts (cloud/token_cost.py), measured at start with
    # position_ms; None: not measured (each pass is then shared equally).
    pass_model: PassModel | None = None

    @abc.abstractmethod
    def new_state(self, params: SamplingParams) -> BackendState:
        """An empty state for a session that samples with `params` (checked already)."""

    @abc.abstractmethod
    def submit(self, state: BackendState, tokens: Sequence[int], *, alone: bool = False,
               rows: int | None = None, check: RoundCheck | None = None) -> Future:
        """Append tokens to the session; the future resolves to a cloud.batcher.ForwardResult
        whose logits are [len(tokens), vocab], row j = the distribution after tokens[j].
        rows = how many of the last rows the caller reads (None = all): a backend may leave the
        others NaN; rows=0 (a prefill nobody reads) may give [0, vocab]. alone=True: a long
        job (prefill) that should not share a pass with rounds. check: the round's acceptance
        test (cloud.verify.RoundCheck); a backend that runs it with the pass (batched, on the
        pass's thread) puts the Verdict in ForwardResult.verdict, one that does not leaves
        None and the engine runs it."""

    @abc.abstractmethod
    def rollback(self, state: BackendState, length: int) -> None:
        """Drop every position >= length."""

    def release(self, state: BackendState) -> None:
        state.release()

    def follow_sessions(self, active_sessions: Callable[[], int]) -> None:
        """Told the engine's live session count once, at start: a backend whose passes wait
        for every session's job (the torch batcher) stops waiting once all are in. Default:
        nothing to follow."""

    def check_sampling(self, params: SamplingParams) -> None:
        """Raise cloud.errors.InvalidRequest naming the setting when this backend cannot score
        `params` exactly. Default: every setting tandem.sampling knows is exact."""

    @abc.abstractmethod
    def info(self) -> BackendInfo: ...

    @abc.abstractmethod
    def close(self, timeout: float | None = None) -> None:
        """Finish what is queued, then stop; submit() afterwards raises Unavailable."""
