"""What a committed token costs the verifier, per mode: speculative rounds and cloud runs
(the proto's Verdict.speculate_token_ms / cloud_token_ms; a priced edge chooses between the two
modes by them: edge/control/pricing.py).

Each pass's time (forward pass and acceptance test) is shared among the jobs in it: with S
jobs, P positions fed, C tokens committed, T ms, c the runtime's measured cost of one more
position and F what a pass costs before any session's share of it (both measured at start:
TargetRuntime.position_ms, pass_fixed_ms),

    share_i = F * C_i / C + (T - F - c * (P - S)) / S + c * (p_i - 1)

the pass's fixed part is carried by the tokens it commits, each alike; every job pays an equal
part of the rest at one position each (its slot's K/V gather, its row) and c for each position
beyond its first. The shares add up to T. A split by positions alone would charge a 5-position
round 5x a 1-token step, though on one CPU core a position adds only 0.1-0.25 of one; an equal
split would make a round's extra positions free; F shared by jobs, not tokens, made a round
that commits 4 tokens pay a quarter of a step's part of it per token, so speculation read ~40%
cheaper than cloud runs per token where it cost the verifier as much (lte/phone, 64 users:
0.53 against 0.86 ms, while adaptive's CPU per token was 1.14x cloud-only's). Without c (vLLM)
the split is equal; without F (the exact path, where every session is a pass) F is 0.

A pass's time is its wall time, or, where the target runs on the pass's own thread (torch on
the CPU with one thread, as `tandem capacity` serves it: cpu_clock), that thread's CPU time: a
verifier sharing its core with other work is descheduled in the middle of passes, and their
wall time then counts the other work too (measured on this 2-core machine under others' load:
2.2 ms a token by wall time against 1.2 ms of the verifier's CPU).

Beside its passes a reply costs the verifier its serving: the stream's thread running the
engine's bookkeeping, decoding a coded q, building and handing over the reply. Where the pass
is timed by its thread's CPU (cpu_clock: the same core serves and passes), each reply's serving
is added to its mode (ServingClock: the stream thread's CPU between its replies, less any pass
it ran itself). Measured at 64 lte/phone users on one core: ~0.17 ms a cloud-run token, and
the figures then come to 0.6-0.7 of the process's CPU per token; the rest (gRPC's own threads
reading and writing the messages, the batcher's loop) is split per mode by nothing here. On a
GPU the figures stay the passes' wall time (serving runs on other cores than the GPU's work).

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


def job_share_ms(result: ForwardResult, positions: int, committed: int,
                 position_ms: float | None, fixed_ms: float | None = None,
                 cpu_clock: bool = False) -> float:
    """One job's share of its pass (see the top): `positions` it fed, of result.positions,
    `committed` tokens, of result.committed. cpu_clock: the pass's time is its thread's CPU
    time (where the backend measured it)."""
    sessions = max(result.batch_size, 1)
    total = result.forward_ms + result.verify_ms
    if cpu_clock and result.cpu_ms is not None:
        total = result.cpu_ms
    if position_ms is None or result.positions < sessions:  # not counted (vLLM): equal split
        return total / sessions
    fixed = min(fixed_ms or 0.0, total) if result.committed > 0 else 0.0
    step = (total - fixed - position_ms * (result.positions - sessions)) / sessions
    if step <= 0.0:  # c and F measured above this pass's cost (noise): split by positions
        return total * positions / result.positions
    carried = fixed * committed / result.committed if fixed else 0.0
    return carried + step + position_ms * max(positions - 1, 0)


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
