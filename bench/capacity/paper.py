"""Users per verifier on paper: a closed-loop model of N users against one verifier whose passes
cost what a pass-cost surface says (bench/passcost/surface.py), with the users' own measured
behaviour (tokens a round buys, time a round spends off the verifier: drafting and the link).

Each user alternates time off the verifier (z: drafting k tokens and the round trip; 0 for a
cloud run, whose next token is generated in the very next pass) and a round in the verifier.
The verifier runs passes of the rounds waiting (at most max_batch), back to back when busy; a
pass of B sessions feeding n tokens each costs

    S(B, n) = scale * surface(B, n, context) + engine.pass_ms + engine.job_ms * B

(the engine's CPU work around the forward pass: batching, the acceptance test, messages; scale
reads a surface measured on a shared CPU at the level its verifier ran, 1 elsewhere), and
the prompts that arrive meanwhile take passes of their own (the batcher never mixes prompts
with rounds). For rounds, the cycle C of the mean user solves, with lambda = N / C rounds/s,
B = clamp(lambda * D, 1, max_batch), D = S(B, n) + the prompts' share, busy share rho =
lambda * D / B:

    C = z + R,  R = (1 - rho) * window + rho * D / 2 + S(B, n)    (or N * D / max_batch past
                                                                  the verifier's throughput)

and a user's TPOT is (z_q + R) / tau at its own z quantile q (speculation: the p50's times the
measured spread, UserMode.spread). Cloud runs: every user is in every
pass (or every N / max_batch-th), TPOT = N / B * D + the link's jitter. A configuration holds N
users when at least GOOD_SHARE of its requests are good, as a run counts them
(bench/capacity/stats.py: TTFT and TPOT both within their SLOs):

    good(N) = (1 - fades) * P(TPOT <= SLO) * P(TTFT <= TTFT SLO)

each P of a log-normal body through the p50 and p90 at that load (the two taken as independent),
and `fades` the requests the link fails at any load: the share the light rows' measured good
share lies below their bodies' (a cellular trace's deep fades fail 4-8% of lte/phone requests
even alone; a model of p90s alone had a configuration at that edge hold 64 users, against 16
measured). KV memory is a second bound (sessions whose K/V fit the device).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

from bench.capacity.stats import GOOD_SHARE
from bench.passcost.surface import Surface

MAX_USERS = 1 << 16
QUANTILES = ("p50", "p90")
Z90 = NormalDist().inv_cdf(0.9)


@dataclass
class Engine:
    """The verifier around its forward passes."""
    pass_ms: float = 0.0       # CPU work per pass beyond the forward (batcher, test, messages)
    job_ms: float = 0.0        # and per session in the pass
    window_ms: float = 2.0     # batch.window_ms: an idle verifier waits this long to gather
    max_batch: int = 64        # batch.max_batch
    surface_scale: float = 1.0  # the forward passes cost this times the surface


@dataclass
class Workload:
    prompt_tokens: float = 60.0  # a request's prompt (the held-out prompts: 35-82)
    max_tokens: int = 48         # tokens a request generates
    context: float | None = None  # positions per session the passes see (None: prompt + half)
    kv_context: float | None = None  # positions per session the K/V bound charges (None:
                                     # prompt + max_tokens)

    def pass_context(self) -> float:
        return self.context or self.prompt_tokens + self.max_tokens / 2

    def kv_positions(self) -> float:
        return self.kv_context or self.prompt_tokens + self.max_tokens


@dataclass
class UserMode:
    """One way every user runs: k = 0 cloud runs, else rounds of k drafted tokens."""
    name: str
    k: int
    tau: float                # tokens committed per round (1: a cloud run's token per pass)
    z_s: dict[str, float]     # quantile -> time off the verifier per round (cloud: jitter), s
    ttft_link_s: float = 0.0  # TTFT p90 less the verifier's part (open round trip, prefill)
    ttft_link_p50_s: float | None = None  # ... TTFT p50's (None: TTFT by its p90 alone)
    fades: dict[str, float] = field(default_factory=dict)  # TPOT SLO (s, as text) -> the share
                                                           # of requests failed at any load
    spread: dict[str, float] = field(default_factory=dict)  # quantile -> TPOT there over TPOT
    # p50, where the spread scales with the TPOT (z_s then has p50 alone): a speculating user's
    # tokens a round differ by prompt, so its TPOT p90 / p50 holds at any load (wifi/laptop,
    # fixed k = 4: 1.37-1.45 from 1 to 96 users; adaptive 1.74-1.89), where a cloud run's
    # spread is the link's jitter, added to a TPOT that grows with load (1.04 -> 1.13)


@dataclass
class Load:
    users: int
    batch: float       # sessions per round pass
    pass_ms: float     # S: one round pass, engine included
    period_ms: float   # D: a round pass and its share of prompt passes
    response_ms: float  # R: a round's time in the verifier (wait, pass)
    busy: float        # the verifier's busy share
    tpot_s: dict[str, float] = field(default_factory=dict)
    ttft_p90_s: float = 0.0
    engine_share: float = 0.0  # of a round pass, the engine's CPU work


class Model:
    def __init__(self, surface: Surface, engine: Engine, workload: Workload) -> None:
        self.surface, self.engine, self.workload = surface, engine, workload
        self._forward: dict[tuple, float] = {}  # the surface, read at rounded points, memoised

    def pass_ms(self, batch: float, tokens: float, context: float | None = None) -> float:
        key = (round(batch, 2), tokens, round(context or self.workload.pass_context(), 1))
        if key not in self._forward:
            self._forward[key] = self.surface.pass_ms(*key)
        return (self.engine.surface_scale * self._forward[key] + self.engine.pass_ms
                + self.engine.job_ms * batch)

    def _period(self, batch: float, tokens: int, prompts_per_s: float) -> tuple[float, float]:
        """(S, D): a round pass and the pass period with the prompts' passes (prompts that
        arrive during a period gather into one pass of their own)."""
        pass_ms = self.pass_ms(batch, tokens)
        plen = self.workload.prompt_tokens
        period = pass_ms
        for _ in range(4):
            m = prompts_per_s * period / 1000.0
            prompt = self.pass_ms(max(m, 1.0), plen, plen) * min(m, 1.0)
            period = pass_ms + prompt
        return pass_ms, period

    def load(self, option: UserMode, users: int) -> Load:
        if option.k == 0:
            return self._cloud_runs(option, users)
        return self._rounds(option, users)

    def _cloud_runs(self, option: UserMode, users: int) -> Load:
        batch = float(min(users, self.engine.max_batch))
        waves = users / batch
        prompts_per_s = 0.0
        for _ in range(4):
            pass_ms, period = self._period(batch, 1, prompts_per_s)
            cycle = waves * period
            prompts_per_s = users / (cycle / 1000.0) / self.workload.max_tokens
        return self._finish(option, users, batch, pass_ms, period, cycle, cycle, 1.0)

    def _rounds(self, option: UserMode, users: int) -> Load:
        tokens, z_ms = option.k + 1, option.z_s["p50"] * 1000.0
        cap = float(min(users, self.engine.max_batch))

        def state(cycle: float) -> tuple[float, float, float, float, float]:
            rate = users / cycle * 1000.0                     # rounds per second
            prompts = rate * option.tau / self.workload.max_tokens
            batch = 1.0
            for _ in range(6):  # sessions a pass gathers: the rounds arriving in its period
                batch = min(max(rate * self._period(batch, tokens, prompts)[1] / 1000.0, 1.0),
                            cap)
            pass_ms, period = self._period(batch, tokens, prompts)
            busy = min(rate * period / 1000.0 / batch, 1.0)
            response = (1 - busy) * self.engine.window_ms + busy * period / 2 + pass_ms
            floor = users * period / cap                      # past the verifier's throughput
            return max(z_ms + response, floor), batch, pass_ms, period, busy

        low, high = z_ms + self.pass_ms(1, tokens), 1e7
        for _ in range(40):
            middle = (low + high) / 2
            if state(middle)[0] > middle:
                low = middle
            else:
                high = middle
        cycle, batch, pass_ms, period, busy = state(high)
        return self._finish(option, users, batch, pass_ms, period, cycle - z_ms, cycle, busy)

    def _finish(self, option: UserMode, users: int, batch: float, pass_ms: float, period: float,
                response: float, cycle: float, busy: float) -> Load:
        tpot = {q: max((z * 1000.0 + response) / option.tau, 0.0) / 1000.0
                for q, z in option.z_s.items()}
        tpot.update({q: tpot["p50"] * ratio for q, ratio in option.spread.items()})
        verifier = busy * period / 2 + period + response
        engine = self.engine.pass_ms + self.engine.job_ms * batch
        return Load(users, batch, pass_ms, period, response, busy, tpot,
                    option.ttft_link_s + verifier / 1000.0, engine / pass_ms if pass_ms else 0.0)

    def verifier_ttft_s(self, option: UserMode) -> float:
        """The verifier's part of an unloaded TTFT (what ttft_link_s excludes)."""
        one = self.load(option, 1)
        return one.ttft_p90_s - option.ttft_link_s

    def good_share(self, option: UserMode, users: int, tpot_slo_s: float,
                   ttft_slo_s: float, fades: bool = True) -> float:
        """The share of requests within both SLOs at N users (see the top); fades=False: the
        bodies alone."""
        load = self.load(option, users)
        tpot = body_within(load.tpot_s["p50"], load.tpot_s["p90"], tpot_slo_s)
        ttft_p50 = None if option.ttft_link_p50_s is None else \
            load.ttft_p90_s - option.ttft_link_s + option.ttft_link_p50_s
        ttft = body_within(ttft_p50, load.ttft_p90_s, ttft_slo_s)
        kept = 1.0 - option.fades.get(f"{tpot_slo_s:g}", 0.0) if fades else 1.0
        return kept * tpot * ttft

    def meets(self, option: UserMode, users: int, tpot_slo_s: float, ttft_slo_s: float) -> bool:
        return self.good_share(option, users, tpot_slo_s, ttft_slo_s) >= GOOD_SHARE

    def capacity(self, option: UserMode, tpot_slo_s: float, ttft_slo_s: float = 1.0) -> int:
        """The most users meeting both SLOs (TPOT grows with N: a binary search)."""
        if not self.meets(option, 1, tpot_slo_s, ttft_slo_s):
            return 0
        low, high = 1, 2
        while high < MAX_USERS and self.meets(option, high, tpot_slo_s, ttft_slo_s):
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            if self.meets(option, middle, tpot_slo_s, ttft_slo_s):
                low = middle
            else:
                high = middle
        return low

    def kv_users(self) -> int | None:
        """Sessions whose K/V fit the device's memory at the workload's context."""
        return self.surface.kv_sessions(int(self.workload.kv_positions()))


def body_within(p50: float | None, p90: float, slo: float) -> float:
    """P(X <= slo) for X log-normal through its p50 and p90; without a spread (no p50, or
    p90 <= p50) 1 when p90 is within the SLO, else 0."""
    if p50 is None or p50 <= 0.0 or p90 <= p50:
        return 1.0 if p90 <= slo else 0.0
    sigma = math.log(p90 / p50) / Z90
    return NormalDist().cdf(math.log(slo / p50) / sigma)
