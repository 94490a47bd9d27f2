"""From generations to the bench's rows (goals: goals.py, intervals: stats.py, table and JSON:
report.py).

One `GenerationSummary` per (channel, device, configuration, unit), a unit being one (prompt, trace
offset) that every configuration of the cell ran; one `BenchRow` per (channel, device,
configuration) with the issue's fields, so other tools can read the JSON:

  tokens_per_s      mean over requests of verified tokens / request wall time (ANCHORS:
                    speed-up is a ratio of these means, same prompts, greedy)
  local_tokens_per_s  the same for tokens committed without the target (outage fallback,
                    edge-only): never added into tokens_per_s
  ttft_s, tpot_s    mean over requests of TTFT and TPOT (tandem.metrics.tpot)
  tau               tandem.metrics.tau over every verification round of the configuration
  passes_per_token  tandem.metrics.passes_per_token: target passes / tokens, all requests
  bytes_per_token   serialized bytes up + down / tokens (protobuf payloads, no framing)
  joules_per_token  the device profile's energy (draft tokens computed + bytes) / tokens
  agreement         share of output positions equal to the target-only greedy output
  tokens_per_s_low, tokens_per_s_high
                    95% bootstrap interval of tokens_per_s over prompts (stats.bootstrap())
  prompts, units    prompts and (prompt, offset) units behind the row

Every goal is a paired ratio per cell (channel, device): config A's mean tokens/s over config
B's on the same units, with a bootstrap interval over prompts; its verdict against the goal's
threshold is `met` (the whole interval clears it), `not met` (the whole interval misses it) or
`tie` (the interval contains it: more prompts needed to decide).
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.matrix.stats import CONFIDENCE, RESAMPLES, bootstrap_ratio
from tandem import metrics

ROW_FIELDS = ("channel", "device", "config", "tokens_per_s", "local_tokens_per_s", "ttft_s", "tpot_s", "tau",
              "passes_per_token", "bytes_per_token", "joules_per_token", "agreement",
              "tokens_per_s_low", "tokens_per_s_high", "prompts", "units")


@dataclass
class GenerationSummary:
    """One generation of one configuration, reduced to what the rows need."""
    channel: str
    device: str
    config: str
    prompt: int
    tokens: int
    wall_s: float
    ttft_s: float
    accepted: int = 0          # accepted draft tokens over verification rounds
    rounds: int = 0            # verification rounds
    target_passes: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    draft_tokens: int = 0      # tokens the draft computed (discarded blocks included)
    joules: float = 0.0
    agreement: float = 0.0
    unverified: int = 0        # tokens committed without the target (local fallback)
    reopens: int = 0           # streams re-opened (evictions, broken links)
    offset_s: float = 0.0      # where on the channel's trace the unit started
    rounds_log: list[dict] = field(default_factory=list)  # kept for the plotted session only


@dataclass(frozen=True)
class BenchRow:
    channel: str
    device: str
    config: str
    tokens_per_s: float                      # verified tokens per second
    local_tokens_per_s: float                # unverified tokens per second (kept apart)
    ttft_s: float
    tpot_s: float
    tau: float
    passes_per_token: float
    bytes_per_token: float
    joules_per_token: float
    agreement: float
    tokens_per_s_low: float | None = None    # None: not estimable (fewer than 2 prompts)
    tokens_per_s_high: float | None = None
    prompts: int = 0
    units: int = 0

    @property
    def cell(self) -> str:
        return f"{self.channel}/{self.device}"


def agreement(output: Sequence[int], reference: Sequence[int]) -> float:
    """Share of the reference's positions where the output has the same token (a missing token
    disagrees); 1.0 for an empty reference."""
    if not reference:
        return 1.0
    return sum(1 for a, b in zip(output, reference) if a == b) / len(reference)


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def speed(g: GenerationSummary) -> float:
    """Verified tokens per second of one request (0 for a request that took no time): the
    speed every goal compares. Local tokens are the draft's alone and count apart."""
    return _ratio(g.tokens - g.unverified, g.wall_s)


def local_speed(g: GenerationSummary) -> float:
    """Tokens per second one request committed without the target."""
    return _ratio(g.unverified, g.wall_s)


def bench_row(generations: Sequence[GenerationSummary], resamples: int = RESAMPLES,
              confidence: float = CONFIDENCE, seed: int = 0) -> BenchRow:
    g0 = generations[0]
    tokens = sum(g.tokens for g in generations)
    by_prompt: dict[int, list[float]] = {}
    for g in generations:
        by_prompt.setdefault(g.prompt, []).append(speed(g))
    mean = bootstrap_ratio([sum(v) for v in by_prompt.values()],
                           [len(v) for v in by_prompt.values()], resamples, confidence, seed)
    return BenchRow(
        channel=g0.channel, device=g0.device, config=g0.config,
        tokens_per_s=statistics.fmean(speed(g) for g in generations),
        local_tokens_per_s=statistics.fmean(local_speed(g) for g in generations),
        ttft_s=statistics.fmean(g.ttft_s for g in generations),
        tpot_s=statistics.fmean(metrics.tpot(g.wall_s, g.ttft_s, g.tokens) for g in generations),
        tau=metrics.tau(sum(g.accepted for g in generations), sum(g.rounds for g in generations)),
        passes_per_token=metrics.passes_per_token(sum(g.target_passes for g in generations), tokens),
        bytes_per_token=_ratio(sum(g.bytes_up + g.bytes_down for g in generations), tokens),
        joules_per_token=_ratio(sum(g.joules for g in generations), tokens),
        agreement=statistics.fmean(g.agreement for g in generations),
        tokens_per_s_low=mean.low, tokens_per_s_high=mean.high,
        prompts=len(by_prompt), units=len({(g.prompt, g.offset_s) for g in generations}))


def details_of(generations: Iterable[GenerationSummary]) -> list[dict]:
    """Per row, what explains it beyond the row's fields: requests, tokens committed without
    the target (a verified configuration's agreement below 100% comes from these), re-opens."""
    groups: dict[tuple[str, str, str], list[GenerationSummary]] = {}
    for g in generations:
        groups.setdefault((g.channel, g.device, g.config), []).append(g)
    return [{"channel": c, "device": d, "config": n, "requests": len(gs),
             "unverified_share": _ratio(sum(g.unverified for g in gs), sum(g.tokens for g in gs)),
             "reopens": sum(g.reopens for g in gs)} for (c, d, n), gs in groups.items()]


def rows_of(generations: Iterable[GenerationSummary], resamples: int = RESAMPLES,
            confidence: float = CONFIDENCE, seed: int = 0) -> list[BenchRow]:
    """One row per (channel, device, configuration), in the order they first ran."""
    groups: dict[tuple[str, str, str], list[GenerationSummary]] = {}
    for g in generations:
        groups.setdefault((g.channel, g.device, g.config), []).append(g)
    return [bench_row(gs, resamples, confidence, seed) for gs in groups.values()]
