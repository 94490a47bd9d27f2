"""What a committed token costs the verifier, per mode: speculative rounds and cloud runs
(the proto's Verdict.speculate_token_ms / cloud_token_ms; a priced edge chooses between the two
modes by them: edge/control/pricing.py).

Each pass's time T (forward pass and acceptance test) is shared among the jobs in it by what
each adds to it, as the runtime measured at start (TargetRuntime.pass_model, a PassModel) and
the live passes confirm (PassFit):

- the pass's fixed part F (its layers' launch, the head's setup) is paid by the sessions open
  through it: each job carries F in proportion to the passes since its session's previous
  job (ForwardResult.weight, at most the batcher's ROUND_GAP_CAP, of the pass's total
  weight). A cloud-run step is in every pass and carries one part; a phone's round that
  comes back after six passes (drafting, the round trip) carries six, as its session kept
  its place for them;
- the rest, T - F, in proportion to each job's part as the probe priced it: a 1-token row a
  step s0; a drafted block beside rows its own layout's share (the blocks attend as a layout
  of their own, cloud/runtime/slot_attention.py: Fb, shared), a step, and cb a position
  beyond its first; a block among blocks alone a step and c a position beyond its first;
- the probe runs at 64 positions, and at the contexts served a block's attention grows with
  its positions x the context while a row's grows far less: rows' and blocks' parts are
  scaled by a and b, fitted with F on the live passes (T = F + a R + b B, least squares).

The shares add up to T. Measured on this CPU with the shipped target at 300-token contexts: 48
one-token rows 33.6 ms a pass; 3 blocks of 6 beside them add 7.2 ms (2.4 a block, committing
~4 tokens on a phone), 3 more rows 1.1-1.6 (~0.5 a row, committing 1). Before this split (F
inside an equal step: the torch backend never passed F on), a phone's rounds read 0.57 ms a
token against 0.84 for cloud runs at 64 lte/phone users, while speculating all the time
(fixed k = 4) cost the verifier as much CPU per token as cloud-only did. Without a step
(vLLM, the exact path) the split is equal.

A pass's time is its wall time, or, where the target runs on the pass's own thread (torch on
the CPU with one thread, as `tandem capacity` serves it: cpu_clock), that thread's CPU time: a
verifier sharing its core with other work is descheduled in the middle of passes, and their
wall time then counts the other work too (measured on this 2-core machine under others' load:
2.2 ms a token by wall time against 1.2 ms of the verifier's CPU).

Beside its passes a reply costs the verifier its serving: the stream's thread running the
engine's bookkeeping, decoding a coded q, building and handing over the reply. Where the pass
is timed by its thread's CPU (cpu_clock: the same core serves and passes), each reply's serving
is added to its mode (ServingClock: the stream thread's CPU between its replies, less any pass
it ran itself). Measured at 64 lte/phone users on one core (each thread's CPU): ~0.16 ms a
cloud-run token, ~0.05 a speculated one. The rest of the process's CPU is the prompts' passes
(~0.3 ms a token of 48-token responses, both modes alike), gRPC's polling thread (~0.02) and
the batcher's loop around its passes (~0.01): split per mode by nothing here. On a GPU the
figures stay the passes' wall time (serving runs on other cores than the GPU's work).

A mode's cost per committed token is the sum of its jobs' shares over the tokens they
committed (a round: its accepted prefix, the bonus token and any unverified tokens it carried;
a cloud-run step: 1), over the mode's last window of committed tokens (whole bins of them):
verifier-wide (what every edge reads until its session has its own) and per session (its own
rounds' passes: a phone's rounds that arrive spread out share few passes and pay more of each
than rounds that arrive together). A window, not a half-life: a token's cost moves with the
load (a lone session pays a whole pass, ~8 ms a cloud-run token on this CPU; 32 sessions
~1 ms), and a half-life of 2000 tokens took ~12000 tokens, 19 s at 32 lte/phone users, to
forget a quiet hour's cloud figure: speculation read 0.24-0.95x a cloud token's cost all that
while, phones speculated at a price, and adaptive cost 1.02-1.06x cloud-only's CPU a token. A mode
not run lately keeps its last figure (its window moves only as its own tokens come in).
Prompts (prefills) are in neither: both modes pay them alike. The totals never forget
(benchmarks read them over a window: Info.batches).
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

import numpy as np

from cloud.batcher import ForwardResult, passes_cpu_ms_here

SPECULATE, CLOUD = "speculate", "cloud"
MODES = (SPECULATE, CLOUD)
VERIFIER_WINDOW_TOKENS = 2000      # ~2-3 s of a loaded verifier's tokens (32-64 users, 10-20
                                   # tok/s each): follows a change of load or mix within it
SESSION_WINDOW_TOKENS = 128        # a session's last few rounds or runs
WINDOW_BINS = 8                    # a window moves a bin (window / WINDOW_BINS tokens) at a time
MIN_TOKENS = 16.0                   # committed tokens of a mode before its figure is said
FIT_HALF_LIFE = 2000.0              # passes (~1 min of a loaded verifier): PassFit's memory
FIT_PRIOR = 20.0                    # passes' worth of the probe's parts PassFit starts from
FIT_EVERY = 64                      # jobs between PassFit's solves


@dataclass(frozen=True)
class PassModel:
    """What a batched pass costs by its parts, ms (measured at start: TargetRuntime.pass_model);
    None: not measured."""
    position_ms: float | None = None        # c: one more position fed, any job
    fixed_ms: float | None = None           # F: the pass before any session's share
    block_fixed_ms: float | None = None     # Fb: drafted blocks beside 1-token rows, their
                                            # own layout's fixed part
    block_position_ms: float | None = None  # cb: a position of such a block
    step_ms: float | None = None            # s0: one more 1-token job in a pass of them

    def row_ms(self) -> float:
        """A 1-token row's part of a pass beside others (its step, s0)."""
        return self.step_ms or 0.0

    def block_terms(self, beside_rows: bool) -> tuple[float, float]:
        """(the blocks' own fixed part, a position beyond a block's first): beside 1-token rows
        their own layout's (Fb, cb); among blocks alone (0, c)."""
        if beside_rows and self.block_fixed_ms is not None:
            return self.block_fixed_ms, self.block_position_ms or 0.0
        return 0.0, self.position_ms or 0.0

    def block_ms(self, positions: int, beside_rows: bool, blocks: int) -> float:
        """A drafted block's part: its share of the blocks' own fixed part, a step, and a
        position's part for each beyond its first (block_terms)."""
        own, per = self.block_terms(beside_rows)
        return own / max(blocks, 1) + self.row_ms() + per * max(positions - 1, 0)


def pass_parts(result: ForwardResult, model: PassModel) -> tuple[float, float]:
    """(R, B): the pass's 1-token rows and its drafted blocks, each in the probe's ms."""
    blocks = result.batch_size - result.ones
    rows = result.ones * model.row_ms()
    if blocks <= 0:
        return rows, 0.0
    own, per = model.block_terms(result.ones > 0)
    extra = result.positions - result.batch_size  # positions beyond each job's first
    return rows, own + blocks * model.row_ms() + per * extra


class PassFit:
    """What the live passes cost by their parts: T = F + a R + b B (pass_parts: R its 1-token
    rows, B its drafted blocks, each as the probe priced them), least squares over the recent
    passes (forgetting with a half-life of FIT_HALF_LIFE passes), pulled toward the probe's
    (F, 1, 1) by FIT_PRIOR passes' worth. a and b carry what the probe, at 64 positions, could
    not see: at the contexts served, a block's attention grows with its positions x context
    and a row's far less (measured at 300 positions: 3 blocks of 6 beside 48 rows add 7.2 ms,
    the probe's parts say 4.5; 3 more rows add 1.1-1.6). Thread-safe; each job adds 1 / S of
    its pass."""

    def __init__(self, model: PassModel) -> None:
        self.model = model
        self._keep = 0.5 ** (1.0 / FIT_HALF_LIFE)
        prior = [model.fixed_ms or 0.0, 1.0, 1.0]
        typical = [1.0, (8 * model.row_ms()) ** 2, (model.block_ms(5, True, 1)) ** 2]
        self._ridge = [FIT_PRIOR * t for t in typical]
        self._prior = prior
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xy = [0.0] * 3
        self._lock = threading.Lock()
        self._coef: tuple[float, float, float] | None = None
        self._since = 0

    def observe_job(self, result: ForwardResult, total_ms: float) -> None:
        if self.model.step_ms is None or result.positions < result.batch_size:
            return
        rows, blocks = pass_parts(result, self.model)
        x = (1.0, rows, blocks)
        weight = 1.0 / max(result.batch_size, 1)
        keep = self._keep ** weight
        with self._lock:
            for i in range(3):
                self._xy[i] = keep * self._xy[i] + weight * x[i] * total_ms
                for j in range(3):
                    self._xx[i][j] = keep * self._xx[i][j] + weight * x[i] * x[j]
            self._since += 1
            if self._since >= FIT_EVERY or self._coef is None:
                self._since = 0
                self._coef = self._solve()

    def _solve(self) -> tuple[float, float, float]:
        a = [[self._xx[i][j] + (self._ridge[i] if i == j else 0.0) for j in range(3)]
             for i in range(3)]
        b = [self._xy[i] + self._ridge[i] * self._prior[i] for i in range(3)]
        try:
            fixed, rows, blocks = (float(v) for v in np.linalg.solve(a, b))
        except np.linalg.LinAlgError:
            return tuple(self._prior)
        return (max(fixed, 0.0), rows if rows > 0 else 1.0, blocks if blocks > 0 else 1.0)

    def coefficients(self) -> tuple[float, float, float]:
        """(F, a, b): the probe's (F, 1, 1) until a pass is seen."""
        with self._lock:
            return self._coef or tuple(self._prior)


def job_share_ms(result: ForwardResult, positions: int, model: PassModel,
                 cpu_clock: bool = False, fit: tuple[float, float, float] | None = None
                 ) -> float:
    """One job's share of its pass (see the top): `positions` it fed, of result.positions.
    cpu_clock: the pass's time is its thread's CPU time (where the backend measured it).
    fit: (F, a, b) of the live passes (PassFit); None: the probe's (F, 1, 1)."""
    sessions = max(result.batch_size, 1)
    total = pass_ms(result, cpu_clock)
    if model.step_ms is None or result.positions < sessions:  # not counted (vLLM): equal split
        return total / sessions
    fixed, a, b = fit or (model.fixed_ms or 0.0, 1.0, 1.0)
    fixed = min(fixed, total)
    carried = fixed * result.weight / result.weights if result.weights > 0 else fixed / sessions
    rows, blocks = pass_parts(result, model)
    parts = a * rows + b * blocks
    if parts <= 0.0:
        return total * positions / max(result.positions, 1)
    blocks_in = sessions - result.ones
    mine = a * model.row_ms() if positions == 1 else \
        b * model.block_ms(positions, result.ones > 0, blocks_in)
    return carried + (total - fixed) * mine / parts


def pass_ms(result: ForwardResult, cpu_clock: bool = False) -> float:
    """A pass's time: its thread's CPU time where that is its cost (cpu_clock), else wall."""
    if cpu_clock and result.cpu_ms is not None:
        return result.cpu_ms
    return result.forward_ms + result.verify_ms


class ModeFigure:
    """A mode's ms and committed tokens over its last window (bins of bin_tokens, the newest
    open), and its totals (kept)."""

    def __init__(self, window_tokens: int) -> None:
        self.bin_tokens = max(window_tokens // WINDOW_BINS, 1)
        self.bins: collections.deque[list[float]] = collections.deque([[0.0, 0.0]],
                                                                      maxlen=WINDOW_BINS + 1)
        self.total_ms = 0.0
        self.total_tokens = 0

    def add(self, ms: float, tokens: int) -> None:
        newest = self.bins[-1]
        newest[0] += ms
        newest[1] += tokens
        if newest[1] >= self.bin_tokens:  # closed: the oldest closed bin leaves the window
            self.bins.append([0.0, 0.0])
        self.total_ms += ms
        self.total_tokens += tokens

    def per_token(self) -> float | None:
        ms = sum(b[0] for b in self.bins)
        tokens = sum(b[1] for b in self.bins)
        return ms / tokens if tokens >= MIN_TOKENS else None


class TokenCosts:
    """Shares of passes and committed tokens in, ms per committed token per mode out;
    thread-safe."""

    def __init__(self, window_tokens: int = VERIFIER_WINDOW_TOKENS) -> None:
        self._lock = threading.Lock()
        self.modes = {mode: ModeFigure(window_tokens) for mode in MODES}

    def observe(self, mode: str, share_ms: float, tokens: int) -> None:
        """A job of `mode` that cost share_ms of its pass and committed `tokens` (0: a
        reply's serving, its tokens counted with its pass)."""
        if tokens < 0 or not share_ms >= 0.0:
            return
        with self._lock:
            self.modes[mode].add(share_ms, tokens)

    def per_token_ms(self, mode: str) -> float | None:
        """ms of passes per committed token in `mode`, lately; None before MIN_TOKENS."""
        with self._lock:
            return self.modes[mode].per_token()

    def totals(self, mode: str) -> tuple[float, int]:
        """(ms, tokens) of `mode` since start."""
        with self._lock:
            figure = self.modes[mode]
            return figure.total_ms, figure.total_tokens


FIELDS = {SPECULATE: "speculate_token_ms", CLOUD: "cloud_token_ms"}  # the proto's names


class ServingClock:
    """One stream thread's CPU between replies, less the passes it ran itself (see the top)."""

    def __init__(self) -> None:
        self._mark = self._now()

    @staticmethod
    def _now() -> float:
        return time.thread_time() * 1000.0 - passes_cpu_ms_here()

    def lap(self) -> float:
        """CPU ms since the last lap (or the start)."""
        now = self._now()
        spent, self._mark = now - self._mark, now
        return max(spent, 0.0)


def cpu_clock(device: str) -> bool:
    """Whether a pass's thread CPU time is its cost: the target on the CPU, one torch thread
    (more threads do work the pass's thread's clock does not see; a GPU's work none)."""
    import torch
    return str(device).startswith("cpu") and torch.get_num_threads() == 1


def said(*sources: TokenCosts) -> dict[str, float]:
    """The proto fields to send: per mode the first source's figure that is measured (a
    session's own, then the verifier's); a mode none has measured is left out (absent)."""
    fields = {}
    for mode, name in FIELDS.items():
        value = next((v for v in (s.per_token_ms(mode) for s in sources) if v is not None), None)
        if value is not None:
            fields[name] = value
    return fields
