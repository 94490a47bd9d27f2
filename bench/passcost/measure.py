"""Timing a target's verify passes through the real batched path: TargetRuntime.forward over
sessions held in its KV pool (packed passes, slot attention), exactly what the verifier's worker
runs, without the engine around it.

Per context c (ascending), the largest batch's sessions are filled to c - 1 positions once
(prefill passes of at most `prefill_tokens` tokens); then per batch B and per rep, for every
tokens-per-session n, the first B sessions are rolled back to c - n and one pass feeds n tokens
each (so every pass ends at position c). Reps go round the n's in turn, so a drifting machine
moves every n alike; the first rep is a warm-up and is dropped. CUDA passes are timed to the
device's completion.
"""
from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.passcost.surface import PassPoint

log = logging.getLogger(__name__)

PAD = 0               # the token every timed pass feeds (a pass's cost does not depend on ids)
MEMORY_RESERVE = 0.15  # of the memory free after loading: activations, logits, the allocator


@dataclass
class Grid:
    batches: Sequence[int]
    tokens: Sequence[int]
    contexts: Sequence[int]
    reps: int = 5
    prefill_tokens: int = 1024   # tokens in one prefill pass (bounds its logits' memory)
    deadline: float | None = None  # time.monotonic() past which measuring stops (keeping what
                                   # is done)


def free_memory_bytes(device) -> int:
    """Memory free now on the runtime's device: CUDA's free bytes, else MemAvailable."""
    if device.type == "cuda":
        import torch
        return int(torch.cuda.mem_get_info(device)[0])
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def pool_bytes(sessions: int, context: int, bytes_per_token: int) -> int:
    """What the shipped pool holds for `sessions` at `context`: slots and capacity each grow by
    doubling (cloud/runtime/kv.py: 4 slots, 256 positions to start)."""
    slots, capacity = 4, 256
    while slots < sessions:
        slots *= 2
    while capacity < context:
        capacity *= 2
    return slots * capacity * bytes_per_token


class PassTimer:
    """One runtime, timed. `kv_room` is the memory the K/V may take (free after loading, less a
    reserve); batches whose pool would not fit it are skipped, and say so."""

    def __init__(self, runtime, kv_room: int) -> None:
        self.runtime = runtime
        self.kv_room = kv_room
        self.skipped: list[str] = []
        if runtime.device.type == "cuda":
            import torch
            self._sync = lambda: torch.cuda.synchronize(runtime.device)
        else:
            self._sync = lambda: None

    def fits(self, sessions: int, context: int) -> bool:
        return pool_bytes(sessions, context, self.runtime.bytes_per_token) <= self.kv_room

    def surface(self, grid: Grid,
                progress: Callable[[str], None] = lambda _: None) -> list[PassPoint]:
        points: list[PassPoint] = []
        for context in sorted(grid.contexts):
            if context > self.runtime.max_context or context <= max(grid.tokens):
                self.skipped.append(f"context {context}: outside (max tokens, the target's "
                                    f"{self.runtime.max_context}]")
                continue
            batches = [b for b in sorted(grid.batches) if self.fits(b, context)]
            self.skipped += [f"B={b} at context {context}: its K/V would not fit"
                             for b in grid.batches if b not in batches]
            if not batches:
                continue
            if grid.deadline and time.monotonic() > grid.deadline:
                self.skipped.append(f"context {context}: out of time")
                continue
            states = [self.runtime.new_state() for _ in range(max(batches))]
            try:
                progress(f"context {context}: filling {len(states)} sessions")
                self.fill(states, context - 1, grid.prefill_tokens)
                for batch in batches:
                    if grid.deadline and time.monotonic() > grid.deadline:
                        self.skipped.append(f"B={batch} at context {context}: out of time")
                        continue
                    points += self.cell(states[:batch], grid.tokens, context, grid.reps)
                    progress(f"context {context} B={batch}: " + ", ".join(
                        f"n={p.tokens} {p.ms:.2f} ms" for p in points[-len(grid.tokens):]))
            finally:
                for state in states:
                    state.release()
        return points

    def fill(self, states, length: int, budget: int) -> None:
        """Every state to `length` positions, in passes of at most `budget` tokens."""
        chunk = max(1, min(length, budget))
        per_pass = max(1, budget // chunk)
        while True:
            behind = [s for s in states if s.length < length][:per_pass]
            if not behind:
                return
            self.runtime.forward([(s, [PAD] * min(chunk, length - s.length)) for s in behind])
            self._sync()

    def cell(self, states, tokens: Sequence[int], context: int, reps: int) -> list[PassPoint]:
        times: dict[int, list[float]] = {n: [] for n in tokens}
        for rep in range(reps + 1):
            for n in tokens:
                for state in states:
                    state.rollback(context - n)
                self._sync()
                began = time.perf_counter()
                self.runtime.forward([(state, [PAD] * n) for state in states])
                self._sync()
                if rep:
                    times[n].append((time.perf_counter() - began) * 1000.0)
        for state in states:
            state.rollback(context - 1)
        return [PassPoint(len(states), n, context, statistics.median(ms), min(ms), max(ms), len(ms))
                for n, ms in times.items()]


PROBE_SESSIONS, PROBE_PAST, PROBE_K = 8, 64, 8   # TargetRuntime.position_ms's probe


def paired_probe(runtime, rounds: int, reps: int = 5) -> list[tuple[float, float]]:
    """The verifier's own c (TargetRuntime.position_ms, measured once per runtime and cached,
    so taken here through its function) and the same c read off this timer's passes (8
    sessions, 1 and 9 tokens each, ending at position 73), one after the other `rounds`
    times: the same load on both, so their spreads say whether they agree. (probe, timer) ms."""
    measure = type(runtime).pass_model.func  # measured afresh each time
    timer = PassTimer(runtime, kv_room=0)
    context = PROBE_PAST + 1 + PROBE_K
    states = [runtime.new_state() for _ in range(PROBE_SESSIONS)]
    pairs = []
    try:
        timer.fill(states, context - 1, 1024)
        for _ in range(rounds):
            probe = measure(runtime).position_ms
            narrow, wide = timer.cell(states, [1, 1 + PROBE_K], context, reps)
            pairs.append((probe, max(wide.ms - narrow.ms, 0.0) / (PROBE_SESSIONS * PROBE_K)))
    finally:
        for state in states:
            state.release()
    return pairs
