"""Cells measured in several processes at once (`tandem bench --workers N`).

Each worker is a spawned process with its own CellBench (verifier on its own loopback port,
draft, link emulators) that takes cells from a shared queue, longest expected first, and
sends every generation back as it finishes. A cell stays in one process, its configurations
interleaved per unit as in a sequential run, so its ratios stay paired; what the workers share is
the machine, whose load then hits every configuration of a unit alike. A cell on a slow link or
a throttled device spends most of its time waiting on the emulated clock, which is why this pays.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import traceback
from collections.abc import Callable, Sequence

from bench.matrix.cell import Cell, CellBench
from bench.matrix.config import BenchConfig
from bench.matrix.results import GenerationSummary

POLL_S = 1.0            # how often the parent looks for a worker that died without a word
LAPTOP_DRAFT_TOKENS_PER_S = 400.0   # an unthrottled draft's rough rate, only to order the cells
STOP_TIMEOUT_S = 30.0


def expected_cost(cell: Cell) -> float:
    """A rough relative duration of a cell, only to hand out the long ones first: per unit one
    round trip and the drafting of a few tokens, times the units (trace offsets)."""
    rate = cell.device.draft_tokens_per_s or LAPTOP_DRAFT_TOKENS_PER_S
    return len(cell.offsets) * (2.0 * cell.profile.delay_ms + 1000.0 / rate)


def run_in_workers(config: BenchConfig, names: Sequence[str], cells: Sequence[Cell],
                   emit: Callable[[GenerationSummary], None]) -> None:
    """Every cell measured by one of min(config.workers, cells) processes; `emit` gets each
    generation in this process. Raises when a worker fails or dies; the others are stopped."""
    context = multiprocessing.get_context("spawn")  # torch, grpc and llama.cpp threads: no fork
    todo, done = context.Queue(), context.Queue()
    for index in sorted(range(len(cells)), key=lambda i: -expected_cost(cells[i])):
        todo.put(index)
    count = min(config.workers, len(cells))
    for _ in range(count):
        todo.put(None)
    threads = max(1, (os.cpu_count() or 1) // count)
    processes = [context.Process(target=_work, args=(config, list(names), list(cells), todo, done, threads),
                                 name=f"bench-worker-{n}") for n in range(count)]
    for process in processes:
        process.start()
    finished = 0
    try:
        while finished < count:
            try:
                kind, payload = done.get(timeout=POLL_S)
            except queue.Empty:
                dead = [p for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"bench worker {dead[0].name} (pid {dead[0].pid}) exited "
                                       f"with code {dead[0].exitcode} before finishing its cells")
                continue
            if kind == "generation":
                emit(payload)
            elif kind == "finished":
                finished += 1
            else:
                raise RuntimeError(f"a bench worker failed:\n{payload}")
    finally:
        for process in processes:
            process.join(timeout=STOP_TIMEOUT_S if finished == count else 0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=STOP_TIMEOUT_S)


def _work(config: BenchConfig, names: list[str], cells: list[Cell], todo, done, threads: int) -> None:
    """A worker's life: load, measure cells until the queue says stop, say finished (or failed)."""
    import torch

    torch.set_num_threads(threads)  # the workers share the machine's cores
    bench = None
    try:
        bench = CellBench(config, names)
        while (index := todo.get()) is not None:
            bench.run(cells[index], lambda g: done.put(("generation", g)))
        done.put(("finished", None))
    except BaseException:  # noqa: BLE001 - the parent re-raises it with the traceback
        done.put(("failed", traceback.format_exc()))
    finally:
        if bench is not None:
            bench.close()
