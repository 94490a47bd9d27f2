"""The figures of one sweep point and the capacity read off a sweep (vLLM's `bench serve` /
GuideLLM definitions, ../shared/ANCHORS.md):

- TTFT: request sent -> first token; TPOT = (E2E - TTFT) / (tokens - 1) (tandem.metrics.tpot).
- A request is good when it completed and meets every SLO (TTFT and TPOT); the point's good
  share is good / requests started in the window (errors and unfinished count as not good).
- Capacity at a TPOT SLO: the largest user count N of the sweep whose good share is at least
  `GOOD_SHARE` (0.9), below the first N that clearly misses it (the 95% bootstrap interval of its
  good share lies wholly under 0.9); 0 when none meets it. A point under 0.9 whose interval
  still reaches it (a handful of requests at small N on a trace whose fades alone fail ~5% of
  requests) neither counts nor ends the run.
"""
from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.capacity.users import Sample
from bench.load import percentile
from tandem import metrics

GOOD_SHARE = 0.9
SATURATED_CPU_SHARE = 0.9     # the emulator's cores this busy: the row measures the emulator
CONTENDED_CPU_SHARE = 0.15    # other processes took this share of the machine: the row is unsound
RESAMPLES = 1000


@dataclass(frozen=True)
class TokenCostReading:
    """What the verifier measured a committed token cost its passes in the window, ms: in
    speculative rounds, in cloud runs, and both together (cloud/token_cost.py: each pass's
    time shared among its sessions; prompts in neither). None where no token of it."""
    speculate: float | None = None
    cloud: float | None = None
    both: float | None = None
    speculate_share: float | None = None  # of its tokens, committed by speculative rounds

    @classmethod
    def between(cls, a, b) -> TokenCostReading:
        """From two readings of the verifiers' totals (bench.capacity.servers.TokenTotals)."""
        if a is None or b is None:
            return cls()
        spec_ms, spec_n = b.speculate_ms - a.speculate_ms, b.speculate_tokens - a.speculate_tokens
        cloud_ms, cloud_n = b.cloud_ms - a.cloud_ms, b.cloud_tokens - a.cloud_tokens
        n = spec_n + cloud_n
        return cls(spec_ms / spec_n if spec_n else None, cloud_ms / cloud_n if cloud_n else None,
                   (spec_ms + cloud_ms) / n if n else None, spec_n / n if n else None)


@dataclass
class ServerReading:
    """What the server did during the window (None where it cannot be read)."""
    window_s: float
    window_tokens: int                  # tokens committed to users inside the window
    batched_passes: int | None = None   # target forward passes run (one serves many sessions)
    verifier_cpu_s: float | None = None
    driver_cpu_s: float | None = None   # devices, links and this driver
    driver_cores: int = 1
    other_cpu_s: float | None = None    # every other process on the machine (it shares the cores)
    price: float | None = None          # the verifiers' price through the window, mean (Info)
    position_cost: float | None = None  # what they said a drafted position costs, mean
    token_ms: TokenCostReading = TokenCostReading()  # what they charged a committed token, per mode


@dataclass
class PointRow:
    """One (channel, device, config, users) point. The JSON's `rows` are these."""
    channel: str
    device: str
    config: str
    users: int
    requests: int
    good_share: float                   # at the run's TTFT and TPOT SLOs
    good_share_low: float               # 95% bootstrap interval of good_share over requests
    good_share_high: float
    good_share_by_tpot: dict[str, float]  # TPOT SLO (s, as text) -> good share
    good_share_high_by_tpot: dict[str, float]  # -> the upper end of its 95% interval
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tpot_p99_s: float | None
    user_tokens_per_s_p10: float | None
    user_tokens_per_s_p50: float | None
    goodput_requests_per_s: float
    goodput_tokens_per_s: float
    tokens_per_s: float                 # every user's tokens committed in the window / window
    passes_per_token: float | None      # the users' own: target passes their rounds cost / tokens
    batched_passes_per_token: float | None  # the verifier's: forward passes / tokens
    verifier_cpu_s_per_token: float | None
    verifier_busy: float | None         # verifier CPU-s / window s (pinned to one core: <= 1)
    verified_share: float
    agreement: float                    # requests identical to the target's greedy output
    errors: int
    unfinished: int
    driver_cpu_share: float | None
    emulator_saturated: bool
    other_cpu_share: float | None       # of the whole machine, taken by processes not under test
    contended: bool                     # other processes took enough that the row is unsound
    first_errors: list[str] = field(default_factory=list)
    price: float | None = None          # the verifiers' price through the window (0..1)
    position_cost: float | None = None  # what a drafted position cost them, in 1-token steps
    # what the verifier measured a committed token cost its passes, ms (TokenCostReading)
    speculate_token_ms: float | None = None
    cloud_token_ms: float | None = None
    measured_token_ms: float | None = None  # both modes together: beside verifier CPU per token
    speculated_share: float | None = None  # of the verifier's tokens, committed by rounds


def tpot_of(sample: Sample) -> float | None:
    if sample.ttft_s is None or sample.tokens < 2:
        return None
    return metrics.tpot(sample.wall_s, sample.ttft_s, sample.tokens)


def is_good(sample: Sample, slo_ttft_s: float, slo_tpot_s: float) -> bool:
    tpot = tpot_of(sample)
    return (sample.ok and sample.ttft_s is not None and sample.ttft_s <= slo_ttft_s
            and tpot is not None and tpot <= slo_tpot_s)


def bootstrap_share(flags: Sequence[bool], seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the share of True in flags."""
    if not flags:
        return 0.0, 0.0
    rng = random.Random(seed)
    n = len(flags)
    shares = sorted(sum(flags[rng.randrange(n)] for _ in range(n)) / n for _ in range(RESAMPLES))
    return shares[int(0.025 * RESAMPLES)], shares[int(0.975 * RESAMPLES) - 1]


def point_row(channel: str, device: str, config: str, users: int, samples: Sequence[Sample],
              reading: ServerReading, slo_ttft_s: float, slo_tpot_s: float,
              extra_tpot_slos: Sequence[float]) -> PointRow:
    ok = [s for s in samples if s.ok]
    good = [is_good(s, slo_ttft_s, slo_tpot_s) for s in samples]
    low, high = bootstrap_share(good)
    flags_by_tpot = {f"{t:g}": [is_good(s, slo_ttft_s, t) for s in samples]
                     for t in (slo_tpot_s, *extra_tpot_slos)}
    by_tpot = {t: sum(f) / len(f) if f else 0.0 for t, f in flags_by_tpot.items()}
    high_by_tpot = {t: bootstrap_share(f)[1] for t, f in flags_by_tpot.items()}
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpots = [t for s in ok if (t := tpot_of(s)) is not None]
    per_user: dict[int, list[Sample]] = {}
    for s in ok:
        per_user.setdefault(s.user, []).append(s)
    speeds = [sum(s.tokens for s in mine) / sum(s.wall_s for s in mine)
              for mine in per_user.values() if sum(s.wall_s for s in mine) > 0]
    tokens = sum(s.tokens for s in samples)
    window = reading.window_s
    tok = reading.window_tokens
    driver_share = (reading.driver_cpu_s / window / reading.driver_cores
                    if reading.driver_cpu_s is not None and window > 0 else None)
    other_share = (reading.other_cpu_s / window / os.cpu_count()
                   if reading.other_cpu_s is not None and window > 0 else None)
    return PointRow(
        channel=channel, device=device, config=config, users=users, requests=len(samples),
        good_share=sum(good) / len(samples) if samples else 0.0,
        good_share_low=low, good_share_high=high, good_share_by_tpot=by_tpot,
        good_share_high_by_tpot=high_by_tpot,
        ttft_p50_s=percentile(ttfts, 50), ttft_p90_s=percentile(ttfts, 90),
        ttft_p99_s=percentile(ttfts, 99),
        tpot_p50_s=percentile(tpots, 50), tpot_p90_s=percentile(tpots, 90),
        tpot_p99_s=percentile(tpots, 99),
        user_tokens_per_s_p10=percentile(speeds, 10), user_tokens_per_s_p50=percentile(speeds, 50),
        goodput_requests_per_s=sum(good) / window if window > 0 else 0.0,
        goodput_tokens_per_s=sum(s.tokens for s, g in zip(samples, good) if g) / window
        if window > 0 else 0.0,
        tokens_per_s=tok / window if window > 0 else 0.0,
        passes_per_token=sum(s.target_passes for s in ok) / sum(s.tokens for s in ok)
        if any(s.tokens for s in ok) else None,
        batched_passes_per_token=reading.batched_passes / tok
        if reading.batched_passes is not None and tok else None,
        verifier_cpu_s_per_token=reading.verifier_cpu_s / tok
        if reading.verifier_cpu_s is not None and tok else None,
        verifier_busy=reading.verifier_cpu_s / window
        if reading.verifier_cpu_s is not None and window > 0 else None,
        verified_share=sum(s.verified_tokens for s in samples) / tokens if tokens else 0.0,
        agreement=sum(s.agrees for s in ok) / len(ok) if ok else 0.0,
        errors=sum(s.error is not None for s in samples),
        unfinished=sum(s.error is None and not s.finished for s in samples),
        driver_cpu_share=driver_share,
        emulator_saturated=driver_share is not None and driver_share >= SATURATED_CPU_SHARE,
        other_cpu_share=other_share,
        contended=other_share is not None and other_share >= CONTENDED_CPU_SHARE,
        first_errors=[s.error for s in samples if s.error][:3],
        price=reading.price, position_cost=reading.position_cost,
        speculate_token_ms=reading.token_ms.speculate, cloud_token_ms=reading.token_ms.cloud,
        measured_token_ms=reading.token_ms.both, speculated_share=reading.token_ms.speculate_share)


@dataclass
class Capacity:
    """The JSON's `capacity` entries: one per (channel, device, config, TPOT SLO)."""
    channel: str
    device: str
    config: str
    tpot_slo_s: float
    users: int
    swept_to: int                       # the largest N measured
    saturated: bool                     # a row up to capacity measured the emulator
    contended: bool                     # a row of the sweep shared the machine with others


def clearly_misses(row: PointRow, tpot_slo_s: float) -> bool:
    """The point's good share is under GOOD_SHARE beyond doubt (its 95% interval is)."""
    return row.good_share_high_by_tpot.get(f"{tpot_slo_s:g}", 0.0) < GOOD_SHARE


def capacity_of(rows: Sequence[PointRow], tpot_slo_s: float) -> int:
    """Largest N with >= GOOD_SHARE good requests below the first N that clearly misses it."""
    best = 0
    for row in sorted(rows, key=lambda r: r.users):
        if row.good_share_by_tpot.get(f"{tpot_slo_s:g}", 0.0) >= GOOD_SHARE:
            best = row.users
        elif clearly_misses(row, tpot_slo_s):
            break
    return best
