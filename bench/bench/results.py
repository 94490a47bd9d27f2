"""From generations to the bench's rows, goal ratios with bootstrap intervals, table and JSON.

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
                    95% bootstrap interval of tokens_per_s over prompts (see bootstrap())
  prompts, units    prompts and (prompt, offset) units behind the row

Every goal is a paired ratio per cell (channel, device): config A's mean tokens/s over config
B's on the same units, with a bootstrap interval over prompts; its verdict against the goal's
threshold is `met` (the whole interval clears it), `not met` (the whole interval misses it) or
`tie` (the interval contains it: more prompts needed to decide).
"""
from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bench.bench.config import ADAPTIVE_FAMILY, PEERS, UNVERIFIED, fixed_k
from tandem import metrics

ROW_FIELDS = ("channel", "device", "config", "tokens_per_s", "local_tokens_per_s", "ttft_s", "tpot_s", "tau",
              "passes_per_token", "bytes_per_token", "joules_per_token", "agreement",
              "tokens_per_s_low", "tokens_per_s_high", "prompts", "units")
ADAPTIVE = ("adaptive-pipelined", "adaptive")  # the first that ran is "adaptive" in the older goals
RESAMPLES, CONFIDENCE = 2000, 0.95


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


def summarize(generations: Sequence[GenerationSummary], resamples: int = RESAMPLES,
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
    return [summarize(gs, resamples, confidence, seed) for gs in groups.values()]


# ---- statistics ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Interval:
    """A statistic on all units and its bootstrap interval. value None: undefined (a zero
    denominator); low/high None: not estimable (fewer than 2 prompts, or value undefined)."""
    value: float | None
    low: float | None = None
    high: float | None = None


def bootstrap(statistic, prompts: int, resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
              seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile interval of `statistic` over prompts resampled with replacement.

    statistic: maps an index array [resamples, prompts] (each row one resample of the prompt
    indices) to [resamples] values; a prompt drawn twice counts twice, and every configuration
    and unit of a drawn prompt comes with it (pairing kept). NaN values (a resample where the
    statistic is undefined) are left out. (None, None) with fewer than 2 prompts: resampling
    one prompt says nothing about the spread.
    """
    if prompts < 2:
        return None, None
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, prompts, size=(resamples, prompts))
    values = np.asarray(statistic(draws), dtype=float)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None, None
    tail = (1.0 - confidence) / 2.0
    # order statistics, no interpolation: an infinite resample (zero denominator) stays infinite
    low, high = np.quantile(values, [tail, 1.0 - tail], method="inverted_cdf")
    return float(low), float(high)


def _divide(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1.0),
                        np.where(num > 0, np.inf, np.nan))


def bootstrap_ratio(num_by_prompt: Sequence[float], den_by_prompt: Sequence[float],
                    resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                    seed: int = 0) -> Interval:
    """sum(num) / sum(den) with a paired bootstrap interval over prompts.

    num_by_prompt[p], den_by_prompt[p]: prompt p's sums over its units (for a tokens/s ratio,
    config A's and config B's request speeds over the same units, so that the ratio of the sums
    is the ratio of the mean speeds). Value None when sum(den) is 0.
    """
    num, den = np.asarray(num_by_prompt, dtype=float), np.asarray(den_by_prompt, dtype=float)
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"one numerator and one denominator per prompt: {num.shape} vs {den.shape}")
    if num.size == 0 or den.sum() == 0:
        return Interval(None)
    low, high = bootstrap(lambda idx: _divide(num[idx].sum(axis=1), den[idx].sum(axis=1)),
                          num.size, resamples, confidence, seed)
    return Interval(float(num.sum() / den.sum()), low, high)


def verdict(interval: Interval, threshold: float, at_most: bool = False) -> str:
    """`met` when the whole interval is on the goal's side of the threshold (>= it, or <= it
    with at_most), `not met` when it is wholly on the other side, `tie` when it contains the
    threshold or could not be estimated, `n/a` when the statistic is undefined."""
    if interval.value is None:
        return "n/a"
    if interval.low is None or interval.high is None:
        return "tie"
    if at_most:
        return "met" if interval.high <= threshold else "not met" if interval.low > threshold else "tie"
    return "met" if interval.low >= threshold else "not met" if interval.high < threshold else "tie"


def versus_one(interval: Interval) -> str:
    """How A compares with B: `faster`, `slower`, or `tie` when the interval spans 1."""
    if interval.value is None:
        return "n/a"
    if interval.low is None or interval.high is None or interval.low <= 1.0 <= interval.high:
        return "tie"
    return "faster" if interval.low > 1.0 else "slower"


# ---- goals -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """One cell of a goal: `a` against `b` (b empty for a plain statistic of a)."""
    cell: str                  # channel/device
    a: str
    b: str
    value: float | None
    low: float | None
    high: float | None
    verdict: str               # met / not met / tie / n/a, against the goal's threshold
    versus_one: str            # faster / slower / tie (a ratio whose interval spans 1); "" else


@dataclass(frozen=True)
class Goal:
    goal: str                  # what the issue asks
    measured: float | None     # the worst cell's value; None = not measurable
    met: bool | None           # True: met, False: not met, None: tie or not measurable
    detail: str                # per cell, or why it could not be measured
    low: float | None = None   # the worst cell's interval
    high: float | None = None
    verdict: str = "n/a"       # met / not met / tie / n/a over all its cells
    threshold: float = 0.0
    cells: tuple[Comparison, ...] = ()


def overall(verdicts: Sequence[str]) -> str:
    """A goal over cells: not met if any cell is, met if every cell is, else tie (n/a alone:
    nothing measurable)."""
    known = [v for v in verdicts if v != "n/a"]
    if not known:
        return "n/a"
    if "not met" in known:
        return "not met"
    return "met" if all(v == "met" for v in known) else "tie"


class Units:
    """The generations of one run, indexed by cell, configuration and unit (prompt, offset)."""

    def __init__(self, generations: Iterable[GenerationSummary], resamples: int = RESAMPLES,
                 confidence: float = CONFIDENCE, seed: int = 0) -> None:
        self.by: dict[tuple[str, str], dict[str, dict[tuple[int, float], GenerationSummary]]] = {}
        for g in generations:
            self.by.setdefault((g.channel, g.device), {}).setdefault(g.config, {})[(g.prompt, g.offset_s)] = g
        self.resamples, self.confidence, self.seed = resamples, confidence, seed

    def cells(self) -> list[tuple[str, str]]:
        return list(self.by)

    def configs(self, cell: tuple[str, str]) -> list[str]:
        return list(self.by[cell])

    def mean_speed(self, cell: tuple[str, str], config: str) -> float:
        units = self.by[cell][config]
        return statistics.fmean(speed(g) for g in units.values())

    def best(self, cell: tuple[str, str], candidates: Iterable[str]) -> str | None:
        """The candidate with the highest mean tokens/s in the cell (on all its units)."""
        present = [c for c in candidates if c in self.by[cell]]
        return max(present, key=lambda c: self.mean_speed(cell, c)) if present else None

    def _grouped(self, cell, a: str, b: str | None, num_of, den_of) -> tuple[list[float], list[float]]:
        """Per prompt, sums over the units both a and b ran (pairing)."""
        units_a = self.by[cell][a]
        units_b = self.by[cell][b] if b is not None else units_a
        num: dict[int, float] = {}
        den: dict[int, float] = {}
        for unit in sorted(set(units_a) & set(units_b)):
            num[unit[0]] = num.get(unit[0], 0.0) + num_of(units_a[unit])
            den[unit[0]] = den.get(unit[0], 0.0) + den_of(units_b[unit])
        return list(num.values()), [den[p] for p in num]

    def speed_ratio(self, cell, a: str, b: str) -> Interval:
        """Mean tokens/s of a over b's on the units both ran, bootstrap interval over prompts."""
        num, den = self._grouped(cell, a, b, speed, speed)
        return bootstrap_ratio(num, den, self.resamples, self.confidence, self.seed)

    def passes_per_token(self, cell, a: str) -> Interval:
        num, den = self._grouped(cell, a, None, lambda g: g.target_passes, lambda g: g.tokens)
        return bootstrap_ratio(num, den, self.resamples, self.confidence, self.seed)

    def passes_ratio(self, cell, a: str, b: str) -> Interval:
        """Target passes per token of a over b's, on the units both ran."""
        ua, ub = self.by[cell][a], self.by[cell][b]
        sums: dict[int, list[float]] = {}
        for unit in sorted(set(ua) & set(ub)):
            row = sums.setdefault(unit[0], [0.0] * 4)
            for i, v in enumerate((ua[unit].target_passes, ua[unit].tokens,
                                   ub[unit].target_passes, ub[unit].tokens)):
                row[i] += v
        x = np.asarray(list(sums.values()), dtype=float).T.reshape(4, -1)  # [4, prompts]
        if x.shape[1] == 0 or (x.sum(axis=1)[1:] == 0).any():
            return Interval(None)

        def stat(idx):
            s = x[:, idx].sum(axis=2)                                       # [4, resamples]
            return _divide(_divide(s[0], s[1]), _divide(s[2], s[3]))
        t = x.sum(axis=1)
        low, high = bootstrap(stat, x.shape[1], self.resamples, self.confidence, self.seed)
        return Interval(float((t[0] / t[1]) / (t[2] / t[3])), low, high)


def _label(cell: tuple[str, str]) -> str:
    return f"{cell[0]}/{cell[1]}"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _interval_text(value, low, high) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} [{_fmt(low)}, {_fmt(high)}]" if low is not None else f"{value:.2f} [-]"


def _goal(name: str, threshold: float, cells: list[Comparison], at_most: bool = False,
          empty: str = "no profile to measure it on") -> Goal:
    if not cells:
        return Goal(name, None, None, empty, threshold=threshold)
    measurable = [c for c in cells if c.value is not None]
    worst = (max if at_most else min)(measurable, key=lambda c: c.value) if measurable else None
    result = overall([c.verdict for c in cells])
    detail = ", ".join(f"{c.cell} {_interval_text(c.value, c.low, c.high)}"
                       f"{' vs ' + c.b if c.b else ''} {c.verdict}" for c in cells)
    return Goal(name, worst.value if worst else None,
                {"met": True, "not met": False}.get(result), detail,
                worst.low if worst else None, worst.high if worst else None, result, threshold,
                tuple(cells))


def _ratio_cells(units: Units, a: str, others, threshold: float,
                 where=lambda cell: True) -> list[Comparison]:
    """Per cell where a ran: a's tokens/s over the best of `others(cell)` (chosen on the
    cell's means), with interval and verdict."""
    out = []
    for cell in units.cells():
        if a not in units.configs(cell) or not where(cell):
            continue
        b = units.best(cell, others(cell))
        if b is None:
            continue
        r = units.speed_ratio(cell, a, b)
        out.append(Comparison(_label(cell), a, b, r.value, r.low, r.high,
                              verdict(r, threshold), versus_one(r)))
    return out


def _geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values and min(values) > 0 else 0.0


def goals(generations: Sequence[GenerationSummary], rtt_ms: dict[str, float], *, lte_channel: str = "lte",
          phone_device: str = "phone", peer_rtt_ms: float = 20.0,
          pipelining_rtt_ms: float = 50.0, cap_passes_per_token: float = 0.30,
          resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = 0) -> list[Goal]:
    """The issues' goals, each measured in this one run per cell, with intervals
    (rtt_ms: base RTT per channel). First the decision goals (issue 16), then the older ones."""
    units = Units(generations, resamples, confidence, seed)
    configs = {c for cell in units.cells() for c in units.configs(cell)}
    out: list[Goal] = []

    def verified_others(cell):  # every verified configuration but the adaptive controller's
        return [c for c in units.configs(cell)
                if c not in ADAPTIVE_FAMILY and c not in UNVERIFIED and c != "oracle"]

    def fixed(cell):
        return [c for c in units.configs(cell) if fixed_k(c) is not None]

    def far(cell):
        return rtt_ms.get(cell[0], 0.0) >= peer_rtt_ms

    name = "adaptive >= 0.95x the best other verified configuration (cloud-only included)"
    out.append(_goal(name, 0.95, _ratio_cells(units, "adaptive", verified_others, 0.95)))
    name = f"adaptive >= 1.1x the best peer rule (RTT >= {peer_rtt_ms:g} ms)"
    out.append(_goal(name, 1.1, _ratio_cells(units, "adaptive", lambda cell: PEERS, 1.1, far)))
    name = "adaptive-capped >= 0.95x the best fixed k"
    out.append(_goal(name, 0.95, _ratio_cells(units, "adaptive-capped", fixed, 0.95)))

    def fixed_within_cap(cell):  # a fixed k spending more than the cap is not an option under it
        return [c for c in fixed(cell)
                if (units.passes_per_token(cell, c).value or 0.0) <= cap_passes_per_token]

    name = f"adaptive-capped >= 0.95x the best fixed k within {cap_passes_per_token:.2f} passes/token"
    out.append(_goal(name, 0.95, _ratio_cells(units, "adaptive-capped", fixed_within_cap, 0.95),
                     empty="no fixed k within the cap ran"))
    cells = []
    for cell in units.cells():
        if "adaptive-capped" in units.configs(cell):
            r = units.passes_per_token(cell, "adaptive-capped")
            cells.append(Comparison(_label(cell), "adaptive-capped", "", r.value, r.low, r.high,
                                    verdict(r, cap_passes_per_token, at_most=True), ""))
    out.append(_goal(f"adaptive-capped target passes per token <= {cap_passes_per_token:.2f}",
                     cap_passes_per_token, cells, at_most=True))

    # ---- the earlier issues' goals (adaptive = adaptive-pipelined when it ran) ----
    adaptive = next((c for c in ADAPTIVE if c in configs), None)
    if adaptive is None:
        return out + [Goal("adaptive configurations", None, None, "neither adaptive nor "
                           "adaptive-pipelined ran")]
    name = f"{adaptive} >= 0.95x the best fixed k of each profile"
    out.append(_goal(name, 0.95, _ratio_cells(units, adaptive, fixed, 0.95)))

    name = f"{adaptive} >= 1.15x the single fixed k best on average"
    shared = [c for c in units.cells() if adaptive in units.configs(c)]
    fixed_all = sorted(set.intersection(*(set(fixed(c)) for c in shared)) if shared else set(), key=fixed_k)
    if fixed_all:
        best = max(fixed_all, key=lambda f: _geomean([units.mean_speed(c, f) for c in shared]))
        out.append(_average_goal(units, name, adaptive, best, shared))
    else:
        out.append(Goal(name, None, None, "no fixed-k configuration ran", threshold=1.15))

    if {"adaptive", "adaptive-pipelined"} <= configs:
        cells = _ratio_cells(units, "adaptive-pipelined", lambda cell: ["adaptive"], 1.3,
                             lambda cell: cell[1] == phone_device
                             and rtt_ms.get(cell[0], 0.0) >= pipelining_rtt_ms)
        out.append(_goal(f"pipelining >= 1.3x without it (RTT >= {pipelining_rtt_ms:g} ms, "
                         f"{phone_device})", 1.3, cells))
    else:
        out.append(Goal("pipelining >= 1.3x without it", None, None,
                        "needs both adaptive and adaptive-pipelined", threshold=1.3))

    out.append(_goal(f"{adaptive} within 80% of the oracle", 0.8,
                     _ratio_cells(units, adaptive, lambda cell: ["oracle"], 0.8)))
    lte = [c for c in units.cells() if c[0] == lte_channel and adaptive in units.configs(c)]
    cells = []
    for cell in lte:
        r = units.passes_per_token(cell, adaptive)
        cells.append(Comparison(_label(cell), adaptive, "", r.value, r.low, r.high,
                                verdict(r, 0.25, at_most=True), ""))
    out.append(_goal(f"{adaptive} target passes per token <= 0.25 on {lte_channel}", 0.25, cells,
                     at_most=True))
    out.append(_goal(f"on {lte_channel}: {adaptive} >= 0.8x cloud-only tokens/s", 0.8,
                     _ratio_cells(units, adaptive, lambda cell: ["cloud-only"], 0.8,
                                  lambda cell: cell[0] == lte_channel)))
    cells = []
    for cell in lte:
        if "cloud-only" in units.configs(cell):
            r = units.passes_ratio(cell, adaptive, "cloud-only")
            cells.append(Comparison(_label(cell), adaptive, "cloud-only", r.value, r.low, r.high,
                                    verdict(r, 0.25, at_most=True), ""))
    out.append(_goal(f"on {lte_channel}: {adaptive} target passes <= 0.25x cloud-only's", 0.25,
                     cells, at_most=True))
    return out


def _average_goal(units: Units, name: str, a: str, b: str, cells: list[tuple[str, str]]) -> Goal:
    """Geometric mean over cells of a's tokens/s over b's, one joint bootstrap of the prompts
    (prompt p is the same text in every cell)."""
    prompts = sorted({u[0] for cell in cells for u in set(units.by[cell][a]) & set(units.by[cell][b])})
    index = {p: i for i, p in enumerate(prompts)}
    num = np.zeros((len(cells), len(prompts)))
    den = np.zeros((len(cells), len(prompts)))
    for j, cell in enumerate(cells):
        ua, ub = units.by[cell][a], units.by[cell][b]
        for unit in set(ua) & set(ub):
            num[j, index[unit[0]]] += speed(ua[unit])
            den[j, index[unit[0]]] += speed(ub[unit])
    if not prompts or (den.sum(axis=1) == 0).any() or (num.sum(axis=1) == 0).any():
        return Goal(name, None, None, "a zero speed: no geometric mean", threshold=1.15)

    def stat(idx):
        ratios = _divide(num[:, idx].sum(axis=2), den[:, idx].sum(axis=2))   # [cells, resamples]
        with np.errstate(divide="ignore"):
            return np.exp(np.log(ratios).mean(axis=0))
    value = _geomean(list(num.sum(axis=1) / den.sum(axis=1)))
    low, high = bootstrap(stat, len(prompts), units.resamples, units.confidence, units.seed)
    interval = Interval(value, low, high)
    result = verdict(interval, 1.15)
    return Goal(name, value, {"met": True, "not met": False}.get(result),
                f"{b} is best on average (geometric mean over {len(cells)} profiles); "
                f"ratio = geometric mean {_interval_text(value, low, high)}",
                low, high, result, 1.15,
                (Comparison("all", a, b, value, low, high, result, versus_one(interval)),))


# ---- output ----------------------------------------------------------------------------------

COLUMNS = [  # header, BenchRow field, format
    ("channel", "channel", "{}"), ("device", "device", "{}"), ("config", "config", "{}"),
    ("verified tok/s", "tokens_per_s", "{:.1f}"), ("95% CI", "tokens_per_s_low", None),
    ("local tok/s", "local_tokens_per_s", "{:.1f}"),
    ("TTFT s", "ttft_s", "{:.3f}"),
    ("TPOT ms", "tpot_s", "{:.1f}"), ("tau", "tau", "{:.2f}"),
    ("passes/tok", "passes_per_token", "{:.3f}"), ("bytes/tok", "bytes_per_token", "{:.1f}"),
    ("mJ/tok", "joules_per_token", "{:.1f}"), ("agree", "agreement", "{:.1%}"),
    ("units", "units", "{}"),
]
_SCALE = {"tpot_s": 1000.0, "joules_per_token": 1000.0}


def _cell(r: BenchRow, name: str, fmt: str | None) -> str:
    value = getattr(r, name)
    if fmt is None:  # the interval column
        low, high = r.tokens_per_s_low, r.tokens_per_s_high
        return "-" if low is None or high is None else f"{low:.1f}-{high:.1f}"
    return value if isinstance(value, str) else fmt.format(value * _SCALE.get(name, 1.0))


def format_table(rows: Sequence[BenchRow], markdown: bool = False) -> str:
    cells = [[h for h, _, _ in COLUMNS]]
    for r in rows:
        cells.append([_cell(r, name, fmt) for _, name, fmt in COLUMNS])
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in cells]
        lines.insert(1, "|" + "|".join("---" if i < 3 else "---:" for i in range(len(COLUMNS))) + "|")
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_goals(items: Sequence[Goal], markdown: bool = False) -> str:
    lines = []
    for g in items:
        value = _interval_text(g.measured, g.low, g.high)
        lines.append(f"| {g.goal} | {value} | {g.verdict} | {g.detail} |" if markdown
                     else f"  [{g.verdict:>7}] {g.goal}: {value}  ({g.detail})")
    if markdown:
        lines[:0] = ["| goal | worst cell [95% CI] | verdict | per cell (vs the best other, verdict) |",
                     "|---|---:|---|---|"]
    return "\n".join(lines)


def _finite(value):
    """JSON has no infinity or NaN: such a number (an unbounded interval end) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path: Path, rows: Sequence[BenchRow], goal_list: Sequence[Goal], extra: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"rows": [asdict(r) for r in rows], "goals": [asdict(g) for g in goal_list], **extra}
    path.write_text(json.dumps(_finite(payload), indent=2, allow_nan=False) + "\n")
