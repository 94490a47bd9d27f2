"""Groups the forward passes that many sessions ask for at about the same time into one.

Each session thread submits (kv_state, new_tokens) and waits on a future; one worker thread
takes the first waiting job, gathers more for up to `window_ms` (or until every active session
has a job in, or `max_batch` is reached), and runs them as a single batched forward pass.
Prompt jobs (prefills, `alone`) never share a pass with rounds: the attention lays queries out
one row per session, so one 1000-token prompt would pad every 9-token round to 1000. They share
passes with each other instead (whatever prompts wait, up to PROMPT_PASS_TOKENS tokens a pass),
before the rounds gathered with them (as vLLM's scheduler puts prefills first: a request's
time to first token waits on its prompt, a round's next token only on a share of its TPOT).

A job may carry its round's acceptance test (cloud.verify.RoundCheck): with a `verify`
function the worker runs the test of every round in the pass in one batched step right after
it (cloud.verify_batch.verify_rounds) and hands each session its verdict, so a session's
thread does no tensor work between submit and reply.

A job submitted while no other session is open and nothing is queued runs on the submitting
thread itself (the pass lock keeps passes one at a time): a lone session does not pay two
thread hand-offs per round.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from cloud.errors import Unavailable

log = logging.getLogger(__name__)
_here = threading.local()  # per thread: CPU ms of the passes it ran (passes_cpu_ms_here)

# forward(batch) -> logits per job; batch[i] = (kv_state, new_tokens), result[i] = [n_i, vocab]
ForwardFn = Callable[[Sequence[tuple[Any, Sequence[int]]]], Sequence[torch.Tensor]]
# verify(checks, logits) -> per job a Verdict, the exception refusing it, or None (no check)
VerifyFn = Callable[[Sequence[Any], Sequence[torch.Tensor]], list[Any]]


@dataclass(frozen=True)
class ForwardResult:
    logits: torch.Tensor  # [len(new_tokens), vocab]
    queue_ms: float       # from submit until the batch's pass began
    forward_ms: float     # the batched pass
    batch_size: int       # jobs in that pass
    verdict: Any = None   # cloud.verify.Verdict when the pass's thread ran the round's test
    verify_ms: float = 0.0  # that batched test (shared by the pass's rounds)
    positions: int = 0      # tokens the pass fed, all its jobs together (0: not counted)
    cpu_ms: float | None = None  # CPU time of the pass's thread, forward pass and test (its
                                 # whole cost where torch runs on that one thread)
    ones: int = 0           # jobs in the pass feeding one position (the rest: drafted blocks)
    weight: float = 1.0     # round passes since this job's session's previous job, at most
                            # ROUND_GAP_CAP (cloud/token_cost.py: its part of the fixed cost)
    weights: float = 0.0    # the pass's jobs' weights together (0: not counted)


@dataclass
class _Job:
    state: Any
    tokens: Sequence[int]
    alone: bool
    check: Any = None     # cloud.verify.RoundCheck or None
    future: Future = field(default_factory=Future)
    submitted: float = field(default_factory=time.perf_counter)


_STOP = object()
ROUND_GAP_CAP = 16  # the most passes one job's weight counts (cloud/token_cost.py): a session
                    # back from a pause (its user's think time) is not charged for passes it
                    # was not there for
PROMPT_PASS_TOKENS = 2048  # the most prompt tokens one pass of prompts takes (its attention
                           # pads each to the longest of them)


class Batcher:
    """A worker thread that runs `forward` on batches of jobs; submit() is thread-safe."""

    def __init__(self, forward: ForwardFn, *, max_batch: int, window_ms: float,
                 active_sessions: Callable[[], int] | None = None,
                 verify: VerifyFn | None = None) -> None:
        assert max_batch >= 1 and window_ms >= 0
        self._forward = forward
        self._verify = verify
        self.max_batch = max_batch
        self.window_s = window_ms / 1000.0
        # Sessions that might still join a batch: once that many jobs are in, waiting longer
        # cannot help, so a lone session never pays the gather window.
        self._active_sessions = active_sessions or (lambda: max_batch)
        self._queue: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._pass_lock = threading.Lock()  # one pass at a time (the runtime is single-threaded)
        self.batches_run = 0
        self.largest_batch = 0
        self.size_counts: collections.Counter[int] = collections.Counter()  # jobs per pass
        self.round_passes = 0  # passes of rounds (not prompts) so far
        self._last_pass: dict[int, int] = {}  # id(job.state) -> round_passes at its last job
        self._worker = threading.Thread(target=self._run, name="tandem-batcher", daemon=True)
        self._worker.start()

    def follow(self, active_sessions: Callable[[], int]) -> None:
        """How many sessions might join a pass (the engine's session count)."""
        self._active_sessions = active_sessions

    def submit(self, state: Any, tokens: Sequence[int], *, alone: bool = False,
               check: Any = None) -> Future:
        """Queue one forward job; the future resolves to a ForwardResult (or its exception).
        check: the round's RoundCheck, tested with the pass when this batcher has `verify`."""
        if self._closed.is_set():
            raise Unavailable("the verifier is shutting down")
        job = _Job(state, tokens, alone, check)
        if self._active_sessions() <= 1 and self._queue.empty() \
                and self._pass_lock.acquire(blocking=False):
            try:  # no one to batch with and the worker is idle: run it here
                self._execute_locked([job])
            finally:
                self._pass_lock.release()
            return job.future
        self._queue.put(job)
        return job.future

    def pending(self) -> int:
        """Jobs queued and not yet taken by the worker (approximate: a snapshot)."""
        return self._queue.qsize()

    def close(self, timeout: float | None = None) -> None:
        """Run what is already queued, then stop the worker."""
        if not self._closed.is_set():
            self._closed.set()
            self._queue.put(_STOP)
        self._worker.join(timeout)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            job = self._queue.get()
            if job is _STOP:
                stopping = True
                self._drain()
                break
            batch, prompts, stopping = self._gather(job)
            for group in _prompt_passes(prompts):  # prompts first: a user waits for its
                self._execute(group)                # first token, rounds have their next
            if batch:
                self._execute(batch)
            if stopping:
                self._drain()

    def _gather(self, first: _Job) -> tuple[list[_Job], list[_Job], bool]:
        """(rounds for one pass, prompts waiting, stop seen). A prompt first gathers no window:
        waiting cannot make its pass cheaper, only later."""
        batch, prompts = ([], [first]) if first.alone else ([first], [])
        deadline = time.perf_counter() + (0.0 if first.alone else self.window_s)
        while len(batch) < self.max_batch:
            remaining = deadline - time.perf_counter()
            wanted = batch and len(batch) < self._active_sessions()
            try:
                # "As many as are waiting" always; wait out the window only while it can help.
                job = self._queue.get(timeout=remaining) if wanted and remaining > 0 \
                    else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                return batch, prompts, True
            (prompts if job.alone else batch).append(job)
        return batch, prompts, False

    def _drain(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not _STOP:
                self._execute([job])

    def _execute(self, batch: list[_Job]) -> None:
        with self._pass_lock:
            self._execute_locked(batch)

    def _execute_locked(self, batch: list[_Job]) -> None:
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            outputs = self._forward([(job.state, job.tokens) for job in batch])
        except Exception as exc:  # noqa: BLE001 - every waiting session must hear about it
            log.exception("batched forward of %d jobs failed", len(batch))
            for job in batch:
                job.future.set_exception(exc)
            return
        forward_ms = (time.perf_counter() - started) * 1000.0
        verdicts, verify_ms = [None] * len(batch), 0.0
        checks = [job.check for job in batch]
        if self._verify is not None and any(check is not None for check in checks):
            verify_started = time.perf_counter()
            try:
                verdicts = self._verify(checks, outputs)
            except Exception as exc:  # noqa: BLE001 - as a failed pass: every job hears it
                log.exception("batched acceptance test of %d rounds failed", len(batch))
                verdicts = [exc] * len(batch)
            verify_ms = (time.perf_counter() - verify_started) * 1000.0
        cpu_ms = (time.thread_time() - cpu_started) * 1000.0
        _here.ms = passes_cpu_ms_here() + cpu_ms
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        self.size_counts[len(batch)] += 1  # read by Info (load reports); ints, no lock needed
        positions = sum(len(job.tokens) for job in batch)
        ones = sum(len(job.tokens) == 1 for job in batch)
        weights = self._weigh(batch)
        for i, job in enumerate(batch):
            if isinstance(verdicts[i], Exception):
                job.future.set_exception(verdicts[i])
                continue
            job.future.set_result(ForwardResult(
                logits=outputs[i], queue_ms=(started - job.submitted) * 1000.0,
                forward_ms=forward_ms, batch_size=len(batch), verdict=verdicts[i],
                verify_ms=verify_ms, positions=positions, cpu_ms=cpu_ms,
                ones=ones, weight=weights[i], weights=sum(weights)))

    def _weigh(self, batch: list[_Job]) -> list[float]:
        """Each job's round passes since its session's previous job (1 to ROUND_GAP_CAP; a
        session's first: 1); a prompt pass counts none and weighs its jobs 1. Under the pass
        lock."""
        if batch[0].alone:
            for job in batch:  # a session's first round counts from its prompt
                self._last_pass[id(job.state)] = self.round_passes
            return [1.0] * len(batch)
        self.round_passes += 1
        now, last = self.round_passes, self._last_pass
        weights = [float(min(max(now - last.get(id(job.state), now - 1), 1), ROUND_GAP_CAP))
                   for job in batch]
        for job in batch:
            last[id(job.state)] = now
        if len(last) > 4 * max(self.max_batch, 64):  # sessions gone: forget them
            for key in [k for k, seen in last.items() if now - seen > ROUND_GAP_CAP]:
                del last[key]
        return weights


def passes_cpu_ms_here() -> float:
    """CPU ms of the passes the calling thread has run itself (a lone session's, on its own
    thread; the worker's): what a thread's CPU clock holds beside its own work."""
    return getattr(_here, "ms", 0.0)


def _prompt_passes(prompts: list[_Job]) -> list[list[_Job]]:
    """Prompts in arrival order, grouped into passes of at most PROMPT_PASS_TOKENS tokens (a
    longer prompt alone)."""
    groups: list[list[_Job]] = []
    tokens = 0
    for job in prompts:
        if groups and tokens + len(job.tokens) <= PROMPT_PASS_TOKENS:
            groups[-1].append(job)
            tokens += len(job.tokens)
        else:
            groups.append([job])
            tokens = len(job.tokens)
    return groups
