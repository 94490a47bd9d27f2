"""Session KV caches in one preallocated pool, read and written in place by batched passes.

Each session owns a slot: per layer, a contiguous [kv_heads, capacity, head_dim] region of
keys[l] / values[l] = [slots, kv_heads, capacity, head_dim]. A pass writes a session's new
positions into its slot and attention reads the slots where they lie (cloud/runtime/
slot_attention.py): no per-session copy, no padded batch cache. Rollback is a length change;
positions past a session's length are stale and always masked.

The pool grows (more slots, or more capacity per slot, both doubling) only between passes, on
the thread that runs them; free() may come from any thread (an eviction, a session's last
reference going away).
"""
from __future__ import annotations

import heapq
import threading
import weakref

import torch


class KVPool:
    def __init__(self, device: torch.device, max_capacity: int, slots: int = 4,
                 capacity: int = 256) -> None:
        self.device = device
        self.max_capacity = max_capacity              # positions one session may ever hold
        self.slots = slots
        self.capacity = min(capacity, max_capacity)
        self.keys: list[torch.Tensor] = []            # [layer] -> [slots, kv_heads, capacity, D]
        self.values: list[torch.Tensor] = []
        self._free = list(range(slots))               # a heap: lowest free slot first
        # Reentrant: a collected KVState's finalizer frees its slot, and the garbage collector
        # may run that on this thread while it holds the lock (an allocation in _resize).
        self._lock = threading.RLock()
        self.grown = 0                                # reallocations so far (each one a copy)

    @property
    def bytes_per_token(self) -> int:
        """K/V bytes one position costs over all layers (0 before the first pass)."""
        return sum(k[0, :, 0].nbytes + v[0, :, 0].nbytes for k, v in zip(self.keys, self.values))

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds (every slot at full capacity)."""
        return self.slots * self.capacity * self.bytes_per_token

    def layer(self, index: int, kv_heads: int, dims: tuple[int, int],
              dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of layer `index`, allocated at first use (the attention function
        learns the shapes from the model): [slots, kv_heads, capacity, key_dim] and
        [..., value_dim] (dims = (key_dim, value_dim); they differ in some families)."""
        if index == len(self.keys):
            for tensors, dim in zip((self.keys, self.values), dims):
                shape = (self.slots, kv_heads, self.capacity, dim)
                tensors.append(torch.zeros(shape, dtype=dtype, device=self.device))
        assert index < len(self.keys), f"layer {index} before layer {len(self.keys)}"
        return self.keys[index], self.values[index]

    def acquire(self) -> int:
        """A free slot (the lowest), growing the pool when none is left. Pass thread only."""
        with self._lock:
            if not self._free:
                self._resize(self.slots * 2, self.capacity)
            return heapq.heappop(self._free)

    def free(self, slot: int) -> None:
        with self._lock:
            heapq.heappush(self._free, slot)

    def reserve(self, length: int) -> None:
        """Make every slot hold at least `length` positions. Pass thread only."""
        if length > self.max_capacity:
            raise ValueError(f"{length} positions exceed the pool's limit {self.max_capacity}")
        if length > self.capacity:
            capacity = self.capacity
            while capacity < length:
                capacity *= 2
            with self._lock:
                self._resize(self.slots, min(capacity, self.max_capacity))

    def _resize(self, slots: int, capacity: int) -> None:
        """Reallocate every layer (under the lock): slot i keeps its positions."""
        for tensors in (self.keys, self.values):
            for i, old in enumerate(tensors):
                new = old.new_zeros((slots, old.shape[1], capacity, old.shape[3]))
                new[: self.slots, :, : self.capacity] = old
                tensors[i] = new
        self._free.extend(range(self.slots, slots))
        heapq.heapify(self._free)
        self.slots, self.capacity = slots, capacity
        self.grown += 1


class KVState:
    """One session's cache: a slot of the pool (taken at its first pass) and how many
    positions of it are valid."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.slot: int | None = None
        self.length = 0
        self._finalizer: weakref.finalize | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the first `length` positions (what the session table charges)."""
        return self.length * self.pool.bytes_per_token

    def bind(self) -> int:
        """The session's slot, taken now if it has none. Pass thread only."""
        if self.slot is None:
            self.slot = self.pool.acquire()
            # The slot goes back when the session's last reference does, if not released first.
            self._finalizer = weakref.finalize(self, self.pool.free, self.slot)
        return self.slot

    def rollback(self, length: int) -> None:
        """Drop every position >= length (0 <= length <= self.length)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}: the cache holds {self.length} "
                             "positions")
        self.length = length

    def release(self) -> None:
        self.length = 0
        if self._finalizer is not None:
            self._finalizer()  # frees the slot, once
            self._finalizer = None
        self.slot = None
