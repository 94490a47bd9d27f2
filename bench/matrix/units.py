"""The generations of one run indexed by cell (channel, device), configuration and unit
(prompt, trace offset), and the paired statistics the goals read from them: ratios over the
units two configurations both ran, with bootstrap intervals over prompts (bench/matrix/stats.py)."""
from __future__ import annotations

import statistics
from collections.abc import Iterable

import numpy as np

from bench.matrix.results import GenerationSummary, speed
from bench.matrix.stats import CONFIDENCE, RESAMPLES, Interval, bootstrap, bootstrap_ratio, divide


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
