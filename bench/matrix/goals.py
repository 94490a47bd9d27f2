"""The bench's goals: paired tokens/s ratios per cell (channel, device) with bootstrap
intervals and a verdict against each goal's threshold (bench/matrix/results.py's docstring)."""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.matrix.config import ADAPTIVE_FAMILY, PEERS, UNVERIFIED, fixed_k
from bench.matrix.results import GenerationSummary, speed
from bench.matrix.stats import (CONFIDENCE, RESAMPLES, Interval, bootstrap, bootstrap_ratio, divide,
                               verdict, versus_one)

ADAPTIVE = ("adaptive-pipelined", "adaptive")  # the first that ran is "adaptive" in the older goals


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
            return divide(divide(s[0], s[1]), divide(s[2], s[3]))
        t = x.sum(axis=1)
        low, high = bootstrap(stat, x.shape[1], self.resamples, self.confidence, self.seed)
        return Interval(float((t[0] / t[1]) / (t[2] / t[3])), low, high)


def _label(cell: tuple[str, str]) -> str:
    return f"{cell[0]}/{cell[1]}"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def interval_text(value, low, high) -> str:
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
    detail = ", ".join(f"{c.cell} {interval_text(c.value, c.low, c.high)}"
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
        ratios = divide(num[:, idx].sum(axis=2), den[:, idx].sum(axis=2))   # [cells, resamples]
        with np.errstate(divide="ignore"):
            return np.exp(np.log(ratios).mean(axis=0))
    value = _geomean(list(num.sum(axis=1) / den.sum(axis=1)))
    low, high = bootstrap(stat, len(prompts), units.resamples, units.confidence, units.seed)
    interval = Interval(value, low, high)
    result = verdict(interval, 1.15)
    return Goal(name, value, {"met": True, "not met": False}.get(result),
                f"{b} is best on average (geometric mean over {len(cells)} profiles); "
                f"ratio = geometric mean {interval_text(value, low, high)}",
                low, high, result, 1.15,
                (Comparison("all", a, b, value, low, high, result, versus_one(interval)),))
