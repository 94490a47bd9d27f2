"""The torch backend: the TargetRuntime (transformers, KV caches in one slot pool) behind the
TargetBackend interface, with the batcher grouping concurrent rounds into one pass and running
their acceptance tests in one batched step (cloud/verify_batch.py)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

from cloud.backend import BackendInfo, TargetBackend
from cloud.batcher import Batcher
from cloud.config import BatchSettings
from cloud.runtime.kv import KVState
from cloud.runtime.target import TargetRuntime
from cloud.verify import RoundCheck
from cloud.verify_batch import verify_rounds
from tandem.sampling import SamplingParams


class TorchBackend(TargetBackend):
    kind = "torch"

    def __init__(self, runtime: TargetRuntime, batch: BatchSettings,
                 active_sessions: Callable[[], int] | None = None) -> None:
        self.runtime = runtime
        self.model_dir = runtime.model_dir
        self.identity = None  # none pinned: the engine identifies the target (cloud/identity.py)
        self.name = runtime.name
        self.fingerprint = runtime.fingerprint
        self.vocab_size = runtime.vocab_size
        self.max_context = runtime.max_context
        self.bytes_per_token = runtime.bytes_per_token
        self.device = str(runtime.device)
        self.dtype = runtime.dtype
        self.position_ms = runtime.position_ms
        self.pass_model = runtime.pass_model
        self.batcher = Batcher(runtime.forward, max_batch=batch.max_batch,
                               window_ms=batch.window_ms, active_sessions=active_sessions,
                               verify=verify_rounds)

    def follow_sessions(self, active_sessions: Callable[[], int]) -> None:
        """The engine's session count: a pass stops waiting once every session is in."""
        self.batcher.follow(active_sessions)

    def new_state(self, params: SamplingParams) -> KVState:
        return self.runtime.new_state()

    def submit(self, state: KVState, tokens: Sequence[int], *, alone: bool = False,
               rows: int | None = None, check: RoundCheck | None = None) -> Future:
        # The pass computes every row anyway; `rows` changes nothing here.
        return self.batcher.submit(state, tokens, alone=alone, check=check)

    def rollback(self, state: KVState, length: int) -> None:
        self.runtime.rollback(state, length)

    def info(self) -> BackendInfo:
        return BackendInfo(kind=self.kind, device=self.device,
                           in_flight=self.batcher.pending(),
                           passes=self.runtime.forward_passes,
                           details={"batches_run": self.batcher.batches_run,
                                    "largest_batch": self.batcher.largest_batch,
                                    "kv_pool_slots": self.runtime.pool.slots,
                                    "kv_pool_capacity": self.runtime.pool.capacity})

    def close(self, timeout: float | None = None) -> None:
        self.batcher.close(timeout=timeout)
