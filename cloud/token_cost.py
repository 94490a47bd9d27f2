"""What a committed token costs the verifier, per mode: speculative rounds and cloud runs
(the proto's Verdict.speculate_token_ms / cloud_token_ms; a priced edge chooses between the two
modes by them: edge/control/pricing.py).

Each pass's time T (forward pass and acceptance test) is shared among the jobs in it by what
each adds to it, measured by the runtime at start (TargetRuntime.pass_model, a PassModel):

- the pass's fixed part F (its layers' launch, the head's setup) is paid by the sessions open
  through it: each job carries F in proportion to the passes since its session's previous
  job (ForwardResult.weight, at most the batcher's ROUND_GAP_CAP, of the pass's total
  weight). A cloud-run step is in every pass and carries one part; a phone's round that
  comes back after six passes (drafting, the round trip) carries six, as its session kept
  its place for them;
- every job pays an equal part of the rest at one position each (its slot's K/V gather, its
  row) and c for each position beyond its first;
- where 1-token rows and drafted blocks share a pass, the blocks attend as a layout of their
  own (cloud/runtime/slot_attention.py): the blocks share that layout's own fixed part Fb
  (equally), and a position beyond a job's first costs cb, what one adds to a block there.

The shares add up to T. Measured on this CPU with the shipped target at 300-token contexts: a
pass of 48 one-token rows 33.8 ms, with one block of 6 beside them 36.1, with 4 blocks of 6
40.5 (Fb 1.5-2.4 ms, cb 0.13-0.2). Before Fb and F were priced so (F by committed tokens, and
then not at all: the torch backend never passed F on), a phone's rounds read 0.57 ms a token
against 0.84 for cloud runs at 64 lte/phone users, while speculating all the time (fixed k = 4)
cost the verifier as much CPU per token as cloud-only did. Without c (vLLM) the split is
equal; without F (the exact path, where every session is a pass) F is 0.

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
the batcher's loop around its passes (~0.01): split per mode by nothing here. On a GPU the figures stay the passes' wall time (serving runs on other cores than the GPU's work).

A mode's cost per committed token is the sum of its jobs' shares over the tokens they
committed (a round: its accepted prefix, the bonus token and any unverified tokens it carried;
a cloud-run step: 1), kept as moving sums that forget with a half-life in committed tokens:
verifier-wide (what every edge reads until its session has its own) and per session (its own
rounds' passes: a phone's rounds that arrive spread out share few passes and pay more of each
than rounds that arrive together). A mode not run lately keeps its last figure (both sums
forget only as the mode's own tokens come in). Prompts (prefills) are in neither: both modes
pay them alike. The totals never forget (benchmarks read them over a window: Info.batches).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from cloud.batcher import ForwardResult, passes_cpu_ms_here

SPECULATE, CLOUD = "speculate", "cloud"
MODES = (SPECULATE, CLOUD)
VERIFIER_HALF_LIFE_TOKENS = 2000.0  # ~2-4 s of a loaded verifier's tokens (64 users, 10-20
                                    # tok/s each): follows a change of mix within seconds
SESSION_HALF_LIFE_TOKENS = 64.0     # a session's last few rounds or runs
MIN_TOKENS = 16.0                   # committed tokens of a mode before its figure is said


@dataclass(frozen=True)
class PassModel:
    """What a batched pass costs by its parts, ms (measured at start: TargetRuntime.pass_model);
    None: not measured."""
    position_ms: float | None = None        # c: one more position fed, any job
    fixed_ms: float | None = None           # F: the pass before any session's share
    block_fixed_ms: float | None = None     # Fb: drafted blocks beside 1-token rows, their
                                            # own layout's fixed part
    block_position_ms: float | None = None  # cb: a position of such a block


def job_share_ms(result: ForwardResult, positions: int, model: PassModel,
                 cpu_clock: bool = False) -> float:
    """One job's share of its pass (see the top): `positions` it fed, of result.positions.
    cpu_clock: the pass's time is its thread's CPU time (where the backend measured it)."""
    sessions = max(result.batch_size, 1)
    total = result.forward_ms + result.verify_ms
    if cpu_clock and result.cpu_ms is not None:
        total = result.cpu_ms
    c = model.position_ms
    if c is None or result.positions < sessions:  # not counted (vLLM): equal split
        return total / sessions
    fixed = min(model.fixed_ms or 0.0, total)
    carried = fixed * result.weight / result.weights if result.weights > 0 else fixed / sessions
    blocks = sessions - result.ones
    layout = 0.0
    if 0 < result.ones < sessions and model.block_fixed_ms is not None:
        layout, c = model.block_fixed_ms, model.block_position_ms
    step = (total - fixed - layout - c * (result.positions - sessions)) / sessions
    if step <= 0.0:  # the model measured above this pass's cost (noise): split by positions
        return total * positions / result.positions
    own = layout / blocks if positions > 1 else 0.0
    return carried + step + own + c * max(positions - 1, 0)


@dataclass
class ModeFigure:
    """A mode's moving sums (forgotten) and totals (kept)."""
    ms: float = 0.0
    tokens: float = 0.0
    total_ms: float = 0.0
    total_tokens: int = 0

    def per_token(self) -> float | None:
        return self.ms / self.tokens if self.tokens >= MIN_TOKENS else None


class TokenCosts:
    """Shares of passes and committed tokens in, ms per committed token per mode out;
    thread-safe."""

    def __init__(self, half_life_tokens: float = VERIFIER_HALF_LIFE_TOKENS) -> None:
        self._keep = 0.5 ** (1.0 / half_life_tokens)
        self._lock = threading.Lock()
        self.modes = {mode: ModeFigure() for mode in MODES}

    def observe(self, mode: str, share_ms: float, tokens: int) -> None:
        """A job of `mode` that cost share_ms of its pass and committed `tokens` (0: a
        reply's serving, its tokens counted with its pass)."""
        if tokens < 0 or not share_ms >= 0.0:
            return
        keep = self._keep ** tokens
        with self._lock:
            figure = self.modes[mode]
            figure.ms = keep * figure.ms + share_ms
            figure.tokens = keep * figure.tokens + tokens
            figure.total_ms += share_ms
            figure.total_tokens += tokens

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
